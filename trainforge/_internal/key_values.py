"""``KEY=VALUE`` words of the command lines (``--config lr=0.01``, ``--metric acc=0.9``, ``--tag
team=vision``): one reading for every CLI, each value JSON when it parses as JSON, else the text."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")


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


# The format of every resources option (--resources, --capacity, --reserve, --quota, --default-quota).
RESOURCES_FORMAT = "KIND=AMOUNT[,KIND=AMOUNT...]"
RESOURCES_METAVAR = "KIND=AMOUNT,..."


def parse_resources(text: str) -> dict[str, float]:
    """``"CPU=8,GPU=2,memory=32G"`` -> ``{"CPU": 8.0, "GPU": 2.0, "memory": 32e9}``. ValueError naming
    the bad word, its value and the format (:data:`RESOURCES_FORMAT`) when it is malformed."""
    how = f"give {RESOURCES_FORMAT}, e.g. CPU=4,GPU=1,memory=32G"
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        kind, sep, amount = part.partition("=")
        if not sep or not kind.strip():
            raise ValueError(f"{part!r} is not KIND=AMOUNT: {how}")
        try:
            value = parse_amount(amount)
        except ValueError:
            raise ValueError(f"{part!r}: {amount.strip()!r} is not a number with an optional unit: {how}") from None
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{part!r}: the amount must be a finite number >= 0: {how}")
        out[kind.strip()] = value
    return out


def argument_type(parse: Callable[[str], T]) -> Callable[[str], T]:
    """``parse`` as an argparse ``type=``: argparse prints its ValueError's message after the option's
    name (``argument --resources: 'GPU=x': 'x' is not a number ...``), where a plain ValueError would
    print only ``invalid parse_resources value: 'GPU=x'``."""

    @functools.wraps(parse)
    def convert(text: str) -> T:
        import argparse

        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


size_arg = argument_type(parse_size)
resources_arg = argument_type(parse_resources)
