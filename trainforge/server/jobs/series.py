"""A job's metric series for charts, downsampled on the server so that a million reports stay
responsive in a browser and a spike in them stays visible.

Each key's series is cut into at most ``points`` buckets of consecutive reports; a bucket keeps its
``min``, ``max`` and ``last`` value and the x (step index and time) of its last report. Reports whose
value is missing, NaN or infinite leave no value in their bucket (a bucket with none is ``None``:
a gap). A chart that zooms asks for a range of step indices (``start``..``end``) and gets that range
cut into ``points`` buckets again, so zooming into a million reports shows the reports themselves.

A bucket never holds reports of two segments: a segment starts at every run's start and every restart
(:class:`~trainforge._internal.job_events.Segments`), so a job whose lost runner was replaced, or a run
restarted from its checkpoint, shows its repeated steps apart, each bucket with its ``segment`` (the
job's attempt, the run and its restart count).

The parsed reports of a job are kept per job as float64 columns (NaN where a report had no finite
value) and extended from the byte offset where the previous read stopped, so a chart that refreshes
reads only what is new; the buckets are computed with numpy (a million reports in milliseconds).
"""

from __future__ import annotations

import array
import collections
import math
import threading
from typing import Any

import numpy as np

from trainforge._internal.job_events import Segments, read_events

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
    """The rank-0 reports of each job, parsed once, as columns: ``t``, the segment of each report
    (:class:`~trainforge._internal.job_events.Segments`) and one column per metric key."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: collections.OrderedDict[int, dict[str, Any]] = collections.OrderedDict()

    def read(self, job_id: int, path: str) -> dict[str, Any]:
        with self._lock:
            entry = self._jobs.get(job_id)
            if entry is None:
                entry = self._jobs[job_id] = {"offset": 0, "t": array.array("d"), "seg": array.array("i"),
                                              "segments": Segments(), "keys": {}, "n": 0}  # fmt: skip
            self._jobs.move_to_end(job_id)
            while len(self._jobs) > MAX_JOBS:
                self._jobs.popitem(last=False)
            events, entry["offset"] = read_events(path, entry["offset"])
            keys: dict[str, array.array[float]] = entry["keys"]
            for event in events:
                seg = entry["segments"].add(event)
                if seg is None:
                    continue
                n = entry["n"]
                t = event.get("t")
                entry["t"].append(t if isinstance(t, (int, float)) else math.nan)
                entry["seg"].append(seg)
                metrics = event.get("metrics")
                for key, value in (metrics if isinstance(metrics, dict) else {}).items():
                    column = keys.get(key)
                    if column is None:
                        column = keys[key] = array.array("d", [math.nan]) * n
                    column.append(_number(value))
                entry["n"] = n + 1
                for column in keys.values():
                    if len(column) < n + 1:
                        column.append(math.nan)
            return entry

    def series(
        self, job_id: int, path: str, points: int, keys: list[str] | None = None,
        start: int = 0, end: int | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """Reports ``start``..``end`` (step indices, inclusive; default: all) of each key (all, or
        ``keys``) cut into about ``points`` buckets of the same size, none across two segments (one
        more bucket at most per segment that starts in the range); each bucket's ``segment`` indexes
        ``segments``, every segment of the job's reports."""
        entry = self.read(job_id, path)
        with self._lock:
            n = entry["n"]
            lo = max(0, start)
            hi = n - 1 if end is None else min(end, n - 1)
            t = np.array(entry["t"][lo : hi + 1], dtype=np.float64)  # copies: the columns keep growing
            seg = np.array(entry["seg"][lo : hi + 1], dtype=np.int64)
            columns = {k: np.array(v[lo : hi + 1], dtype=np.float64)
                       for k, v in entry["keys"].items() if keys is None or k in keys}  # fmt: skip
            offset = entry["offset"]
            segments = [dict(s) for s in entry["segments"].segments]
        out: dict[str, Any] = {"n": n, "next_offset": offset, "points": points, "start": lo, "end": hi,
                               "segments": segments, "series": {}}  # fmt: skip
        size = max(1, math.ceil(len(seg) / points))
        cuts = [0, *(np.flatnonzero(np.diff(seg)) + 1).tolist(), len(seg)]  # where a segment starts
        pieces = [(a, b) for a, b in zip(cuts, cuts[1:], strict=False) if b > a]
        for key, values in sorted(columns.items()):
            parts = [downsample(values[a:b], math.ceil((b - a) / size), first=lo + a) for a, b in pieces]
            d: dict[str, list[Any]] = {k: [x for p in parts for x in p[k]] for k in ("i", "min", "max", "last")}
            at = np.asarray(d["i"], dtype=np.int64) - lo
            d["t"] = [None if math.isnan(x) else x for x in t[at].tolist()]
            d["segment"] = seg[at].tolist()
            out["series"][key] = d
        return out

    def forget(self, job_id: int) -> None:
        with self._lock:
            self._jobs.pop(job_id, None)
