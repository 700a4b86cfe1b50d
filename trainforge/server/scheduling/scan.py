"""The scheduling rule's walk down the ordered queue (:class:`Scan`), and the reasons of the jobs
past where it stopped, worked out only as someone asks (:class:`Tail`). The rule itself, and why the
walk may stop early, is :mod:`trainforge.server.scheduling.rule`'s docstring."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from trainforge.server.scheduling.decision import Pending, Start
from trainforge.server.scheduling.policy import PolicySet
from trainforge.server.scheduling.resources import EPS, add, lacking
from trainforge.server.scheduling.sharing import Team

if TYPE_CHECKING:
    from trainforge.server.scheduling.rule import JobRequest


_NO_POLICIES = PolicySet()
_NO_TEAM = Team()


class Scan:
    """The walk, resumable: ``run(i)`` handles jobs from index ``i`` until the end, or, with
    ``stop_when_saturated``, until no later job can start; ``run`` then returns the index to resume
    from. ``policies``: those whose :meth:`~trainforge.server.scheduling.policy.Policy.admit` a job
    must pass, with ``team`` their inputs; ``held``/``counts``: what each user's jobs hold and how many
    run (kept up to date as jobs start, when some policy admits). ``shapes``: the distinct sets of
    kinds the jobs not held ask for, and ``asks_nothing``: whether one of them asks for nothing
    (worked out from ``ordered`` when not given: a :class:`WaitingQueue` keeps them)."""

    def __init__(self, ordered: list[JobRequest], free: dict[str, float], policies: PolicySet | None = None,
                 team: Team | None = None, held: dict[str, dict[str, float]] | None = None,
                 counts: dict[str, int] | None = None, shapes: set[frozenset[str]] | None = None,
                 asks_nothing: bool | None = None):  # fmt: skip
        self.ordered = ordered
        self.free = free
        self.policies = policies if policies is not None else _NO_POLICIES
        self.admits = bool(self.policies.admitters)
        self.team = team if team is not None else _NO_TEAM
        self.held = held if held is not None else {}
        self.counts = counts if counts is not None else {}
        self.reserved: dict[str, tuple[int, int]] = {}  # kind -> (position, job id) of the first lacking it
        self.position = 0
        self.starts: list[Start] = []
        self.pending: list[Pending] = []
        self.blocked: int | None = None  # the first job that lacks resources
        # Once each shape has a kind that is reserved or has nothing free, no later job can start
        # (free only shrinks and reservations only grow).
        if shapes is None or asks_nothing is None:
            kinds = {job.kinds for job in ordered if not job.held}
            shapes, asks_nothing = kinds - {frozenset()}, frozenset() in kinds
        self.shapes = shapes
        self.asks_nothing = asks_nothing

    def refused(self, job: JobRequest, request: Mapping[str, float], position: int | None = None) -> Pending | None:
        """Why a policy refuses ``job`` the ``request`` (None: none does)."""
        return self.policies.admit(job, request, self.held.get(job.user, {}), self.counts.get(job.user, 0),
                                   self.team, position)  # fmt: skip

    def judge(self, job: JobRequest, position: int, reserved: Mapping[str, tuple[int, int]]) -> Pending | None:
        """Why ``job`` (not held) waits, at ``position``, with ``reserved`` as the jobs before it left
        it; None: it can start (read-only)."""
        request = job.min_request
        if self.admits and (refused := self.refused(job, request, position)) is not None:
            return refused
        free = self.free
        short = [k for k, v in request.items() if v > free.get(k, 0.0) + EPS]
        if short:
            return Pending(job.job_id, position, "resources", need={k: request[k] for k in short},
                           free={k: max(0.0, free.get(k, 0.0)) for k in short})  # fmt: skip
        blocked_by = min((reserved[k] for k in request if k in reserved), default=None)
        if blocked_by is not None:
            return Pending(job.job_id, position, "reserved", behind=blocked_by[1])
        return None

    def first_lacking(self, i: int) -> int | None:
        """The first job from index ``i`` on that is not held, is admitted and lacks resources (read-only)."""
        for job in self.ordered[i:]:
            if not job.held and lacking(job.min_request, self.free):
                if self.admits and self.refused(job, job.min_request) is not None:
                    continue
                return job.job_id
        return None

    def saturated(self) -> bool:
        free, reserved = self.free, self.reserved
        return all(any(k in reserved or free.get(k, 0.0) <= EPS for k in shape) for shape in self.shapes)

    def start(self, job: JobRequest, workers: int, grant: dict[str, float]) -> None:
        for k, v in grant.items():
            self.free[k] = self.free.get(k, 0.0) - v
        if self.admits:
            add(self.held.setdefault(job.user, {}), grant)
            self.counts[job.user] = self.counts.get(job.user, 0) + 1
        self.starts.append(Start(job.job_id, workers, grant))

    def run(self, i: int, *, stop_when_saturated: bool) -> int:
        ordered, free, reserved, admits = self.ordered, self.free, self.reserved, self.admits
        n = len(ordered)
        while i < n:
            job = ordered[i]
            i += 1
            if job.held:
                self.pending.append(Pending(job.job_id, position=None, reason="held"))
                continue
            waits = self.judge(job, self.position + 1, reserved)
            if waits is not None:
                self.position += 1
                self.pending.append(waits)
                if waits.reason == "resources":
                    for k in waits.need:
                        reserved.setdefault(k, (self.position, job.job_id))
                    if self.blocked is None:
                        self.blocked = job.job_id
                    if stop_when_saturated and self.saturated():
                        return i
                continue
            workers = job.min_workers
            while workers < job.upper_workers and not lacking(job.request(workers + 1), free) and not (
                admits and self.refused(job, job.request(workers + 1))
            ):
                workers += 1
            grant = job.request(workers)
            self.start(job, workers, grant)
            if stop_when_saturated and grant and self.saturated():
                return i
        return n


class Tail:
    """The reasons of the jobs from index ``start`` on, where the scan stopped, worked out only as
    someone asks. Saturated there, what is free and what each user holds no longer change (only a job
    asking for nothing starts), and a job that lacks nothing waits behind a kind reserved before
    ``start`` (its shape has a kind reserved, or one with nothing free, which it would lack): so a
    reason needs only the job's position, which one light pass works out (:meth:`advance`)."""

    def __init__(self, scan: Scan, start: int, starts_in_tail: bool):
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
