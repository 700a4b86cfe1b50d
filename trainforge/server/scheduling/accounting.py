"""``Accounting``: each user's recent usage of the server, the U of fair share
(:mod:`trainforge.server.scheduling.sharing`).

A job holding ``grant`` uses, per second, its dominant share of the capacity (the largest fraction
of any one kind it holds: 2 of 8 GPUs is 0.25, whatever its CPUs). A user's usage is the integral of
their jobs' dominant shares over time, every second's worth halving each ``half_life_s`` (Slurm's
``PriorityDecayHalfLife``; ``inf``: no decay). Running jobs are charged continuously (:meth:`usage`
counts them up to now); the service calls :meth:`sync` with what every running job holds whenever
that may have changed (a start, an end, a resize), under its lock. The values survive a restart in
the store's ``usage`` table (written every ``PERSIST_S`` and at close).
"""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Mapping

from trainforge.server.scheduling.sharing import dominant_share
from trainforge.server.store.database import JobStore

PERSIST_S = 30.0


class Accounting:
    def __init__(self, store: JobStore | None, capacity: Mapping[str, float], half_life_s: float):
        if not (half_life_s > 0):
            raise ValueError(f"half_life_s={half_life_s!r}: give a number of seconds > 0 (or inf for no decay)")
        self.store = store
        self.capacity = dict(capacity)
        self.half_life_s = float(half_life_s)
        self._values: dict[str, tuple[float, float]] = {}  # user -> (usage, as of when)
        self._running: dict[int, tuple[str, float, float]] = {}  # job -> (user, dominant share, charged until)
        self._persisted = time.time()
        if store is not None:
            for row in store.query("SELECT user, value, at FROM usage"):
                self._values[row["user"]] = (float(row["value"]), float(row["at"]))

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

    def sync(self, held: Mapping[int, tuple[str, Mapping[str, float]]], now: float) -> None:
        """What each running job (job id -> (user, grant)) holds from now on: jobs that ended or
        changed are charged up to ``now``."""
        for job_id in list(self._running):
            user, weight, since = self._running[job_id]
            now_held = held.get(job_id)
            new_weight = dominant_share(now_held[1], self.capacity) if now_held is not None else None
            if now_held is None or now_held[0] != user or new_weight != weight:
                self._charge(user, self._accrued(weight, since, now), now)
                del self._running[job_id]
        for job_id, (user, grant) in held.items():
            if job_id not in self._running:
                self._running[job_id] = (user, dominant_share(grant, self.capacity), now)
        if self.store is not None and now - self._persisted >= PERSIST_S:
            self.persist(now)

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

    def persist(self, now: float) -> None:
        """Write every user's usage as of ``now`` to the store."""
        if self.store is None:
            return
        values = self.usage(now)
        self._persisted = now

        def work(conn: sqlite3.Connection) -> None:
            conn.executemany("INSERT INTO usage(user, value, at) VALUES (?, ?, ?) ON CONFLICT(user) DO UPDATE "
                             "SET value=excluded.value, at=excluded.at", [(u, v, now) for u, v in values.items()])  # fmt: skip

        self.store.write(work)
