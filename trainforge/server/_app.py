"""The train server's HTTP API: FastAPI under ``/api/v1`` (OpenAPI at ``/api/v1/openapi.json``).

Every request needs the server's token (``Authorization: Bearer <token>``, or the server's own
``trainforge_token_<server id>`` cookie the dashboard sets); the ``Host`` header must name this server
(no DNS rebinding); a state-changing request must come from this server's own origin (scheme, host
and port) and send JSON (:mod:`trainforge._internal.http.guard`). Bad input is
answered by the schema (422 naming the field), an unknown job by 404, a change that the job's state
does not allow by 409; never a 500.

Live data is server-sent events: ``GET /events`` (every job's lifecycle, ``id`` = the event's
sequence number), ``GET /jobs/{id}/stream`` (one job's runs, reports and restarts from its events
file, ``id`` = byte offset, ending with an ``end`` event once the job has ended) and
``GET /jobs/{id}/logs/stream`` (``id`` = byte offset). Each resumes where ``Last-Event-ID`` says.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any, Literal, TypeVar

import anyio
from fastapi import Body, FastAPI, Header, HTTPException, Path, Query, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)
from starlette.exceptions import HTTPException as StarletteHTTPException

import trainforge
from trainforge._internal.http import Guard, GuardPolicy
from trainforge._internal.job_events import Segments, read_events
from trainforge._internal.json_depth import too_deep_detail
from trainforge.server import _store as st
from trainforge.server._runner import EVENTS_FILE, OUTPUT_FILE, RESULT_FILE
from trainforge.server._scheduler import Pending
from trainforge.server._series import SeriesCache
from trainforge.server._service import ConflictError, JobService, NotFoundError

API_PREFIX = "/api/v1"
_POLL_S = 0.1
_MAX_LOG_CHUNK = 1 << 20

KindName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:/-]+$")]
Amount = Annotated[float, Field(ge=0, le=1e15, allow_inf_nan=False)]
JobId = Annotated[int, Path(ge=0, le=2**62, description="the job's id")]
ConfigKey = Annotated[str, Field(min_length=1, max_length=200)]
# A JSON scalar kept as the type it was sent as: strict, so 0 stays 0 (not False) and "0" stays text.
ConfigValue = Annotated[
    StrictBool | StrictInt | StrictFloat | Annotated[StrictStr, Field(max_length=1000)] | None,
    Field(union_mode="left_to_right"),
]
StateName = Literal["QUEUED", "HELD", "STARTING", "RUNNING", "STOPPING", "SUCCEEDED", "FAILED", "STOPPED", "LOST"]


class JobSpecIn(BaseModel):
    """A job to queue. ``kind``: ``trainer`` (``trainer_b64``: the cloudpickled trainer, as
    ``trainer.submit()`` sends it), ``script`` (``path`` run as ``__main__`` with ``args``) or
    ``function`` (``target`` ``"pkg.module:function"`` returning a trainer). The request is
    ``workers`` (the minimum, all started at once) up to ``max_workers``, ``per_worker`` resources
    each, plus the job's ``driver``."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["trainer", "script", "function"]
    name: str | None = Field(default=None, max_length=200)
    trainer_b64: str | None = Field(default=None, max_length=512 * 1024 * 1024)
    path: str | None = Field(default=None, min_length=1, max_length=4096)
    target: str | None = Field(default=None, max_length=512, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    args: list[Annotated[str, Field(max_length=65536)]] = Field(default_factory=list, max_length=1000)
    cwd: str | None = Field(default=None, min_length=1, max_length=4096)
    sys_path: list[Annotated[str, Field(max_length=4096)]] = Field(default_factory=list, max_length=100)
    env: dict[Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")],
              Annotated[str, Field(max_length=65536)]] = Field(default_factory=dict)  # fmt: skip
    workers: int = Field(default=1, ge=1, le=100_000)
    max_workers: int | None = Field(default=None, ge=1, le=100_000)
    per_worker: dict[KindName, Amount] = Field(default_factory=lambda: {"CPU": 1.0})
    driver: dict[KindName, Amount] = Field(default_factory=dict)
    priority: int = Field(default=0, ge=-1_000_000, le=1_000_000)
    hold: bool = False
    max_retries: int = Field(default=1, ge=0, le=100)
    submission_id: str | None = Field(default=None, min_length=1, max_length=200)
    config: dict[ConfigKey, ConfigValue] = Field(default_factory=dict, max_length=500, description=(
        "the job's configuration as flat scalars (nested keys joined by '/'), e.g. the trainer's "
        "train_loop_config: shown on the job page, and what the compare page groups jobs by"))

    @model_validator(mode="after")
    def _kind_fields(self) -> JobSpecIn:
        need = {"trainer": "trainer_b64", "script": "path", "function": "target"}[self.kind]
        if getattr(self, need) is None:
            raise ValueError(f"kind={self.kind!r} needs the field {need!r}")
        if self.max_workers is not None and self.max_workers < self.workers:
            raise ValueError(f"max_workers={self.max_workers} is less than workers={self.workers}")
        return self

    @field_validator("path", "cwd")
    @classmethod
    def _no_nul(cls, v: str | None) -> str | None:
        if v is not None and "\0" in v:
            raise ValueError("must not contain NUL characters")
        return v


class PendingOut(BaseModel):
    reason: Literal["held", "resources", "reserved"]
    position: int | None
    text: str
    need: dict[str, float] = Field(default_factory=dict)
    free: dict[str, float] = Field(default_factory=dict)
    behind: int | None = None


class JobOut(BaseModel):
    id: int
    name: str
    kind: str
    state: str
    priority: int
    pending: PendingOut | None
    submitted_at: float
    started_at: float | None
    ended_at: float | None
    attempt: int
    max_retries: int
    request: dict[str, Any]
    grant: dict[str, float] | None
    workers: int | None
    gpu_ids: list[str] | None
    pid: int | None
    run_path: str | None
    exit_code: int | None
    failure_class: str | None
    error: str | None
    reports: int
    last_metrics: dict[str, Any] | None
    config: dict[str, Any]


class JobListOut(BaseModel):
    jobs: list[JobOut]
    next_before: int | None = Field(description="pass as ?before= for the next (older) page; null at the end")


class SubmitOut(BaseModel):
    id: int
    created: bool
    job: JobOut


class PatchIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    priority: int | None = Field(default=None, ge=-1_000_000, le=1_000_000)
    hold: bool | None = None


class RetryIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    checkpoint: str | None = Field(default=None, min_length=1, max_length=4096, description=(
        "start the new attempt from this checkpoint (a path or URL, e.g. one of GET /jobs/{id}/checkpoints) "
        "instead of continuing the last run from its latest one"))


class StopIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    grace_s: float | None = Field(default=None, ge=0, le=3600, allow_inf_nan=False)
    force: bool = False


class LogsOut(BaseModel):
    text: str
    offset: int = Field(description="byte offset of the first byte of text")
    next_offset: int = Field(description="byte offset after text: pass as ?offset= to read on")
    size: int
    path: str | None


class EventOut(BaseModel):
    seq: int
    job_id: int
    ts: float
    type: str
    payload: dict[str, Any]


class QueueEntryOut(BaseModel):
    job_id: int
    name: str
    priority: int
    pending: PendingOut


class ResourcesOut(BaseModel):
    capacity: dict[str, float]
    granted: dict[str, float]
    free: dict[str, float]
    jobs: dict[str, dict[str, Any]] = Field(description="job id -> its grant and GPU ids")
    gpus: dict[str, int] = Field(description="GPU id -> the job holding it")
    decision_ms: float


class HealthOut(BaseModel):
    status: Literal["ok"]
    version: str
    pid: int
    uptime_s: float
    jobs: dict[str, int]
    warm_pool: dict[str, Any] = Field(
        default_factory=dict, description="the warm fork server jobs' processes start from: enabled, ready, pid"
    )


def _pending_out(p: Pending | None) -> PendingOut | None:
    if p is None:
        return None
    return PendingOut(reason=p.reason, position=p.position, text=p.describe(), need=p.need, free=p.free, behind=p.behind)


def job_out(service: JobService, job: st.JobRow) -> JobOut:
    spec = job.spec
    request = {
        "workers": spec.get("min_workers", 1),
        "max_workers": spec.get("max_workers"),
        "per_worker": spec.get("per_worker", {}),
        "driver": spec.get("driver", {}),
    }
    return JobOut(
        id=job.id, name=job.name, kind=job.kind, state=job.state, priority=job.priority,
        pending=_pending_out(service.pending(job.id)) if job.state in st.WAITING_STATES else None,
        submitted_at=job.submitted_at, started_at=job.started_at, ended_at=job.ended_at, attempt=job.attempt,
        max_retries=job.max_retries, request=request, grant=job.grant, workers=job.workers, gpu_ids=job.gpu_ids,
        pid=job.pid, run_path=job.run_path, exit_code=job.exit_code, failure_class=job.failure_class,
        error=job.error, reports=job.reports, last_metrics=_finite(job.last_metrics),
        config=_finite(spec.get("config") or {}),
    )  # fmt: skip


def _finite(value: Any) -> Any:
    """JSON has no NaN/inf: they become strings ("nan", "inf")."""
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


_Event = tuple[str, int, Any]  # (event, id, data)
_T = TypeVar("_T")
_KEEPALIVE_S = 15.0


def _sse_response(events: AsyncIterator[_Event | None]) -> StreamingResponse:
    """Server-sent events from ``events`` (``None``: nothing new; a comment goes out every 15 s so
    proxies keep an idle stream open). A client that goes away just ends the generator."""

    async def body() -> AsyncIterator[bytes]:
        last = time.monotonic()
        async for item in events:
            now = time.monotonic()
            if item is None:
                if now - last >= _KEEPALIVE_S:
                    last = now
                    yield b": keepalive\n\n"
                continue
            last = now
            event, ident, data = item
            yield f"event: {event}\nid: {ident}\ndata: {json.dumps(data, default=str)}\n\n".encode()

    return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _invalid(loc: tuple[str, ...], msg: str) -> RequestValidationError:
    """A 422 in the same shape as the schema's own (``detail``: a list of ``{loc, msg, type}``)."""
    return RequestValidationError([{"type": "value_error", "loc": loc, "msg": msg}])


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


def _resume_at(last_event_id: str | None, default: int) -> int:
    if last_event_id is None:
        return default
    try:
        return max(0, int(last_event_id))
    except ValueError:
        raise _invalid(
            ("header", "last-event-id"), f"Last-Event-ID={last_event_id!r} must be an integer (an id this stream sent)"
        ) from None


def _job_or_404(service: JobService, job_id: int) -> st.JobRow:
    try:
        return service.get(job_id)
    except NotFoundError as exc:
        raise HTTPException(404, str(exc)) from None


def _log_path(service: JobService, job: st.JobRow, rank: int | None) -> str | None:
    if rank is None:
        return os.path.join(service.job_dir(job.id), OUTPUT_FILE)
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


def _complete_size(path: str) -> int:
    """Offset after the file's last complete line (0 if there is none or no file)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            pos = max(0, size - 65536)
            while True:
                f.seek(pos)
                block = f.read(size - pos)
                i = block.rfind(b"\n")
                if i >= 0:
                    return pos + i + 1
                if pos == 0:
                    return 0
                size, pos = pos, max(0, pos - 65536)
    except FileNotFoundError:
        return 0


def _read_range(path: str | None, offset: int | None, tail: int | None) -> LogsOut:
    if path is None or not os.path.exists(path):
        return LogsOut(text="", offset=0, next_offset=0, size=0, path=path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if offset is None:
            offset = 0 if tail is None else _tail_offset(f, size, tail)
        offset = min(max(0, offset), size)
        f.seek(offset)
        data = f.read(min(_MAX_LOG_CHUNK, size - offset))
    return LogsOut(text=data.decode("utf-8", "replace"), offset=offset, next_offset=offset + len(data), size=size, path=path)


def cookie_name(server_id: str) -> str:
    """The dashboard's token cookie of the server with ``server_id``: a name of its own, so two servers
    on one host (cookies ignore the port) never overwrite each other's."""
    return f"trainforge_token_{server_id}"


def make_app(service: JobService, *, token: str, allowed_hosts: set[str], registry: str | None = None,
             tls: bool = False) -> Any:  # fmt: skip
    """The guarded ASGI app and the FastAPI app inside it; ``registry``: the model registry's URI
    (None: ``Registry()``'s default), see :mod:`trainforge.server._models`. The guard is
    :mod:`trainforge._internal.http.guard` (token, Host, whole Origin, JSON-only changes)."""
    app = FastAPI(
        title="trainforge train server",
        version=trainforge.__version__,
        openapi_url=f"{API_PREFIX}/openapi.json",
        docs_url=f"{API_PREFIX}/docs",
        redoc_url=None,
        responses={400: {"description": "a body that cannot be parsed (not JSON, or not UTF-8)"},
                   415: {"description": "a state-changing request whose body is not JSON (Content-Type: "
                                        "application/json)"}},  # fmt: skip
        description="Queues training jobs and runs them by the resources they ask for. Submitting a job runs "
        "code as the server's user.",
    )
    errors: dict[int | str, dict[str, Any]] = {
        404: {"description": "no such job"},
        409: {"description": "not allowed in the job's state"},
    }

    @app.exception_handler(RequestValidationError)
    async def _unprocessable(request: Request, exc: RequestValidationError) -> Response:
        # FastAPI's own handler echoes each bad value back ("input"), which fails to render for NaN or a
        # lone surrogate (a 500): name the field and the problem, without the value.
        errors = [{"type": e.get("type", "value_error"), "loc": list(e.get("loc", ())), "msg": str(e.get("msg", ""))}
                  for e in exc.errors()]  # fmt: skip
        body = json.dumps({"detail": errors}, ensure_ascii=True, default=str)
        return Response(body, status_code=422, media_type="application/json")

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        # FastAPI answers a body it cannot decode with 400 "There was an error parsing the body"; one
        # that nests past what Python's decoder can recurse into (RecursionError) is told why.
        if isinstance(exc.__cause__, RecursionError):
            return JSONResponse({"detail": too_deep_detail()}, status_code=400)
        return await http_exception_handler(request, exc)

    @app.exception_handler(NotFoundError)
    async def _not_found(request: Request, exc: NotFoundError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=404)

    @app.exception_handler(ConflictError)
    async def _conflict(request: Request, exc: ConflictError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=409)

    p = API_PREFIX
    sse: dict[int | str, dict[str, Any]] = {
        200: {"description": "server-sent events (resumable with Last-Event-ID)", "content": {"text/event-stream": {}}}
    }

    @app.get(f"{p}/health", response_model=HealthOut)
    def health() -> HealthOut:
        counts = {s: service.store.count([s]) for s in (st.QUEUED, st.HELD, st.STARTING, st.RUNNING, st.STOPPING)}
        return HealthOut(status="ok", version=trainforge.__version__, pid=os.getpid(),
                         uptime_s=time.time() - service.started_at, jobs=counts,
                         warm_pool=service.warm_pool)  # fmt: skip

    @app.post(f"{p}/jobs", status_code=201, response_model=SubmitOut,
              responses={409: {"description": "the submission_id was used for a different submission"}})  # fmt: skip
    def submit(spec: JobSpecIn) -> SubmitOut:
        blob = None
        if spec.trainer_b64 is not None:
            try:
                blob = base64.b64decode(spec.trainer_b64, validate=True)
            except (binascii.Error, ValueError):
                raise _invalid(("body", "trainer_b64"), "not valid base64 (send the cloudpickled trainer, base64-encoded)") from None
        body = spec.model_dump(exclude={"trainer_b64", "name", "priority", "hold", "max_retries", "submission_id",
                                        "workers"})  # fmt: skip
        body["min_workers"] = spec.workers
        name = spec.name or (spec.target or os.path.basename(spec.path or "") or spec.kind)
        try:
            job, created = service.submit(
                name=name, spec=body, trainer_blob=blob, priority=spec.priority, hold=spec.hold,
                max_retries=spec.max_retries, submission_id=spec.submission_id,
            )  # fmt: skip
        except ValueError as exc:  # a request that can never fit this server's capacity
            raise _invalid(("body", "workers"), str(exc)) from None
        return SubmitOut(id=job.id, created=created, job=job_out(service, job))

    @app.get(f"{p}/jobs", response_model=JobListOut)
    def list_jobs(
        state: Annotated[list[StateName] | None, Query()] = None,
        before: Annotated[int | None, Query(ge=0, le=2**62)] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
        name: Annotated[str | None, Query(max_length=200)] = None,
    ) -> JobListOut:
        rows = service.store.jobs(state, before=before, limit=limit + 1, name=name)
        more = len(rows) > limit
        rows = rows[:limit]
        return JobListOut(jobs=[job_out(service, j) for j in rows], next_before=rows[-1].id if more else None)

    @app.get(f"{p}/jobs/{{job_id}}", response_model=JobOut, responses=errors)
    def get_job(job_id: JobId) -> JobOut:
        return job_out(service, _job_or_404(service, job_id))

    @app.patch(f"{p}/jobs/{{job_id}}", response_model=JobOut, responses=errors)
    def patch_job(job_id: JobId, change: PatchIn) -> JobOut:
        return job_out(service, service.patch(job_id, priority=change.priority, hold=change.hold))

    @app.post(f"{p}/jobs/{{job_id}}/stop", response_model=JobOut, responses=errors)
    def stop_job(job_id: JobId, body: Annotated[StopIn | None, Body()] = None) -> JobOut:
        body = body or StopIn()
        return job_out(service, service.stop(job_id, grace_s=body.grace_s, force=body.force))

    @app.post(f"{p}/jobs/{{job_id}}/retry", response_model=JobOut, responses=errors)
    def retry_job(job_id: JobId, body: Annotated[RetryIn | None, Body()] = None) -> JobOut:
        checkpoint = body.checkpoint if body else None
        if checkpoint is not None and "://" not in checkpoint and not os.path.isdir(checkpoint):
            raise _invalid(("body", "checkpoint"), f"{checkpoint!r} is not a directory on the server's machine: "
                           f"give one of GET /jobs/{job_id}/checkpoints")  # fmt: skip
        return job_out(service, service.retry(job_id, checkpoint=checkpoint))

    @app.delete(f"{p}/jobs/{{job_id}}", status_code=204, responses=errors)
    def delete_job(job_id: JobId) -> Response:
        service.delete(job_id)
        return Response(status_code=204)

    @app.get(f"{p}/jobs/{{job_id}}/logs", response_model=LogsOut, responses=errors)
    def logs(
        job_id: JobId,
        rank: Annotated[int | None, Query(ge=0, le=100_000)] = None,
        offset: Annotated[int | None, Query(ge=0, le=2**62)] = None,
        tail: Annotated[int | None, Query(ge=0, le=1_000_000)] = None,
    ) -> LogsOut:
        job = _job_or_404(service, job_id)
        return _read_range(_log_path(service, job, rank), offset, tail)

    @app.get(f"{p}/jobs/{{job_id}}/logs/stream", response_class=StreamingResponse, responses={**errors, **sse})
    def logs_stream(
        job_id: JobId,
        rank: Annotated[int | None, Query(ge=0, le=100_000)] = None,
        offset: Annotated[int | None, Query(ge=0, le=2**62)] = None,
        tail: Annotated[int | None, Query(ge=0, le=1_000_000)] = None,
        last_event_id: Annotated[str | None, Header(max_length=32)] = None,
    ) -> StreamingResponse:
        """Log text as it is written (``data``: ``{"text": ...}``; ``id``: the byte offset after it),
        then an ``end`` event once the job has ended and the log is read to its end."""
        job = _job_or_404(service, job_id)
        start = _resume_at(last_event_id, -1)
        if start < 0:
            start = _read_range(_log_path(service, job, rank), offset, tail).offset
        return _sse_response(_log_events(job_id, rank, start))

    # The streams' polls run on the event loop, and the store lends its few reader connections to
    # whichever thread asks (waiting for one if they are all lent): their reads go to threads of their
    # own, at most as many as the store has readers, so that the loop never waits for a connection, and
    # a stream neither waits behind the routes' threads nor takes them (20 followers woken by one event
    # would take 20).
    stream_reads: anyio.CapacityLimiter | None = None

    async def _read_off_loop(fn: Callable[..., _T], *args: Any) -> _T:
        nonlocal stream_reads
        if stream_reads is None:  # made in the event loop (older anyio cannot make one outside it)
            stream_reads = anyio.CapacityLimiter(st.READERS)
        return await anyio.to_thread.run_sync(fn, *args, limiter=stream_reads)

    async def _log_events(job_id: int, rank: int | None, pos: int) -> AsyncIterator[_Event | None]:
        while True:
            job = await _read_off_loop(service.get, job_id)
            chunk = _read_range(_log_path(service, job, rank), pos, None)
            if chunk.text:
                pos = chunk.next_offset
                yield "log", pos, {"text": chunk.text}
                continue
            if job.state in st.TERMINAL_STATES:
                yield "end", pos, {"state": job.state, "exit_code": job.exit_code}
                return
            yield None
            await asyncio.sleep(_POLL_S)

    @app.get(f"{p}/jobs/{{job_id}}/stream", response_class=StreamingResponse, responses={**errors, **sse})
    def job_stream(
        job_id: JobId,
        start: Literal["begin", "end"] = "begin",
        offset: Annotated[int | None, Query(ge=0, le=2**62)] = None,
        last_event_id: Annotated[str | None, Header(max_length=32)] = None,
    ) -> StreamingResponse:
        """The job's run events as its runs write them (``event``: run_start | report | restart |
        run_end; ``data``: the event; ``id``: byte offset in its events file), then ``end`` (the job).
        ``start=end``: only what comes from now on (to wait for the end); ``offset``: from that byte
        offset (``next_offset`` of ``/series``: a chart loaded from it goes on without a gap)."""
        _job_or_404(service, job_id)
        path = os.path.join(service.job_dir(job_id), EVENTS_FILE)
        first = offset if offset is not None else _complete_size(path) if start == "end" else 0
        pos = _resume_at(last_event_id, first)
        return _sse_response(_job_events(job_id, path, pos))

    async def _job_events(job_id: int, path: str, pos: int) -> AsyncIterator[_Event | None]:
        buffer = b""
        while True:
            job = await _read_off_loop(service.get, job_id)
            ended = job.state in st.TERMINAL_STATES
            data = b""
            if os.path.exists(path):
                with open(path, "rb") as f:
                    f.seek(pos + len(buffer))
                    data = f.read(_MAX_LOG_CHUNK)
            buffer += data
            sent = False
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                pos += len(line) + 1
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                sent = True
                yield str(event.get("type", "event")), pos, _finite(event)
            if data or sent:
                continue
            if ended:
                yield "end", pos, job_out(service, job).model_dump()
                return
            yield None
            await asyncio.sleep(_POLL_S)

    @app.get(f"{p}/jobs/{{job_id}}/metrics", responses=errors)
    def metrics(
        job_id: JobId,
        after: Annotated[int, Query(ge=-1, le=2**62)] = -1,
        limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000,
    ) -> dict[str, Any]:
        """Rank 0's reports of the job's runs, in order: ``{"reports": [{"seq", "run", "job_attempt",
        "index", "attempt", "t", "metrics", "checkpoint"}], "next_after"}`` (pass ``next_after`` as
        ``?after=``). ``job_attempt``: the job's attempt that made it (as the job's ``attempt``);
        ``attempt``: its run's restart count."""
        _job_or_404(service, job_id)
        rows: list[dict[str, Any]] = []
        segments = Segments()
        events, _ = read_events(os.path.join(service.job_dir(job_id), EVENTS_FILE))
        for event in events:
            seg = segments.add(event)
            n = segments.reports - 1
            if seg is not None and n > after and len(rows) < limit:
                where = segments.segments[seg]
                rows.append({"seq": n, "run": where["run"], "job_attempt": where["job_attempt"],
                             "index": event.get("index"), "attempt": event.get("attempt"), "t": event.get("t"),
                             "metrics": _finite(event.get("metrics")), "checkpoint": event.get("checkpoint")})  # fmt: skip
        return {"reports": rows, "next_after": rows[-1]["seq"] if rows else after}

    series_cache = SeriesCache()

    @app.get(f"{p}/jobs/{{job_id}}/series", responses=errors)
    def series(
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
        _job_or_404(service, job_id)
        if end is not None and end < start:
            raise HTTPException(422, f"end={end} is before start={start}: give start <= end")
        path = os.path.join(service.job_dir(job_id), EVENTS_FILE)
        return series_cache.series(job_id, path, points, key, start, end)

    @app.get(f"{p}/jobs/{{job_id}}/usage", responses=errors)
    def usage(job_id: JobId) -> dict[str, Any]:
        """What the job's processes use now, sampled every second: ``processes`` (pid, role: runner |
        worker | other, cpu_percent, rss bytes, threads, and gpu_memory bytes / gpu_util % with
        NVML), ``total``, ``history`` (totals, the last 10 minutes), ``gpu`` ("ok" or why not)."""
        _job_or_404(service, job_id)
        return service.usage.usage(job_id)

    sizes: dict[str, int | None] = {}  # a committed checkpoint never changes: its size is read once

    @app.get(f"{p}/jobs/{{job_id}}/checkpoints", responses=errors)
    def checkpoints(job_id: JobId) -> dict[str, Any]:
        """The checkpoints the job's runs reported that are still on storage, oldest first, each
        with its ``size`` in bytes (None where storage would not say)."""
        rows = [r for r in metrics(job_id, -1, 100_000)["reports"] if r["checkpoint"]]
        rows = [r for r in rows if "://" in r["checkpoint"] or os.path.exists(r["checkpoint"])]
        for r in rows:
            if r["checkpoint"] not in sizes:
                sizes[r["checkpoint"]] = checkpoint_size(r["checkpoint"])
            r["size"] = sizes[r["checkpoint"]]
        return {"checkpoints": rows}

    @app.get(f"{p}/jobs/{{job_id}}/events", response_model=list[EventOut], responses=errors)
    def job_events(
        job_id: JobId, after: Annotated[int, Query(ge=0, le=2**62)] = 0,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    ) -> list[EventOut]:  # fmt: skip
        _job_or_404(service, job_id)
        return [EventOut(**e.__dict__) for e in service.store.events_after(after, job_id, limit)]

    @app.get(f"{p}/jobs/{{job_id}}/result", responses={**errors, 200: {"content": {"application/octet-stream": {}}}})
    def result(job_id: JobId) -> Response:
        """The run's :class:`trainforge.Result`, cloudpickled (trainer jobs, once ended)."""
        job = _job_or_404(service, job_id)
        if job.state not in st.TERMINAL_STATES:
            raise HTTPException(409, f"job {job_id} is {job.state}: its result exists once it has ended")
        path = os.path.join(service.job_dir(job_id), RESULT_FILE)
        if not os.path.exists(path):
            raise HTTPException(404, f"job {job_id} ({job.kind}, {job.state}) left no Result: see its logs and events")
        with open(path, "rb") as f:
            return Response(f.read(), media_type="application/octet-stream")

    @app.get(f"{p}/queue", response_model=list[QueueEntryOut])
    def queue() -> list[QueueEntryOut]:
        waiting = {j.id: j for j in service.store.jobs(st.WAITING_STATES)}  # one query, not one per job
        out = []
        for p in service.queue():
            job = waiting.get(p.job_id)
            pending = _pending_out(p)
            if job is not None and pending is not None:
                out.append(QueueEntryOut(job_id=job.id, name=job.name, priority=job.priority, pending=pending))
        return out

    @app.get(f"{p}/resources", response_model=ResourcesOut)
    def resources() -> ResourcesOut:
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

    @app.get(f"{p}/events", response_class=StreamingResponse, responses=sse)
    def events(
        after: Annotated[int | None, Query(ge=0, le=2**62)] = None,
        last_event_id: Annotated[str | None, Header(max_length=32)] = None,
    ) -> StreamingResponse:
        """Every job's lifecycle events (``event``: submitted, starting, running, run_start, restart,
        stopping, ended, lost, requeued, ...; ``id``: the sequence number). Without ``after`` or
        ``Last-Event-ID`` it starts at the next event."""
        seq = _resume_at(last_event_id, after if after is not None else service.store.last_seq)
        return _sse_response(_store_events(seq))

    async def _store_events(seq: int) -> AsyncIterator[_Event | None]:
        while True:
            # A query only once the store has committed an event after seq (it counts them itself).
            batch = await _read_off_loop(service.store.events_after, seq) if service.store.last_seq > seq else []
            for e in batch:
                seq = e.seq
                yield e.type, e.seq, EventOut(**e.__dict__).model_dump()
            if not batch:
                yield None
                await asyncio.sleep(_POLL_S)

    @app.get(f"{p}/version")
    def version() -> dict[str, str]:
        return {"version": trainforge.__version__}

    from trainforge.server import _dashboard, _models

    _models.mount(app, service, registry, API_PREFIX)
    _dashboard.mount(app, service)
    policy = GuardPolicy(
        token=token, allowed_hosts=frozenset(allowed_hosts), api_prefix=API_PREFIX + "/", tls=tls,
        cookie_name=cookie_name(service.server_id) if service is not None else None,
        token_hint="the token from the server's state directory (<state-dir>/token; the CLI and Python client "
        "read it themselves)",
    )  # fmt: skip
    return Guard(app, policy), app
