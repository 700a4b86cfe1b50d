"""``WaitingQueue``: the jobs waiting in a train server's queue (queued or held), kept in the
scheduler's order as they come and go (rule 1 of :mod:`trainforge.server.scheduling.rule`: priority,
then submission), with what :func:`~trainforge.server.scheduling.rule.decide` asks of them at every
decision kept up to date beside it: the distinct sets of resource kinds that the jobs not held ask
for (its scan stops once each set is blocked), whether one of them asks for nothing, and whose
they are.

A server with 10,000 waiting jobs decides at every submission; sorting them and grouping them by
kind at each decision cost more than the decision itself (2-3 ms of its 3). Here a change costs a
binary search and a list insertion, and a decision reads the order as it is.
"""

from __future__ import annotations

import bisect
import collections
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from trainforge.server.scheduling.rule import JobRequest

_NOTHING: frozenset[str] = frozenset()
_K = TypeVar("_K")


def _change(counter: collections.Counter[_K], key: _K, n: int) -> None:
    counter[key] += n
    if not counter[key]:
        del counter[key]


class WaitingQueue:
    """The waiting jobs by id, in start order (see the module docstring). ``put`` adds a job or
    replaces the one with its id (a priority change, a hold, a release); ``pop`` and ``discard``
    remove one."""

    def __init__(self, jobs: Iterable[JobRequest] = ()):
        self._jobs: dict[int, JobRequest] = {}
        self._keys: list[tuple[int, int]] = []  # (-priority, seq) of each job in order
        self._ordered: list[JobRequest] = []
        self._shapes: collections.Counter[frozenset[str]] = collections.Counter()  # of the jobs not held
        self._users: collections.Counter[str] = collections.Counter()
        # Each priority's jobs by user, in submission order (what fair share interleaves): seqs, jobs.
        self._runs: dict[int, dict[str, tuple[list[int], list[JobRequest]]]] = {}
        for job in jobs:
            self.put(job)

    def put(self, job: JobRequest) -> None:
        self.discard(job.job_id)
        key = (-job.priority, job.seq)
        i = bisect.bisect_right(self._keys, key)
        self._keys.insert(i, key)
        self._ordered.insert(i, job)
        seqs, run = self._runs.setdefault(job.priority, {}).setdefault(job.user, ([], []))
        i = bisect.bisect_right(seqs, job.seq)
        seqs.insert(i, job.seq)
        run.insert(i, job)
        self._jobs[job.job_id] = job
        self._count(job, 1)

    def pop(self, job_id: int) -> JobRequest:
        """Remove the job (KeyError if it does not wait) and return it."""
        job = self._jobs.pop(job_id)
        i = bisect.bisect_left(self._keys, (-job.priority, job.seq))
        while self._ordered[i].job_id != job_id:  # another job with the same key (seq is meant to be unique)
            i += 1
        del self._keys[i]
        del self._ordered[i]
        users = self._runs[job.priority]
        seqs, run = users[job.user]
        i = bisect.bisect_left(seqs, job.seq)
        while run[i].job_id != job_id:
            i += 1
        del seqs[i]
        del run[i]
        if not run:
            del users[job.user]
            if not users:
                del self._runs[job.priority]
        self._count(job, -1)
        return job

    def discard(self, job_id: int) -> None:
        if job_id in self._jobs:
            self.pop(job_id)

    def _count(self, job: JobRequest, n: int) -> None:
        _change(self._users, job.user, n)
        if not job.held:
            _change(self._shapes, job.kinds, n)

    def get(self, job_id: int) -> JobRequest | None:
        return self._jobs.get(job_id)

    def __getitem__(self, job_id: int) -> JobRequest:
        return self._jobs[job_id]

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self) -> Iterator[JobRequest]:
        return iter(self._ordered)

    @property
    def ordered(self) -> list[JobRequest]:
        """The jobs in start order (rule 1), fair share aside. The queue's own list: do not change it."""
        return self._ordered

    def runs(self) -> list[tuple[int, dict[str, list[JobRequest]]]]:
        """Each priority, highest first, with its jobs by user in submission order (the queue's own
        lists: do not change them)."""
        return [(p, {u: run for u, (_, run) in self._runs[p].items()}) for p in sorted(self._runs, reverse=True)]

    @property
    def shapes(self) -> set[frozenset[str]]:
        """The distinct sets of kinds that jobs not held ask for (asking for nothing aside)."""
        return {kinds for kinds in self._shapes if kinds}

    @property
    def asks_nothing(self) -> bool:
        """Whether a job not held asks for no resource at all (it can start whatever is reserved)."""
        return _NOTHING in self._shapes

    @property
    def users(self) -> set[str]:
        return set(self._users)
