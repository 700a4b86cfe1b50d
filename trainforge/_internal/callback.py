"""``Callback``: driver-side hooks into a run (progress output, experiment trackers)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainforge._internal.result import Result, TrainingReport
    from trainforge._internal.worker_group.api import WorkerMetadata


class Callback:
    """Subclass and pass in ``RunConfig(callbacks=[...])``. Every hook runs on the driver."""

    def on_run_start(self, run_path: str, num_workers: int | tuple[int, int]) -> None:
        pass

    def on_workers_start(self, workers: list[WorkerMetadata]) -> None:
        """An attempt's workers are up and training: each one's rank, pid, node and GPUs (trainforge
        extension; called again for each restart's new group)."""

    def on_report(self, report: TrainingReport) -> None:
        """A report that every rank has made (``report.metrics`` is rank 0's)."""

    def on_restart(self, attempt: int, reason: str) -> None:
        """The group is about to start again after a failure or an elastic resize: ``attempt`` is the
        number of the attempt about to start, as ``get_context().get_attempt()`` will say in it (1 at
        the first restart); ``reason`` is one line (the failure's root cause, or the resize)."""

    def on_run_end(self, result: Result) -> None:
        pass
