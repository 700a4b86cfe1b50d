"""What the API's routers share: the per-app state they take the service from (a dependency, not a
closure), the errors they answer in one shape, and the server-sent events they stream (each ends
within a poll once its caller's credential no longer holds: :func:`still_signed_in`)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Annotated, Any, TypeVar

import anyio
from fastapi import Depends, HTTPException, Request
from fastapi.responses import StreamingResponse

from trainforge.server._schemas import JobOut, invalid, job_out
from trainforge.server.jobs.series import SeriesCache
from trainforge.server.jobs.service import JobRow, JobService, NotFoundError
from trainforge.server.routes.access import caller_of

POLL_S = 0.1
KEEPALIVE_S = 15.0
ERRORS: dict[int | str, dict[str, Any]] = {
    404: {"description": "no such job"},
    409: {"description": "not allowed in the job's state"},
}
SSE: dict[int | str, dict[str, Any]] = {
    200: {"description": "server-sent events (resumable with Last-Event-ID)", "content": {"text/event-stream": {}}}
}

Event = tuple[str, int, Any]  # (event, id, data)
_T = TypeVar("_T")


@dataclasses.dataclass
class ApiState:
    """What the routes of one app share (``app.state.api``): the service, and what outlives a request."""

    service: JobService
    series: SeriesCache = dataclasses.field(default_factory=SeriesCache)
    checkpoint_sizes: dict[str, int | None] = dataclasses.field(default_factory=dict)  # committed: read once
    # The streams' polls run on the event loop, and the store lends its few reader connections to
    # whichever thread asks (waiting for one if they are all lent): their reads go to threads of their
    # own, at most as many as the store has readers, so that the loop never waits for a connection, and
    # a stream neither waits behind the routes' threads nor takes them (20 followers woken by one event
    # would take 20). Made in the event loop (older anyio cannot make one outside it).
    stream_reads: anyio.CapacityLimiter | None = None

    async def read_off_loop(self, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` (a read of the store) on a stream-read thread."""
        if self.stream_reads is None:
            self.stream_reads = anyio.CapacityLimiter(self.service.store.readers.size)
        return await anyio.to_thread.run_sync(fn, *args, limiter=self.stream_reads)


async def api_state(request: Request) -> ApiState:
    return request.app.state.api  # type: ignore[no-any-return]


async def service_of(request: Request) -> JobService:
    return request.app.state.api.service  # type: ignore[no-any-return]


def still_signed_in(request: Request) -> Callable[[], bool]:
    """Whether the caller of ``request`` is still signed in, asked as a lasting request goes on (a
    removed user, a rotated token, a job's credential once the job ended: no longer). The one check
    of every stream, through :meth:`UserBook.is_current <trainforge.server.team.users.UserBook.is_current>`
    or, for a job's credential, :meth:`JobTokens.live <trainforge.server.team.job_tokens.JobTokens.live>`."""
    who = caller_of(request)
    service = request.app.state.api.service
    if who.job_id is not None:
        job_id = who.job_id
        return lambda: bool(service.job_tokens.live(job_id))
    return lambda: bool(service.users.is_current(who))


Api = Annotated[ApiState, Depends(api_state)]
Service = Annotated[JobService, Depends(service_of)]
SignedIn = Annotated[Callable[[], bool], Depends(still_signed_in)]


def job_out_for(service: JobService, job: JobRow) -> JobOut:
    """A job as the API answers it, with why it waits (for a waiting one)."""
    return job_out(job, service.pending(job.id) if job.state.waiting else None)


def job_or_404(service: JobService, job_id: int) -> JobRow:
    try:
        return service.get(job_id)
    except NotFoundError as exc:
        raise HTTPException(404, str(exc)) from None


def resume_at(last_event_id: str | None, default: int) -> int:
    """Where a stream resumes: after the id its client last got (``Last-Event-ID``), else ``default``."""
    if last_event_id is None:
        return default
    try:
        return max(0, int(last_event_id))
    except ValueError:
        raise invalid(
            ("header", "last-event-id"), f"Last-Event-ID={last_event_id!r} must be an integer (an id this stream sent)"
        ) from None


def sse_response(events: AsyncGenerator[Event | None, None], signed_in: Callable[[], bool]) -> StreamingResponse:
    """Server-sent events from ``events`` (``None``: nothing new, yielded at each of its polls; a
    comment goes out every 15 s so proxies keep an idle stream open). It ends once ``signed_in()``
    (:func:`still_signed_in`), asked at every item, says the caller's credential no longer holds. A
    client that goes away just ends the generator."""

    async def body() -> AsyncIterator[bytes]:
        last = time.monotonic()
        async with contextlib.aclosing(events):
            async for item in events:
                if not signed_in():
                    return  # removed, or their token rotated: what they follow ends with it
                now = time.monotonic()
                if item is None:
                    if now - last >= KEEPALIVE_S:
                        last = now
                        yield b": keepalive\n\n"
                    continue
                last = now
                event, ident, data = item
                yield f"event: {event}\nid: {ident}\ndata: {json.dumps(data, default=str)}\n\n".encode()

    return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
