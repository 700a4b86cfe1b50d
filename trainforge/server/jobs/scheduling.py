"""``Scheduling``: the job service's side of the scheduling rules, put together from their parts:
the :class:`~trainforge.server.scheduling.ledger.ResourceLedger` (what running jobs hold, their
users' usage), the configured policies (:mod:`trainforge.server.scheduling.policies`, from
:class:`~trainforge.server.scheduling.team_policy.TeamPolicy`), the users' shares and quotas
(:mod:`trainforge.server.team.users`) turned into the decision's
:class:`~trainforge.server.scheduling.sharing.Team` (:meth:`team`), the preemption executor
(:mod:`trainforge.server.jobs.preemption`) and the operators' counters
(:mod:`trainforge.server.jobs.metrics`). What people and operators read of them (``/shares``,
``/whoami``, ``/metrics``, ``GET /resources`` and ``trainforge resources``) is read here.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from trainforge.client import JobState
from trainforge.server.jobs.alarm import Alarm
from trainforge.server.jobs.metrics import SchedulerCounters
from trainforge.server.jobs.preemption import Preemptor
from trainforge.server.scheduling.accounting import Accounting
from trainforge.server.scheduling.decision import Decision
from trainforge.server.scheduling.ledger import ResourceLedger
from trainforge.server.scheduling.policies import Settings, build_all
from trainforge.server.scheduling.policy import Gauge, TeamView
from trainforge.server.scheduling.rule import JobRequest, decide
from trainforge.server.scheduling.sharing import Team
from trainforge.server.scheduling.team_policy import TeamPolicy
from trainforge.server.scheduling.waiting import WaitingQueue
from trainforge.server.store.database import JobRow, JobStore
from trainforge.server.team.users import ADMIN, UserBook


class Scheduling:
    """See the module docstring. ``capacity``: the service's (it may change it in place);
    ``stop_runner(job_id)``: stops a job's runner and returns once it is gone; ``lock``: the service's,
    which the reads for people and operators take (the decisions' callers hold it already);
    ``on_alarm``: decide again (the service's, called by the alarm); ``clock``: the time."""

    def __init__(self, store: JobStore, capacity: dict[str, float], policy: TeamPolicy, users: UserBook,
                 stop_runner: Callable[[int], None], *, lock: threading.RLock | None = None,
                 on_alarm: Callable[[], None] = lambda: None, clock: Callable[[], float] = time.time):  # fmt: skip
        self._lock = lock or threading.RLock()
        self.capacity = capacity
        self.alarm = Alarm(on_alarm, clock=clock)
        self.policy = policy
        self.users = users
        self.ledger = ResourceLedger(capacity, Accounting(store, capacity, policy.half_life_s))
        self.counters = SchedulerCounters()
        self.preemptor = Preemptor(store, self.ledger, stop_runner, self.counters.preemptions)

    @property
    def policy(self) -> TeamPolicy:
        return self._policy

    @policy.setter
    def policy(self, policy: TeamPolicy) -> None:
        """The rules from now on, and the policies they name (the half-life stays the one usage was
        built with)."""
        self._policy = policy
        self.policies = build_all(policy.active_policies(),
                                  Settings(policy.preempt_exempt_s, policy.preempt_cooldown_s))  # fmt: skip

    # -- deciding --------------------------------------------------------------------------------------
    def hold(self, job: JobRow, grant: Mapping[str, float], now: float, started_at: float | None = None) -> None:
        """``job`` holds ``grant`` from ``now`` on (the ledger charges its user from now)."""
        self.ledger.hold(job.id, grant, now, user=job.owner, priority=job.priority, preemptible=job.preemptible,
                         started_at=started_at, preempted_at=job.preempted_at,
                         stopping=job.state == JobState.STOPPING)  # fmt: skip

    def decide(self, waiting: WaitingQueue, lendable: Mapping[int, Mapping[str, float]], now: float) -> Decision:
        """The scheduler's decision as of ``now`` (``lendable``: what elastic jobs hold above their
        minimum), timed for ``/metrics``."""
        running = self.ledger.running(now, lendable)
        team = self.team(waiting.users, now)
        t0 = time.perf_counter()
        decision = decide(waiting, running, self.capacity, team, self.policies)
        self.counters.decided(time.perf_counter() - t0)
        return decision

    def carry_out(self, decision: Decision, blocked: JobRequest | None, now: float) -> None:
        """After the decision's starts: its preemptions (for ``blocked``, its first job lacking
        resources), and the alarm at the next moment a time-based rule could change the answer with no
        other event (a preemptible job leaving its exemption; disarmed when none: nothing waits for a
        moment); usage saved when due."""
        self.preemptor.preempt(decision.preempt, decision.blocked, now)
        self.alarm.arm(self.policies.next_change(blocked, self.ledger.running(now), now))
        self.ledger.accounting.persist_due(now)

    def quota(self, user: str) -> dict[str, float] | None:
        """What ``user``'s jobs may hold at once (None: no limit; the built-in admin has none, and none
        has any without the ``quota`` policy)."""
        if user == ADMIN or "quota" not in self.policies:
            return None
        try:
            own = self.users.get(user).quota
        except LookupError:
            own = None
        return own if own is not None else self.policy.default_quota

    def headroom(self, job_id: int) -> dict[str, float] | None:
        """How much more the running job's user may hold under their quota, by kind (None: no limit)."""
        held = self.ledger.get(job_id)
        quota = self.quota(held.user) if held is not None else None
        if held is None or quota is None:
            return None
        holds = self.ledger.held_by(held.user)
        return {k: max(0.0, v - holds.get(k, 0.0)) for k, v in quota.items()}

    def team(self, waiting_users: Iterable[str], now: float) -> Team:
        """The decision's :class:`Team` as of ``now``: the users' usage (charged up to now), shares and
        quotas (their own, or the default quota of the users with waiting or running jobs:
        ``waiting_users`` and the ledger's)."""
        quoted = "quota" in self.policies
        quotas = self.users.quotas() if quoted else {}
        if quoted and self.policy.default_quota is not None:
            users = set(waiting_users) | set(self.ledger.owners().values())
            for user in users - set(quotas) - {ADMIN}:
                quotas[user] = dict(self.policy.default_quota)
        return Team(usage=self.ledger.usage(now), shares=self.users.shares(), quotas=quotas,
                    exempt_s=self.policy.preempt_exempt_s, cooldown_s=self.policy.preempt_cooldown_s,
                    fair_share="fair_share" in self.policies, preemption="preemption" in self.policies)  # fmt: skip

    # -- for people and operators ---------------------------------------------------------------------
    def view(self, now: float) -> TeamView:
        """The users as the policies show them (``/metrics``): every user with a row, usage or jobs."""
        with self._lock:
            return self._view(now)

    def _view(self, now: float) -> TeamView:
        usage = self.ledger.usage(now)
        holds = self.ledger.holdings()
        shares = {u.name: u.shares for u in self.users.list()}
        names = sorted(set(shares) | set(usage) | set(holds) | {ADMIN})
        quotas = {n: q for n in names if (q := self.quota(n)) is not None}
        running: dict[str, int] = {}
        for user in self.ledger.owners().values():
            running[user] = running.get(user, 0) + 1
        return TeamView(Team(usage=usage, shares=shares, quotas=quotas), tuple(names), holds, running)

    def report(self, now: float) -> list[dict[str, Any]]:
        """Per user (those with users' rows, usage or running jobs): shares, usage, its fraction of
        everyone's, the share's fraction, the fair-share factor, holdings and quota."""
        view = self.view(now)
        team, names = view.team, view.users
        factors = team.factors(names)
        total_usage = math.fsum(team.usage.values())
        total_share = math.fsum(team.shares.get(n, 1.0) for n in names)
        return [{"user": n, "shares": team.shares.get(n, 1.0), "usage": team.usage.get(n, 0.0),
                 "usage_fraction": team.usage.get(n, 0.0) / total_usage if total_usage > 0 else 0.0,
                 "share_fraction": team.shares.get(n, 1.0) / total_share, "factor": factors[n],
                 "holds": view.holds.get(n, {}), "quota": team.quotas.get(n)} for n in names]  # fmt: skip

    def gauges(self, now: float) -> list[Gauge]:
        """What the policies expose to operators, as of ``now``."""
        view = self.view(now)
        return [g for p in self.policies for g in p.metrics(view)]

    def describe(self) -> list[dict[str, str]]:
        """Each policy, in order: its name and what it does."""
        return self.policies.describe()

    def free(self) -> dict[str, float]:
        with self._lock:
            return self.ledger.free()

    def grants(self) -> dict[int, dict[str, Any]]:
        """Each running job's grant and GPU ids."""
        with self._lock:
            owned = self.ledger.gpus_by_job()
            return {j: {"grant": g, "gpu_ids": owned.get(j, [])} for j, g in self.ledger.grants().items()}

    def gpu_owners(self) -> dict[str, int]:
        with self._lock:
            return self.ledger.gpu_owners()

    def holdings(self) -> dict[str, dict[str, float]]:
        """What each user's running jobs hold, by kind."""
        with self._lock:
            return self.ledger.holdings()

    def owners(self) -> dict[int, str]:
        """Whose each running job is."""
        with self._lock:
            return self.ledger.owners()
