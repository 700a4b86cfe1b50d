"""The Python client of a train server: :class:`Client`, one method per API call. A job's handle
and status: :mod:`trainforge.client._job`; the transport: :mod:`trainforge.client._http`; finding
the server and its token: :func:`~trainforge.client.discover`; the exceptions:
:mod:`trainforge.client._errors`.

Streams (a job's reports, its logs, its end) reconnect by themselves with ``Last-Event-ID`` when the
server restarts, so a client waiting on a job sees every report even across a server ``kill -9``.
"""

from __future__ import annotations

import json as _json
import os
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from trainforge._internal.constants import API_PREFIX, ENV_ADDRESS, ENV_STATE_DIR, default_state_dir
from trainforge.client._discovery import discover, server_certificate, server_holds
from trainforge.client._errors import (
    BadResponseError,
    InvalidJobError,
    JobConflictError,
    JobNotFoundError,
    ServerError,
    ServerNotFoundError,
)
from trainforge.client._http import Transport
from trainforge.client._job import Job, JobStatus

_RECONNECT_S = 60.0


SUBMIT_WAIT_S = 60.0  # how long a submission cut by a lost connection is retried (with its key)


class Client:
    """Talks to a train server. Example::

        client = Client()                     # the server on this machine
        job = client.job(3)
        print(job.status().describe())
    """

    def __init__(self, address: str | None = None, *, token: str | None = None, state_dir: str | None = None,
                 timeout: float = 60.0):  # fmt: skip
        self.address, found_token = discover(address, token, state_dir)
        self.state_dir = state_dir
        self._given = (address, token, state_dir)
        # Found through a state directory's address file (not given): a restarted server may have
        # written another address there; a retried submission looks again.
        self._found_in: str | None = None
        if not (address or os.environ.get(ENV_ADDRESS)):
            self._found_in = state_dir or os.environ.get(ENV_STATE_DIR) or default_state_dir()
        self._timeout = timeout
        self._http = Transport(self.address, prefix=API_PREFIX, token=found_token, timeout=timeout,
                               pinned=server_certificate(self.address, state_dir))  # fmt: skip

    def _rediscover(self) -> None:
        if self._found_in is None:
            return
        try:
            address, token = discover(*self._given)
        except ServerNotFoundError:
            return
        self.address = address
        self._http = Transport(address, prefix=API_PREFIX, token=token, timeout=self._timeout,
                               pinned=server_certificate(address, self.state_dir))  # fmt: skip

    def _server_starting(self) -> bool:
        """A train server holds the state directory the address came from (it is starting, or
        restarting): worth waiting for."""
        return self._found_in is not None and server_holds(self._found_in)

    def close(self) -> None:
        """Nothing stays open between requests (each has its own connection); kept for ``with``."""

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- plumbing ---------------------------------------------------------------------------------
    def request(self, method: str, path: str, *, params: dict[str, Any] | None = None, json: Any = None) -> Any:
        """One API call: the decoded JSON reply (raw bytes for a non-JSON one); the server's 4xx/5xx
        as :class:`ServerError` subclasses; :class:`ServerNotFoundError` if nothing answers;
        :class:`BadResponseError` if a reply that says it is JSON is not."""
        status, content_type, body = self._http.request(method, path, params=params, body=json)
        if status >= 400:
            self._raise_for(status, body)
        if content_type.startswith("application/json"):
            return self._decode(body, f"{method} {path}")
        return body

    def _object(self, method: str, path: str, *, params: dict[str, Any] | None = None, json: Any = None,
                fields: tuple[str, ...] = ()) -> dict[str, Any]:  # fmt: skip
        """:meth:`request` for a call whose reply is a JSON object with ``fields``: anything else
        (another program's page, a reply cut short) is a :class:`BadResponseError`."""
        reply = self.request(method, path, params=params, json=json)
        if not isinstance(reply, dict) or any(f not in reply for f in fields):
            shown = reply[:200] if isinstance(reply, bytes) else str(reply)[:200]
            raise BadResponseError(
                f"{method} {path}: {self.address} answered {shown!r}, not the API's JSON"
                + (f" with {', '.join(fields)}" if fields else "")
                + ": is it a train server's address, and as new as this client?"
            )
        return reply

    def _decode(self, body: bytes | str, what: str) -> Any:
        try:
            return _json.loads(body)
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
            raise BadResponseError(
                f"{what}: {self.address} answered with what it calls JSON but is not ({exc}): {body[:200]!r}"
            ) from exc

    def stream(self, path: str, *, params: dict[str, Any] | None = None, last_id: str | None = None,
               reconnect_s: float = _RECONNECT_S) -> Iterator[tuple[str, str | None, Any]]:  # fmt: skip
        """Server-sent events as ``(event, id, data)``; reconnects with ``Last-Event-ID`` for up to
        ``reconnect_s`` when the connection drops (a server restart), then raises
        :class:`ServerNotFoundError`."""
        lost_at: float | None = None
        while True:
            headers = {"Last-Event-ID": last_id} if last_id is not None else {}
            try:
                with self._http.open_stream(path, params=params, headers=headers) as response:
                    if response.status >= 400:
                        self._raise_for(response.status, response.body())
                    lost_at = None
                    for event, ident, data in response.events():
                        if ident is not None:
                            last_id = ident
                        yield event, ident, self._decode(data, f"GET {path} (an event's data)")
                    return
            except ServerNotFoundError as exc:
                now = time.monotonic()
                lost_at = lost_at or now
                if now - lost_at > reconnect_s:
                    raise ServerNotFoundError(f"lost the train server at {self.address}: {exc}") from exc
                time.sleep(0.2)  # back off before reconnecting (the server may be restarting)

    @staticmethod
    def _raise_for(status: int, body: bytes) -> None:
        """The server's 4xx/5xx as our exception, with its reason (a schema error names the fields)."""
        try:
            detail = _json.loads(body).get("detail")
        except (ValueError, AttributeError):
            detail = body.decode("utf-8", errors="replace")
        problems: tuple[tuple[str, str], ...] = ()
        if isinstance(detail, list):
            # pydantic's loc starts with where ("body"); a model validator's message starts "Value error, "
            problems = tuple(
                (".".join(str(x) for x in d.get("loc", [])[1:]), str(d.get("msg")).removeprefix("Value error, "))
                for d in detail if isinstance(d, dict)
            )  # fmt: skip
            detail = "; ".join([f"{field}: {msg}" if field else msg for field, msg in problems]
                               + [str(d) for d in detail if not isinstance(d, dict)])  # fmt: skip
        cls = {404: JobNotFoundError, 409: JobConflictError, 422: InvalidJobError}.get(status, ServerError)
        raise cls(status, str(detail), problems)

    # -- API --------------------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        return self._object("GET", "/health")

    def submit(self, spec: dict[str, Any], *, wait_s: float = SUBMIT_WAIT_S,
               on_wait: Callable[[str], Any] | None = None) -> Job:  # fmt: skip
        """Queue a job described as the API's ``JobSpecIn`` (see ``/api/v1/docs``), exactly once.

        The submission carries an idempotency key (``submission_id``; one is made if ``spec`` has
        none). When the connection is lost after the request went out (the server crashed or
        restarted before its reply), or nothing answers while a server holds the state directory
        (it is starting), the same submission is sent again, with the same key, until the server
        answers or ``wait_s`` passes (``on_wait`` is told once, in words): the server queues it once
        and answers with the job it committed (``job.created`` is False when an earlier try had
        queued it). The same key with a different spec is refused (409). Nothing answering at all
        fails at once (:class:`ServerNotFoundError`)."""
        spec = {**spec, "submission_id": spec.get("submission_id") or uuid.uuid4().hex}
        deadline: float | None = None
        pause = 0.1
        while True:
            try:
                body = self._object("POST", "/jobs", json=spec, fields=("id", "job"))
                break
            except ServerNotFoundError as exc:
                now = time.monotonic()
                if deadline is None:
                    if not (exc.sent or self._server_starting()):
                        raise
                    deadline = now + wait_s
                    if on_wait is not None:
                        on_wait(f"the train server at {self.address} did not answer ({exc.__cause__ or exc}); "
                                f"sending the submission again (key {spec['submission_id']}) until it does, "
                                f"for up to {wait_s:g} s")  # fmt: skip
                if now >= deadline:
                    raise ServerNotFoundError(
                        f"the train server at {self.address} did not answer for {wait_s:g} s. It may have queued "
                        f"the job before it went away: once it answers, `trainforge jobs` shows it; submit again "
                        f"with submission_id {spec['submission_id']!r} to get that job instead of a second one.",
                        sent=True,
                    ) from exc
                time.sleep(pause)  # the server is restarting: give it a moment, then look again
                pause = min(1.0, pause * 2)
                self._rediscover()
        job = Job(self, body["id"])
        job.submitted = JobStatus.from_json(body["job"])
        job.created = bool(body.get("created", True))
        return job

    def job(self, job_id: int) -> Job:
        return Job(self, job_id)

    def jobs(self, state: Sequence[str] | None = None, *, limit: int = 50, before: int | None = None) -> list[JobStatus]:
        params: dict[str, Any] = {"limit": limit}
        if state:
            params["state"] = list(state)
        if before is not None:
            params["before"] = before
        return [JobStatus.from_json(j) for j in self._object("GET", "/jobs", params=params, fields=("jobs",))["jobs"]]

    def queue(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The waiting jobs in start order, each with why it waits (the first ``limit``; None: all),
        fetched a page of up to 1000 at a time."""
        entries: list[dict[str, Any]] = []
        offset: int | None = 0
        while offset is not None and (limit is None or len(entries) < limit):
            want = 1000 if limit is None else min(1000, limit - len(entries))
            page = self._object("GET", "/queue", params={"offset": offset, "limit": want}, fields=("entries", "next_offset"))
            entries += page["entries"]
            offset = page["next_offset"]
        return entries

    def resources(self) -> dict[str, Any]:
        return self._object("GET", "/resources")
