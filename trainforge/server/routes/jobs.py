"""``/jobs``: submit, list, look at, change (priority, hold), stop, retry and delete jobs, and a job's
Result. A change that the job's state does not allow is a 409 (the service's ``ConflictError``)."""

from __future__ import annotations

import base64
import binascii
import os
from typing import Annotated

from fastapi import APIRouter, Body, HTTPException, Query
from fastapi.responses import Response

from trainforge._internal.state_files import open_regular
from trainforge.client import JobState
from trainforge.server._schemas import (
    JobId,
    JobListOut,
    JobOut,
    JobSpecIn,
    PatchIn,
    RetryIn,
    StopIn,
    SubmitOut,
    invalid,
)
from trainforge.server.routes.access import Caller, check_priority
from trainforge.server.routes.common import ERRORS, Service, job_or_404, job_out_for

router = APIRouter()


@router.post("/jobs", status_code=201, response_model=SubmitOut,
             responses={409: {"description": "the submission_id was used for a different submission"}})  # fmt: skip
def submit(service: Service, caller: Caller, spec: JobSpecIn) -> SubmitOut:
    check_priority(caller, spec.priority, service.scheduling.policy.member_max_priority)
    blob = None
    if spec.trainer_b64 is not None:
        try:
            blob = base64.b64decode(spec.trainer_b64, validate=True)
        except (binascii.Error, ValueError):
            raise invalid(("body", "trainer_b64"), "not valid base64 (send the cloudpickled trainer, base64-encoded)") from None
    body = spec.model_dump(exclude={"trainer_b64", "name", "priority", "hold", "max_retries", "submission_id",
                                    "preemptible"})  # fmt: skip  (num_workers: the stored spec's key too)
    name = spec.name or (spec.target or os.path.basename(spec.path or "") or spec.kind)
    try:
        job, created = service.submit(
            name=name, spec=body, trainer_blob=blob, priority=spec.priority, hold=spec.hold,
            max_retries=spec.max_retries, submission_id=spec.submission_id, owner=caller.name,
            preemptible=spec.preemptible,
        )  # fmt: skip
    except ValueError as exc:  # a request that can never fit this server's capacity (or its user's quota)
        raise invalid(("body", "num_workers"), str(exc)) from None
    return SubmitOut(id=job.id, created=created, job=job_out_for(service, job))


@router.get("/jobs", response_model=JobListOut)
def list_jobs(
    service: Service,
    state: Annotated[list[JobState] | None, Query()] = None,
    before: Annotated[int | None, Query(ge=0, le=2**62)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    name: Annotated[str | None, Query(max_length=200)] = None,
    total: Annotated[bool, Query(description="also count every job the filters match (this page and older)")] = False,
) -> JobListOut:
    rows = service.store.jobs(state, before=before, limit=limit + 1, name=name)
    more = len(rows) > limit
    rows = rows[:limit]
    counted = (service.store.count(state, before=before, name=name) if more else len(rows)) if total else None
    return JobListOut(jobs=[job_out_for(service, j) for j in rows], next_before=rows[-1].id if more else None,
                      total=counted)  # fmt: skip


@router.get("/jobs/{job_id}", response_model=JobOut, responses=ERRORS)
def get_job(service: Service, job_id: JobId) -> JobOut:
    return job_out_for(service, job_or_404(service, job_id))


@router.patch("/jobs/{job_id}", response_model=JobOut, responses=ERRORS)
def patch_job(service: Service, caller: Caller, job_id: JobId, change: PatchIn) -> JobOut:
    check_priority(caller, change.priority, service.scheduling.policy.member_max_priority)
    return job_out_for(service, service.patch(job_id, priority=change.priority, hold=change.hold))


@router.post("/jobs/{job_id}/stop", response_model=JobOut, responses=ERRORS)
def stop_job(service: Service, job_id: JobId, body: Annotated[StopIn | None, Body()] = None) -> JobOut:
    body = body or StopIn()
    return job_out_for(service, service.stop(job_id, grace_s=body.grace_s, force=body.force, complete=body.complete))


@router.post("/jobs/{job_id}/retry", response_model=JobOut, responses=ERRORS)
def retry_job(service: Service, job_id: JobId, body: Annotated[RetryIn | None, Body()] = None) -> JobOut:
    checkpoint = body.checkpoint if body else None
    if checkpoint is not None and "://" not in checkpoint and not os.path.isdir(checkpoint):
        raise invalid(("body", "checkpoint"), f"{checkpoint!r} is not a directory on the server's machine: "
                      f"give one of GET /jobs/{job_id}/checkpoints")  # fmt: skip
    return job_out_for(service, service.retry(job_id, checkpoint=checkpoint))


@router.delete("/jobs/{job_id}", status_code=204, responses=ERRORS)
def delete_job(service: Service, job_id: JobId) -> Response:
    service.delete(job_id)
    return Response(status_code=204)


@router.get("/jobs/{job_id}/result", responses={**ERRORS, 200: {"content": {"application/octet-stream": {}}},
                                                 403: {"description": "the job is not the caller's (rule job.result)"}})  # fmt: skip
def result(service: Service, job_id: JobId) -> Response:
    """The run's :class:`trainforge.Result`, cloudpickled (trainer jobs, once ended), to the job's
    owner only (rule ``job.result``, checked before the route: the pickle is what the job's code
    wrote, and unpickling it runs code)."""
    job = job_or_404(service, job_id)
    if not job.state.terminal:
        raise HTTPException(409, f"job {job_id} is {job.state}: its result exists once it has ended")
    try:
        f = open_regular(service.files.result(job_id))  # the job's file: never through a link it put there
    except FileNotFoundError:
        raise HTTPException(404, f"job {job_id} ({job.kind}, {job.state}) left no Result: see its logs and events") from None
    with f:
        return Response(f.read(), media_type="application/octet-stream")
