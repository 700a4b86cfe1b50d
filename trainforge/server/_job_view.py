"""Following a job from a terminal (``trainer.submit(wait=True)``, ``trainforge submit``): its
output as it comes and, on a terminal, the live panel of a local ``fit()`` fed by the job's state
and reports (:class:`_JobView`)."""

from __future__ import annotations

import sys
import threading
from typing import Any

from trainforge._internal.trainer_job import NUM_WORKERS
from trainforge.client import Job, JobState, JobStatus, ServerError, ServerNotFoundError


def follow(job: Job, out: Any = None) -> JobStatus | None:
    """Print the job's output as it comes until it ends and return its final status; Ctrl-C
    detaches (the job goes on) and returns None. On a terminal, the job's reports are drawn in the
    same live panel as a local ``fit()``'s (its state while queued, each rank's latest report, the
    rate, checkpoints), with the output above it."""
    out = out or sys.stdout
    from trainforge._internal.live_view import live_view_available

    view = _JobView(job, out) if live_view_available(out) else None
    try:
        for text in job.logs(follow=True):
            if view is not None:
                text = view.filter(text)
            out.write(text)
            out.flush()
        status = job.status()
        if view is not None:
            view.close(status)
        print(f"trainforge: {status.describe()}", file=out, flush=True)
        return status
    except KeyboardInterrupt:
        if view is not None:
            view.close(None)
        print(
            f"\ntrainforge: detached from job {job.id}; it keeps running. Reattach with "
            f"`trainforge logs {job.id} -f`, stop it with `trainforge stop {job.id}`.", file=out, flush=True,
        )  # fmt: skip
        # No further request on this client: the interrupt may have hit inside its connection pool.
        return None


REPORTS_DRAIN_S = 10.0


class _JobView:
    """The live panel (``_internal/live_view.py``) fed by a job of the server: its state polled every
    second, its reports streamed in a thread. The runner's own per-report lines are left out of the
    output shown above the panel (the panel has them)."""

    def __init__(self, job: Job, out: Any):
        from trainforge._internal.live_view import LiveView

        status = job.submitted or job.status()
        self.job = job
        self.view = LiveView(1, f"job {job.id} ({status.name})", out=out)
        self.view.closing_lines = False  # the runner's own closing lines come with the output
        self.view.on_run_start(status.raw.get("run_path") or "", status.raw.get("workers") or
                               (status.raw.get("request") or {}).get(NUM_WORKERS) or "?")  # fmt: skip
        self._set(status)
        self.done = threading.Event()
        self.threads = {
            name: threading.Thread(target=target, daemon=True, name=f"tf-job{job.id}-view-{name}")
            for target, name in ((self._poll, "status"), (self._reports, "reports"))
        }
        for thread in self.threads.values():
            thread.start()

    def _set(self, status: JobStatus) -> None:
        text = status.state.lower() + (f" ({status.pending})" if status.pending else "")
        self.view.set_state(text, run_path=status.raw.get("run_path"))

    def _poll(self) -> None:
        while not self.done.wait(1.0):
            try:
                status = self.job.status()
            except (ServerError, ServerNotFoundError, OSError):
                continue
            self._set(status)
            if status.ended:
                return

    def _reports(self) -> None:
        try:
            for report in self.job.reports():
                if self.done.is_set():
                    return
                self.view.on_report(report)
        except (ServerError, ServerNotFoundError, OSError):
            pass

    @staticmethod
    def filter(text: str) -> str:
        return "".join(line for line in text.splitlines(keepends=True) if not line.startswith("trainforge: [report "))

    def close(self, status: JobStatus | None) -> None:
        """Draw the panel's end. A job that ended: its report stream ends with it, so the last
        reports (which may still be on their way when the output stream closes) are drawn first;
        waited for at most ``REPORTS_DRAIN_S``. Detaching (``None``) waits for nothing."""
        if status is not None and status.ended:
            self.threads["reports"].join(REPORTS_DRAIN_S)
        self.done.set()
        if status is not None:
            self._set(status)
        error = None if status is None or status.state == JobState.SUCCEEDED else (status.error or status.state)
        self.view.on_run_end(_Ended(error))


class _Ended:
    """What the panel's end needs of a Result."""

    def __init__(self, error: Any):
        self.error = error
        self.checkpoint = None
