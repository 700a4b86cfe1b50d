"""``JobEventsCallback``: every ``fit()`` inside a train-server job appends its events to one file.

The server's runner sets ``$TRAINFORGE_JOB_EVENTS`` (constants) to a file in the job's directory; a
run started with it set adds this callback, so the same trainer/controller code runs in a job as in
a local ``fit()`` and the server learns what happened by reading the file (even the part that
happened while the server itself was down). One JSON object per line, flushed as it is written:

- ``{"type": "run_start", "run_path", "name", "num_workers", "job_attempt", "t"}``: ``job_attempt``
  is the job's attempt on the server (``$TRAINFORGE_JOB_ATTEMPT``: 1 for its first runner, 2 for the
  one that took over a lost one, ...; None if the server did not say)
- ``{"type": "report", "index", "attempt", "metrics", "all_metrics", "checkpoint", "t"}``
- ``{"type": "restart", "attempt", "reason", "t"}``, plus ``"workers"`` (the new group size) when the
  restart is an elastic resize (grow or shrink at a checkpoint); the server reads it to know a
  shrink it asked for happened
- ``{"type": "run_end", "status": "finished" | "errored", "error", "metrics", "checkpoint", "t"}``

Its reader is :func:`read_events` (complete lines from a byte offset); :class:`Segments` says which
attempt and run each report belongs to, so a series never joins the steps of two of them.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Any

from trainforge._internal import constants
from trainforge._internal.callback import Callback
from trainforge._internal.controller import parse_resize_reason
from trainforge._internal.state_files import open_append
from trainforge._internal.storage import dumps

if TYPE_CHECKING:
    from trainforge._internal.result import Result, TrainingReport


def job_events_callback() -> JobEventsCallback | None:
    """The callback for this process's job, or None outside a train-server job."""
    path = os.environ.get(constants.ENV_JOB_EVENTS)
    return JobEventsCallback(path) if path else None


class JobEventsCallback(Callback):
    def __init__(self, path: str):
        self.path = path
        self._file: IO[str] | None = None
        self._lock = threading.Lock()

    def _write(self, event: dict[str, Any]) -> None:
        event["t"] = time.time()
        line = dumps(event) + "\n"
        with self._lock:
            if self._file is None:
                self._file = open_append(self.path, "utf-8")  # kept open for the run
            self._file.write(line)
            self._file.flush()

    def on_run_start(self, run_path: str, num_workers: int | tuple[int, int]) -> None:
        name = run_path.rstrip("/").rsplit("/", 1)[-1]
        self._write({"type": "run_start", "run_path": run_path, "name": name, "num_workers": num_workers,
                     "job_attempt": constants.job_attempt()})  # fmt: skip

    def on_report(self, report: TrainingReport) -> None:
        self._write(
            {
                "type": "report",
                "index": report.index,
                "attempt": report.attempt,
                "metrics": report.metrics,
                "all_metrics": report.all_metrics,
                "checkpoint": report.checkpoint.path if report.checkpoint is not None else None,
            }
        )

    def on_restart(self, attempt: int, reason: str) -> None:
        event: dict[str, Any] = {"type": "restart", "attempt": attempt, "reason": reason}
        workers = parse_resize_reason(reason)
        if workers is not None:
            event["workers"] = workers
        self._write(event)

    def on_run_end(self, result: Result) -> None:
        self._write(
            {
                "type": "run_end",
                "status": "errored" if result.error is not None else "finished",
                "error": str(result.error) if result.error is not None else None,
                "metrics": result.metrics,
                "checkpoint": result.checkpoint.path if result.checkpoint is not None else None,
            }
        )
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def read_events(path: str, offset: int = 0) -> tuple[Iterator[dict[str, Any]], int]:
    """The events in the file from byte ``offset`` (parsed as they are iterated), and the offset
    after them. Only complete lines count (a line being written is read next time); a line that is
    not a JSON object is skipped."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return iter(()), offset
    end = data.rfind(b"\n") + 1
    return _parse(data[:end]), offset + end


def _parse(data: bytes) -> Iterator[dict[str, Any]]:
    for line in data.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            yield event


class Segments:
    """Which stretch of a job's reports each report belongs to, from its events in order (fed to
    :meth:`add`). A segment starts at every ``run_start`` (a ``fit()``: a new run, or the job's next
    attempt taking a lost one's run over) and every ``restart`` (the run's workers restarted or
    resized, going on from its latest checkpoint), so its steps never repeat ones of the same segment.

    ``segments[k]``: ``start`` and ``end``, the numbers of its first and last report (counted from 0
    over the whole file; ``end < start`` while it has none), ``run`` (the run's name), ``job_attempt``
    (the job's attempt on the server, None if unknown) and ``attempt`` (the run's restart count, as a
    report's ``attempt``)."""

    def __init__(self) -> None:
        self.segments: list[dict[str, Any]] = []
        self.reports = 0

    def add(self, event: dict[str, Any]) -> int | None:
        """Take the next event; for a report, the number of its segment."""
        kind = event.get("type")
        if kind == "run_start":
            self._open(event.get("name"), event.get("job_attempt"), 0)
        elif kind == "restart":
            last = self.segments[-1] if self.segments else {}
            self._open(last.get("run"), last.get("job_attempt"), event.get("attempt"))
        elif kind == "report":
            if not self.segments:  # reports before any run_start (not written by JobEventsCallback)
                self._open(None, None, event.get("attempt", 0))
            self.segments[-1]["end"] = self.reports
            self.reports += 1
            return len(self.segments) - 1
        return None

    def _open(self, run: Any, job_attempt: Any, attempt: Any) -> None:
        self.segments.append({"start": self.reports, "end": self.reports - 1, "run": run,
                              "job_attempt": job_attempt, "attempt": attempt})  # fmt: skip
