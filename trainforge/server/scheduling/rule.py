"""The train server's scheduling rule, as a pure function: which queued jobs start now, and why the
others wait.

:func:`decide` is called on every event that can change the answer (a submission, a job's end, a
stop, a priority change, a hold or release, a capacity change); it reads nothing but its arguments
and returns the same answer for the same arguments, so the server never polls and the rule is
tested on its own (``tests/test_server_scheduler.py``). The server passes the waiting jobs as the
:class:`WaitingQueue` it keeps in order as they come and go, and reads the reasons of the page it
shows (:class:`~trainforge.server.scheduling.decision.Decision`): with 10,000 waiting jobs a decision walks
only as far as a job could still start.

The rule:

0. **Charge.** Every worker is charged what it asks for, with at least
   :data:`~trainforge._internal.resources.MIN_CPU_PER_WORKER` (0.1) CPUs, as a small Kubernetes
   CPU request (:meth:`JobRequest.from_spec`): a job of 8 workers asking for no CPU is charged 0.8
   CPU, against capacity, quotas and fair-share usage alike, so zero-CPU workers cannot start
   without bound. The job's spec keeps what it asked for; its grant is what it is charged.
1. **Order.** Queued jobs are taken by priority (higher first), then by submission sequence.
   Held jobs are skipped (they wait with reason ``held`` and reserve nothing).
2. **Gang.** A job starts only when its whole request fits in what is free: its driver plus
   ``min_workers`` workers (``per_worker`` each). An elastic job (``max_workers > min_workers``)
   starts with as many workers up to ``max_workers`` as fit. Nothing is ever half-started, so two
   jobs can never deadlock each other.
3. **Reservation, then backfill.** A job that does not fit *reserves the resource kinds it lacks*
   (the kinds whose free amount is below its request). A later job may start ahead of it only if
   it needs none of the reserved kinds: a CPU-only job passes a job waiting for GPUs, but no job
   takes CPUs that an earlier job is waiting for. Every waiting job reserves, not just the first,
   so a big job is never starved by a stream of small ones: what it lacks can only be taken by
   jobs ahead of it, and those end.
4. **Never fits.** A request larger than the whole capacity can never start: :func:`check_fits`
   rejects it at submission, naming the numbers (a job already queued when capacity shrank below
   its request waits with reason ``resources``, and reserves, until capacity returns).
5. **Lending (elastic jobs).** The workers an elastic job runs above its ``min_workers`` are lent.
   When the first waiting job that is not held (:attr:`Decision.blocked`) lacks resources that such
   extras hold, the lending jobs, lowest priority first, then newest first, are asked to shrink,
   never below their minimum, just enough for it to fit (or not at all, if all their extras
   together would not be enough). A job shrinks at its next committed checkpoint, so no work is
   lost (one that never checkpoints gives nothing back until it ends); what it gives back goes to
   the waiting job. A running elastic job grows only into resources that no waiting job lacks, so
   grow and shrink never ping-pong. The server does both (:mod:`trainforge.server.jobs.elastic`);
   this function only names the blocked job.

With a :class:`Team` (a server shared by several users; the service passes it), three more rules:

6. **Quotas.** A user's jobs never hold more than their quota (``Team.quotas``: CPUs, GPUs, memory,
   any kind) at once: a job that would take its user over waits with reason ``quota`` and reserves
   nothing (a quota never holds back another user's job, and never preempts).
7. **Fair share.** Among jobs of equal priority, users are ordered by Slurm's classic fair-share
   factor F = 2^(-U/S): U is the user's decayed usage as a fraction of everyone's (the service keeps
   it, running jobs included, halving every half-life), S their share as a fraction of the users'.
   A user who used less than their share comes first, so a user with one job is not stuck behind
   another's hundred; over time each user's usage converges to their share. Users who tie (nobody
   has used anything yet) take turns, one job each; then submission order.
8. **Preemption.** When the blocked job (rule 5) cannot start from what is free, what stopping jobs
   will give back and what elastic jobs can lend (they shrink first), running ``preemptible`` jobs
   of *lower* priority that have run at least ``exempt_s`` and were not preempted in the last
   ``cooldown_s`` are named in :attr:`Decision.preempt`: lowest priority first, then newest, just
   enough for it to fit (a last pass drops any victim it could do without), or none at all if all of
   them together would not be enough. The server asks them to stop as Ctrl-C would and requeues them;
   they resume from their latest committed checkpoint.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from trainforge._internal.amounts import fmt_number
from trainforge._internal.resources import MIN_CPU_PER_WORKER, charge
from trainforge._internal.trainer_job import num_workers_of
from trainforge.server.scheduling.decision import Decision, Pending, Start, _Tail
from trainforge.server.scheduling.sharing import RunningJob, Team, add, fair_order, usage_ratios, victims
from trainforge.server.scheduling.waiting import WaitingQueue

Resources = Mapping[str, float]
"""Amounts by resource kind: ``{"CPU": 4, "GPU": 1, "memory": 8e9, "my_custom": 2}``."""

_EPS = 1e-9


@dataclasses.dataclass(frozen=True)
class JobRequest:
    """What a queued job is charged (:meth:`from_spec`: what its ``ScalingConfig`` or spec asks for,
    each worker with at least ``MIN_CPU_PER_WORKER`` CPUs)."""

    job_id: int
    seq: int  # submission order, unique
    per_worker: Resources
    min_workers: int = 1
    max_workers: int | None = None  # None: min_workers (not elastic)
    driver: Resources = dataclasses.field(default_factory=dict)
    priority: int = 0
    held: bool = False
    user: str = ""  # who owns it (fair share, quotas)

    def __post_init__(self) -> None:
        if self.min_workers < 1:
            raise ValueError(f"JobRequest.min_workers={self.min_workers!r}: must be at least 1.")
        if self.max_workers is not None and self.max_workers < self.min_workers:
            raise ValueError(
                f"JobRequest.max_workers={self.max_workers!r}: must be at least min_workers={self.min_workers}."
            )
        for field in ("per_worker", "driver"):
            for kind, amount in getattr(self, field).items():
                if not (isinstance(amount, (int, float)) and math.isfinite(amount) and amount >= 0):
                    raise ValueError(
                        f"JobRequest.{field}[{kind!r}]={amount!r}: must be a finite number >= 0."
                    )

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any], job_id: int = 0, *, priority: int = 0, held: bool = False,
                  user: str = "") -> JobRequest:  # fmt: skip
        """What a job spec (as the server stores it) is charged (``job_id`` 0: a request checked
        before the job has an id): each worker what it asks for, with at least
        :data:`~trainforge._internal.resources.MIN_CPU_PER_WORKER` CPUs (rule 0). The one place a
        spec becomes a request: submission checks, the queue, grants, grant files, elastic sizes,
        quotas and usage all count this, while the spec keeps what was asked."""
        return cls(
            job_id=job_id,
            seq=job_id,
            per_worker=charge(spec.get("per_worker", {})),
            min_workers=num_workers_of(spec),  # the user's num_workers (an older server's spec: min_workers)
            max_workers=spec.get("max_workers"),
            driver=spec.get("driver", {}),
            priority=priority,
            held=held,
            user=user,
        )

    @property
    def upper_workers(self) -> int:
        return self.min_workers if self.max_workers is None else self.max_workers

    @functools.cached_property
    def min_request(self) -> dict[str, float]:
        """``request(min_workers)``, computed once (the server keeps a job's request while it waits)."""
        return self.request(self.min_workers)

    @functools.cached_property
    def kinds(self) -> frozenset[str]:
        """The kinds its minimum request asks for (in amounts above zero)."""
        return frozenset(self.min_request)

    def request(self, workers: int) -> dict[str, float]:
        """Driver plus ``workers`` workers, by kind (kinds asked for in zero amounts are left out)."""
        kinds = sorted(set(self.per_worker) | set(self.driver))
        total = {k: self.driver.get(k, 0.0) + workers * self.per_worker.get(k, 0.0) for k in kinds}
        return {k: v for k, v in total.items() if v > 0}


def free_resources(capacity: Resources, grants: Iterable[Resources]) -> dict[str, float]:
    """What ``capacity`` has left after ``grants`` (kinds absent from capacity have none)."""
    free = {k: float(v) for k, v in capacity.items()}
    for grant in grants:
        for k, v in grant.items():
            free[k] = free.get(k, 0.0) - v
    return free


def _lacking(request: Resources, free: Resources) -> dict[str, float]:
    return {k: v for k, v in request.items() if v > free.get(k, 0.0) + _EPS}


def check_fits(job: JobRequest, capacity: Resources, quota: Resources | None = None) -> None:
    """Raise ValueError, with the numbers, if ``job`` could not start even on an idle ``capacity``
    (or, given its user's ``quota``, even when its user holds nothing else)."""
    request = job.request(job.min_workers)
    who = f"job {job.job_id}" if job.job_id else "the job"  # job id 0: a request checked before it has one
    lacking = _lacking(request, capacity)
    if lacking:
        parts = ", ".join(
            f"{fmt_number(v)} {k} (capacity {fmt_number(capacity.get(k, 0.0))})" for k, v in sorted(lacking.items())
        )
        raise ValueError(
            f"{who} asks for {parts} with {job.min_workers} worker(s) and its driver{_floor_note(job, lacking)}, more "
            "than the server has even when idle: ask for fewer workers or resources per worker, or start the server "
            "with more capacity (--capacity)."
        )
    over = _lacking({k: v for k, v in request.items() if quota and k in quota}, quota or {})
    if over:
        parts = ", ".join(f"{fmt_number(v)} {k} (quota {fmt_number((quota or {})[k])})" for k, v in sorted(over.items()))
        raise ValueError(
            f"{who} asks for {parts} with {job.min_workers} worker(s) and its driver{_floor_note(job, over)}, more "
            "than its user's quota "
            f"{job.user!r} allows even with nothing else running: ask for less, or ask an admin to raise the quota "
            "(`trainforge server users set NAME --quota ...`)."
        )


def _floor_note(job: JobRequest, lacking: Mapping[str, float]) -> str:
    """Why a request names CPUs its user may not have asked for (rule 0), when that is why it is refused."""
    if "CPU" in lacking and job.per_worker.get("CPU", 0.0) <= MIN_CPU_PER_WORKER + _EPS:
        return f" (each worker counts at least {fmt_number(MIN_CPU_PER_WORKER)} CPU)"
    return ""


class _Scan:
    """The rule's walk down the ordered queue (see the module docstring), resumable: ``run(i)``
    handles jobs from index ``i`` until the end, or, with ``stop_when_saturated``, until no later
    job can start; ``run`` then returns the index to resume from. ``quotas``/``held``: each user's
    quota and what their jobs hold (rule 6; empty: no quotas). ``shapes``: the distinct sets of kinds
    the jobs not held ask for, and ``asks_nothing``: whether one of them asks for nothing (worked out
    from ``ordered`` when not given: a :class:`WaitingQueue` keeps them)."""

    def __init__(self, ordered: list[JobRequest], free: dict[str, float],
                 quotas: Mapping[str, Resources] | None = None, held: dict[str, dict[str, float]] | None = None,
                 shapes: set[frozenset[str]] | None = None, asks_nothing: bool | None = None):  # fmt: skip
        self.ordered = ordered
        self.free = free
        self.quotas = quotas or {}
        self.held = held if held is not None else {}
        self.reserved: dict[str, tuple[int, int]] = {}  # kind -> (position, job id) of the first lacking it
        self.position = 0
        self.starts: list[Start] = []
        self.pending: list[Pending] = []
        self.blocked: int | None = None  # the first job that lacks resources
        # Once each shape has a kind that is reserved or has nothing free, no later job can start
        # (free only shrinks and reservations only grow).
        if shapes is None or asks_nothing is None:
            kinds = {job.kinds for job in ordered if not job.held}
            shapes, asks_nothing = kinds - {frozenset()}, frozenset() in kinds
        self.shapes = shapes
        self.asks_nothing = asks_nothing

    def over_quota(self, job: JobRequest, request: Resources, position: int | None = None) -> Pending | None:
        """Why ``job`` waits for its user's quota (rule 6), or None (no quota, or within it)."""
        limit = self.quotas.get(job.user)
        if limit is None:
            return None
        held = self.held.get(job.user, {})
        over = [k for k, v in request.items() if k in limit and held.get(k, 0.0) + v > limit[k] + _EPS]
        if not over:
            return None
        return Pending(job.job_id, position, "quota", need={k: request[k] for k in over},
                       free={k: max(0.0, limit[k] - held.get(k, 0.0)) for k in over},
                       limit={k: float(limit[k]) for k in over})  # fmt: skip

    def judge(self, job: JobRequest, position: int, reserved: Mapping[str, tuple[int, int]]) -> Pending | None:
        """Why ``job`` (not held) waits, at ``position``, with ``reserved`` as the jobs before it left
        it; None: it can start (read-only)."""
        request = job.min_request
        if self.quotas and (over := self.over_quota(job, request, position)) is not None:
            return over
        free = self.free
        lacking = [k for k, v in request.items() if v > free.get(k, 0.0) + _EPS]
        if lacking:
            return Pending(job.job_id, position, "resources", need={k: request[k] for k in lacking},
                           free={k: max(0.0, free.get(k, 0.0)) for k in lacking})  # fmt: skip
        blocked_by = min((reserved[k] for k in request if k in reserved), default=None)
        if blocked_by is not None:
            return Pending(job.job_id, position, "reserved", behind=blocked_by[1])
        return None

    def first_lacking(self, i: int) -> int | None:
        """The first job from index ``i`` on that is not held, is within its quota and lacks
        resources (read-only)."""
        for job in self.ordered[i:]:
            if not job.held and _lacking(job.min_request, self.free):
                if self.quotas and self.over_quota(job, job.min_request) is not None:
                    continue
                return job.job_id
        return None

    def saturated(self) -> bool:
        free, reserved = self.free, self.reserved
        return all(any(k in reserved or free.get(k, 0.0) <= _EPS for k in shape) for shape in self.shapes)

    def run(self, i: int, *, stop_when_saturated: bool) -> int:
        ordered, free, reserved, quotas = self.ordered, self.free, self.reserved, self.quotas
        n = len(ordered)
        while i < n:
            job = ordered[i]
            i += 1
            if job.held:
                self.pending.append(Pending(job.job_id, position=None, reason="held"))
                continue
            waits = self.judge(job, self.position + 1, reserved)
            if waits is not None:
                self.position += 1
                self.pending.append(waits)
                if waits.reason == "resources":
                    for k in waits.need:
                        reserved.setdefault(k, (self.position, job.job_id))
                    if self.blocked is None:
                        self.blocked = job.job_id
                    if stop_when_saturated and self.saturated():
                        return i
                continue
            workers = job.min_workers
            while workers < job.upper_workers and not _lacking(job.request(workers + 1), free) and not (
                quotas and self.over_quota(job, job.request(workers + 1))
            ):
                workers += 1
            grant = job.request(workers)
            for k, v in grant.items():
                free[k] = free.get(k, 0.0) - v
            if quotas:
                add(self.held.setdefault(job.user, {}), grant)
            self.starts.append(Start(job.job_id, workers, grant))
            if stop_when_saturated and grant and self.saturated():
                return i
        return n


def _order(queue: Iterable[JobRequest] | WaitingQueue, team: Team | None = None,
           capacity: Resources | None = None) -> list[JobRequest]:  # fmt: skip
    """Rule 1 (priority, then submission order), with rule 7 (fair share) given a ``team``. A
    :class:`WaitingQueue` keeps rule 1's order, and each priority's jobs by user: when no two users
    tie, fair share is each priority's users' jobs one user after the other. Any other queue is
    sorted here: two stable sorts on plain attributes (submission, then priority: the fastest way to
    sort by both), and no key cached on the job (each attribute more makes every job's dict, and the
    sorts, slower)."""
    fair = team is not None and team.fair_share and capacity is not None
    if isinstance(queue, WaitingQueue):
        users = queue.users
        if not fair or len(users) < 2:
            return list(queue.ordered)  # a copy: the queue changes after the decision
        assert team is not None
        ratio = usage_ratios(team, users)
        if len(set(ratio.values())) == len(ratio):
            return [job for _, runs in queue.runs() for user in sorted(runs, key=ratio.__getitem__)
                    for job in runs[user]]  # fmt: skip
        ordered = list(queue.ordered)
    else:
        ordered = sorted(sorted(queue, key=operator.attrgetter("seq")), key=operator.attrgetter("priority"), reverse=True)
    if not fair:
        return ordered
    assert team is not None and capacity is not None
    return fair_order(ordered, team, capacity)


def decide(queue: Sequence[JobRequest] | WaitingQueue, running: Sequence[Resources | RunningJob],
           capacity: Resources, team: Team | None = None) -> Decision:  # fmt: skip
    """Which of ``queue`` start now, given the ``running`` jobs (their grants, or :class:`RunningJob`
    with who holds them) and the ``capacity``; the others with their reasons, in queue order; with a
    ``team``, quotas, fair share and preemption too (see the module docstring for the rules). A
    :class:`WaitingQueue` (what the server keeps) spares the sort and the grouping of its jobs."""
    grants = [r.grant if isinstance(r, RunningJob) else r for r in running]
    held: dict[str, dict[str, float]] = {}
    if team is not None and team.quotas:
        for r in running:
            if isinstance(r, RunningJob):
                add(held.setdefault(r.user, {}), r.grant)
    ordered = _order(queue, team, capacity)
    shapes, asks_nothing = (queue.shapes, queue.asks_nothing) if isinstance(queue, WaitingQueue) else (None, None)
    scan = _Scan(ordered, free_resources(capacity, grants), team.quotas if team is not None else None, held,
                 shapes, asks_nothing)  # fmt: skip
    resume = scan.run(0, stop_when_saturated=True)
    if resume >= len(ordered):
        return Decision(scan.starts, scan.pending, reserved=set(scan.reserved), blocked=scan.blocked,
                        preempt=_preempt(scan, scan.blocked, running, team))  # fmt: skip
    # Saturated: every kind with anything free is reserved, so a later job can start only if it
    # asks for nothing at all. Start those now; the others' reasons are worked out when asked for.
    starts = list(scan.starts)
    if scan.asks_nothing:
        for job in ordered[resume:]:
            if not job.held and not job.min_request:
                starts.append(Start(job.job_id, job.upper_workers, {}))
    # Saturated with nobody lacking yet (the last start took what was left): the next job that asks
    # for anything lacks it, so this walk is short.
    blocked = scan.blocked if scan.blocked is not None else scan.first_lacking(resume)
    tail = _Tail(scan, resume, len(starts) > len(scan.starts))
    return Decision(starts, list(scan.pending), tail, reserved=set(scan.reserved), blocked=blocked,
                    preempt=_preempt(scan, blocked, running, team))  # fmt: skip


def _preempt(scan: _Scan, blocked: int | None, running: Sequence[Resources | RunningJob], team: Team | None) -> list[int]:
    if team is None or not team.preemption or blocked is None:
        return []
    jobs = [r for r in running if isinstance(r, RunningJob)]
    if not any(r.preemptible for r in jobs):
        return []
    job = next(j for j in scan.ordered if j.job_id == blocked)
    return victims(job, scan.free, jobs, team)
