"""``Accounting``: each user's recent usage of the server, the U of fair share
(:mod:`trainforge.server.scheduling.policies.fair_share`).

The accounting rule: a job holding ``grant`` uses, per second, its dominant share of the capacity
(the largest fraction of any one kind it holds: 2 of 8 GPUs is 0.25, whatever its CPUs). A user's
usage is the integral of their jobs' dominant shares over time, every second's worth halving each
``half_life_s`` (Slurm's ``PriorityDecayHalfLife``; ``inf``: no decay). A job is charged from the
moment it holds resources (:meth:`start`) until the moment it releases them (:meth:`end`), at the
share it holds in between (:meth:`change`: a resize charges the old share up to then): continuously,
whatever decisions run or do not run meanwhile. Time is an argument of every method, so tests drive it.

The values survive a restart through the injected :class:`UsageStore` (the server's
:class:`~trainforge.server.store.database.JobStore`: written every ``PERSIST_S`` and at close); this
module speaks no SQL.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Protocol

from trainforge.server.scheduling.resources import dominant_share

PERSIST_S = 30.0


class UsageStore(Protocol):
    """Where usage survives a restart: each user's value as of a time."""

    def usage_rows(self) -> dict[str, tuple[float, float]]:
        """user -> (usage, as of when)."""
        ...

    def save_usage(self, values: Mapping[str, float], at: float) -> None:
        """Each user's usage as of ``at``."""
        ...


class Accounting:
    """See the module docstring. ``capacity``: what the dominant shares are fractions of (read when a
    job starts or changes)."""

    def __init__(self, store: UsageStore | None, capacity: Mapping[str, float], half_life_s: float):
        if not (half_life_s > 0):
            raise ValueError(f"half_life_s={half_life_s!r}: give a number of seconds > 0 (or inf for no decay)")
        self.store = store
        self.capacity = capacity
        self.half_life_s = float(half_life_s)
        self._values: dict[str, tuple[float, float]] = {}  # user -> (usage, as of when)
        self._running: dict[int, tuple[str, float, float]] = {}  # job -> (user, dominant share, charged until)
        self._persisted: float | None = None
        if store is not None:
            self._values.update(store.usage_rows())

    # -- the arithmetic ------------------------------------------------------------------------------
    def _decay(self, dt: float) -> float:
        return 1.0 if math.isinf(self.half_life_s) else 0.5 ** (max(0.0, dt) / self.half_life_s)

    def _accrued(self, weight: float, since: float, now: float) -> float:
        """What ``weight`` held from ``since`` to ``now`` adds up to, as of ``now``."""
        dt = max(0.0, now - since)
        if math.isinf(self.half_life_s):
            return weight * dt
        return weight * self.half_life_s / math.log(2) * (1.0 - self._decay(dt))

    def _charge(self, user: str, amount: float, now: float) -> None:
        value, at = self._values.get(user, (0.0, now))
        self._values[user] = (value * self._decay(now - at) + amount, now)

    # -- what jobs hold --------------------------------------------------------------------------------
    def start(self, job_id: int, user: str, grant: Mapping[str, float], now: float) -> None:
        """``job_id`` (``user``'s) holds ``grant`` from ``now`` on (a job already charged is first
        charged up to ``now``)."""
        self.end(job_id, now)
        self._running[job_id] = (user, dominant_share(grant, self.capacity), now)

    def change(self, job_id: int, grant: Mapping[str, float], now: float) -> None:
        """``job_id`` holds ``grant`` from ``now`` on (a resize): charged its old share up to ``now``."""
        held = self._running.get(job_id)
        if held is not None:
            self.start(job_id, held[0], grant, now)

    def end(self, job_id: int, now: float) -> None:
        """``job_id`` released what it held at ``now``: charged up to then."""
        held = self._running.pop(job_id, None)
        if held is not None:
            user, weight, since = held
            self._charge(user, self._accrued(weight, since, now), now)

    def sync(self, held: Mapping[int, tuple[str, Mapping[str, float]]], now: float) -> None:
        """What each running job (job id -> (user, grant)) holds from ``now`` on, all at once: jobs
        absent from ``held`` ended at ``now``, jobs new in it started then."""
        for job_id in list(self._running):
            user, weight, _ = self._running[job_id]
            now_held = held.get(job_id)
            if now_held is None or now_held[0] != user:
                self.end(job_id, now)
            elif dominant_share(now_held[1], self.capacity) != weight:
                self.change(job_id, now_held[1], now)
        for job_id, (user, grant) in held.items():
            if job_id not in self._running:
                self.start(job_id, user, grant, now)

    def rename(self, old: str, new: str) -> None:
        """``old``'s usage, and what their running jobs accrue from now on, are ``new``'s (a removed
        user's: the store's row was renamed in the same transaction as the user's removal)."""
        if old in self._values:
            self._values[new] = self._values.pop(old)
        for job_id, (user, weight, since) in list(self._running.items()):
            if user == old:
                self._running[job_id] = (new, weight, since)

    def usage(self, now: float) -> dict[str, float]:
        """Each user's decayed usage as of ``now`` (dominant-share seconds), running jobs included."""
        out = {user: value * self._decay(now - at) for user, (value, at) in self._values.items()}
        for user, weight, since in self._running.values():
            out[user] = out.get(user, 0.0) + self._accrued(weight, since, now)
        return out

    # -- surviving a restart ---------------------------------------------------------------------------
    def persist_due(self, now: float) -> None:
        """:meth:`persist` when the last one is ``PERSIST_S`` old."""
        if self._persisted is None:
            self._persisted = now
        elif self.store is not None and now - self._persisted >= PERSIST_S:
            self.persist(now)

    def persist(self, now: float) -> None:
        """Write every user's usage as of ``now`` to the store."""
        self._persisted = now
        if self.store is not None:
            self.store.save_usage(self.usage(now), now)
