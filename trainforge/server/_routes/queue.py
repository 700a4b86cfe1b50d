"""The server as a whole: ``/queue`` (the waiting jobs in start order, with why each waits),
``/resources`` (capacity, grants, free, who holds which GPU), ``/health`` and ``/version``."""

from __future__ import annotations

import os
import time

from fastapi import APIRouter

import trainforge
from trainforge.server._routes.common import Service
from trainforge.server._schemas import HealthOut, QueueEntryOut, ResourcesOut, pending_out
from trainforge.server._state import ACTIVE_STATES, WAITING_STATES

router = APIRouter()


@router.get("/health", response_model=HealthOut)
def health(service: Service) -> HealthOut:
    counts = {s.value: service.store.count([s]) for s in (*WAITING_STATES, *ACTIVE_STATES)}
    return HealthOut(status="ok", version=trainforge.__version__, pid=os.getpid(),
                     uptime_s=time.time() - service.started_at, jobs=counts,
                     warm_pool=service.warm_pool)  # fmt: skip


@router.get("/queue", response_model=list[QueueEntryOut])
def queue(service: Service) -> list[QueueEntryOut]:
    waiting = {j.id: j for j in service.store.jobs(WAITING_STATES)}  # one query, not one per job
    out = []
    for p in service.queue():
        job = waiting.get(p.job_id)
        pending = pending_out(p)
        if job is not None and pending is not None:
            out.append(QueueEntryOut(job_id=job.id, name=job.name, priority=job.priority, pending=pending))
    return out


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
        decision_ms=service.last_decision_s * 1e3,
    )  # fmt: skip


@router.get("/version")
def version() -> dict[str, str]:
    return {"version": trainforge.__version__}
