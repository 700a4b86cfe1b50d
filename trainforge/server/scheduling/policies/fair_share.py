"""``fair_share``: among jobs of equal priority, users are ordered by Slurm's classic fair-share
factor F = 2^(-U/S) (rule 7 of :mod:`trainforge.server.scheduling.rule`,
``doc/html/classic_fair_share.shtml``): U is a user's usage as a fraction of everyone's
(:mod:`trainforge.server.scheduling.accounting`: dominant share x time, decayed), S their share as a
fraction of the users'. F is 1 for a user who has used nothing, 0.5 for one who used exactly their
share. As in Slurm, the order is worked out again at every decision from the usage as it is then
(running jobs count as they run), so a user below their share comes first until they are not. Users
who tie (a fresh server: nobody has used anything yet) take turns, one job each; then submission
order."""

from __future__ import annotations

import itertools
import operator
from typing import TYPE_CHECKING

from trainforge.server.scheduling.policy import Gauge, Policy, TeamView
from trainforge.server.scheduling.sharing import usage_ratios

if TYPE_CHECKING:
    from trainforge.server.scheduling.rule import JobRequest
    from trainforge.server.scheduling.sharing import Team
    from trainforge.server.scheduling.waiting import WaitingQueue



class FairShare(Policy):
    name = "fair_share"

    def order(self, ordered: list[JobRequest], team: Team, queue: WaitingQueue | None = None) -> list[JobRequest]:
        if queue is not None:
            # The queue keeps each priority's jobs by user: when no two users tie, fair share is each
            # priority's users' jobs one user after the other.
            users = queue.users
            if len(users) < 2:
                return ordered
            ratio = usage_ratios(team, users)
            if len(set(ratio.values())) == len(ratio):
                return [job for _, runs in queue.runs() for user in sorted(runs, key=ratio.__getitem__)
                        for job in runs[user]]  # fmt: skip
        return fair_order(ordered, team)

    def describe(self) -> str:
        return "equal priorities: the user furthest below their share first (F = 2^(-U/S))"

    def metrics(self, view: TeamView) -> list[Gauge]:
        usage = view.team.usage
        factors = view.team.factors(view.users)
        return [Gauge("user_usage", "Each user's decayed usage (dominant-share seconds).", ("user",),
                      {(u,): usage.get(u, 0.0) for u in view.users}),
                Gauge("user_fairshare_factor", "Each user's fair-share factor F = 2^(-U/S).", ("user",),
                      {(u,): factors[u] for u in view.users})]  # fmt: skip


def fair_order(ordered: list[JobRequest], team: Team) -> list[JobRequest]:
    """``ordered`` (by priority, then submission) reordered within each priority by U/S (the order of
    F = 2^(-U/S), best first). Users whose U/S tie take turns, one job each, in submission order."""
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
