"""``JobEventsCallback``: every ``fit()`` inside a train-server job appends its events to one file.

The server's runner sets ``$TRAINFORGE_JOB_EVENTS`` (constants) to a file in the job's directory; a
run started with it set adds this callback, so the same trainer/controller code runs in a job as in
a local ``fit()`` and the server learns what happened by reading the file (even the part that
happened while the server itself was down). One JSON object per line, flushed as it is written:

- ``{"type": "run_start", "run_path", "name", "num_workers", "t"}``
- ``{"type": "report", "index", "attempt", "metrics", "all_metrics", "checkpoint", "t"}``
- ``{"type": "restart", "attempt", "reason", "t"}``, plus ``"workers"`` (the new group size) when the
  restart is an elastic resize (grow or shrink at a checkpoint); the server reads it to know a
  shrink it asked for happened
- ``{"type": "run_end", "status": "finished" | "errored", "error", "metrics", "checkpoint", "t"}``
"""

from __future__ import annotations

import os
import threading
import time
from typing import IO, TYPE_CHECKING, Any

from trainforge._internal import constants
from trainforge._internal.callback import Callback
from trainforge._internal.controller import parse_resize_reason
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
                self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (kept open for the run)
            self._file.write(line)
            self._file.flush()

    def on_run_start(self, run_path: str, num_workers: int | tuple[int, int]) -> None:
        name = run_path.rstrip("/").rsplit("/", 1)[-1]
        self._write({"type": "run_start", "run_path": run_path, "name": name, "num_workers": num_workers})

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
