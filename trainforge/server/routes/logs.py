"""A job's logs and live streams, and the lifecycle events: ``/jobs/{id}/logs`` (a range of its
output, or of one rank's log), ``/jobs/{id}/logs/stream`` (the log as it is written),
``/jobs/{id}/stream`` (its runs' events as they are written, from its events file), ``/jobs/{id}/events``
(its lifecycle events in the store) and ``/events`` (every job's, as one stream).

Streams are server-sent events that resume where ``Last-Event-ID`` says: a byte offset in the file
(logs, run events) or the store's sequence number (lifecycle events).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query
from fastapi.responses import StreamingResponse

from trainforge._internal.http import json_safe
from trainforge._internal.job_events import end_offset, events_with_offsets
from trainforge._internal.state_files import open_regular
from trainforge.server._schemas import EventOut, JobId, LogsOut
from trainforge.server.jobs.service import JobRow, JobService
from trainforge.server.routes.common import (
    ERRORS,
    POLL_S,
    SSE,
    Api,
    Event,
    Service,
    SignedIn,
    job_or_404,
    job_out_for,
    resume_at,
    sse_response,
)

MAX_CHUNK = 1 << 20  # bytes of a log, or of an events file, read at once

router = APIRouter()


def _log_path(service: JobService, job: JobRow, rank: int | None) -> str | None:
    if rank is None:
        return service.files.output(job.id)
    if not job.run_path or "://" in job.run_path:
        return None
    return os.path.join(job.run_path, "logs", f"rank_{rank}.log")


def _tail_offset(f: Any, size: int, lines: int) -> int:
    """Byte offset where the last ``lines`` lines of ``f`` begin, read backwards in blocks (never
    the whole file, however large)."""
    if lines <= 0 or size == 0:
        return size
    f.seek(size - 1)
    trailing = f.read(1) == b"\n"  # the newline ending the last line does not start another
    seen, pos = 0, size
    while pos > 0:
        step = min(65536, pos)
        pos -= step
        f.seek(pos)
        block = f.read(step)
        i = len(block)
        while (i := block.rfind(b"\n", 0, i)) >= 0:
            if trailing and pos + i == size - 1:
                continue
            seen += 1
            if seen == lines:
                return pos + i + 1
    return 0


def _read_range(path: str | None, offset: int | None, tail: int | None) -> LogsOut:
    try:
        f = open_regular(path) if path is not None else None  # a job's file: never through a link it put there
    except FileNotFoundError:
        f = None
    if f is None:
        return LogsOut(text="", offset=0, next_offset=0, size=0, path=path)
    with f:
        size = os.fstat(f.fileno()).st_size
        if offset is None:
            offset = 0 if tail is None else _tail_offset(f, size, tail)
        offset = min(max(0, offset), size)
        f.seek(offset)
        data = f.read(min(MAX_CHUNK, size - offset))
    return LogsOut(text=data.decode("utf-8", "replace"), offset=offset, next_offset=offset + len(data), size=size, path=path)


@router.get("/jobs/{job_id}/logs", response_model=LogsOut, responses=ERRORS)
def logs(
    service: Service,
    job_id: JobId,
    rank: Annotated[int | None, Query(ge=0, le=100_000)] = None,
    offset: Annotated[int | None, Query(ge=0, le=2**62)] = None,
    tail: Annotated[int | None, Query(ge=0, le=1_000_000)] = None,
) -> LogsOut:
    job = job_or_404(service, job_id)
    return _read_range(_log_path(service, job, rank), offset, tail)


@router.get("/jobs/{job_id}/logs/stream", response_class=StreamingResponse, responses={**ERRORS, **SSE})
def logs_stream(
    api: Api,
    signed_in: SignedIn,
    job_id: JobId,
    rank: Annotated[int | None, Query(ge=0, le=100_000)] = None,
    offset: Annotated[int | None, Query(ge=0, le=2**62)] = None,
    tail: Annotated[int | None, Query(ge=0, le=1_000_000)] = None,
    last_event_id: Annotated[str | None, Header(max_length=32)] = None,
) -> StreamingResponse:
    """Log text as it is written (``data``: ``{"text": ...}``; ``id``: the byte offset after it),
    then an ``end`` event once the job has ended and the log is read to its end."""
    service = api.service
    job = job_or_404(service, job_id)
    start = resume_at(last_event_id, -1)
    if start < 0:
        start = _read_range(_log_path(service, job, rank), offset, tail).offset

    async def log_events(pos: int) -> AsyncGenerator[Event | None, None]:
        while True:
            job = await api.read_off_loop(service.get, job_id)
            chunk = _read_range(_log_path(service, job, rank), pos, None)
            if chunk.text:
                pos = chunk.next_offset
                yield "log", pos, {"text": chunk.text}
                continue
            if job.state.terminal:
                yield "end", pos, {"state": job.state, "exit_code": job.exit_code}
                return
            yield None
            await asyncio.sleep(POLL_S)

    return sse_response(log_events(start), signed_in)


@router.get("/jobs/{job_id}/stream", response_class=StreamingResponse, responses={**ERRORS, **SSE})
def job_stream(
    api: Api,
    signed_in: SignedIn,
    job_id: JobId,
    start: Literal["begin", "end"] = "begin",
    offset: Annotated[int | None, Query(ge=0, le=2**62)] = None,
    last_event_id: Annotated[str | None, Header(max_length=32)] = None,
) -> StreamingResponse:
    """The job's run events as its runs write them (``event``: run_start | report | restart |
    run_end; ``data``: the event; ``id``: byte offset in its events file), then ``end`` (the job).
    ``start=end``: only what comes from now on (to wait for the end); ``offset``: from that byte
    offset (``next_offset`` of ``/series``: a chart loaded from it goes on without a gap)."""
    service = api.service
    job_or_404(service, job_id)
    path = service.files.events(job_id)
    first = offset if offset is not None else end_offset(path) if start == "end" else 0

    async def run_events(pos: int) -> AsyncGenerator[Event | None, None]:
        while True:
            job = await api.read_off_loop(service.get, job_id)
            batch, after = events_with_offsets(path, pos, limit=MAX_CHUNK)
            for end, event in batch:
                yield str(event.get("type", "event")), end, json_safe(event)
            if after > pos:  # read on at once: more may be there already
                pos = after
                continue
            if job.state.terminal:
                yield "end", pos, job_out_for(service, job).model_dump()
                return
            yield None
            await asyncio.sleep(POLL_S)

    return sse_response(run_events(resume_at(last_event_id, first)), signed_in)


@router.get("/jobs/{job_id}/events", response_model=list[EventOut], responses=ERRORS)
def job_events(
    service: Service, job_id: JobId, after: Annotated[int, Query(ge=0, le=2**62)] = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> list[EventOut]:  # fmt: skip
    job_or_404(service, job_id)
    return [EventOut(**e.__dict__) for e in service.store.events_after(after, job_id, limit)]


@router.get("/events", response_class=StreamingResponse, responses=SSE)
def events(
    api: Api,
    signed_in: SignedIn,
    after: Annotated[int | None, Query(ge=0, le=2**62)] = None,
    last_event_id: Annotated[str | None, Header(max_length=32)] = None,
) -> StreamingResponse:
    """Every job's lifecycle events (``event``: submitted, starting, running, run_start, restart,
    stopping, ended, lost, requeued, ...; ``id``: the sequence number). Without ``after`` or
    ``Last-Event-ID`` it starts at the next event."""
    store = api.service.store
    seq = resume_at(last_event_id, after if after is not None else store.last_seq)

    async def store_events(seq: int) -> AsyncGenerator[Event | None, None]:
        while True:
            # A query only once the store has committed an event after seq (it counts them itself).
            batch = await api.read_off_loop(store.events_after, seq) if store.last_seq > seq else []
            for e in batch:
                seq = e.seq
                yield e.type, e.seq, EventOut(**e.__dict__).model_dump()
            if not batch:
                yield None
                await asyncio.sleep(POLL_S)

    return sse_response(store_events(seq), signed_in)
