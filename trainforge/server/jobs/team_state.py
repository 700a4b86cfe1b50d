"""``TeamState``: what the job service keeps for the rules of a server shared by a team, and the
service's side of them. It knows, of each running job, whose it is, its priority, whether it may be
preempted, when it started and when it was last preempted (in memory, under the service's lock);
it turns that, the users' usage (:mod:`trainforge.server.scheduling.accounting`), shares and quotas
(:mod:`trainforge.server.team.users`) into the pure scheduler's inputs (:meth:`inputs`), and carries
out a decision's preemptions (:meth:`preempt`): each victim is recorded STOPPING (``preempting``)
and asked to stop as Ctrl-C would, on a thread of its own; once its runner has ended, the service
requeues it (:func:`trainforge.server.jobs.outcome.run_ended`) and it resumes from its latest
committed checkpoint.

It also keeps the operators' counters (submissions and preemptions by user) and the histogram of
the scheduler's decision times, in memory (``/metrics``: :mod:`trainforge.server.routes.operator`).
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from trainforge.client._states import JobEvent, JobState
from trainforge.server.scheduling.accounting import Accounting
from trainforge.server.scheduling.rule import JobRequest, RunningJob, Team
from trainforge.server.scheduling.sharing import add
from trainforge.server.scheduling.team_policy import TeamPolicy
from trainforge.server.store.database import JobRow, JobStore
from trainforge.server.team.users import ADMIN, UserBook

logger = logging.getLogger(__name__)

# Decision-time buckets (seconds): a decision takes about a millisecond with 10,000 queued jobs.
DECISION_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class Histogram:
    """Observations counted into fixed buckets (upper bounds ``buckets``, then +Inf), and their sum."""

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


@dataclasses.dataclass
class Active:
    """A running job, as the rules of a shared server need it."""

    user: str
    priority: int
    preemptible: bool
    started_at: float
    preempted_at: float | None
    stopping: bool = False


class TeamState:
    """See the module docstring. ``grants``: the service's table of what each running job holds
    (read only); ``stop_runner(job_id)`` stops a job's runner (as Ctrl-C, then a kill after the grace
    period) and returns once it is gone."""

    def __init__(self, store: JobStore, capacity: Mapping[str, float], grants: Mapping[int, Mapping[str, float]],
                 policy: TeamPolicy, users: UserBook, stop_runner: Callable[[int], None],
                 lock: threading.RLock | None = None):  # fmt: skip
        self.store = store
        self._grants = grants
        self._lock = lock or threading.RLock()  # the service's: held while the tables change
        self.policy = policy
        self.users = users
        self.accounting = Accounting(store, capacity, policy.half_life_s)
        self.active: dict[int, Active] = {}
        self.preempted_at: dict[int, float] = {}  # job id -> when it was last preempted (within the cooldown)
        self.submissions: collections.Counter[str] = collections.Counter()
        self.preemptions: collections.Counter[str] = collections.Counter()
        self.decisions = Histogram()
        self._stop_runner = stop_runner

    # -- running jobs ---------------------------------------------------------------------------------
    def track(self, job: JobRow, started_at: float | None = None) -> None:
        """``job`` holds resources (starting now, at ``started_at``, or found running at recovery)."""
        self.active[job.id] = Active(job.owner, job.priority, job.preemptible,
                                     started_at or job.started_at or time.time(),
                                     self.preempted_at.get(job.id, job.preempted_at),
                                     stopping=job.state == JobState.STOPPING)  # fmt: skip

    def started(self, request: JobRequest, now: float) -> None:
        """The job of ``request`` starts now (the scheduler's decision: its user's quota counts it
        at once; :meth:`track` adds what its row knows once its runner is being started)."""
        self.active[request.job_id] = Active(request.user, request.priority, False, now,
                                             self.preempted_at.get(request.job_id))  # fmt: skip

    def waiting(self, job: JobRow) -> None:
        """``job`` waits in the queue (found at recovery): when it was last preempted, if it was."""
        if job.preempted_at is not None:
            self.preempted_at[job.id] = job.preempted_at

    def renamed(self, old: str, new: str) -> None:
        """The user ``old`` was removed, their jobs and usage given to ``new`` (a name no user can have:
        :meth:`UserBook.remove`): what their running jobs hold, and their usage, are ``new``'s."""
        for a in self.active.values():
            if a.user == old:
                a.user = new
        self.accounting.rename(old, new)

    def forget(self, job_id: int) -> None:
        self.active.pop(job_id, None)

    def stopping(self, job_id: int) -> None:
        """The job was asked to stop: what it holds comes free once it has (no one is preempted for it)."""
        if job_id in self.active:
            self.active[job_id].stopping = True

    def quota(self, user: str) -> dict[str, float] | None:
        """What ``user``'s jobs may hold at once (None: no limit; the built-in admin has none)."""
        if user == ADMIN:
            return None
        try:
            own = self.users.get(user).quota
        except LookupError:
            own = None
        return own if own is not None else self.policy.default_quota

    def headroom(self, job_id: int) -> dict[str, float] | None:
        """How much more the running job's user may hold under their quota, by kind (None: no limit)."""
        a = self.active.get(job_id)
        quota = self.quota(a.user) if a is not None else None
        if a is None or quota is None:
            return None
        held: dict[str, float] = {}
        for other, b in self.active.items():
            if b.user == a.user:
                add(held, self._grants.get(other, {}))
        return {k: max(0.0, v - held.get(k, 0.0)) for k, v in quota.items()}

    # -- the scheduler's inputs -----------------------------------------------------------------------
    def inputs(self, requests: Iterable[JobRequest], lendable: Mapping[int, Mapping[str, float]],
               now: float) -> tuple[list[RunningJob], Team]:  # fmt: skip
        """The running jobs and the :class:`Team` that :func:`~trainforge.server.scheduling.rule.decide`
        takes, as of ``now`` (``lendable``: what elastic jobs hold above their minimum); charges the
        users' usage up to now."""
        active, grants = self.active, self._grants
        self.settle(now)
        running = []
        for job_id, grant in grants.items():
            a = active.get(job_id)
            if a is None:
                running.append(RunningJob(job_id, grant))
                continue
            running.append(RunningJob(
                job_id, grant, user=a.user, priority=a.priority, preemptible=a.preemptible,
                run_s=max(0.0, now - a.started_at), stopping=a.stopping, lendable=lendable.get(job_id, {}),
                since_preempted_s=None if a.preempted_at is None else max(0.0, now - a.preempted_at),
            ))  # fmt: skip
        quotas = self.users.quotas()
        if self.policy.default_quota is not None:
            users = {r.user for r in requests} | {a.user for a in active.values()}
            for user in users - set(quotas) - {ADMIN}:
                quotas[user] = dict(self.policy.default_quota)
        team = Team(
            usage=self.accounting.usage(now), shares=self.users.shares(), quotas=quotas,
            exempt_s=self.policy.preempt_exempt_s, cooldown_s=self.policy.preempt_cooldown_s,
            fair_share=self.policy.fair_share, preemption=self.policy.preemption,
        )  # fmt: skip
        return running, team

    def settle(self, now: float) -> None:
        """Charge the users' usage for what their jobs held up to ``now``, and from now on for what
        they hold now (called before each decision, and after it: what started or grew is charged
        from its start, not from the next decision)."""
        active, grants = self.active, self._grants
        for job_id in [j for j in active if j not in grants]:
            del active[job_id]  # its start failed (its files were incomplete): it holds nothing
        self.accounting.sync({j: (active[j].user, g) for j, g in grants.items() if j in active}, now)

    # -- for people and operators ---------------------------------------------------------------------
    def holdings(self) -> dict[str, dict[str, float]]:
        """What each user's running jobs hold, by kind."""
        with self._lock:
            out: dict[str, dict[str, float]] = {}
            for job_id, grant in self._grants.items():
                a = self.active.get(job_id)
                add(out.setdefault(a.user if a is not None else ADMIN, {}), grant)
            return out

    def report(self, now: float) -> list[dict[str, Any]]:
        """Per user (those with users' rows, usage or running jobs): shares, usage, its fraction of
        everyone's, the share's fraction, the fair-share factor, holdings and quota."""
        with self._lock:
            usage = self.accounting.usage(now)
            holds = self.holdings()
        shares = {u.name: u.shares for u in self.users.list()}
        names = sorted(set(shares) | set(usage) | set(holds) | {ADMIN})
        team = Team(usage=usage, shares=shares)
        factors = team.factors(names)
        total_usage = math.fsum(usage.values())
        total_share = math.fsum(shares.get(n, 1.0) for n in names)
        return [{"user": n, "shares": shares.get(n, 1.0), "usage": usage.get(n, 0.0),
                 "usage_fraction": usage.get(n, 0.0) / total_usage if total_usage > 0 else 0.0,
                 "share_fraction": shares.get(n, 1.0) / total_share, "factor": factors[n],
                 "holds": holds.get(n, {}), "quota": self.quota(n)} for n in names]  # fmt: skip

    # -- preemption -----------------------------------------------------------------------------------
    def preempt(self, victims: Iterable[int], for_job: int | None, now: float) -> None:
        """Ask each of ``victims`` to give its resources back to ``for_job``: recorded STOPPING with a
        ``preempting`` event first (a server killed now finds it stopping, and finishes stopping it),
        then stopped as Ctrl-C would, on a thread of its own (the caller holds the service's lock)."""
        for job_id in [j for j, t in self.preempted_at.items() if now - t > self.policy.preempt_cooldown_s]:
            del self.preempted_at[job_id]  # past the cooldown: may be preempted again, as if never
        for job_id in victims:
            a = self.active.get(job_id)
            if a is None or a.stopping:
                continue
            job = self.store.get(job_id)
            if job is None or job.state != JobState.RUNNING:
                continue  # still starting: its runner cannot take Ctrl-C yet; the next decision sees it
            a.stopping, a.preempted_at = True, now
            self.preempted_at[job_id] = now
            self.store.update(
                job_id, JobEvent.PREEMPTING, {"for_job": for_job, "priority": job.priority, "preemptions": job.preemptions + 1},
                state=JobState.STOPPING, preempted_at=now, preemptions=job.preemptions + 1,
            )  # fmt: skip
            self.preemptions[job.owner] += 1
            logger.info("preempting job %s (%s, priority %s) for job %s", job_id, job.owner, job.priority, for_job)
            threading.Thread(target=self._stop, args=(job_id,), daemon=True, name=f"tf-job{job_id}-preempt").start()

    def _stop(self, job_id: int) -> None:
        try:
            self._stop_runner(job_id)
        except Exception:  # noqa: BLE001 - a thread of its own: say what failed, the server goes on
            logger.exception("preempting job %s", job_id)
