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


# Amounts with a unit: decimal K/M/G/T (1e3...) and binary Ki/Mi/Gi/Ti (2**10...), a trailing B allowed.
UNITS = {"K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}


def parse_amount(text: str) -> float:
    """``"32G"`` -> 32e9, ``"64Mi"`` -> 64 * 2**20, ``"8"`` -> 8.0 (see :data:`UNITS`). ValueError when
    it is not a number with an optional unit."""
    upper = text.strip().upper().removesuffix("B")
    scale = 1.0
    for suffix in sorted(UNITS, key=len, reverse=True):
        if upper.endswith(suffix):
            scale, upper = UNITS[suffix], upper[: -len(suffix)]
            break
    try:
        return float(upper) * scale
    except ValueError:
        raise ValueError(f"{text.strip()!r} is not a number with an optional unit (e.g. 8, 32G, 64Mi)") from None


def parse_size(text: str) -> int:
    """A size in bytes from the command line: ``"64Mi"`` (64 * 2**20), ``"1G"`` (10**9), ``"1048576"``.
    ValueError, naming the text, unless it is a whole number of bytes >= 1."""
    try:
        value = parse_amount(text)
    except ValueError:
        value = float("nan")
    if not (1 <= value < 2**63 and value == int(value)):
        raise ValueError(f"size {text!r}: give a whole number of bytes >= 1, e.g. 64Mi (64 MiB), 1G, 1048576")
    return int(value)


def size_arg(text: str) -> int:
    """:func:`parse_size` as an argparse ``type=``: its message is what argparse prints."""
    import argparse

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
