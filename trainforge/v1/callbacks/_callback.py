"""``TrainingCallback``: Ray Train 1.x's driver-side hooks into a ``Trainer.run()``."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class TrainingCallback:
    """Subclass it and pass instances in ``trainer.run(..., callbacks=[...])``; every hook runs on the
    driver.

    Example::

        class PrintingCallback(TrainingCallback):
            def handle_result(self, results, **info):
                print([r["loss"] for r in results])  # one dict per worker
    """

    def process_results(self, results: list[dict[str, Any]], **info: Any) -> None:
        """Called by the trainer for each ``train.report()``: passes the results on to :meth:`handle_result`."""
        self.handle_result(results, **info)

    def handle_result(self, results: list[dict[str, Any]], **info: Any) -> None:
        """Called every time ``train.report()`` is called: ``results[r]`` is what worker ``r`` reported."""

    def start_training(self, logdir: str, config: dict[str, Any], **info: Any) -> None:
        """Called once at the start of a run: ``logdir`` is its directory (``{logdir}/run_NNN``),
        ``config`` the dict passed to ``run()``."""

    def finish_training(self, error: bool = False, **info: Any) -> None:
        """Called once at the end of a run (``error``: it raised); ``info["run_dir"]`` is its directory."""


class TrainingLogdirMixin:
    """A callback writing into a directory: its own ``logdir``, else the run's."""

    _logdir: str | None

    def start_training_logdir(self, logdir: str) -> None:
        path = Path(self._logdir).expanduser() if self._logdir else Path(logdir)
        if not path.is_dir():
            raise ValueError(f"logdir '{path}' must be a directory: create it first, or leave logdir=None for the run's.")
        self._logdir_path = path

    @property
    def logdir(self) -> Path | None:
        """The directory in use (set when a run starts)."""
        if hasattr(self, "_logdir_path"):
            return self._logdir_path
        return Path(self._logdir) if self._logdir else None


def workers_list(workers_to_log: Any, name: str = "workers_to_log") -> list[int] | None:
    """``workers_to_log`` as a list of worker indices (None: every worker)."""
    if workers_to_log is None:
        return None
    if isinstance(workers_to_log, int) and not isinstance(workers_to_log, bool):
        workers_to_log = [workers_to_log]
    if not isinstance(workers_to_log, (list, tuple)) or not all(
        isinstance(w, int) and not isinstance(w, bool) and w >= 0 for w in workers_to_log
    ):
        raise TypeError(f"{name}={workers_to_log!r} is not valid: use a worker index (int >= 0), a list of them, or None.")
    if not workers_to_log:
        raise ValueError(f"{name}=[] is not valid: at least one worker must be specified.")
    return list(workers_to_log)


def worker_index(worker_to_log: Any, cls: str) -> int:
    """The one worker a single-worker callback logs."""
    workers = workers_list(worker_to_log, "worker_to_log")
    if workers is None or len(workers) != 1:
        raise ValueError(f"{cls}(worker_to_log={worker_to_log!r}): {cls} logs a single worker: pass its index.")
    return workers[0]
