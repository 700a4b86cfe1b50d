"""Ray Train 1.x's logging callbacks: ``JsonLoggerCallback`` (``results.json``),
``TBXLoggerCallback`` (TensorBoard event files, tags ``ray/train/<metric>`` as 1.x wrote them) and
``PrintCallback``. Written on the 1.x callback interface with the standard library and tensorboardX:
trainforge's own tracker sinks (tune's ``logger`` package) write other files (a JSON line per
report of rank 0) and hook into a core run, not a 1.x ``Trainer.run()``."""

from __future__ import annotations

import json
import math
import numbers
import os
from pathlib import Path
from typing import Any

from trainforge.v1._constants import PID, RESULT_FILE_JSON, TIME_TOTAL_S, TIMESTAMP, TRAINING_ITERATION
from trainforge.v1.callbacks._callback import (
    TrainingCallback,
    TrainingLogdirMixin,
    worker_index,
    workers_list,
)


class SafeFallbackEncoder(json.JSONEncoder):
    """numpy values as numbers or lists, NaN as null, anything else as its ``str`` (as 1.x)."""

    def default(self, value: Any) -> Any:
        try:
            tolist = getattr(value, "tolist", None)
            if callable(tolist) and getattr(value, "ndim", 0) > 0:
                return tolist()
            item = getattr(value, "item", None)
            if callable(item):
                value = item()
            if isinstance(value, bool):
                return value
            if isinstance(value, numbers.Integral):
                return int(value)
            if isinstance(value, numbers.Number):
                number = float(value)  # type: ignore[arg-type]
                return None if math.isnan(number) else number
            return super().default(value)
        except Exception:
            return str(value)


class JsonLoggerCallback(TrainingLogdirMixin, TrainingCallback):
    """Logs each run's results to ``{run_dir}/results.json``: a JSON list with, for each
    ``train.report()``, the list of the logged workers' results.

    ``logdir``: another directory (it must exist). ``filename``: another file name.
    ``workers_to_log``: a worker index, a list of them, or None for every worker (default 0).
    """

    def __init__(self, logdir: str | None = None, filename: str | None = None, workers_to_log: Any = 0):
        if filename is not None and (not isinstance(filename, str) or not filename):
            raise ValueError(f"JsonLoggerCallback(filename={filename!r}) is not valid: use a file name, or None for "
                             f"{RESULT_FILE_JSON!r}.")  # fmt: skip
        self._logdir = logdir
        self._filename = filename or RESULT_FILE_JSON
        self._workers_to_log = workers_list(workers_to_log)
        self._log_path: Path | None = None

    @property
    def log_path(self) -> Path | None:
        """The file written (None before a run starts)."""
        return self._log_path

    def start_training(self, logdir: str, config: dict[str, Any] | None = None, **info: Any) -> None:
        self.start_training_logdir(logdir)
        assert self.logdir is not None
        self._log_path = self.logdir / self._filename
        self._write([])

    def handle_result(self, results: list[dict[str, Any]], **info: Any) -> None:
        assert self._log_path is not None, "start_training() was not called"
        logged = results if self._workers_to_log is None else [results[i] for i in self._workers_to_log if i < len(results)]
        with open(self._log_path) as f:
            loaded = json.load(f)
        self._write(loaded + [logged])

    def _write(self, rows: list[Any]) -> None:
        assert self._log_path is not None
        tmp = self._log_path.with_name(self._log_path.name + ".tmp")
        with open(tmp, "w") as f:
            json.dump(rows, f, cls=SafeFallbackEncoder)
        os.replace(tmp, self._log_path)


class TBXLoggerCallback(TrainingLogdirMixin, TrainingCallback):
    """Logs one worker's results as TensorBoard scalars (and histograms of lists/arrays) in the run's
    directory, tag ``ray/train/<metric>`` (nested dicts as ``a/b``), step ``_training_iteration``.
    Needs tensorboardX (``pip install 'trainforge[tensorboard]'``)."""

    IGNORE_KEYS = {PID, TIMESTAMP, TIME_TOTAL_S, TRAINING_ITERATION}

    def __init__(self, logdir: str | None = None, worker_to_log: int = 0):
        self._logdir = logdir
        self._worker_to_log = worker_index(worker_to_log, "TBXLoggerCallback")
        self._file_writer: Any = None

    def start_training(self, logdir: str, config: dict[str, Any] | None = None, **info: Any) -> None:
        self.start_training_logdir(logdir)
        try:
            from tensorboardX import SummaryWriter
        except ImportError as exc:
            raise ImportError("TBXLoggerCallback needs tensorboardX: pip install 'trainforge[tensorboard]'") from exc
        self._file_writer = SummaryWriter(str(self.logdir), flush_secs=30)

    def handle_result(self, results: list[dict[str, Any]], **info: Any) -> None:
        import numpy as np

        result = results[self._worker_to_log]
        step = result[TRAINING_ITERATION]
        flat = _flatten({k: v for k, v in result.items() if k not in self.IGNORE_KEYS})
        for attr, value in flat.items():
            tag = f"ray/train/{attr}"
            if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
                if not np.isnan(value):
                    self._file_writer.add_scalar(tag, value, global_step=step)
            elif (isinstance(value, list) and value) or (isinstance(value, np.ndarray) and value.size > 0):
                try:
                    self._file_writer.add_histogram(tag, np.asarray(value), global_step=step)
                except (ValueError, TypeError):
                    pass  # not numbers (e.g. [[]]): skipped, as 1.x did
        self._file_writer.flush()

    def finish_training(self, error: bool = False, **info: Any) -> None:
        if self._file_writer is not None:
            self._file_writer.close()
            self._file_writer = None


class PrintCallback(TrainingCallback):
    """Prints each result to stdout as 1.x did: a JSON list with one dict per worker (indented by
    4), so ``json.loads`` of one result's output gives ``[worker 0's result, worker 1's, ...]``.

    Example (two workers)::

        [
            {
                "loss": 2.290156
            },
            {
                "loss": 2.275099
            }
        ]
    """

    def handle_result(self, results: list[dict[str, Any]], **info: Any) -> None:
        print(json.dumps(results, cls=SafeFallbackEncoder, indent=4))


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, name + "/"))
        else:
            out[name] = value
    return out
