"""What :func:`~trainforge.server.scheduling.rule.decide` answers: the jobs that start (:class:`Start`),
and why each of the others waits (:class:`Pending`), worked out only as far as someone asks
(:class:`Decision`: a page of the queue, or one job's reason, without the other 10,000).
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from trainforge.server.scheduling.resources import amount_text

REASONS = ("held", "resources", "reserved", "quota", "max_running")
"""The reasons a job waits that the server's own rules and policies give (a policy of one's own may
add its name)."""


@dataclasses.dataclass(frozen=True)
class Start:
    """Start ``job_id`` now with ``workers`` workers, holding ``grant`` until it ends."""

    job_id: int
    workers: int
    grant: dict[str, float]


@dataclasses.dataclass(frozen=True)
class Pending:
    """Why a queued job waits, and its place among the waiting jobs that are not held (1 = next).

    ``reason``: ``"held"``; ``"resources"`` (``need`` and ``free`` name the kinds it lacks);
    ``"reserved"`` (it would fit, but ``behind`` waits for kinds it also needs); ``"quota"``
    (it would take its user over their quota: ``need`` its request, ``free`` what is left of the
    quota, ``limit`` the quota, of the kinds it would exceed); or the name of the scheduling policy
    that holds it back (``"max_running"``: its user runs as many jobs as they may), ``note`` saying
    why in words.
    """

    job_id: int
    position: int | None  # None while held
    reason: str
    need: dict[str, float] = dataclasses.field(default_factory=dict)
    free: dict[str, float] = dataclasses.field(default_factory=dict)
    behind: int | None = None
    limit: dict[str, float] = dataclasses.field(default_factory=dict)
    note: str = ""

    def describe(self) -> str:
        """One line for a person: ``needs 4 CPU, 2 free``, ``behind job 12``, ``held``."""
        if self.reason == "held":
            return "held"
        if self.note:
            return self.note
        if self.reason == "reserved":
            return f"behind job {self.behind}"
        if self.reason == "quota":
            parts = [f"{amount_text(self.need[k])} {k}, {amount_text(self.free.get(k, 0.0))} of {amount_text(self.limit.get(k, 0.0))} left"
                     for k in sorted(self.need)]  # fmt: skip
            return "over its user's quota: needs " + "; ".join(parts)
        parts = [f"{amount_text(self.need[k])} {k}, {amount_text(self.free.get(k, 0.0))} free" for k in sorted(self.need)]
        return "needs " + "; ".join(parts)


class LazyReasons(Protocol):
    """The reasons of the jobs past where the scan stopped, worked out as someone asks
    (:class:`trainforge.server.scheduling.scan.Tail`)."""

    total: int

    def page(self, offset: int, limit: int) -> list[Pending]: ...

    def reason(self, job_id: int) -> Pending | None: ...


class Decision:
    """``starts``: the jobs to start now. ``pending``: the others with their reasons, in queue order;
    :meth:`page` and :meth:`reason` give some of them (a server with 10,000 queued jobs decides in
    well under a millisecond: once every resource kind that is still free is reserved, no later job
    can start, so the scan stops there, and a later job's reason is worked out when someone asks for
    it, :class:`LazyReasons`). ``reserved``: kinds a waiting job lacks. ``blocked``: the first waiting job,
    in queue order and not held, that lacks resources (the one elastic jobs lend to, rule 5), known
    without working out the others' reasons. ``preempt``: the running jobs to preempt for it (rule 8)."""

    def __init__(self, starts: list[Start], pending: list[Pending], tail: LazyReasons | None = None,
                 reserved: set[str] | None = None, blocked: int | None = None,
                 preempt: list[int] | None = None):  # fmt: skip
        self.starts = starts
        self._pending = pending
        self._tail = tail
        self._all: list[Pending] | None = None if tail is not None else pending  # every reason, once worked out
        self._index: dict[int, Pending] | None = None
        self.reserved = reserved if reserved is not None else set()
        self.blocked = blocked
        self.preempt = preempt if preempt is not None else []

    @property
    def pending(self) -> list[Pending]:
        if self._all is None:
            assert self._tail is not None
            self._all = self._tail.page(0, self._tail.total)
        return self._all

    @property
    def waiting(self) -> int:
        """How many jobs wait (the length of :attr:`pending`)."""
        return self._tail.total if self._tail is not None else len(self._pending)

    def page(self, offset: int, limit: int) -> list[Pending]:
        """``pending[offset:offset + limit]``, working out only the reasons of those (and the positions
        before them)."""
        if self._all is not None or self._tail is None:
            return self.pending[offset : offset + limit]
        return self._tail.page(offset, limit)

    def reason(self, job_id: int) -> Pending | None:
        """Why ``job_id`` waits (None: it starts, or is not in the queue)."""
        if self._tail is not None:
            return self._tail.reason(job_id)
        if self._index is None:
            self._index = {p.job_id: p for p in self._pending}
        return self._index.get(job_id)

    def __repr__(self) -> str:
        return f"Decision(starts={self.starts!r}, pending={self.pending!r}, preempt={self.preempt!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Decision):
            return NotImplemented
        return self.starts == other.starts and self.pending == other.pending and self.preempt == other.preempt

    __hash__ = None  # type: ignore[assignment]
