"""``max_running:N``: a user runs at most N jobs at once. A job of a user who already runs N waits
with reason ``max_running`` (and reserves nothing, as a quota: it never holds back another user's
job). Enabled by one line: ``trainforge server start --policy max_running:2``, or
``TeamPolicy(policies=(*DEFAULT_POLICIES, "max_running:2"))``.

The example of docs/team-server.md ("Writing a policy"): one module, one hook (:meth:`admit`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainforge.server.scheduling.decision import Pending
from trainforge.server.scheduling.policy import Gauge, Policy, TeamView
from trainforge.server.scheduling.resources import Resources

if TYPE_CHECKING:
    from trainforge.server.scheduling.rule import JobRequest
    from trainforge.server.scheduling.sharing import Team



class MaxRunning(Policy):
    """``limit``: the most jobs a user runs at once (>= 1)."""

    name = "max_running"

    def __init__(self, limit: int):
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"max_running limit={limit!r}: give a whole number of jobs >= 1, e.g. max_running:2")
        self.limit = limit

    @classmethod
    def from_args(cls, args: str) -> MaxRunning:
        try:
            return cls(int(args))
        except ValueError:
            raise ValueError(f"max_running:{args}: give the most jobs a user runs at once, e.g. max_running:2") from None

    def admit(self, job: JobRequest, request: Resources, held: Resources, running: int, team: Team,
              position: int | None) -> Pending | None:  # fmt: skip
        if running < self.limit:
            return None
        return Pending(job.job_id, position, "max_running", limit={"jobs": float(self.limit)},
                       note=f"its user runs {running} jobs, at most {self.limit}")  # fmt: skip

    def describe(self) -> str:
        return f"a user runs at most {self.limit} job(s) at once"

    def metrics(self, view: TeamView) -> list[Gauge]:
        return [Gauge("user_running_jobs", "Jobs each user runs.", ("user",),
                      {(u,): float(n) for u, n in view.running.items()}),
                Gauge("policy_max_running_jobs", "The most jobs a user may run at once.", (), {(): float(self.limit)})]  # fmt: skip
