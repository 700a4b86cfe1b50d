"""The inputs a shared server adds to the scheduler (:mod:`trainforge.server.scheduling.rule`,
rules 6-9): :class:`Team` (each user's decayed usage, share and quota; the preemption bounds when no
policies are given) and :class:`RunningJob` (who holds what, and whether it may be preempted), and
the fair-share arithmetic on them (:func:`usage_ratios`, :meth:`Team.factors`). The rules that read
them are the scheduling policies (:mod:`trainforge.server.scheduling.policies`): quotas, fair share
(Slurm's classic factor F = 2^(-U/S)), preemption.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping

from trainforge.server.scheduling.resources import Resources


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
    ``fair_share`` and ``preemption`` turn rules 7 and 8 off (what they and ``exempt_s``/``cooldown_s``
    say is read only when :func:`~trainforge.server.scheduling.rule.decide` is given no policies:
    :func:`trainforge.server.scheduling.policies.from_team`).

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
