"""``quota``: a user's jobs never hold more than their quota at once (rule 6 of
:mod:`trainforge.server.scheduling.rule`): a job that would take its user over waits with reason
``quota`` and reserves nothing (a quota never holds back another user's job, and never preempts).
The quotas are the decision's (``Team.quotas``: each user's own, or the server's default quota)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainforge.server.scheduling.decision import Pending
from trainforge.server.scheduling.policy import Gauge, Policy, TeamView
from trainforge.server.scheduling.resources import EPS, Resources

if TYPE_CHECKING:
    from trainforge.server.scheduling.rule import JobRequest
    from trainforge.server.scheduling.sharing import Team



class Quota(Policy):
    name = "quota"

    def admit(self, job: JobRequest, request: Resources, held: Resources, running: int, team: Team,
              position: int | None) -> Pending | None:  # fmt: skip
        limit = team.quotas.get(job.user)
        if limit is None:
            return None
        over = [k for k, v in request.items() if k in limit and held.get(k, 0.0) + v > limit[k] + EPS]
        if not over:
            return None
        return Pending(job.job_id, position, "quota", need={k: request[k] for k in over},
                       free={k: max(0.0, limit[k] - held.get(k, 0.0)) for k in over},
                       limit={k: float(limit[k]) for k in over})  # fmt: skip

    def describe(self) -> str:
        return "a user's jobs hold at most their quota at once"

    def metrics(self, view: TeamView) -> list[Gauge]:
        return [Gauge("user_quota", "Each user's quota, by kind.", ("user", "resource"),
                      {(u, k): float(v) for u, q in view.team.quotas.items() for k, v in q.items()})]  # fmt: skip
