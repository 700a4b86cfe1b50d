"""The job events file: every ``fit()`` inside a train-server job appends its events to one file,
and the server (and its API) reads them back. The one definition of the format: its event types
(:class:`EventType`), its writer (:class:`JobEventsCallback`) and its reader (:func:`read_events`,
:func:`events_with_offsets`) beside each other.

The server's runner sets ``$TRAINFORGE_JOB_EVENTS`` (constants) to a file in the job's directory; a
run started with it set adds the callback, so the same trainer/controller code runs in a job as in
a local ``fit()`` and the server learns what happened by reading the file (even the part that
happened while the server itself was down). One JSON object per line, flushed as it is written:

- ``{"type": "run_start", "run_path", "name", "num_workers", "job_attempt", "t"}``: ``job_attempt``
  is the job's attempt on the server (``$TRAINFORGE_JOB_ATTEMPT``: 1 for its first runner, 2 for the
  one that took over a lost one, ...; None if the server did not say)
- ``{"type": "report", "index", "attempt", "metrics", "all_metrics", "checkpoint", "t"}``
  (:func:`decode_report` turns one back into a ``TrainingReport``)
- ``{"type": "restart", "attempt", "reason", "t"}``, plus ``"workers"`` (the new group size) when the
  restart is an elastic resize (grow or shrink at a checkpoint: the controller calls
  :meth:`JobEventsCallback.on_resize` with the size); the server reads it to know a shrink it asked
  for happened
- ``{"type": "run_end", "status": "finished" | "errored", "error", "metrics", "checkpoint", "t"}``

Readers go by byte offsets: only complete lines count (a line being written is read next time), a
line that is not a JSON object is skipped, and the offset after what was read is where the next read
starts (the server keeps it per job, the API sends it as each event's id). :class:`Segments` says
which attempt and run each report belongs to, so a series never joins the steps of two of them.
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
from trainforge._internal.state_files import open_append, open_regular
from trainforge._internal.storage import dumps
from trainforge._internal.str_enum import StrEnum

if TYPE_CHECKING:
    from trainforge._internal.result import Result, TrainingReport

READ_CAP = 256 << 20  # bytes a reader without a limit takes at once (the file is a job's: bound what we hold)
MAX_LINE = 16 << 20  # a longer line is skipped, never held whole


class EventType(StrEnum):
    """The ``type`` of each line of a job events file; a ``str`` (``EventType.REPORT == "report"``)."""

    RUN_START = "run_start"
    REPORT = "report"
    RESTART = "restart"
    RUN_END = "run_end"


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
        self._write({"type": EventType.RUN_START.value, "run_path": run_path, "name": name,
                     "num_workers": num_workers, "job_attempt": constants.job_attempt()})  # fmt: skip

    def on_report(self, report: TrainingReport) -> None:
        self._write(
            {
                "type": EventType.REPORT.value,
                "index": report.index,
                "attempt": report.attempt,
                "metrics": report.metrics,
                "all_metrics": report.all_metrics,
                "checkpoint": report.checkpoint.path if report.checkpoint is not None else None,
            }
        )

    def on_restart(self, attempt: int, reason: str) -> None:
        self._write({"type": EventType.RESTART.value, "attempt": attempt, "reason": reason})

    def on_resize(self, attempt: int, workers: int, reason: str) -> None:
        """An elastic resize: a restart that carries the group's new size (``workers``)."""
        self._write({"type": EventType.RESTART.value, "attempt": attempt, "reason": reason, "workers": workers})

    def on_run_end(self, result: Result) -> None:
        self._write(
            {
                "type": EventType.RUN_END.value,
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


def decode_report(event: dict[str, Any]) -> TrainingReport:
    """A ``report`` event (as written by :meth:`JobEventsCallback.on_report`) as the
    :class:`~trainforge.TrainingReport` that ``fit_iter()`` yielded for it."""
    from trainforge._internal.checkpoint import Checkpoint
    from trainforge._internal.result import TrainingReport

    ckpt = event.get("checkpoint")
    return TrainingReport(
        index=event["index"], metrics=event["metrics"], all_metrics=event.get("all_metrics") or [event["metrics"]],
        checkpoint=Checkpoint(ckpt) if ckpt else None, attempt=event.get("attempt", 0),
    )  # fmt: skip


def events_with_offsets(path: str, offset: int = 0, *, limit: int | None = None) -> tuple[list[tuple[int, dict[str, Any]]], int]:
    """The events in the file from byte ``offset``, each with the byte offset just after its line,
    and the offset after the last complete line read (past skipped lines too). ``limit``: read
    about that many bytes at most (more only to finish a line longer than it), so that a client far
    behind gets the file in pieces."""
    data = _complete_lines(path, offset, limit)
    events: list[tuple[int, dict[str, Any]]] = []
    pos = offset
    for line in data.split(b"\n")[:-1]:
        pos += len(line) + 1
        event = _parse(line)
        if event is not None:
            events.append((pos, event))
    return events, offset + len(data)


def read_events(path: str, offset: int = 0) -> tuple[Iterator[dict[str, Any]], int]:
    """The events in the file from byte ``offset`` (parsed as they are iterated), and the offset
    after them. Only complete lines count (a line being written is read next time); a line that is
    not a JSON object is skipped."""
    data = _complete_lines(path, offset, None)
    return (e for line in data.split(b"\n")[:-1] if (e := _parse(line)) is not None), offset + len(data)


def end_offset(path: str) -> int:
    """The byte offset after the file's last complete line (0 if it has none, or there is no file):
    where a reader that wants only what comes from now on starts."""
    try:
        with open_regular(path) as f:
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


def _complete_lines(path: str, offset: int, limit: int | None) -> bytes:
    """The file's bytes from ``offset`` up to its last complete line (``limit``: see
    :func:`events_with_offsets`; None: up to :data:`READ_CAP` bytes); empty if there is no file or
    no complete line yet. The file is the job's (it writes it): it is read only as a regular file
    (never through a link), and a line longer than :data:`MAX_LINE` is returned whole-less, without
    a newline, so that readers skip it rather than hold it."""
    step = limit or READ_CAP
    try:
        with open_regular(path) as f:
            f.seek(offset)
            data = more = f.read(step)
            while more and b"\n" not in more and len(data) < MAX_LINE:  # a line longer than limit: read on
                more = f.read(step)
                data += more
    except FileNotFoundError:
        return b""
    end = data.rfind(b"\n") + 1
    if end == 0 and len(data) >= MAX_LINE:
        return data[:MAX_LINE]  # no newline in MAX_LINE bytes: skipped (no reader parses a line without one)
    return data[:end]


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


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
        if kind == EventType.RUN_START:
            self._open(event.get("name"), event.get("job_attempt"), 0)
        elif kind == EventType.RESTART:
            last = self.segments[-1] if self.segments else {}
            self._open(last.get("run"), last.get("job_attempt"), event.get("attempt"))
        elif kind == EventType.REPORT:
            if not self.segments:  # reports before any run_start (not written by JobEventsCallback)
                self._open(None, None, event.get("attempt", 0))
            self.segments[-1]["end"] = self.reports
            self.reports += 1
            return len(self.segments) - 1
        return None

    def _open(self, run: Any, job_attempt: Any, attempt: Any) -> None:
        self.segments.append({"start": self.reports, "end": self.reports - 1, "run": run,
                              "job_attempt": job_attempt, "attempt": attempt})  # fmt: skip
