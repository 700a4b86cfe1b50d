"""The default console output of a run (``RunConfig.verbose``): where results go, worker start-up,
rank-0 metrics at most once a second (every report with verbose=2), restarts, and the outcome."""

from __future__ import annotations

import sys
import time
from typing import Any

from trainforge._internal.callback import Callback


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    text = repr(value) if not isinstance(value, (int, str)) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def format_metrics(metrics: dict[str, Any]) -> str:
    return " ".join(f"{k}={_fmt(v)}" for k, v in metrics.items())


class ProgressReporter(Callback):
    def __init__(self, verbose: int, name: str, executor: str = "local"):
        self.verbose = verbose
        self.name = name
        self.kind = "Ray" if executor == "ray" else "local"
        self._last_print = 0.0
        self._pending: Any = None
        self._t0 = time.monotonic()

    def _print(self, text: str) -> None:
        print(f"trainforge: {text}", file=sys.stderr, flush=True)

    def on_run_start(self, run_path: str, num_workers: Any) -> None:
        self._t0 = time.monotonic()
        workers = f"{num_workers[0]}-{num_workers[1]}" if isinstance(num_workers, tuple) else str(num_workers)
        self._print(f"run {self.name!r} on {workers} {self.kind} worker(s); results in {run_path}")

    def on_report(self, report: Any) -> None:
        now = time.monotonic()
        if self.verbose >= 2 or report.checkpoint is not None or now - self._last_print >= 1.0:
            self._show(report)
        else:
            self._pending = report

    def _show(self, report: Any) -> None:
        self._last_print = time.monotonic()
        self._pending = None
        text = f"[report {report.index}] {format_metrics(report.metrics)}"
        if report.checkpoint is not None:
            text += f" (checkpoint {report.checkpoint.path.rstrip('/').rsplit('/', 1)[-1]})"
        self._print(text)

    def on_restart(self, attempt: int, reason: str) -> None:
        self._print(f"restart {attempt}: {reason}")

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
