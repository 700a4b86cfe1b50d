"""The model server's statistics (``GET /v1/stats``): requests and errors by status, latency
percentiles and throughput over a sliding window, batch sizes, and the swaps of versions."""

from __future__ import annotations

import collections
import math
import time
from typing import Any

_MAX_WINDOW = 200_000  # latency samples kept at most


class Stats:
    """Counters kept by one engine; :meth:`snapshot` is what ``stats()`` reports of them."""

    def __init__(self, window_s: float):
        self.window_s = window_s
        self.started = time.monotonic()
        self.requests = 0
        self.ok = 0
        self.errors: collections.Counter[int] = collections.Counter()
        self.instances = 0
        self.batches = 0
        self.retried_batches = 0
        self.batch_sizes: collections.Counter[int] = collections.Counter()
        self.window: collections.deque[tuple[float, float]] = collections.deque(maxlen=_MAX_WINDOW)
        self.swaps: collections.deque[dict[str, Any]] = collections.deque(maxlen=20)
        self.swap_count = 0

    def record(self, status: int, latency_s: float | None) -> None:
        """One request answered with ``status``; ``latency_s`` when the model answered (or failed on) it."""
        self.requests += 1
        if status == 200:
            self.ok += 1
        else:
            self.errors[status] += 1
        if latency_s is not None:
            self.window.append((time.monotonic(), latency_s))

    def batch(self, size: int) -> None:
        """One batch of ``size`` instances started."""
        self.batches += 1
        self.instances += size
        self.batch_sizes[size] += 1

    def swap(self, from_version: int, to_version: int, load_s: float) -> None:
        """A new version answers now (it took ``load_s`` to load)."""
        self.swap_count += 1
        self.swaps.append({"from": from_version, "to": to_version, "at": time.time(), "load_s": round(load_s, 3)})

    def snapshot(self) -> dict[str, Any]:
        now = time.monotonic()
        while self.window and self.window[0][0] < now - self.window_s:
            self.window.popleft()
        latencies = sorted(lat for _, lat in self.window)
        span = min(self.window_s, now - self.started)
        return {
            "uptime_s": round(now - self.started, 3),
            "requests": self.requests,
            "ok": self.ok,
            "errors": {str(k): v for k, v in sorted(self.errors.items())},
            "instances": self.instances,
            "window_s": self.window_s,
            "latency_ms": {
                "count": len(latencies),
                "p50": _percentile(latencies, 50),
                "p99": _percentile(latencies, 99),
                "mean": round(1e3 * sum(latencies) / len(latencies), 3) if latencies else None,
                "max": round(1e3 * latencies[-1], 3) if latencies else None,
            },
            "throughput_rps": round(len(latencies) / span, 3) if span > 0 else 0.0,
            "batches": self.batches,
            "retried_batches": self.retried_batches,
            "batch_sizes": {str(k): v for k, v in sorted(self.batch_sizes.items())},
            "mean_batch_size": round(sum(k * v for k, v in self.batch_sizes.items()) / self.batches, 3)
            if self.batches else None,
            "swaps": self.swap_count,
            "swap_history": list(self.swaps),
        }  # fmt: skip


def _percentile(sorted_values: list[float], q: float) -> float | None:
    """Nearest-rank percentile, in milliseconds."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return round(1e3 * sorted_values[rank - 1], 3)
