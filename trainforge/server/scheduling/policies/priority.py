"""``priority``: higher-priority jobs start first, then by submission (rule 1 of
:mod:`trainforge.server.scheduling.rule`). The base order: the server's
:class:`~trainforge.server.scheduling.waiting.WaitingQueue` keeps its jobs in it as they come and go,
so this policy costs a decision nothing; a scheduler without it takes jobs by submission only."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainforge.server.scheduling.policy import Policy

if TYPE_CHECKING:
    from trainforge.server.scheduling.rule import JobRequest
    from trainforge.server.scheduling.sharing import Team
    from trainforge.server.scheduling.waiting import WaitingQueue



class Priority(Policy):
    name = "priority"

    def order(self, ordered: list[JobRequest], team: Team, queue: WaitingQueue | None = None) -> list[JobRequest]:
        return ordered  # the base order already is priority, then submission

    def describe(self) -> str:
        return "higher priority first, then submission order"
