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

With a :class:`Team` (a server shared by several users; the service passes it) and its scheduling
policies (:mod:`trainforge.server.scheduling.policy`: each rule below is one plug-in of
:mod:`trainforge.server.scheduling.policies`; rule 1 is ``priority``), more rules:

6. **Quotas** (``quota``). A user's jobs never hold more than their quota (``Team.quotas``: CPUs, GPUs, memory,
   any kind) at once: a job that would take its user over waits with reason ``quota`` and reserves
   nothing (a quota never holds back another user's job, and never preempts).
7. **Fair share** (``fair_share``). Among jobs of equal priority, users are ordered by Slurm's classic fair-share
   factor F = 2^(-U/S): U is the user's decayed usage as a fraction of everyone's (the service keeps
   it, running jobs included, halving every half-life), S their share as a fraction of the users'.
   A user who used less than their share comes first, so a user with one job is not stuck behind
   another's hundred; over time each user's usage converges to their share. Users who tie (nobody
   has used anything yet) take turns, one job each; then submission order.
8. **Preemption** (``preemption``). When the blocked job (rule 5) cannot start from what is free, what stopping jobs
   will give back and what elastic jobs can lend (they shrink first), running ``preemptible`` jobs
   of *lower* priority that have run at least ``exempt_s`` and were not preempted in the last
   ``cooldown_s`` are named in :attr:`Decision.preempt`: lowest priority first, then newest, just
   enough for it to fit (a last pass drops any victim it could do without), or none at all if all of
   them together would not be enough. The server asks them to stop as Ctrl-C would and requeues them;
   they resume from their latest committed checkpoint.
9. **Any other policy** the server is configured with (``max_running:N``: a user runs at most N
   jobs at once) admits jobs as quotas do: a job it refuses waits with its reason and reserves
   nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from trainforge._internal.resources import MIN_CPU_PER_WORKER, charge
from trainforge._internal.trainer_job import num_workers_of
from trainforge.server.scheduling.decision import Decision, Start
from trainforge.server.scheduling.policies import from_team
from trainforge.server.scheduling.policy import PolicySet
from trainforge.server.scheduling.resources import EPS, Resources, add, amount_text, free_resources, lacking
from trainforge.server.scheduling.scan import Scan, Tail
from trainforge.server.scheduling.sharing import RunningJob, Team
from trainforge.server.scheduling.waiting import WaitingQueue


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


def check_fits(job: JobRequest, capacity: Resources, quota: Resources | None = None) -> None:
    """Raise ValueError, with the numbers, if ``job`` could not start even on an idle ``capacity``
    (or, given its user's ``quota``, even when its user holds nothing else)."""
    request = job.request(job.min_workers)
    who = f"job {job.job_id}" if job.job_id else "the job"  # job id 0: a request checked before it has one
    short = lacking(request, capacity)
    if short:
        parts = ", ".join(
            f"{amount_text(v)} {k} (capacity {amount_text(capacity.get(k, 0.0))})" for k, v in sorted(short.items())
        )
        raise ValueError(
            f"{who} asks for {parts} with {job.min_workers} worker(s) and its driver{_floor_note(job, short)}, more "
            "than the server has even when idle: ask for fewer workers or resources per worker, or start the server "
            "with more capacity (--capacity)."
        )
    over = lacking({k: v for k, v in request.items() if quota and k in quota}, quota or {})
    if over:
        parts = ", ".join(f"{amount_text(v)} {k} (quota {amount_text((quota or {})[k])})" for k, v in sorted(over.items()))
        raise ValueError(
            f"{who} asks for {parts} with {job.min_workers} worker(s) and its driver{_floor_note(job, over)}, more "
            "than its user's quota "
            f"{job.user!r} allows even with nothing else running: ask for less, or ask an admin to raise the quota "
            "(`trainforge server users set NAME --quota ...`)."
        )


def _floor_note(job: JobRequest, short: Mapping[str, float]) -> str:
    """Why a request names CPUs its user may not have asked for (rule 0), when that is why it is refused."""
    if "CPU" in short and job.per_worker.get("CPU", 0.0) <= MIN_CPU_PER_WORKER + EPS:
        return f" (each worker counts at least {amount_text(MIN_CPU_PER_WORKER)} CPU)"
    return ""


def order(queue: Iterable[JobRequest] | WaitingQueue, policies: PolicySet | None = None,
          team: Team | None = None) -> list[JobRequest]:  # fmt: skip
    """Rule 1 (priority, then submission order; submission only without the ``priority`` policy),
    then each ordering policy in turn (fair share, rule 7) with ``team``'s inputs. A
    :class:`WaitingQueue` keeps rule 1's order, and each priority's jobs by user (fair share's
    groups). Any other queue is sorted here: two stable sorts on plain attributes (submission, then
    priority: the fastest way to sort by both), and no key cached on the job (each attribute more
    makes every job's dict, and the sorts, slower). A new list: the queue changes after the decision."""
    kept = isinstance(queue, WaitingQueue)
    if kept:
        assert isinstance(queue, WaitingQueue)
        ordered = queue.ordered
    else:
        ordered = sorted(sorted(queue, key=operator.attrgetter("seq")), key=operator.attrgetter("priority"), reverse=True)
    if policies is not None and "priority" not in policies:
        ordered, kept = sorted(ordered, key=operator.attrgetter("seq")), False
    if policies is not None and policies.orderers:
        inputs = team if team is not None else Team()
        for policy in policies.orderers:
            before = ordered
            ordered = policy.order(ordered, inputs, queue if kept else None)  # type: ignore[arg-type]
            kept = kept and ordered is before
    return list(ordered) if isinstance(queue, WaitingQueue) and ordered is queue.ordered else ordered


def decide(queue: Sequence[JobRequest] | WaitingQueue, running: Sequence[Resources | RunningJob],
           capacity: Resources, team: Team | None = None, policies: PolicySet | None = None) -> Decision:  # fmt: skip
    """Which of ``queue`` start now, given the ``running`` jobs (their grants, or :class:`RunningJob`
    with who holds them) and the ``capacity``; the others with their reasons, in queue order. With a
    ``team``, its ``policies`` too (quotas, fair share, preemption, ...: see the module docstring;
    without ``policies``, those the team stands for, :func:`trainforge.server.scheduling.policies.from_team`).
    A :class:`WaitingQueue` (what the server keeps) spares the sort and the grouping of its jobs."""
    if policies is None and team is not None:
        policies = from_team(team)
    grants = [r.grant if isinstance(r, RunningJob) else r for r in running]
    held: dict[str, dict[str, float]] = {}
    counts: dict[str, int] = {}
    if policies is not None and policies.admitters:
        for r in running:
            if isinstance(r, RunningJob):
                add(held.setdefault(r.user, {}), r.grant)
                counts[r.user] = counts.get(r.user, 0) + 1
    ordered = order(queue, policies, team)
    shapes, asks_nothing = (queue.shapes, queue.asks_nothing) if isinstance(queue, WaitingQueue) else (None, None)
    scan = Scan(ordered, free_resources(capacity, grants), policies, team, held, counts, shapes, asks_nothing)
    resume = scan.run(0, stop_when_saturated=True)
    if resume < len(ordered) and scan.asks_nothing and scan.admits:
        # A job asking for nothing starts past the saturation point, and a policy that counts jobs
        # (max_running) would see it: walk on (only jobs built by hand ask for nothing).
        resume = scan.run(resume, stop_when_saturated=False)
    if resume >= len(ordered):
        return Decision(scan.starts, scan.pending, reserved=set(scan.reserved), blocked=scan.blocked,
                        preempt=_preempt(scan, scan.blocked, running, policies))  # fmt: skip
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
    tail = Tail(scan, resume, len(starts) > len(scan.starts))
    return Decision(starts, list(scan.pending), tail, reserved=set(scan.reserved), blocked=blocked,
                    preempt=_preempt(scan, blocked, running, policies))  # fmt: skip


def _preempt(scan: Scan, blocked: int | None, running: Sequence[Resources | RunningJob],
             policies: PolicySet | None) -> list[int]:  # fmt: skip
    if policies is None or not policies.preempters or blocked is None:
        return []
    jobs = [r for r in running if isinstance(r, RunningJob)]
    job = next(j for j in scan.ordered if j.job_id == blocked)
    for policy in policies.preempters:
        chosen = policy.victims(job, scan.free, jobs, scan.team)
        if chosen:
            return chosen
    return []
