"""``Elastic``: the sizes of the running elastic jobs (those asking for ``workers`` up to
``max_workers``). The workers such a job runs above its minimum are lent: they grow into resources
no waiting job lacks (:meth:`Elastic.grow`) and are asked back when the first waiting job needs them
(:meth:`Elastic.shrink`). Asking is writing the job's grant file (:meth:`JobFiles.write_grant`): the core
re-reads it at every sizing decision and resizes the group at its next committed checkpoint, so no
work is lost; the job's events then say it runs at the new size (:meth:`Elastic.resized`).

What a job holds, and which GPUs, is the :class:`~trainforge.server.scheduling.ledger.ResourceLedger`'s:
a grow or a shrink is a :meth:`~trainforge.server.scheduling.ledger.ResourceLedger.resize` there at
``now`` (its user is charged the new size from then on). Called under the service's lock.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from trainforge.client import JobEvent
from trainforge.server.jobs.files import JobFiles
from trainforge.server.jobs.tailer import Sized
from trainforge.server.scheduling.ledger import ResourceLedger
from trainforge.server.scheduling.rule import JobRequest
from trainforge.server.store.database import JobRow, JobStore

_EPS = 1e-9


class Elastic:
    def __init__(self, ledger: ResourceLedger, store: JobStore, files: JobFiles, get_job: Callable[[int], JobRow]):
        self.ledger = ledger
        self.store = store
        self.files = files
        self._get_job = get_job
        self.shapes: dict[int, tuple[JobRequest, int]] = {}  # running elastic jobs: request, workers
        # Running elastic jobs asked to shrink (by shrink): job id -> target workers. Their grant file
        # says the target; their grant here still counts their current workers until resized sees
        # them run within it. Empty after a server restart (see resized).
        self.shrinking: dict[int, int] = {}
        self.world: dict[int, int] = {}  # running elastic jobs' group sizes, as their latest events show

    def track(self, job_id: int, request: JobRequest, workers: int) -> None:
        """A job that runs with ``workers``: followed if it is elastic."""
        if request.upper_workers > request.min_workers:
            self.shapes[job_id] = (request, workers)

    def forget(self, job_id: int) -> None:
        self.shapes.pop(job_id, None)
        self.shrinking.pop(job_id, None)
        self.world.pop(job_id, None)

    def shrink(self, waiting: JobRequest | None, now: float) -> None:
        """Take lent workers back for ``waiting``, the first waiting job that is not held (the
        decision's ``blocked``): when it lacks resources that extras hold, the lending jobs (lowest
        priority first, then newest first) are asked to shrink, never below their minimum, just
        enough for it to fit, counting what jobs already shrinking will give back; if all the extras
        together are not enough, nobody is asked. Asking writes the smaller grant file (a job that
        never checkpoints gives nothing back until it ends) and records a ``shrink`` event; the
        grant here shrinks only once the job runs within it (:meth:`resized`). Only the first
        blocked job is looked at, so this stays cheap however long the queue."""
        if waiting is None or not self.shapes:
            return
        free = self.ledger.free()
        for job_id, target in self.shrinking.items():  # what shrinks under way will give back
            request, workers = self.shapes[job_id]
            for k, v in request.per_worker.items():
                free[k] = free.get(k, 0.0) + (workers - target) * v
        lacking = {k: v - free.get(k, 0.0) for k, v in waiting.min_request.items() if v > free.get(k, 0.0) + _EPS}
        if not lacking:
            return  # the shrinks under way will make room
        lenders = sorted(
            (job_id for job_id, (request, workers) in self.shapes.items()
             if job_id not in self.shrinking and workers > request.min_workers
             and any(request.per_worker.get(k, 0.0) > 0 for k in lacking)),
            key=lambda job_id: (self.shapes[job_id][0].priority, -job_id),
        )  # fmt: skip
        targets: list[tuple[int, int]] = []
        for job_id in lenders:
            request, workers = self.shapes[job_id]
            need = [math.ceil(left / request.per_worker[k] - _EPS) for k, left in lacking.items()
                    if request.per_worker.get(k, 0.0) > 0]  # fmt: skip
            if not need:
                continue
            give = min(workers - request.min_workers, max(need))
            targets.append((job_id, workers - give))
            for k in list(lacking):
                lacking[k] -= give * request.per_worker.get(k, 0.0)
                if lacking[k] <= _EPS:
                    del lacking[k]
            if not lacking:
                break
        if lacking:
            return  # not enough even from all of them: shrinking would only slow them down
        for job_id, target in targets:
            request, _ = self.shapes[job_id]
            self.files.write_grant(job_id, request, target)
            self.shrinking[job_id] = target
            self.store.update(job_id, JobEvent.SHRINK, {"workers": target, "for_job": waiting.job_id})

    def lendable(self) -> dict[int, dict[str, float]]:
        """What each running elastic job holds above its minimum (its lent workers)."""
        return {job_id: {k: (workers - request.min_workers) * v for k, v in request.per_worker.items()}
                for job_id, (request, workers) in self.shapes.items() if workers > request.min_workers}  # fmt: skip

    def grow(self, reserved: set[str], headroom: Callable[[int], dict[str, float] | None] | None, now: float) -> None:
        """Running elastic jobs below their maximum take free resources that no waiting job lacks:
        their grant file grows, and the core resizes the group at its next checkpoint (it re-reads
        the file at every sizing decision). Growing only into what no waiting job lacks
        (``reserved``: the kinds they lack) is what keeps grow and :meth:`shrink` from ping-ponging;
        a job being shrunk does not grow. ``headroom(job_id)``: how much more its user's quota lets it
        hold, by kind (None: no limit); ``now``: when (what grows is charged from then)."""
        free = self.ledger.free()
        for job_id in sorted(self.shapes):
            request, workers = self.shapes[job_id]
            kinds = {k for k, v in request.per_worker.items() if v > 0}
            if workers >= request.upper_workers or kinds & reserved or job_id in self.shrinking:
                continue
            room = headroom(job_id) if headroom is not None else None
            extra = 0
            while workers + extra < request.upper_workers and all(
                min(free.get(k, 0.0), (room or {}).get(k, math.inf)) + 1e-9 >= (extra + 1) * v
                for k, v in request.per_worker.items()
            ):
                extra += 1
            if not extra:
                continue
            workers += extra
            grant = request.request(workers)
            for k, v in request.per_worker.items():
                free[k] = free.get(k, 0.0) - extra * v
            self.shapes[job_id] = (request, workers)
            self.ledger.resize(job_id, grant, now)
            self.files.write_grant(job_id, request, workers)
            self.store.update(job_id, JobEvent.GROW, {"workers": workers, "grant": grant}, workers=workers, grant=grant)

    def has_news(self, job_id: int, sized: Sized) -> bool:
        """Whether :meth:`resized` has anything to look at (most passes of the tailer: no), without
        the service's lock."""
        return sized.news or sized.resized is not None or job_id in self.shrinking

    def resized(self, job_id: int, sized: Sized, now: float) -> bool:
        """What the job's new events show of its group size (under the service's lock). Its grant
        here shrinks, and True is returned (the resources it gave back go to the waiting jobs: the
        caller schedules), when it resized to fewer workers than it holds (the shrink asked for;
        after a server restart ``shrinking`` is empty, but the grant file it resized to still said
        the smaller size), or when it was asked to shrink to a size it already runs within (a grow
        it had not applied yet). A grow resize needs nothing: its grant grew first. Recorded as a
        ``shrunk`` event; its user is charged the smaller grant from ``now``."""
        shape = self.shapes.get(job_id)
        if shape is None:
            return False
        if sized.news:
            if sized.world is None:
                self.world.pop(job_id, None)
            else:
                self.world[job_id] = sized.world
        request, granted = shape
        target = self.shrinking.get(job_id)
        if sized.resized is not None and sized.resized < granted:
            workers = sized.resized
        elif target is not None and self.world.get(job_id, granted) <= target:
            workers = target
        else:
            return False
        if target is not None and workers <= target:
            del self.shrinking[job_id]
        grant = request.request(workers)
        self.shapes[job_id] = (request, workers)
        fields: dict[str, Any] = {"workers": workers, "grant": grant}
        keep = math.ceil(grant.get("GPU", 0.0) - 1e-9)
        gpu_ids = self.ledger.gpu_ids(job_id)
        kept = None
        if len(gpu_ids) > keep:  # its workers use the first of its CUDA_VISIBLE_DEVICES: free the rest
            kept = [g for g in self._get_job(job_id).gpu_ids or [] if g in gpu_ids][:keep]
            fields["gpu_ids"] = kept
        self.ledger.resize(job_id, grant, now, gpu_ids=kept)
        self.store.update(job_id, JobEvent.SHRUNK, {"workers": workers, "grant": grant}, **fields)
        return True
