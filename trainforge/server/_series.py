"""A job's metric series for charts, downsampled on the server so that a million reports stay
responsive in a browser and a spike in them stays visible.

Each key's series is cut into at most ``points`` buckets of consecutive reports; a bucket keeps its
``min``, ``max`` and ``last`` value and the x (step index and time) of its last report. Reports whose
value is missing, NaN or infinite leave no value in their bucket (a bucket with none is ``None``:
a gap). The parsed reports of a job are kept per job and extended from the byte offset where the
previous read stopped, so a chart that refreshes reads only what is new.
"""

from __future__ import annotations

import collections
import json
import math
import threading
from typing import Any

MAX_JOBS = 32  # jobs whose parsed reports are kept (least recently read ones go first)


def downsample(values: list[float | None], points: int) -> dict[str, list[Any]]:
    """``values`` cut into at most ``points`` buckets: per bucket the index of its last element
    (``i``), and the ``min``, ``max`` and ``last`` of its finite values (None when it has none)."""
    if points < 1:
        raise ValueError(f"points={points!r}: give at least 1")
    n = len(values)
    size = max(1, math.ceil(n / points))
    out: dict[str, list[Any]] = {"i": [], "min": [], "max": [], "last": []}
    for start in range(0, n, size):
        chunk = [v for v in values[start : start + size] if v is not None and math.isfinite(v)]
        out["i"].append(min(start + size, n) - 1)
        out["min"].append(min(chunk) if chunk else None)
        out["max"].append(max(chunk) if chunk else None)
        out["last"].append(chunk[-1] if chunk else None)
    return out


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


class SeriesCache:
    """The rank-0 reports of each job, parsed once, as columns: ``t`` and one list per metric key."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: collections.OrderedDict[int, dict[str, Any]] = collections.OrderedDict()

    def read(self, job_id: int, path: str) -> dict[str, Any]:
        with self._lock:
            entry = self._jobs.setdefault(job_id, {"offset": 0, "t": [], "keys": {}, "n": 0})
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
            for line in data[:end].splitlines():
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if event.get("type") != "report":
                    continue
                n = entry["n"]
                entry["t"].append(event.get("t"))
                for key, value in (event.get("metrics") or {}).items():
                    column = entry["keys"].get(key)
                    if column is None:
                        column = entry["keys"][key] = [None] * n
                    column.append(_number(value))
                entry["n"] = n + 1
                for column in entry["keys"].values():
                    if len(column) < n + 1:
                        column.append(None)
            entry["offset"] += end
            return entry

    def series(self, job_id: int, path: str, points: int, keys: list[str] | None = None) -> dict[str, Any]:
        entry = self.read(job_id, path)
        with self._lock:
            n, t = entry["n"], list(entry["t"])
            columns = {k: list(v) for k, v in entry["keys"].items() if keys is None or k in keys}
            offset = entry["offset"]
        out: dict[str, Any] = {"n": n, "next_offset": offset, "points": points, "series": {}}
        for key, values in sorted(columns.items()):
            d = downsample(values, points)
            d["t"] = [t[i] for i in d["i"]]
            out["series"][key] = d
        return out

    def forget(self, job_id: int) -> None:
        with self._lock:
            self._jobs.pop(job_id, None)
