"""A trial's numbers from its jobs' events files (:mod:`trainforge._internal.job_events`, the one
reader): :class:`Stats` (iterations, the metric's latest and best value, the latest metrics) counted
in report by report from a byte offset, and :class:`CurveCache` (each job's numeric metrics by report,
parsed once and extended from where the last read stopped) for the curves of a whole experiment.

A trial's *iteration* is its ``training_iteration``: a report's ``index + 1`` in its job's run, plus the
iterations of the trial's earlier jobs (``base``: PBT continues a trial in a new job). A tuner's stop
decision at iteration ``cut`` of a job ends the trial there: the job's later reports (it ran on until
the stop reached it) are not counted, here or in any chart.
"""

from __future__ import annotations

import array
import collections
import dataclasses
import math
import threading
from typing import Any

from trainforge._internal.http import json_safe
from trainforge._internal.job_events import EventType, read_events
from trainforge._internal.metric_path import lookup

MAX_JOBS = 4096  # jobs whose parsed reports the curve cache keeps (least recently read go first)


def number(value: Any) -> float | None:
    """A finite float, or None (missing, NaN, infinite, not a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def better(a: float, b: float | None, mode: str | None) -> bool:
    """Whether ``a`` beats ``b`` (None: anything does) for ``mode`` ("max"; else lower is better)."""
    return b is None or (a > b if mode == "max" else a < b)


@dataclasses.dataclass
class Stats:
    """What a trial's reports so far say of the experiment's metric."""

    iterations: int = 0
    last: float | None = None
    best: float | None = None
    best_at: int | None = None
    metrics: dict[str, Any] | None = None
    first_t: float | None = None
    last_t: float | None = None

    def add(self, iteration: int, t: Any, metrics: Any, metric: str | None, mode: str | None) -> None:
        self.iterations = max(self.iterations, iteration)
        if isinstance(t, (int, float)):
            self.first_t = t if self.first_t is None else self.first_t
            self.last_t = t
        if isinstance(metrics, dict):
            self.metrics = json_safe(metrics)
        value = number(lookup(metrics, metric))
        self.last = value if value is not None else self.last
        if value is not None and better(value, self.best, mode):
            self.best, self.best_at = value, iteration

    def read(self, path: str, offset: int, *, base: int, cut: int | None, metric: str | None,
             mode: str | None) -> int:  # fmt: skip
        """Count in the reports of the events file at ``path`` from byte ``offset`` (a job whose
        trial had ``base`` iterations before it, cut at its iteration ``cut``); the offset after them."""
        events, end = read_events(path, offset)
        for event in events:
            if event.get("type") != EventType.REPORT:
                continue
            index = event.get("index")
            local = index + 1 if isinstance(index, int) else self.iterations - base + 1
            if cut is not None and local > cut:
                continue
            self.add(base + local, event.get("t"), event.get("metrics"), metric, mode)
        return end


class CurveCache:
    """Each job's reports as columns: ``it`` (the report's iteration in its job), ``t`` and one column
    per numeric metric key (NaN where a report lacks it), extended from the last offset read."""

    def __init__(self, max_jobs: int = MAX_JOBS) -> None:
        self._lock = threading.Lock()
        self._max = max_jobs
        self._jobs: collections.OrderedDict[int, dict[str, Any]] = collections.OrderedDict()

    def read(self, job_id: int, path: str) -> dict[str, Any]:
        with self._lock:
            entry = self._jobs.get(job_id)
            if entry is None:
                entry = self._jobs[job_id] = {"offset": 0, "it": array.array("q"), "t": array.array("d"), "keys": {}}
            self._jobs.move_to_end(job_id)
            while len(self._jobs) > self._max:
                self._jobs.popitem(last=False)
            events, entry["offset"] = read_events(path, entry["offset"])
            keys: dict[str, array.array[float]] = entry["keys"]
            for event in events:
                if event.get("type") != EventType.REPORT:
                    continue
                n = len(entry["it"])
                index = event.get("index")
                entry["it"].append(index + 1 if isinstance(index, int) else n + 1)
                t = event.get("t")
                entry["t"].append(float(t) if isinstance(t, (int, float)) else math.nan)
                metrics = event.get("metrics")
                for key, value in (metrics if isinstance(metrics, dict) else {}).items():
                    v = number(value)
                    column = keys.get(key)
                    if column is None:
                        if v is None:
                            continue
                        column = keys[key] = array.array("d", [math.nan]) * n
                    column.append(math.nan if v is None else v)
                for column in keys.values():
                    if len(column) < n + 1:
                        column.append(math.nan)
            return entry

    def curve(self, job_id: int, path: str, metric: str, cut: int | None) -> tuple[list[int], list[float], list[float]]:
        """The job's reports of ``metric`` up to its iteration ``cut``: iterations, times, values
        (NaN: the report lacked it)."""
        entry = self.read(job_id, path)
        with self._lock:
            its = entry["it"].tolist()
            ts = entry["t"].tolist()
            column = entry["keys"].get(metric)
            vs = column.tolist() if column is not None else [math.nan] * len(its)
        if cut is not None:
            keep = [k for k, i in enumerate(its) if i <= cut]
            its, ts, vs = [its[k] for k in keep], [ts[k] for k in keep], [vs[k] for k in keep]
        return its, ts, vs

    def keys(self, job_id: int, path: str) -> list[str]:
        entry = self.read(job_id, path)
        with self._lock:
            return list(entry["keys"])


def thin(n: int, points: int) -> list[int]:
    """At most ``points`` indices of ``n``, evenly spread, the first and the last always in."""
    if n <= points:
        return list(range(n))
    if points <= 1:
        return [n - 1]
    step = (n - 1) / (points - 1)
    return sorted({round(k * step) for k in range(points)})
