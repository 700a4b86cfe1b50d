"""``TeamPolicy``: how a train server shared by several users schedules and guards them (the
``ServerConfig.team`` of :mod:`trainforge.server._config`; the rules themselves are the scheduling
policies, :mod:`trainforge.server.scheduling.policies`, and :mod:`trainforge.server.routes.access`)."""

from __future__ import annotations

import dataclasses
import math

from trainforge.server.scheduling.policies import DEFAULT_POLICIES, Settings, build_all

DAY_S = 86400.0


@dataclasses.dataclass(frozen=True)
class TeamPolicy:
    """The rules of a shared server.

    ``half_life_s``: fair share's usage halves every this long (Slurm's default: 7 days; ``inf``: no
    decay). ``fair_share``: order equal-priority jobs of several users by fair share (else by
    submission). ``preemption``: let a higher-priority job preempt ``preemptible`` ones;
    ``preempt_exempt_s``: a job runs at least this long before it may be preempted;
    ``preempt_cooldown_s``: and is preempted at most once in this long. ``member_max_priority``: the
    highest priority a member may give a job (admins: any). ``default_quota``: the quota of users
    who have none of their own (``{"GPU": 2}``; None: none). ``metrics_per_job``: ``/metrics`` also
    has one series per running job (off by default: a series per job grows without bound).
    ``policies``: the scheduling policies, in order, each ``"NAME"`` or ``"NAME:ARGS"``
    (:func:`trainforge.server.scheduling.policies.build`; ``trainforge server start --policy
    NAME[:ARGS]`` adds one): by default priority, quotas, fair share and preemption; ``fair_share``
    and ``preemption`` False leave those out (:meth:`active_policies`).

    Example::

        TeamPolicy(half_life_s=86400, preempt_exempt_s=300, default_quota={"GPU": 2})
        TeamPolicy(policies=(*DEFAULT_POLICIES, "max_running:2"))  # a user runs at most 2 jobs at once
    """

    half_life_s: float = 7 * DAY_S
    fair_share: bool = True
    preemption: bool = True
    preempt_exempt_s: float = 60.0
    preempt_cooldown_s: float = 600.0
    member_max_priority: int = 0
    default_quota: dict[str, float] | None = None
    metrics_per_job: bool = False
    policies: tuple[str, ...] = DEFAULT_POLICIES

    def __post_init__(self) -> None:
        if not (isinstance(self.half_life_s, (int, float)) and self.half_life_s > 0 and not math.isnan(self.half_life_s)):
            raise ValueError(f"TeamPolicy.half_life_s={self.half_life_s!r}: give seconds > 0 (inf: usage never decays)")
        for field in ("preempt_exempt_s", "preempt_cooldown_s"):
            value = getattr(self, field)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"TeamPolicy.{field}={value!r}: give a number of seconds >= 0")
        if not isinstance(self.member_max_priority, int) or isinstance(self.member_max_priority, bool):
            raise ValueError(f"TeamPolicy.member_max_priority={self.member_max_priority!r}: give an integer")
        for kind, amount in (self.default_quota or {}).items():
            if not (isinstance(amount, (int, float)) and math.isfinite(amount) and amount >= 0):
                raise ValueError(f"TeamPolicy.default_quota[{kind!r}]={amount!r}: give a finite amount >= 0")
        if isinstance(self.policies, str) or not all(isinstance(p, str) for p in self.policies):
            raise ValueError(f"TeamPolicy.policies={self.policies!r}: give a tuple of names, e.g. ('priority', 'quota')")
        object.__setattr__(self, "policies", tuple(self.policies))
        try:
            build_all(self.active_policies(), Settings(self.preempt_exempt_s, self.preempt_cooldown_s))
        except ValueError as exc:
            raise ValueError(f"TeamPolicy.policies={self.policies!r}: {exc}") from None

    def active_policies(self) -> tuple[str, ...]:
        """``policies`` without fair share or preemption when they are turned off."""
        off = {name for name, on in (("fair_share", self.fair_share), ("preemption", self.preemption)) if not on}
        return tuple(p for p in self.policies if p.partition(":")[0] not in off)


def parse_duration(text: str) -> float:
    """``"90"``, ``"90s"``, ``"15m"``, ``"12h"``, ``"7d"``, ``"inf"`` -> seconds (ValueError if malformed)."""
    raw = text.strip().lower()
    if raw in ("inf", "infinity", "never"):
        return math.inf
    units = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": DAY_S, "w": 7 * DAY_S}
    scale = units.get(raw[-1:], None)
    number = raw[:-1] if scale is not None else raw
    try:
        value = float(number) * (scale or 1.0)
    except ValueError:
        raise ValueError(f"{text!r}: give a duration such as 90, 90s, 15m, 12h, 7d or inf") from None
    if math.isnan(value) or value < 0:
        raise ValueError(f"{text!r}: a duration is >= 0")
    return value
