"""The Python client of a train server: :class:`Client` (one method per API call), the :class:`Job`
handle, and :class:`JobStatus` (a job as the server answers it). Finding the server and its token:
:func:`~trainforge.client._discovery.discover`; the exceptions: :mod:`trainforge.client._errors`;
``trainer.submit()``: :mod:`trainforge.server._submission`.

Streams (a job's reports, its logs, its end) reconnect by themselves with ``Last-Event-ID`` when the
server restarts, so a client waiting on a job sees every report even across a server ``kill -9``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json as _json
import os
import socket
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from trainforge._internal.constants import API_PREFIX, ENV_ADDRESS, ENV_STATE_DIR, default_state_dir
from trainforge._internal.run_outcome import FailureClass
from trainforge._internal.trainer_job import fetch_result
from trainforge.client._discovery import discover, server_holds
from trainforge.client._errors import (
    InvalidJobError,
    JobConflictError,
    JobNotFoundError,
    ServerError,
    ServerNotFoundError,
)
from trainforge.client._states import JobState

if TYPE_CHECKING:
    from trainforge import Result, TrainingReport

_RECONNECT_S = 60.0


SUBMIT_WAIT_S = 60.0  # how long a submission cut by a lost connection is retried (with its key)


class _Dropped(OSError):
    """A connection lost after the request started going out: the server may have acted on it."""


@dataclasses.dataclass(frozen=True)
class JobStatus:
    """A job as the server sees it (``raw`` has every field of the API's ``JobOut``)."""

    id: int
    name: str
    state: JobState
    priority: int
    pending: str | None  # why it waits, in words ("needs 4 CPU, 2 free", "behind job 3", "held")
    position: int | None
    exit_code: int | None
    failure_class: FailureClass | None  # whose fault, for a job that ended without success
    error: str | None
    raw: dict[str, Any]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> JobStatus:
        pending = d.get("pending") or {}
        return cls(
            id=d["id"], name=d["name"], state=JobState(d["state"]), priority=d["priority"], pending=pending.get("text"),
            position=pending.get("position"), exit_code=d.get("exit_code"),
            failure_class=FailureClass(d["failure_class"]) if d.get("failure_class") is not None else None,
            error=d.get("error"), raw=d,
        )  # fmt: skip

    @property
    def ended(self) -> bool:
        return self.state.terminal

    def describe(self) -> str:
        line = f"job {self.id} ({self.name}): {self.state}"
        if self.pending:
            line += f", {self.pending}" + (f" (position {self.position})" if self.position else "")
        if self.error:
            line += f": {self.error}"
        return line


class _Http:
    """HTTP/1.1 to the server with the standard library (``http.client``): a fresh connection per
    request (loopback connects in microseconds; nothing kept alive goes stale, nothing is shared
    between threads), and importing nothing heavier, so a fresh ``trainforge`` command or a
    ``submit()`` from a new process pays no HTTP library import (httpx costs ~0.1 s)."""

    def __init__(self, base_url: str, headers: dict[str, str], timeout: float):
        url = urllib.parse.urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"train server address {base_url!r}: give an http:// or https:// URL")
        self._https = url.scheme == "https"
        self._host, self._port = url.hostname, url.port or (443 if self._https else 80)
        self._prefix = url.path.rstrip("/")
        self._headers = headers
        self._timeout = timeout

    def _connect(self, timeout: float | None) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        conn = cls(self._host, self._port, timeout=timeout)
        conn.connect()
        assert conn.sock is not None
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def _target(self, path: str, params: dict[str, Any] | None) -> str:
        query = urllib.parse.urlencode({k: v for k, v in (params or {}).items() if v is not None}, doseq=True)
        return self._prefix + path + (f"?{query}" if query else "")

    def request(self, method: str, path: str, *, params: dict[str, Any] | None = None,
                body: Any = None) -> tuple[int, str, bytes]:  # fmt: skip
        headers = {**self._headers, "Connection": "close"}
        data = None
        if body is None and method in ("POST", "PUT", "PATCH"):
            body = {}  # the server takes state changes as JSON only
        if body is not None:
            data = _json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn = self._connect(self._timeout)
        try:
            conn.request(method, self._target(path, params), body=data, headers=headers)
            response = conn.getresponse()
            return response.status, response.getheader("content-type", ""), response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise _Dropped(f"{type(exc).__name__}: {exc}") from exc
        finally:
            conn.close()

    @contextlib.contextmanager
    def open_stream(self, path: str, *, params: dict[str, Any] | None = None,
                    headers: dict[str, str] | None = None) -> Iterator[http.client.HTTPResponse]:  # fmt: skip
        """A GET whose response is read as it comes (no read timeout once connected)."""
        conn = self._connect(10.0)
        try:
            conn.request("GET", self._target(path, params),
                         headers={**self._headers, **(headers or {}), "Accept": "text/event-stream"})  # fmt: skip
            assert conn.sock is not None
            conn.sock.settimeout(None)
            yield conn.getresponse()
        finally:
            conn.close()


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
        self._http = _Http(self.address + API_PREFIX, {"Authorization": f"Bearer {found_token}"} if found_token else {},
                           timeout)  # fmt: skip

    def _rediscover(self) -> None:
        if self._found_in is None:
            return
        try:
            address, token = discover(*self._given)
        except ServerNotFoundError:
            return
        self.address = address
        self._http = _Http(address + API_PREFIX, {"Authorization": f"Bearer {token}"} if token else {}, self._timeout)

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
        as :class:`ServerError` subclasses; ServerNotFoundError if nothing answers."""
        try:
            status, content_type, body = self._http.request(method, path, params=params, body=json)
        except (OSError, http.client.HTTPException) as exc:
            raise ServerNotFoundError(
                f"no train server answers at {self.address} ({exc}): is it running? (`trainforge server status`)",
                sent=isinstance(exc, _Dropped),
            ) from exc
        if status >= 400:
            self._raise_for(status, body)
        if content_type.startswith("application/json"):
            return _json.loads(body)
        return body

    def stream(self, path: str, *, params: dict[str, Any] | None = None, last_id: str | None = None,
               reconnect_s: float = _RECONNECT_S) -> Iterator[tuple[str, str | None, Any]]:  # fmt: skip
        """Server-sent events as ``(event, id, data)``; reconnects with ``Last-Event-ID`` for up to
        ``reconnect_s`` when the connection drops (a server restart), then raises."""
        lost_at: float | None = None
        while True:
            headers = {"Last-Event-ID": last_id} if last_id is not None else {}
            try:
                with self._http.open_stream(path, params=params, headers=headers) as response:
                    if response.status >= 400:
                        self._raise_for(response.status, response.read())
                    lost_at = None
                    event, ident = "message", None
                    data: list[str] = []
                    while True:
                        raw = response.readline()
                        if not raw:
                            break
                        line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                        if not line:
                            if data:
                                if ident is not None:
                                    last_id = ident
                                yield event, ident, _json.loads("\n".join(data))
                            event, data, ident = "message", [], None
                            continue
                        field, _, value = line.partition(":")
                        value = value[1:] if value.startswith(" ") else value
                        if field == "data":
                            data.append(value)
                        elif field == "event":
                            event = value
                        elif field == "id":
                            ident = value
                    return
            except (OSError, http.client.HTTPException) as exc:
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
        if isinstance(detail, list):
            detail = "; ".join(f"{'.'.join(str(x) for x in d.get('loc', [])[1:])}: {d.get('msg')}" for d in detail)
        cls = {404: JobNotFoundError, 409: JobConflictError, 422: InvalidJobError}.get(status, ServerError)
        raise cls(status, str(detail))

    # -- API --------------------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        return self.request("GET", "/health")  # type: ignore[no-any-return]

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
                body = self.request("POST", "/jobs", json=spec)
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

    def jobs(self, state: list[str] | None = None, *, limit: int = 50, before: int | None = None) -> list[JobStatus]:
        params: dict[str, Any] = {"limit": limit}
        if state:
            params["state"] = state
        if before is not None:
            params["before"] = before
        return [JobStatus.from_json(j) for j in self.request("GET", "/jobs", params=params)["jobs"]]

    def queue(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The waiting jobs in start order, each with why it waits (the first ``limit``; None: all),
        fetched a page of up to 1000 at a time."""
        entries: list[dict[str, Any]] = []
        offset: int | None = 0
        while offset is not None and (limit is None or len(entries) < limit):
            want = 1000 if limit is None else min(1000, limit - len(entries))
            page = self.request("GET", "/queue", params={"offset": offset, "limit": want})
            entries += page["entries"]
            offset = page["next_offset"]
        return entries

    def resources(self) -> dict[str, Any]:
        return self.request("GET", "/resources")  # type: ignore[no-any-return]


class Job:
    """A handle on one job of a train server: what ``trainer.submit()`` returns."""

    def __init__(self, client: Client, job_id: int):
        self.client = client
        self.id = job_id
        self.submitted: JobStatus | None = None  # its status as the submission's reply gave it
        self.created = True  # False: the submission had been queued by an earlier try of the same key

    def __repr__(self) -> str:
        return f"Job({self.id}, server={self.client.address!r})"

    def status(self) -> JobStatus:
        """Its state, and why it waits while it is queued (``.pending``, ``.position``)."""
        return JobStatus.from_json(self.client.request("GET", f"/jobs/{self.id}"))

    def wait(self, timeout: float | None = None) -> JobStatus:
        """Block until the job has ended (TimeoutError after ``timeout`` seconds)."""
        if timeout is None:
            status = self.status()
            if status.ended:
                return status
            for event, _, data in self.client.stream(f"/jobs/{self.id}/stream", params={"start": "end"}):
                if event == "end":
                    return JobStatus.from_json(data)
            return self.status()
        done: list[JobStatus] = []
        waiter = threading.Thread(target=lambda: done.append(self.wait()), daemon=True)
        waiter.start()
        waiter.join(timeout)
        if not done:
            raise TimeoutError(f"job {self.id} is still {self.status().state} after {timeout} s")
        return done[0]

    def result(self, timeout: float | None = None) -> Result:
        """The :class:`~trainforge.Result` its run returned, as ``fit()`` would return it (waits).
        Like ``fit()``, raises the run's error if it failed; a job stopped or lost before it had a
        result raises :class:`ServerError`."""
        status = self.wait(timeout)
        try:
            result = fetch_result(self.client, self.id)
        except JobNotFoundError as exc:
            raise ServerError(exc.status, f"{status.describe()}; {exc.detail}") from None
        if result.error is not None:
            raise result.error
        return result

    def reports(self) -> Iterator[TrainingReport]:
        """Every report of its runs as they arrive (from the first), as ``fit_iter()`` yields them;
        ends when the job ends."""
        from trainforge._internal.job_events import EventType, decode_report

        for event, _, data in self.client.stream(f"/jobs/{self.id}/stream"):
            if event == EventType.REPORT:
                yield decode_report(data)
            elif event == "end":
                return

    def logs(self, *, follow: bool = False, tail: int | None = None, rank: int | None = None) -> Iterator[str]:
        """Its output (the runner's, with every rank's lines; ``rank=N``: that rank's own log), in
        chunks of text: the last ``tail`` lines or all of it; with ``follow``, on until the job ends."""
        params: dict[str, Any] = {}
        if rank is not None:
            params["rank"] = rank
        if tail is not None:
            params["tail"] = tail
        if follow:
            for event, _, data in self.client.stream(f"/jobs/{self.id}/logs/stream", params=params):
                if event == "log":
                    yield data["text"]
                elif event == "end":
                    return
            return
        while True:
            chunk = self.client.request("GET", f"/jobs/{self.id}/logs", params=params)
            if chunk["text"]:
                yield chunk["text"]
            if chunk["next_offset"] >= chunk["size"] or not chunk["text"]:
                return
            params = {k: v for k, v in params.items() if k != "tail"}
            params["offset"] = chunk["next_offset"]

    def stop(self, *, grace_s: float | None = None, force: bool = False) -> JobStatus:
        """Stop it (as Ctrl-C; SIGKILL with ``force``): returns once all its processes are gone."""
        body: dict[str, Any] = {"force": force}
        if grace_s is not None:
            body["grace_s"] = grace_s
        return JobStatus.from_json(self.client.request("POST", f"/jobs/{self.id}/stop", json=body))

    def set_priority(self, priority: int) -> JobStatus:
        return JobStatus.from_json(self.client.request("PATCH", f"/jobs/{self.id}", json={"priority": priority}))

    def hold(self) -> JobStatus:
        return JobStatus.from_json(self.client.request("PATCH", f"/jobs/{self.id}", json={"hold": True}))

    def release(self) -> JobStatus:
        return JobStatus.from_json(self.client.request("PATCH", f"/jobs/{self.id}", json={"hold": False}))

    def retry(self, checkpoint: str | None = None) -> JobStatus:
        """Queue the ended job again: its last run continues from its latest checkpoint, or a new run
        starts from ``checkpoint`` (a path or URL from its checkpoints)."""
        body = {"checkpoint": checkpoint} if checkpoint is not None else None
        return JobStatus.from_json(self.client.request("POST", f"/jobs/{self.id}/retry", json=body))
