"""The server as a whole: ``/queue`` (the waiting jobs in start order, with why each waits, a page
at a time), ``/resources`` (capacity, grants, free, who holds which GPU), ``/health`` and ``/version``."""

from __future__ import annotations

import os
import time
from typing import Annotated

from fastapi import APIRouter, Query

import trainforge
from trainforge.client import ACTIVE_STATES, WAITING_STATES
from trainforge.server._schemas import HealthOut, QueueEntryOut, QueueListOut, ResourcesOut, pending_out
from trainforge.server.routes.common import Service

router = APIRouter()


@router.get("/health", response_model=HealthOut)
def health(service: Service) -> HealthOut:
    counts = {s.value: service.store.count([s]) for s in (*WAITING_STATES, *ACTIVE_STATES)}
    return HealthOut(status="ok", version=trainforge.__version__, pid=os.getpid(),
                     uptime_s=time.time() - service.started_at, jobs=counts,
                     warm_pool=service.processes.warm_pool)  # fmt: skip


@router.get("/queue", response_model=QueueListOut)
def queue(
    service: Service,
    offset: Annotated[int, Query(ge=0, le=2**31, description="how many waiting jobs to skip, in start order")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> QueueListOut:
    """A page of the waiting jobs in start order, with why each waits. Paged by place in the queue
    (not by id, as ``/jobs``: the order is by priority and fair share and changes at every decision),
    and only the page's reasons are worked out: a page of a 10,000-job queue costs what one of ten does."""
    page, total = service.queue_page(offset, limit)
    jobs = service.store.names([p.job_id for p in page])  # one query for the page
    entries = [QueueEntryOut(job_id=p.job_id, name=jobs[p.job_id][0], priority=jobs[p.job_id][1], pending=pending)
               for p in page if p.job_id in jobs and (pending := pending_out(p))]  # fmt: skip
    return QueueListOut(entries=entries, next_offset=offset + limit if offset + limit < total else None, total=total)


@router.get("/resources", response_model=ResourcesOut)
def resources(service: Service) -> ResourcesOut:
    grants = service.grants()
    granted: dict[str, float] = {}
    for g in grants.values():
        for k, v in g["grant"].items():
            granted[k] = granted.get(k, 0.0) + v
    return ResourcesOut(
        capacity=service.capacity, granted=granted, free=service.free(),
        jobs={str(j): g for j, g in grants.items()}, gpus=service.gpu_owners(),
        decision_ms=service.last_decision_s * 1e3, policies=service.scheduling.describe(),
    )  # fmt: skip


@router.get("/version")
def version() -> dict[str, str]:
    return {"version": trainforge.__version__}
