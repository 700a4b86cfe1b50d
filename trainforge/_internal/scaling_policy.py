"""How many workers to run: fixed, or elastic within (min, max) by the resources on offer, growing
when more fit and shrinking (never below min) when the offer drops below what the group uses.

The resource view is the executor's: the local machine's CPUs and GPUs (resources.local_available),
or a Ray cluster's free resources plus those the run's own placement group holds
(worker_group/ray.py), so a running group counts as room for itself. Locally each worker counts at
least ``resources.MIN_CPU_PER_WORKER`` CPUs (one that asks for none included), so a train server's
grant bounds a job of zero-CPU workers too.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from trainforge._internal.config import ScalingConfig
from trainforge._internal.resources import per_worker, workers_that_fit


class ScalingDecision(enum.Enum):
    KEEP = "keep"
    GROW = "grow"
    SHRINK = "shrink"


class ScalingPolicy:
    """``size_now()`` is the group size to start with now (None: not even ``min`` fits yet);
    ``decide(current)`` says whether a running elastic group should grow (more workers fit) or
    shrink (fewer fit, but still ``min``: a scheduler took resources back). Below ``min`` it says
    KEEP: resources that are really gone make the workers fail, and the failure path restarts
    smaller or waits."""

    def __init__(self, scaling: ScalingConfig, available: Callable[[], dict[str, float]], executor: str = "local"):
        self.scaling = scaling
        self._available = available
        self._where = "the Ray cluster offers" if executor == "ray" else "the machine offers"
        self._charged = executor != "ray"  # locally each worker counts at least MIN_CPU_PER_WORKER (resources.py)

    def size_now(self) -> int | None:
        if not self.scaling.elastic:
            return self.scaling.max_workers
        n = workers_that_fit(self.scaling, self._available(), charged=self._charged)
        return n if n >= self.scaling.min_workers else None

    def decide(self, current: int) -> ScalingDecision:
        if not self.scaling.elastic:
            return ScalingDecision.KEEP
        n = workers_that_fit(self.scaling, self._available(), charged=self._charged)
        if n > current:
            return ScalingDecision.GROW
        if self.scaling.min_workers <= n < current:
            return ScalingDecision.SHRINK
        return ScalingDecision.KEEP

    def shortage(self) -> str:
        need = per_worker(self.scaling)
        return (
            f"need at least {self.scaling.min_workers} worker(s) of {need}, {self._where} {self._available()}"
        )
