"""The default console output of a run (``RunConfig.verbose``): where results go, worker start-up,
rank-0 metrics at most once a second (every report with verbose=2; the first time a report goes
unshown, a line says so and where every report is), warnings, and the outcome.

Every line starts ``trainforge: ``. Warnings (waiting for resources, restarts, resizes, storage
retries, unequal report counts, ...) are records of the ``trainforge`` logger: the package gives it
only a ``NullHandler`` (a library does not configure logging), and :func:`console_warnings` shows
them as console lines while a run goes — in the driver with ``verbose >= 1``, and in each worker
while its loop runs (there they land in ``logs/rank_N.log`` and on the driver with the rank prefix).
An application that configures logging also gets the records through its own handlers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

from trainforge._internal.amounts import fmt_metric
from trainforge._internal.callback import Callback
from trainforge._internal.constants import ENV_JOB_ID
from trainforge._internal.storage import METRICS_FILE


def console(text: str) -> None:
    """Print one console line of trainforge's: ``trainforge: {text}`` on stderr."""
    print(f"trainforge: {text}", file=sys.stderr, flush=True)


class ConsoleHandler(logging.Handler):
    """Shows WARNING and higher records as console lines (:func:`console`)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            console(record.getMessage())
        except Exception:
            self.handleError(record)


@contextlib.contextmanager
def console_warnings(enabled: bool = True) -> Iterator[None]:
    """While inside, the ``trainforge`` logger's warnings are printed as console lines (once each)."""
    if not enabled:
        yield
        return
    logger = logging.getLogger("trainforge")
    handler = ConsoleHandler()
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return fmt_metric(value)
    text = repr(value) if not isinstance(value, (int, str)) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def format_metrics(metrics: dict[str, Any]) -> str:
    return " ".join(f"{k}={_fmt(v)}" for k, v in metrics.items())


def all_reports_note(run_path: str) -> str:
    """The line said once, when report lines start to skip reports: that they are sampled, and where
    every report is (in a train-server job: the job's metrics; else the run's)."""
    job = os.environ.get(ENV_JOB_ID)
    where = (f"job {job}'s metrics (its dashboard page; GET /api/v1/jobs/{job}/metrics)" if job
             else f"Result.metrics_dataframe and {run_path.rstrip('/')}/{METRICS_FILE}")  # fmt: skip
    return (f"[report lines: at most one a second, so not every report is shown (RunConfig(verbose=2) shows "
            f"each); all are in {where}]")  # fmt: skip


class ProgressReporter(Callback):
    def __init__(self, verbose: int, name: str, executor: str = "local"):
        self.verbose = verbose
        self.name = name
        self.kind = "Ray" if executor == "ray" else "local"
        self._last_print = 0.0
        self._pending: Any = None
        self._skipped = False  # a report was never shown since the last line
        self._noted = False  # the sampling was said (once a run)
        self._run_path = ""
        self._t0 = time.monotonic()

    def _print(self, text: str) -> None:
        console(text)

    def on_run_start(self, run_path: str, num_workers: Any) -> None:
        self._t0 = time.monotonic()
        self._run_path = run_path
        self._noted = False
        workers = f"{num_workers[0]}-{num_workers[1]}" if isinstance(num_workers, tuple) else str(num_workers)
        self._print(f"run {self.name!r} on {workers} {self.kind} worker(s); results in {run_path}")

    def on_report(self, report: Any) -> None:
        now = time.monotonic()
        if self.verbose >= 2 or report.checkpoint is not None or now - self._last_print >= 1.0:
            self._show(report)
        else:
            self._skipped = self._skipped or self._pending is not None  # the pending one is replaced
            self._pending = report

    def _show(self, report: Any) -> None:
        self._skipped = self._skipped or (self._pending is not None and self._pending is not report)
        if self._skipped and not self._noted:
            self._print(all_reports_note(self._run_path))
            self._noted = True
        self._skipped = False
        self._last_print = time.monotonic()
        self._pending = None
        # The report's row in metrics_dataframe; after a restart, also the attempt (get_attempt()).
        label = f"report {report.index}" + (f", attempt {report.attempt}" if report.attempt else "")
        text = f"[{label}] {format_metrics(report.metrics)}"
        if report.checkpoint is not None:
            text += f" (checkpoint {report.checkpoint.path.rstrip('/').rsplit('/', 1)[-1]})"
        self._print(text)

    def on_run_end(self, result: Any) -> None:
        if self._pending is not None:
            self._show(self._pending)
        elapsed = time.monotonic() - self._t0
        if result.error is not None:
            self._print(f"run {self.name!r} failed after {elapsed:.1f}s (see the error below)")
            return
        self._print(f"run {self.name!r} finished in {elapsed:.1f}s")
        if result.checkpoint is not None:
            self._print(f"latest checkpoint: {result.checkpoint.path}")
