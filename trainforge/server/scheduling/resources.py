"""Amounts of resources by kind, and the arithmetic the scheduler does on them (shared by the rule,
its policies and the ledger)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from trainforge._internal.amounts import fmt_number

Resources = Mapping[str, float]
"""Amounts by resource kind: ``{"CPU": 4, "GPU": 1, "memory": 8e9, "my_custom": 2}``."""

EPS = 1e-9
"""Amounts closer than this are equal (sums of fractions of workers)."""


def add(into: dict[str, float], amounts: Resources, sign: float = 1.0) -> None:
    """``into += sign * amounts``, by kind."""
    for k, v in amounts.items():
        into[k] = into.get(k, 0.0) + sign * v


def lacking(request: Resources, free: Resources) -> dict[str, float]:
    """The kinds of ``request`` that ``free`` has too little of, with the amounts asked."""
    return {k: v for k, v in request.items() if v > free.get(k, 0.0) + EPS}


def free_resources(capacity: Resources, grants: Iterable[Resources]) -> dict[str, float]:
    """What ``capacity`` has left after ``grants`` (kinds absent from capacity have none)."""
    free = {k: float(v) for k, v in capacity.items()}
    for grant in grants:
        for k, v in grant.items():
            free[k] = free.get(k, 0.0) - v
    return free


def dominant_share(amounts: Resources, capacity: Resources) -> float:
    """The largest fraction of any one kind of ``capacity`` that ``amounts`` takes (as in DRF)."""
    return max((v / capacity[k] for k, v in amounts.items() if capacity.get(k, 0.0) > 0), default=0.0)


# An amount for a person (``4``, ``0.5``, ``8e+09``): every server's one number formatter.
amount_text = fmt_number
