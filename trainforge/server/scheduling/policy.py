"""``Policy``: the interface of a scheduling policy, the plug-in point of the train server's scheduler.

The scheduler (:func:`~trainforge.server.scheduling.rule.decide`) owns the walk down the queue: gang
starts, reservations and backfill, elastic sizes. What a shared server adds on top is a list of
policies, each one module of :mod:`trainforge.server.scheduling.policies`, each overriding only the
hooks it needs:

- :meth:`Policy.order`: reorder the waiting jobs (fair share interleaves users);
- :meth:`Policy.admit`: may a job start, given what its user's jobs hold and how many run? (quotas,
  at most N running jobs per user): a :class:`~trainforge.server.scheduling.decision.Pending` with
  the policy's reason when not. Read-only, and the same answer for the same arguments: the scan
  asks again for a page of the queue;
- :meth:`Policy.victims`: which running jobs to preempt for the first blocked job (preemption);
- :meth:`Policy.next_change`: the next moment a time-based rule could change the answer with no
  other event (a job passing its preemption exemption), so the server decides again then;
- :meth:`Policy.describe` and :meth:`Policy.metrics`: what it shows people (``trainforge
  resources``, ``GET /resources``) and operators (``/metrics``).

Every hook gets the decision's :class:`~trainforge.server.scheduling.sharing.Team` (usage, shares,
quotas as they are at the decision). Policies are named in a registry
(:func:`trainforge.server.scheduling.policies.build`) and configured in one line:
``TeamPolicy(policies=("priority", "quota", "fair_share", "preemption", "max_running:2"))``, or
``trainforge server start --policy max_running:2``.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar

from trainforge.server.scheduling.decision import Pending
from trainforge.server.scheduling.resources import Resources
from trainforge.server.scheduling.sharing import RunningJob, Team

if TYPE_CHECKING:
    from trainforge.server.scheduling.rule import JobRequest
    from trainforge.server.scheduling.waiting import WaitingQueue



@dataclasses.dataclass(frozen=True)
class Gauge:
    """One metric family a policy exposes: ``trainforge_<name>{labels} value`` per key of ``values``."""

    name: str
    doc: str
    labels: tuple[str, ...]
    values: Mapping[tuple[str, ...], float]


@dataclasses.dataclass(frozen=True)
class TeamView:
    """What policies show about the users, as of a moment: the :class:`Team` of a decision and what
    each user's jobs hold and how many of them run."""

    team: Team
    users: tuple[str, ...]
    holds: Mapping[str, Resources]
    running: Mapping[str, int]


class Policy(abc.ABC):
    """A scheduling policy (see the module docstring). Subclasses set ``name`` (the registry's key)
    and override the hooks they need; the defaults do nothing."""

    name: ClassVar[str]

    def order(self, ordered: list[JobRequest], team: Team, queue: WaitingQueue | None = None) -> list[JobRequest]:
        """The waiting jobs in the order they may start: ``ordered`` as the policies before left it
        (do not change it: return another list); ``queue``, when the server passed its
        :class:`WaitingQueue` and ``ordered`` is still its order (its groupings spare a sort)."""
        return ordered

    def admit(self, job: JobRequest, request: Resources, held: Resources, running: int, team: Team,
              position: int | None) -> Pending | None:  # fmt: skip
        """Why ``job`` may not take ``request`` now, its user's jobs holding ``held`` and ``running``
        of them running (a :class:`Pending` at ``position``), or None."""
        return None

    def victims(self, job: JobRequest, free: Resources, running: Sequence[RunningJob], team: Team) -> list[int]:
        """The running jobs to preempt so that ``job``, the first waiting job lacking resources, fits."""
        return []

    def next_change(self, blocked: JobRequest | None, running: Sequence[RunningJob], now: float) -> float | None:
        """The next moment after ``now`` at which this policy could answer otherwise with nothing else
        changed (None: never)."""
        return None

    @abc.abstractmethod
    def describe(self) -> str:
        """One line for a person: what it does, with its settings."""

    def metrics(self, view: TeamView) -> list[Gauge]:
        """What it exposes to operators (``/metrics``)."""
        return []


def _overrides(policy: Policy, hook: str) -> bool:
    return getattr(type(policy), hook) is not getattr(Policy, hook)


class PolicySet:
    """The policies of a scheduler, in order, with which of them use each hook worked out once (a
    decision calls only those)."""

    def __init__(self, policies: Sequence[Policy] = ()):
        self.policies = tuple(policies)
        names = [p.name for p in self.policies]
        if len(set(names)) != len(names):
            raise ValueError(f"policies={names!r}: each policy at most once")
        self.orderers = tuple(p for p in self.policies if _overrides(p, "order"))
        self.admitters = tuple(p for p in self.policies if _overrides(p, "admit"))
        self.preempters = tuple(p for p in self.policies if _overrides(p, "victims"))
        self.timed = tuple(p for p in self.policies if _overrides(p, "next_change"))

    def __contains__(self, name: object) -> bool:
        return any(p.name == name for p in self.policies)

    def __iter__(self) -> Iterator[Policy]:
        return iter(self.policies)

    def get(self, name: str) -> Policy | None:
        return next((p for p in self.policies if p.name == name), None)

    def admit(self, job: JobRequest, request: Resources, held: Resources, running: int, team: Team,
              position: int | None) -> Pending | None:  # fmt: skip
        for policy in self.admitters:
            pending = policy.admit(job, request, held, running, team, position)
            if pending is not None:
                return pending
        return None

    def next_change(self, blocked: JobRequest | None, running: Sequence[RunningJob], now: float) -> float | None:
        """The earliest of the policies' next changes (None: none)."""
        times = [t for p in self.timed if (t := p.next_change(blocked, running, now)) is not None]
        return min(times, default=None)

    def describe(self) -> list[dict[str, str]]:
        return [{"name": p.name, "description": p.describe()} for p in self.policies]
