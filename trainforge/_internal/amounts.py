"""Numbers and amounts for people, one rule each, used by every part that shows them (the train
server's CLI, pages and scheduling reasons, ``trainforge serve``, the HTTP guard's messages):

- :func:`fmt_number`: a plain number, as short as it is exact enough (``2``, ``0.5``, ``1e+06``);
- :func:`fmt_metric`: a reported metric's value in a line or a cell, to 4 significant digits
  (``0.1235``; the API and the files keep them all; the pages' scripts round alike);
- :func:`fmt_bytes`: an amount of bytes in binary units (``21.5 GiB``), which ``--capacity
  memory=21.5GiB`` reads back (:func:`~trainforge._internal.key_values.parse_amount`; the train
  server's ``static/units.js`` is its copy for the pages' scripts, and a browser test checks that the
  two agree);
- :func:`fmt_amount` and :func:`fmt_resources`: a resource's amount by its kind (bytes for
  ``memory``), and resources by kind (``2 CPU, 1 GPU, 21.5 GiB memory``);
- :func:`size_text`: a size limit exactly (``64 MiB (67108864 bytes)``), for messages that name one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

BYTE_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def fmt_number(x: float) -> str:
    """``x`` for people: ``2`` (not ``2.0``), ``0.5``, ``0.333333``, ``1e+06`` (six significant digits)."""
    return f"{x:g}"


def fmt_metric(value: float) -> str:
    """A metric's value for people: 4 significant digits (``0.1235``, ``1.235e+04``)."""
    return f"{value:.4g}"


def fmt_bytes(n: float) -> str:
    """``n`` bytes for people: ``512 B``, ``10.2 KiB``, ``21.5 GiB`` (one decimal from KiB on)."""
    # Rounded half up by arithmetic that JavaScript does alike (its toFixed and Python's format
    # break ties differently), so the pages' copy prints the same text.
    if math.floor(n + 0.5) < 1024:
        return f"{math.floor(n + 0.5)} B"
    value, i = float(n) / 1024, 0
    while math.floor(value * 10 + 0.5) / 10 >= 1024 and i < len(BYTE_UNITS) - 1:
        value, i = value / 1024, i + 1
    return f"{math.floor(value * 10 + 0.5) / 10:.1f} {BYTE_UNITS[i]}"


def fmt_amount(kind: str, value: float) -> str:
    """One resource's amount: bytes for ``memory``, else the number (``2``, ``0.5``)."""
    return fmt_bytes(value) if kind == "memory" else fmt_number(value)


def fmt_resources(amounts: Mapping[str, float] | None, empty: str = "") -> str:
    """``{"CPU": 2, "memory": 2.3e10}`` -> ``2 CPU, 21.4 GiB memory`` (by kind); ``empty`` for none."""
    if not amounts:
        return empty
    return ", ".join(f"{fmt_amount(k, v)} {k}" for k, v in sorted(amounts.items()))


def size_text(size: int) -> str:
    """``67108864`` -> ``"64 MiB (67108864 bytes)"``; sizes that are no whole KiB, MiB or GiB in bytes."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit} ({size} bytes)"
    return f"{size} bytes"
