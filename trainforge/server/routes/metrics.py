"""What a job measured: ``/jobs/{id}/metrics`` (rank 0's reports, in order), ``/jobs/{id}/series``
(its metrics as chart series, downsampled on the server), ``/jobs/{id}/checkpoints`` (the reported
checkpoints still on storage) and ``/jobs/{id}/usage`` (what its processes use now). All read the
job's events file with the one reader of :mod:`trainforge._internal.job_events`."""

from __future__ import annotations

import os
from typing import Annotated, Any

from fastapi import APIRouter, Query

from trainforge._internal.http import json_safe
from trainforge._internal.job_events import Segments, read_events
from trainforge.server._schemas import JobId, invalid
from trainforge.server.jobs.service import JobService
from trainforge.server.routes.common import ERRORS, Api, Service, job_or_404
from trainforge.server.routes.experiments import ExperimentsDep

router = APIRouter()


def _reports(service: JobService, job_id: int, after: int, limit: int) -> dict[str, Any]:
    job_or_404(service, job_id)
    rows: list[dict[str, Any]] = []
    segments = Segments()
    events, _ = read_events(service.files.events(job_id))
    for event in events:
        seg = segments.add(event)
        n = segments.reports - 1
        if seg is not None and n > after and len(rows) < limit:
            where = segments.segments[seg]
            rows.append({"seq": n, "run": where["run"], "job_attempt": where["job_attempt"],
                         "index": event.get("index"), "attempt": event.get("attempt"), "t": event.get("t"),
                         "metrics": json_safe(event.get("metrics")), "checkpoint": event.get("checkpoint")})  # fmt: skip
    return {"reports": rows, "next_after": rows[-1]["seq"] if rows else after}


@router.get("/jobs/{job_id}/metrics", responses=ERRORS)
def metrics(
    service: Service,
    job_id: JobId,
    after: Annotated[int, Query(ge=-1, le=2**62)] = -1,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000,
) -> dict[str, Any]:
    """Rank 0's reports of the job's runs, in order: ``{"reports": [{"seq", "run", "job_attempt",
    "index", "attempt", "t", "metrics", "checkpoint"}], "next_after"}`` (pass ``next_after`` as
    ``?after=``). ``job_attempt``: the job's attempt that made it (as the job's ``attempt``);
    ``attempt``: its run's restart count."""
    return _reports(service, job_id, after, limit)


@router.get("/jobs/{job_id}/series", responses=ERRORS)
def series(
    api: Api,
    ex: ExperimentsDep,
    job_id: JobId,
    points: Annotated[int, Query(ge=1, le=100_000)] = 2000,
    key: Annotated[list[str] | None, Query(max_length=1000)] = None,
    start: Annotated[int, Query(ge=0, le=2**62)] = 0,
    end: Annotated[int | None, Query(ge=0, le=2**62)] = None,
) -> dict[str, Any]:
    """Rank 0's metrics as chart series, each cut into at most ``points`` buckets of consecutive
    reports with their ``min``, ``max`` and ``last`` value (NaN/inf/missing: no value; an empty
    bucket is null) and the step index ``i`` and time ``t`` of each bucket's last report; ``n``
    reports in all; ``next_offset``: where the job's event stream goes on from. No bucket spans two
    ``segments`` (each run's start, the job's next attempt included, and each restart: their
    ``job_attempt``, ``run`` and ``attempt``); each bucket's ``segment`` says which it is of. ``key``
    (repeatable) picks keys; ``start``..``end`` (step indices, inclusive) a range, for a chart that zooms."""
    job_or_404(api.service, job_id)
    if end is not None and end < start:
        raise invalid(("query", "end"), f"end={end} is before start={start}: give start <= end")
    cut = ex.cut_of(job_id)  # a Tune trial its tuner stopped (at a rung): its later reports are not the trial's
    if cut is not None:
        end = cut - 1 if end is None else min(end, cut - 1)
    return api.series.series(job_id, api.service.files.events(job_id), points, key, start, end)


@router.get("/jobs/{job_id}/usage", responses=ERRORS)
def usage(service: Service, job_id: JobId) -> dict[str, Any]:
    """What the job's processes use now, sampled every second: ``processes`` (pid, role: runner |
    worker | other, cpu_percent, rss bytes, threads, and gpu_memory bytes / gpu_util % with
    NVML), ``total``, ``history`` (totals, the last 10 minutes), ``gpu`` ("ok" or why not)."""
    job_or_404(service, job_id)
    return service.usage.usage(job_id)


def checkpoint_size(path: str) -> int | None:
    """Bytes in a checkpoint directory (local or any fsspec URL); None when storage fails to say."""
    if "://" not in path:
        total = 0
        for root, _, files in os.walk(path):
            for name in files:
                try:
                    total += os.path.getsize(os.path.join(root, name))
                except OSError:
                    pass
        return total
    try:
        import fsspec

        fs, root = fsspec.core.url_to_fs(path)
        return int(fs.du(root))
    except Exception:  # noqa: BLE001 - remote storage may refuse; the page shows no size then
        return None


@router.get("/jobs/{job_id}/checkpoints", responses=ERRORS)
def checkpoints(api: Api, job_id: JobId) -> dict[str, Any]:
    """The checkpoints the job's runs reported that are still on storage, oldest first, each
    with its ``size`` in bytes (None where storage would not say)."""
    rows = [r for r in _reports(api.service, job_id, -1, 100_000)["reports"] if r["checkpoint"]]
    rows = [r for r in rows if "://" in r["checkpoint"] or os.path.exists(r["checkpoint"])]
    sizes = api.checkpoint_sizes  # a committed checkpoint never changes: its size is read once
    for r in rows:
        if r["checkpoint"] not in sizes:
            sizes[r["checkpoint"]] = checkpoint_size(r["checkpoint"])
        r["size"] = sizes[r["checkpoint"]]
    return {"checkpoints": rows}
