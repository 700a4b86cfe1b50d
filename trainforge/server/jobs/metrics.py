"""What the job service counts for operators in memory since it started (``/metrics``:
:mod:`trainforge.server.routes.operator`): submissions and preemptions by user, and the histogram of
the scheduler's decision times."""

from __future__ import annotations

import bisect
import collections
import threading
from collections.abc import Iterable

# Decision-time buckets (seconds): a decision takes about a millisecond with 10,000 queued jobs.
DECISION_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class Histogram:
    """Observations counted into fixed buckets (upper bounds ``buckets``, then +Inf), and their sum
    (prometheus_client is an optional dependency of the server: its ``Histogram`` cannot be the one
    the service always fills)."""

    def __init__(self, buckets: Iterable[float] = DECISION_BUCKETS):
        self.buckets = tuple(sorted(buckets))
        self.counts = [0] * (len(self.buckets) + 1)
        self.sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        with self._lock:
            self.counts[bisect.bisect_left(self.buckets, value)] += 1
            self.sum += value

    def snapshot(self) -> tuple[list[tuple[float, int]], float]:
        """Cumulative counts per upper bound (the last one +Inf), and the sum."""
        with self._lock:
            counts, total = list(self.counts), self.sum
        out, running = [], 0
        for bound, n in zip((*self.buckets, float("inf")), counts, strict=True):
            running += n
            out.append((bound, running))
        return out, total


class SchedulerCounters:
    """``submissions``/``preemptions``: by user; ``decisions``: how long each decision took;
    ``last_decision_s``: the latest's."""

    def __init__(self) -> None:
        self.submissions: collections.Counter[str] = collections.Counter()
        self.preemptions: collections.Counter[str] = collections.Counter()
        self.decisions = Histogram()
        self.last_decision_s = 0.0

    def decided(self, seconds: float) -> None:
        self.last_decision_s = seconds
        self.decisions.observe(seconds)
