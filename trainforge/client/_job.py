"""A job of a train server as the client sees it: :class:`JobStatus` (the server's answer about it)
and :class:`Job` (a handle: its status, waiting for it, its result, reports and logs, and the
changes one may ask for)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from trainforge._internal.failure_reason import reason_of
from trainforge._internal.run_outcome import FailureClass
from trainforge._internal.trainer_job import fetch_result
from trainforge.client._errors import (
    BadResponseError,
    ClientError,
    JobNotFoundError,
    JobTimeoutError,
    ServerError,
)
from trainforge.client._states import JobState

if TYPE_CHECKING:
    from trainforge import Result, TrainingReport
    from trainforge.client._client import Client


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
        """From the API's ``JobOut``; :class:`BadResponseError` if ``d`` is not one (a field missing,
        a state this client does not know)."""
        try:
            pending = d.get("pending") or {}
            return cls(
                id=d["id"], name=d["name"], state=JobState(d["state"]), priority=d["priority"],
                pending=pending.get("text"), position=pending.get("position"), exit_code=d.get("exit_code"),
                failure_class=FailureClass(d["failure_class"]) if d.get("failure_class") is not None else None, error=d.get("error"), raw=d,
            )  # fmt: skip
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BadResponseError(
                f"a job as the server answered it lacks what the API sends ({type(exc).__name__}: {exc}): "
                f"is the address a train server's, and as new as this client? {str(d)[:200]}"
            ) from exc

    @property
    def ended(self) -> bool:
        return self.state.terminal

    @property
    def reason(self) -> str | None:
        """Why it failed, in one line (``ValueError: bad lr (train.py:8, in loop)``); the whole story,
        tracebacks included, is :attr:`error`. From the API's ``reason`` (an older server's answer: the
        first line of ``error``)."""
        given = self.raw.get("reason")
        return given if isinstance(given, str) and given else reason_of(self.error)

    def describe(self) -> str:
        line = f"job {self.id} ({self.name}): {self.state}"
        if self.pending:
            line += f", {self.pending}" + (f" (position {self.position})" if self.position else "")
        if self.error:
            line += f": {self.reason}"
        return line


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
        """Block until the job has ended (:class:`JobTimeoutError`, a TimeoutError, after ``timeout``
        seconds)."""
        if timeout is None:
            status = self.status()
            if status.ended:
                return status
            for event, _, data in self.client.stream(f"/jobs/{self.id}/stream", params={"start": "end"}):
                if event == "end":
                    return JobStatus.from_json(data)
            return self.status()
        done: list[JobStatus] = []
        failed: list[ClientError] = []

        def wait() -> None:
            try:
                done.append(self.wait())
            except ClientError as exc:  # raised here, in the caller's thread, not lost in the waiter's
                failed.append(exc)

        waiter = threading.Thread(target=wait, daemon=True)
        waiter.start()
        waiter.join(timeout)
        if failed:
            raise failed[0]
        if not done:
            raise JobTimeoutError(f"job {self.id} is still {self.status().state} after {timeout:g} s: it goes on "
                                  f"(wait again, or `trainforge stop {self.id}`)")
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
                try:
                    report = decode_report(data)
                except (KeyError, TypeError, ValueError, AttributeError) as exc:
                    raise BadResponseError(
                        f"job {self.id}: a report the server sent is not one ({type(exc).__name__}: {exc}): "
                        f"is {self.client.address} a train server as new as this client? {str(data)[:200]}"
                    ) from exc
                yield report
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
            chunk = self.client._object("GET", f"/jobs/{self.id}/logs", params=params,
                                        fields=("text", "next_offset", "size"))  # fmt: skip
            if chunk["text"]:
                yield chunk["text"]
            if chunk["next_offset"] >= chunk["size"] or not chunk["text"]:
                return
            params = {k: v for k, v in params.items() if k != "tail"}
            params["offset"] = chunk["next_offset"]

    def stop(self, *, grace_s: float | None = None, force: bool = False, complete: bool = False) -> JobStatus:
        """Stop it (as Ctrl-C; SIGKILL with ``force``): returns once all its processes are gone.
        ``complete``: its run is complete (as a tuner's stop criteria say): it ends SUCCEEDED, not STOPPED."""
        body: dict[str, Any] = {"force": force}
        if complete:
            body["complete"] = True
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
