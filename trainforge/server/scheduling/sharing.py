"""The rules a shared server adds to the scheduler (:mod:`trainforge.server.scheduling.rule`, rules 6-8),
as pure functions of their inputs: :class:`Team` (each user's decayed usage, share and quota; the
preemption bounds) and :class:`RunningJob` (who holds what, and whether it may be preempted), the
fair-share order (:func:`fair_order`) and the choice of preemption victims (:func:`victims`).

Fair share is Slurm's classic factor F = 2^(-U/S) (``doc/html/classic_fair_share.shtml``): U is a
user's usage as a fraction of everyone's, S their share as a fraction of the users'; F is 1 for a
user who has used nothing, 0.5 for one who used exactly their share; as in Slurm, the order is worked
out again at every decision, from the usage as it is then (running jobs count as they run), so a user
below their share comes first until they are not. Usage is measured as the
dominant share (the largest fraction of any one kind of the capacity a user's jobs held, as in DRF)
integrated over time and halving every half-life; the service keeps it
(:mod:`trainforge.server.scheduling.accounting`).

Preemption follows Slurm's and Kueue's bounds: only ``preemptible`` jobs, only for a job of higher
priority (never for fair share), only after ``exempt_s`` of running (Slurm's PreemptExemptTime) and
at most once per ``cooldown_s``; victims lowest priority first, then newest; a last pass drops any
victim the waiting job can do without (Kueue), so no more are preempted than it needs.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainforge.server.scheduling.rule import JobRequest

Resources = Mapping[str, float]
_EPS = 1e-9


@dataclasses.dataclass(frozen=True)
class RunningJob:
    """A running job as the rules of a shared server see it: what it holds, whose it is, and whether
    (and since when) it may be preempted. ``stopping``: asked to stop (or preempted), so its grant
    comes free once it has; ``lendable``: what an elastic job holds above its minimum."""

    job_id: int
    grant: Resources
    user: str = ""
    priority: int = 0
    preemptible: bool = False
    run_s: float = 0.0  # since its latest start
    since_preempted_s: float | None = None  # since it was last asked to give its resources back
    stopping: bool = False
    lendable: Resources = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Team:
    """The inputs of rules 6-8: ``usage`` (each user's decayed usage, any unit: only the fractions
    count), ``shares`` (a user's weight; 1 when absent), ``quotas`` (a user's limit on what their
    jobs hold at once, by kind), and the preemption bounds ``exempt_s`` (a job runs at least this
    long before it may be preempted) and ``cooldown_s`` (and is preempted at most once in this long).
    ``fair_share`` and ``preemption`` turn rules 7 and 8 off.

    Example::

        Team(usage={"ann": 120.0, "bob": 0.0}, shares={"ann": 2}, quotas={"bob": {"GPU": 1}}, exempt_s=60)
    """

    usage: Mapping[str, float] = dataclasses.field(default_factory=dict)
    shares: Mapping[str, float] = dataclasses.field(default_factory=dict)
    quotas: Mapping[str, Resources] = dataclasses.field(default_factory=dict)
    exempt_s: float = 0.0
    cooldown_s: float = 0.0
    fair_share: bool = True
    preemption: bool = True

    def __post_init__(self) -> None:
        for field in ("usage", "shares"):
            for user, value in getattr(self, field).items():
                if not (math.isfinite(value) and (value > 0 if field == "shares" else value >= 0)):
                    raise ValueError(f"Team.{field}[{user!r}]={value!r}: must be a finite number "
                                     f"{'> 0' if field == 'shares' else '>= 0'}.")  # fmt: skip
        for user, quota in self.quotas.items():
            for kind, amount in quota.items():
                if not (math.isfinite(amount) and amount >= 0):
                    raise ValueError(f"Team.quotas[{user!r}][{kind!r}]={amount!r}: must be a finite number >= 0.")
        for field in ("exempt_s", "cooldown_s"):
            value = getattr(self, field)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"Team.{field}={value!r}: must be a number of seconds >= 0.")

    def factors(self, users: Iterable[str]) -> dict[str, float]:
        """Each user's fair-share factor F = 2^(-U/S) (1: has used nothing; 0.5: used exactly their
        share; towards 0: used far more)."""
        return {u: 2.0**-r for u, r in usage_ratios(self, set(users)).items()}


def _lacking(request: Resources, free: Resources) -> dict[str, float]:
    return {k: v for k, v in request.items() if v > free.get(k, 0.0) + _EPS}


def add(into: dict[str, float], amounts: Resources, sign: float = 1.0) -> None:
    """``into += sign * amounts``, by kind."""
    for k, v in amounts.items():
        into[k] = into.get(k, 0.0) + sign * v


def dominant_share(amounts: Resources, capacity: Resources) -> float:
    """The largest fraction of any one kind of ``capacity`` that ``amounts`` takes (as in DRF)."""
    return max((v / capacity[k] for k, v in amounts.items() if capacity.get(k, 0.0) > 0), default=0.0)


def usage_ratios(team: Team, users: set[str]) -> dict[str, float]:
    """U/S of each of ``users``: their usage as a fraction of everyone's, over their share as a
    fraction of the users' (sums taken exactly, so the answer does not depend on dict order)."""
    everyone = users | set(team.usage)
    total_usage = math.fsum(team.usage.values())
    total_share = math.fsum(team.shares.get(u, 1.0) for u in everyone)
    out = {}
    for u in users:
        used = team.usage.get(u, 0.0) / total_usage if total_usage > 0 else 0.0
        out[u] = used * total_share / team.shares.get(u, 1.0)
    return out


def fair_order(ordered: list[JobRequest], team: Team, capacity: Resources) -> list[JobRequest]:
    """``ordered`` (by priority, then submission) reordered within each priority by U/S (the order of
    F = 2^(-U/S), best first). Users whose U/S tie (a fresh server: nobody has used anything yet)
    take turns, one job each, in submission order. ``capacity``: what the usage fractions are of
    (kept for the callers' symmetry with :func:`dominant_share`)."""
    users = set(map(operator.attrgetter("user"), ordered))
    if len(users) < 2:
        return ordered  # one user: fair share orders nothing
    ratio = usage_ratios(team, users)
    if len(set(ratio.values())) == len(ratio):
        # No two users tie: a stable sort of each priority's run by U/S keeps each user's jobs in
        # submission order (a float key: CPython compares those fastest).
        out: list[JobRequest] = []
        for _, run in itertools.groupby(ordered, key=operator.attrgetter("priority")):
            out.extend(sorted(run, key=lambda job: ratio[job.user]))
        return out
    rank: dict[tuple[str, int], int] = {}
    keyed = []
    for job in ordered:
        at = (job.user, job.priority)
        k = rank.get(at, 0)
        keyed.append((-job.priority, ratio[job.user], k, job.seq, job))
        if not job.held:
            rank[at] = k + 1
    keyed.sort(key=operator.itemgetter(0, 1, 2, 3))
    return [entry[4] for entry in keyed]


def victims(job: JobRequest, free: Resources, running: Sequence[RunningJob], team: Team) -> list[int]:
    """The running jobs to preempt so that ``job`` (the first waiting job that lacks resources) fits
    (see the module docstring), or none: when it fits in what is ``free`` plus what stopping jobs give
    back (it waits for that), or when elastic jobs can lend it what it lacks (they shrink first), or
    when all the jobs it may preempt would not be enough."""
    need = job.min_request
    coming = dict(free)
    for r in running:
        if r.stopping:
            add(coming, r.grant)
    if not _lacking(need, coming):
        return []
    lent = dict(coming)
    for r in running:
        if not r.stopping:
            add(lent, r.lendable)
    if not _lacking(need, lent):
        return []
    lacking = set(_lacking(need, coming))
    candidates = sorted(
        (r for r in running if r.preemptible and not r.stopping and r.priority < job.priority
         and r.run_s >= team.exempt_s and (r.since_preempted_s is None or r.since_preempted_s >= team.cooldown_s)
         and any(r.grant.get(k, 0.0) > 0 for k in lacking)),
        key=lambda r: (r.priority, r.run_s, -r.job_id),
    )  # fmt: skip
    chosen: list[RunningJob] = []
    pool = dict(coming)
    for r in candidates:
        chosen.append(r)
        add(pool, r.grant)
        if not _lacking(need, pool):
            break
    else:
        return []
    for r in reversed(chosen[:-1]):  # the last pass: drop any victim it can do without
        add(pool, r.grant, -1.0)
        if _lacking(need, pool):
            add(pool, r.grant)
        else:
            chosen.remove(r)
    return sorted(r.job_id for r in chosen)
