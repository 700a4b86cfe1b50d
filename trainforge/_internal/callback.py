"""``Callback``: driver-side hooks into a run (progress output, experiment trackers)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

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

    def on_resize(self, attempt: int, workers: int, reason: str) -> None:
        """An elastic resize (trainforge extension): the group is about to start again with
        ``workers`` workers, from its latest checkpoint. By default, the same as
        ``on_restart(attempt, reason)``."""
        self.on_restart(attempt, reason)

    def on_run_end(self, result: Result) -> None:
        pass


_starting = threading.local()


@contextlib.contextmanager
def run_starting(trainer: Any, storage: Any) -> Iterator[None]:
    """While ``on_run_start`` hooks run: the trainer and its ``StorageContext``, for
    :func:`starting_run` (the hooks get the run's path only; a tracker sink needs its config,
    metadata and storage too)."""
    previous = getattr(_starting, "run", None)
    _starting.run = (trainer, storage)
    try:
        yield
    finally:
        _starting.run = previous


def starting_run() -> tuple[Any, Any]:
    """(trainer, storage) of the run whose ``on_run_start`` hooks this thread is running, or
    (None, None) outside of them."""
    return getattr(_starting, "run", None) or (None, None)
