"""``KEY=VALUE`` words of the command lines (``--config lr=0.01``, ``--metric acc=0.9``, ``--tag
team=vision``): one reading for every CLI, each value JSON when it parses as JSON, else the text."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any


def parse_key_values(items: Iterable[str], option: str) -> dict[str, Any]:
    """``{KEY: VALUE}`` from the ``KEY=VALUE`` words given to ``--option``: ``lr=0.01`` gives 0.01,
    ``flag=true`` True, ``name=resnet`` the text "resnet". ValueError naming the word when it has no
    "=" or no KEY."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--{option} {item!r}: give KEY=VALUE")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out
