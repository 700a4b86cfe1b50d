"""A job's metric series for charts, downsampled on the server so that a million reports stay
responsive in a browser and a spike in them stays visible.

Each key's series is cut into at most ``points`` buckets of consecutive reports; a bucket keeps its
``min``, ``max`` and ``last`` value and the x (step index and time) of its last report. Reports whose
value is missing, NaN or infinite leave no value in their bucket (a bucket with none is ``None``:
a gap). A chart that zooms asks for a range of step indices (``start``..``end``) and gets that range
cut into ``points`` buckets again, so zooming into a million reports shows the reports themselves.

The parsed reports of a job are kept per job as float64 columns (NaN where a report had no finite
value) and extended from the byte offset where the previous read stopped, so a chart that refreshes
reads only what is new; the buckets are computed with numpy (a million reports in milliseconds).
"""

from __future__ import annotations

import array
import collections
import json
import math
import threading
from typing import Any

import numpy as np

MAX_JOBS = 32  # jobs whose parsed reports are kept (least recently read ones go first)


def downsample(values: list[float | None] | np.ndarray, points: int, first: int = 0) -> dict[str, list[Any]]:
    """``values`` cut into at most ``points`` buckets: per bucket the index of its last element
    (``i``, counted from ``first``), and the ``min``, ``max`` and ``last`` of its finite values (None
    when it has none)."""
    if points < 1:
        raise ValueError(f"points={points!r}: give at least 1")
    v = np.asarray([np.nan if x is None else x for x in values] if isinstance(values, list) else values,
                   dtype=np.float64)  # fmt: skip
    n = len(v)
    if n == 0:
        return {"i": [], "min": [], "max": [], "last": []}
    size = max(1, math.ceil(n / points))
    starts = np.arange(0, n, size)
    ends = np.minimum(starts + size, n) - 1
    finite = np.isfinite(v)
    clean = np.where(finite, v, np.nan)
    with np.errstate(invalid="ignore"):
        lo = np.fmin.reduceat(clean, starts)  # fmin/fmax skip NaN unless a whole bucket is NaN
        hi = np.fmax.reduceat(clean, starts)
    # The last finite value of each bucket: the latest finite index at or before the bucket's end.
    latest = np.maximum.accumulate(np.where(finite, np.arange(n), -1))[ends]
    has = latest >= starts
    last = np.where(has, v[np.maximum(latest, 0)], np.nan)

    def column(a: np.ndarray) -> list[float | None]:
        return [float(x) if ok else None for x, ok in zip(a.tolist(), has.tolist(), strict=True)]

    return {"i": (ends + first).tolist(), "min": column(lo), "max": column(hi), "last": column(last)}


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    return float(value)


class SeriesCache:
    """The rank-0 reports of each job, parsed once, as columns: ``t`` and one per metric key."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: collections.OrderedDict[int, dict[str, Any]] = collections.OrderedDict()

    def read(self, job_id: int, path: str) -> dict[str, Any]:
        with self._lock:
            entry = self._jobs.setdefault(job_id, {"offset": 0, "t": array.array("d"), "keys": {}, "n": 0})
            self._jobs.move_to_end(job_id)
            while len(self._jobs) > MAX_JOBS:
                self._jobs.popitem(last=False)
            try:
                with open(path, "rb") as f:
                    f.seek(entry["offset"])
                    data = f.read()
            except FileNotFoundError:
                data = b""
            end = data.rfind(b"\n") + 1  # complete lines only
            keys: dict[str, array.array[float]] = entry["keys"]
            for line in data[:end].splitlines():
                if b'"report"' not in line:
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if event.get("type") != "report":
                    continue
                n = entry["n"]
                t = event.get("t")
                entry["t"].append(t if isinstance(t, (int, float)) else math.nan)
                for key, value in (event.get("metrics") or {}).items():
                    column = keys.get(key)
                    if column is None:
                        column = keys[key] = array.array("d", [math.nan]) * n
                    column.append(_number(value))
                entry["n"] = n + 1
                for column in keys.values():
                    if len(column) < n + 1:
                        column.append(math.nan)
            entry["offset"] += end
            return entry

    def series(
        self, job_id: int, path: str, points: int, keys: list[str] | None = None,
        start: int = 0, end: int | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """Reports ``start``..``end`` (step indices, inclusive; default: all) of each key (all, or
        ``keys``) cut into at most ``points`` buckets."""
        entry = self.read(job_id, path)
        with self._lock:
            n = entry["n"]
            lo = max(0, start)
            hi = n - 1 if end is None else min(end, n - 1)
            t = np.array(entry["t"][lo : hi + 1], dtype=np.float64)  # copies: the columns keep growing
            columns = {k: np.array(v[lo : hi + 1], dtype=np.float64)
                       for k, v in entry["keys"].items() if keys is None or k in keys}  # fmt: skip
            offset = entry["offset"]
        out: dict[str, Any] = {"n": n, "next_offset": offset, "points": points, "start": lo, "end": hi,
                               "series": {}}  # fmt: skip
        for key, values in sorted(columns.items()):
            d = downsample(values, points, first=lo)
            d["t"] = [None if math.isnan(x) else x for x in t[np.asarray(d["i"], dtype=np.int64) - lo].tolist()]
            out["series"][key] = d
        return out

    def forget(self, job_id: int) -> None:
        with self._lock:
            self._jobs.pop(job_id, None)
