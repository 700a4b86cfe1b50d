"""``preemption``: a job of higher priority may take the place of running ``preemptible`` jobs
(rule 8 of :mod:`trainforge.server.scheduling.rule`), within Slurm's and Kueue's bounds: only for a
job of *higher* priority (never for fair share), only after ``exempt_s`` of running (Slurm's
PreemptExemptTime) and at most once per ``cooldown_s``. When the first waiting job that lacks
resources (the decision's ``blocked``) cannot start from what is free, what stopping jobs will give
back and what elastic jobs can lend (they shrink first), victims are taken lowest priority first,
then newest, just enough for it to fit; a last pass drops any victim it can do without (Kueue), and
none at all are taken if all of them together would not be enough. The server asks them to stop as
Ctrl-C would and requeues them; they resume from their latest committed checkpoint.

Its bounds are time-based: :meth:`Preemption.next_change` says when a job that may not be preempted
yet could be, so the server decides again then, with no other event (an urgent job preempts within
the exemption, not at the next submission)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from trainforge.server.scheduling.policy import Policy
from trainforge.server.scheduling.resources import Resources, add, lacking

if TYPE_CHECKING:
    from trainforge.server.scheduling.rule import JobRequest
    from trainforge.server.scheduling.sharing import RunningJob, Team



class Preemption(Policy):
    """``exempt_s``: a job runs at least this long before it may be preempted; ``cooldown_s``: and is
    preempted at most once in this long."""

    name = "preemption"

    def __init__(self, exempt_s: float = 60.0, cooldown_s: float = 600.0):
        for field, value in (("exempt_s", exempt_s), ("cooldown_s", cooldown_s)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"Preemption.{field}={value!r}: give a number of seconds >= 0")
        self.exempt_s = float(exempt_s)
        self.cooldown_s = float(cooldown_s)

    def victims(self, job: JobRequest, free: Resources, running: Sequence[RunningJob], team: Team) -> list[int]:
        if not any(r.preemptible for r in running):
            return []
        return victims(job, free, running, self.exempt_s, self.cooldown_s)

    def next_change(self, blocked: JobRequest | None, running: Sequence[RunningJob], now: float) -> float | None:
        """When the first running job that could be preempted for ``blocked`` but is still within its
        exemption or cooldown leaves it (None: no job waits, or none could ever be a victim)."""
        if blocked is None:
            return None
        waits = [max(self.exempt_s - r.run_s,
                     0.0 if r.since_preempted_s is None else self.cooldown_s - r.since_preempted_s)
                 for r in running if r.preemptible and not r.stopping and r.priority < blocked.priority]  # fmt: skip
        later = [w for w in waits if w > 0]
        return now + min(later) if later else None

    def describe(self) -> str:
        return (f"a higher-priority job preempts preemptible ones that ran {self.exempt_s:g} s or more, "
                f"each at most once per {self.cooldown_s:g} s")  # fmt: skip


def victims(job: JobRequest, free: Resources, running: Sequence[RunningJob], exempt_s: float,
            cooldown_s: float) -> list[int]:  # fmt: skip
    """The running jobs to preempt so that ``job`` (the first waiting job that lacks resources) fits
    (see the module docstring), or none: when it fits in what is ``free`` plus what stopping jobs give
    back (it waits for that), or when elastic jobs can lend it what it lacks (they shrink first), or
    when all the jobs it may preempt would not be enough."""
    need = job.min_request
    coming = dict(free)
    for r in running:
        if r.stopping:
            add(coming, r.grant)
    if not lacking(need, coming):
        return []
    lent = dict(coming)
    for r in running:
        if not r.stopping:
            add(lent, r.lendable)
    if not lacking(need, lent):
        return []
    short = set(lacking(need, coming))
    candidates = sorted(
        (r for r in running if r.preemptible and not r.stopping and r.priority < job.priority
         and r.run_s >= exempt_s and (r.since_preempted_s is None or r.since_preempted_s >= cooldown_s)
         and any(r.grant.get(k, 0.0) > 0 for k in short)),
        key=lambda r: (r.priority, r.run_s, -r.job_id),
    )  # fmt: skip
    chosen: list[RunningJob] = []
    pool = dict(coming)
    for r in candidates:
        chosen.append(r)
        add(pool, r.grant)
        if not lacking(need, pool):
            break
    else:
        return []
    for r in reversed(chosen[:-1]):  # the last pass: drop any victim it can do without
        add(pool, r.grant, -1.0)
        if lacking(need, pool):
            add(pool, r.grant)
        else:
            chosen.remove(r)
    return sorted(r.job_id for r in chosen)
