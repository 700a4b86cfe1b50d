"""How deeply a JSON request may nest arrays and objects: :data:`MAX_DEPTH` levels, for the model
server's predict body and the train server's free-form fields (a model version's ``tags`` and
``metrics``).

Python's JSON decoder recurses once per level, and so does every walk of what it decoded (the
model's ``preprocess``, the encoding of an answer), so a body like ``{"inputs": [[[[...]]]]}`` a few
thousand levels deep ends in ``RecursionError``: a 500. A body is measured before it is decoded
(:func:`body_too_deep`), a decoded value without recursing (:func:`value_too_deep`; :func:`shallow`
as a pydantic validator of a free-form field), and the refusal names the limit (:func:`too_deep_detail`). Real inputs nest a handful of levels (a batch of
images: 4).
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

T = TypeVar("T")

MAX_DEPTH = 100

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)  # a JSON string: its brackets do not count
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")  # as int8: +1 opens a level, -1 closes one
_CHUNK = 1 << 22


def too_deep_detail(limit: int = MAX_DEPTH) -> str:
    return (f"the body nests arrays/objects deeper than {limit} levels, more than this server takes: "
            "send a flatter body")  # fmt: skip


def body_too_deep(body: bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether the JSON text ``body`` nests arrays/objects more than ``limit`` levels deep (brackets
    inside strings do not count). Linear in the body and in C (a regular expression, ``translate``,
    numpy): a 32 MiB body in tens of milliseconds, one with few brackets at once."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return False
    import numpy as np

    steps = _STRING.sub(b"", body).translate(_STEPS, _NOT_BRACKETS)
    depth = 0
    for start in range(0, len(steps), _CHUNK):
        running = np.cumsum(np.frombuffer(steps, np.int8, min(_CHUNK, len(steps) - start), start), dtype=np.int64)
        if depth + int(running.max()) > limit:
            return True
        depth += int(running[-1])
    return False


def value_too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether the decoded JSON ``value`` nests lists/dicts more than ``limit`` levels deep (walked
    without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return False


def shallow(value: T) -> T:
    """``value``, a free-form field of a request's body object, or ValueError naming the limit if
    the body nests deeper than :data:`MAX_DEPTH` through it (a pydantic ``AfterValidator``)."""
    if value_too_deep(value, MAX_DEPTH - 1):  # the body's object is the level above it
        raise ValueError(too_deep_detail())
    return value
