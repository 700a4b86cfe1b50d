"""What :func:`~trainforge.server.scheduling.rule.decide` answers: the jobs that start (:class:`Start`),
and why each of the others waits (:class:`Pending`), worked out only as far as someone asks
(:class:`Decision`: a page of the queue, or one job's reason, without the other 10,000).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from trainforge._internal.amounts import fmt_number

if TYPE_CHECKING:
    from trainforge.server.scheduling.rule import _Scan



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
    ``"reserved"`` (it would fit, but ``behind`` waits for kinds it also needs); or ``"quota"``
    (it would take its user over their quota: ``need`` its request, ``free`` what is left of the
    quota, ``limit`` the quota, of the kinds it would exceed).
    """

    job_id: int
    position: int | None  # None while held
    reason: Literal["held", "resources", "reserved", "quota"]
    need: dict[str, float] = dataclasses.field(default_factory=dict)
    free: dict[str, float] = dataclasses.field(default_factory=dict)
    behind: int | None = None
    limit: dict[str, float] = dataclasses.field(default_factory=dict)

    def describe(self) -> str:
        """One line for a person: ``needs 4 CPU, 2 free``, ``behind job 12``, ``held``."""
        if self.reason == "held":
            return "held"
        if self.reason == "reserved":
            return f"behind job {self.behind}"
        if self.reason == "quota":
            parts = [f"{fmt_number(self.need[k])} {k}, {fmt_number(self.free.get(k, 0.0))} of {fmt_number(self.limit.get(k, 0.0))} left"
                     for k in sorted(self.need)]  # fmt: skip
            return "over its user's quota: needs " + "; ".join(parts)
        parts = [f"{fmt_number(self.need[k])} {k}, {fmt_number(self.free.get(k, 0.0))} free" for k in sorted(self.need)]
        return "needs " + "; ".join(parts)


class Decision:
    """``starts``: the jobs to start now. ``pending``: the others with their reasons, in queue order;
    :meth:`page` and :meth:`reason` give some of them (a server with 10,000 queued jobs decides in
    well under a millisecond: once every resource kind that is still free is reserved, no later job
    can start, so the scan stops there, and a later job's reason is worked out when someone asks for
    it, :class:`_Tail`). ``reserved``: kinds a waiting job lacks. ``blocked``: the first waiting job,
    in queue order and not held, that lacks resources (the one elastic jobs lend to, rule 5), known
    without working out the others' reasons. ``preempt``: the running jobs to preempt for it (rule 8)."""

    def __init__(self, starts: list[Start], pending: list[Pending], tail: _Tail | None = None,
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


class _Tail:
    """The reasons of the jobs from index ``start`` on, where the scan stopped, worked out only as
    someone asks. Saturated there, what is free and what each user holds no longer change (only a job
    asking for nothing starts), and a job that lacks nothing waits behind a kind reserved before
    ``start`` (its shape has a kind reserved, or one with nothing free, which it would lack): so a
    reason needs only the job's position, which one light pass works out (:meth:`advance`)."""

    def __init__(self, scan: _Scan, start: int, starts_in_tail: bool):
        self.scan, self.start = scan, start
        self.head = list(scan.pending)  # the reasons before ``start``
        self.reserved = dict(scan.reserved)
        self.positions: list[int | None] = []  # of ordered[start + j]; None: held, or starts
        self.position = scan.position
        ordered = scan.ordered
        self.entries = (None if not starts_in_tail else  # the indices of the jobs that wait, when some start
                        [i for i in range(start, len(ordered)) if ordered[i].held or ordered[i].min_request])  # fmt: skip
        self.total = len(self.head) + (len(ordered) - start if self.entries is None else len(self.entries))
        self._index: dict[int, int] | None = None
        self._head: dict[int, Pending] = {}

    def advance(self, upto: int) -> None:
        """The positions of the jobs up to index ``upto`` (exclusive)."""
        positions, pos = self.positions, self.position
        for job in self.scan.ordered[self.start + len(positions) : upto]:
            if job.held or not job.min_request:
                positions.append(None)
            else:
                pos += 1
                positions.append(pos)
        self.position = pos

    def at(self, i: int) -> Pending | None:
        """The reason of ``ordered[i]`` (None: it starts)."""
        job = self.scan.ordered[i]
        if job.held:
            return Pending(job.job_id, None, "held")
        if i - self.start >= len(self.positions):
            self.advance(i + 1)
        position = self.positions[i - self.start]
        return None if position is None else self.scan.judge(job, position, self.reserved)

    def page(self, offset: int, limit: int) -> list[Pending]:
        out = self.head[offset : offset + limit]
        first, last = max(0, offset - len(self.head)), max(0, offset + limit - len(self.head))
        if self.entries is None:
            indices: Sequence[int] = range(self.start + first, min(self.start + last, len(self.scan.ordered)))
        else:
            indices = self.entries[first:last]
        out += [p for p in map(self.at, indices) if p is not None]
        return out

    def reason(self, job_id: int) -> Pending | None:
        if self._index is None:  # once per decision: where each job is
            ordered = self.scan.ordered
            self._head = {p.job_id: p for p in self.head}
            self._index = {ordered[i].job_id: i for i in range(self.start, len(ordered))}
        if job_id in self._head:
            return self._head[job_id]
        i = self._index.get(job_id)
        return None if i is None else self.at(i)
