"""The scheduling policies (:class:`~trainforge.server.scheduling.policy.Policy`), by name, and
:func:`build`, which turns ``"NAME"`` or ``"NAME:ARGS"`` into one. Adding a policy: a module here
with a :class:`Policy` subclass, and one line in :data:`REGISTRY` (docs/team-server.md, "Writing a
policy")."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from trainforge.server.scheduling.policies.fair_share import FairShare
from trainforge.server.scheduling.policies.max_running import MaxRunning
from trainforge.server.scheduling.policies.preemption import Preemption
from trainforge.server.scheduling.policies.priority import Priority
from trainforge.server.scheduling.policies.quota import Quota
from trainforge.server.scheduling.policy import Policy, PolicySet
from trainforge.server.scheduling.sharing import Team

DEFAULT_POLICIES = ("priority", "quota", "fair_share", "preemption")
"""What a server schedules with unless told otherwise."""


@dataclasses.dataclass(frozen=True)
class Settings:
    """What the built-in policies take from the server's configuration when their name comes without
    arguments: the preemption bounds (``TeamPolicy.preempt_exempt_s``/``preempt_cooldown_s``)."""

    exempt_s: float = 60.0
    cooldown_s: float = 600.0


def _no_args(cls: Callable[[], Policy]) -> Callable[[str | None, Settings], Policy]:
    def make(args: str | None, settings: Settings) -> Policy:
        if args:
            raise ValueError(f"policy {cls.name!r} takes no arguments (got {args!r})")  # type: ignore[attr-defined]
        return cls()

    return make


def _max_running(args: str | None, settings: Settings) -> Policy:
    if not args:
        raise ValueError("policy 'max_running' needs the most jobs a user runs at once: max_running:N")
    return MaxRunning.from_args(args)


REGISTRY: dict[str, Callable[[str | None, Settings], Policy]] = {
    "priority": _no_args(Priority),
    "quota": _no_args(Quota),
    "fair_share": _no_args(FairShare),
    "preemption": lambda args, s: Preemption(s.exempt_s, s.cooldown_s) if not args else _preemption_args(args),
    "max_running": _max_running,
}
"""Policy name -> a factory taking the text after ``NAME:`` (None without one) and the server's settings."""


def _preemption_args(args: str) -> Policy:
    """``preemption:EXEMPT_S[,COOLDOWN_S]``."""
    try:
        values = [float(a) for a in args.split(",")]
    except ValueError:
        raise ValueError(f"preemption:{args}: give seconds, e.g. preemption:60,600") from None
    if not 1 <= len(values) <= 2:
        raise ValueError(f"preemption:{args}: give EXEMPT_S or EXEMPT_S,COOLDOWN_S")
    return Preemption(*values)


def build(spec: str, settings: Settings | None = None) -> Policy:
    """The policy ``spec`` names (``"fair_share"``, ``"max_running:2"``); ValueError listing the
    available names if there is no such policy."""
    name, _, args = spec.strip().partition(":")
    factory = REGISTRY.get(name)
    if factory is None:
        raise ValueError(f"no scheduling policy {name!r}: the policies are {', '.join(sorted(REGISTRY))}")
    return factory(args or None, settings or Settings())


def build_all(specs: Iterable[str], settings: Settings | None = None) -> PolicySet:
    return PolicySet([build(s, settings) for s in specs])


def from_team(team: Team) -> PolicySet:
    """The policies a :class:`Team` of :func:`~trainforge.server.scheduling.rule.decide` stands for
    when none are given: priority, its quotas (when it has any), fair share and preemption (unless
    turned off), with its preemption bounds."""
    policies: list[Policy] = [Priority()]
    if team.quotas:
        policies.append(Quota())
    if team.fair_share:
        policies.append(FairShare())
    if team.preemption:
        policies.append(Preemption(team.exempt_s, team.cooldown_s))
    return PolicySet(policies)
