"""The live console view of a run on a terminal (``RunConfig.verbose >= 1`` and stderr a terminal):
a panel redrawn four times a second with the run's workers and their state, each rank's latest
report and metrics, the reporting rate, checkpoints, restarts and the elapsed time. When output is
not a terminal (or rich is not installed, or ``$TRAINFORGE_PLAIN_PROGRESS=1``), the plain lines of
:class:`~trainforge._internal.progress.ProgressReporter` are printed instead, as always.

The view is a driver-side callback: its hooks only record what happened (a few dict writes, so the
controller never waits on the terminal); rich's own refresh thread draws it. Lines printed while it
is live (worker output, warnings) appear above it. When the run ends the panel stays on screen,
followed by the same closing lines the plain reporter prints.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

from trainforge._internal.progress import ProgressReporter, format_metrics

ENV_PLAIN = "TRAINFORGE_PLAIN_PROGRESS"
_RATE_WINDOW_S = 10.0


def live_view_available(stream: Any = None) -> bool:
    """True if a live view can be drawn on ``stream`` (default stderr): a terminal, rich installed,
    not turned off with ``$TRAINFORGE_PLAIN_PROGRESS=1``."""
    stream = stream if stream is not None else sys.stderr
    if os.environ.get(ENV_PLAIN, "") not in ("", "0") or not getattr(stream, "isatty", lambda: False)():
        return False
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


class LiveView(ProgressReporter):
    """A :class:`ProgressReporter` that draws a live panel instead of a line per report."""

    def __init__(self, verbose: int, name: str, executor: str = "local", out: Any = None):
        super().__init__(verbose, name, executor)
        self.out = out if out is not None else sys.stderr
        self._lock = threading.Lock()
        self._live: Any = None
        self._run_path = ""
        self._size = ""
        self._workers: dict[int, dict[str, Any]] = {}
        self._state = "starting"
        self._attempt = 0
        self._restarts: list[str] = []
        self._reports = 0
        self._times: list[float] = []
        self._checkpoints = 0
        self._last_checkpoint = ""
        self._metrics: dict[str, Any] = {}
        self.closing_lines = True  # the plain reporter's lines at the end (a followed job has its own)

    def set_state(self, text: str, run_path: str | None = None) -> None:
        """The run's state in words (a followed server job: "queued (needs 2 CPU, 1 free)", ...)."""
        with self._lock:
            self._state = text
            if run_path:
                self._run_path = run_path

    # -- callback hooks (driver thread): record only -------------------------------------------------
    def on_run_start(self, run_path: str, num_workers: Any) -> None:
        from rich.console import Console
        from rich.live import Live

        self._t0 = time.monotonic()
        self._run_path = run_path
        self._size = f"{num_workers[0]}-{num_workers[1]}" if isinstance(num_workers, tuple) else str(num_workers)
        console = Console(file=self.out)
        self._live = Live(self, console=console, refresh_per_second=4, transient=False,
                          redirect_stdout=True, redirect_stderr=True)  # fmt: skip
        self._live.start()

    def on_workers_start(self, workers: list[Any]) -> None:
        with self._lock:
            self._state = "running"
            self._workers = {w.rank: {"pid": w.pid, "node": w.node_ip or w.hostname, "state": "running",
                                      "index": None, "metrics": {}} for w in workers}  # fmt: skip

    def on_report(self, report: Any) -> None:
        now = time.monotonic()
        with self._lock:
            self._reports += 1
            self._times.append(now)
            if len(self._times) > 1000:
                del self._times[:500]
            self._metrics = dict(report.metrics)
            self._attempt = report.attempt
            for rank, metrics in enumerate(report.all_metrics):
                w = self._workers.setdefault(rank, {"pid": None, "node": "", "state": "running"})
                w.update(index=report.index, metrics=metrics)
            if report.checkpoint is not None:
                self._checkpoints += 1
                self._last_checkpoint = report.checkpoint.path.rstrip("/").rsplit("/", 1)[-1]

    def on_restart(self, attempt: int, reason: str) -> None:
        with self._lock:
            self._attempt = attempt
            self._restarts.append(reason)
            self._state = f"restarting (attempt {attempt})"
            for w in self._workers.values():
                w["state"] = "stopped"

    def on_run_end(self, result: Any) -> None:
        with self._lock:
            self._state = "failed" if result.error is not None else "finished"
            if not self.closing_lines and result.error is not None and isinstance(result.error, str):
                self._state = f"failed: {result.error.splitlines()[0][:100]}"
            for w in self._workers.values():
                if w["state"] == "running":
                    w["state"] = self._state
        if self._live is not None:
            self._live.refresh()
            self._live.stop()
            self._live = None
        self._pending = None
        if self.closing_lines:
            super().on_run_end(result)  # the closing lines, as without the view

    def _print(self, text: str) -> None:
        print(f"trainforge: {text}", file=self.out, flush=True)

    def _show(self, report: Any) -> None:  # the plain reporter's per-report line: the panel has it
        self._pending = None

    # -- drawing (rich's refresh thread) ---------------------------------------------------------------
    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        with self._lock:
            now = time.monotonic()
            recent = [t for t in self._times if now - t <= _RATE_WINDOW_S]
            span = now - recent[0] if len(recent) > 1 else 0.0
            rate = f"{(len(recent) - 1) / span:.1f}/s" if span > 0 else "-"
            head = Text.assemble(
                ("trainforge ", "bold"), (f"{self.name}", "cyan"),
                f"  {self._state}  {now - self._t0:.0f}s  {self._size} {self.kind} worker(s)"
                f"  reports {self._reports} ({rate})  checkpoints {self._checkpoints}"
                + (f" (latest {self._last_checkpoint})" if self._last_checkpoint else "")
                + (f"  restarts {len(self._restarts)}" if self._restarts else ""),
            )  # fmt: skip
            table = Table(box=None, pad_edge=False, show_edge=False)
            for col in ("rank", "pid", "node", "state", "report", "metrics"):
                table.add_column(col, no_wrap=col != "metrics", overflow="ellipsis")
            for rank in sorted(self._workers)[:16]:
                w = self._workers[rank]
                table.add_row(str(rank), str(w.get("pid") or "-"), str(w.get("node") or "-"), w["state"],
                              "-" if w.get("index") is None else str(w["index"]),
                              format_metrics(w.get("metrics") or {}))  # fmt: skip
            if len(self._workers) > 16:
                table.add_row("...", "", "", f"{len(self._workers) - 16} more", "", "")
            parts: list[Any] = [head, table]
            if self._restarts:
                parts.append(Text(f"last restart: {self._restarts[-1]}", style="yellow"))
            parts.append(Text(f"results: {self._run_path}", style="dim"))
        return Group(*parts)
