"""``TBXLoggerCallback``: TensorBoard event files in the run directory, through tensorboardX.

Every real-number metric (nested ones flattened to ``a/b`` tags) is a scalar at step
``training_iteration`` (1 for the first report). Reports redone after a restart from a checkpoint
open a new event file with ``purge_step``, so TensorBoard drops the superseded steps. At the end of a
run with a config (a tuner's trial), the config and the last metrics are written as hparams.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from trainforge._internal.extras import require
from trainforge._internal.sinks.api import (
    DEFAULT_FLUSH_TIMEOUT_S,
    DEFAULT_QUEUE_SIZE,
    LoggerCallback,
    TrialInfo,
)
from trainforge._internal.sinks.drain import ResultRecord
from trainforge._internal.sinks.files import claim, release
from trainforge._internal.sinks.values import as_number, flatten, numeric_metrics

FLUSH_SECS = 30  # tensorboardX's own flush period; the sink also flushes after each batch


@dataclass
class _TrialWriter:
    writer: Any = None
    writers: int = 0  # opened so far for the run
    last_step: int = 0
    last_metrics: dict[str, float] | None = None


class TBXLoggerCallback(LoggerCallback):
    """TensorBoard logging (Ray Tune's ``TBXLoggerCallback``): event files readable by TensorBoard
    and its ``EventAccumulator``, in each run's directory (``tensorboard --logdir <experiment dir>``
    shows every trial). Needs ``pip install 'trainforge[tensorboard]'`` (tensorboardX)."""

    transient_attributes = ("_writers",)

    def __init__(
        self, *, queue_size: int = DEFAULT_QUEUE_SIZE, flush_timeout_s: float = DEFAULT_FLUSH_TIMEOUT_S
    ):
        require("tensorboardX", "tensorboard", "TBXLoggerCallback")
        super().__init__(queue_size=queue_size, flush_timeout_s=flush_timeout_s)

    def _trial_writers(self) -> dict[TrialInfo, _TrialWriter]:
        return self.__dict__.setdefault("_writers", {})

    def claim_run(self, trial: TrialInfo) -> None:
        claim(self, trial.local_path)

    def log_trial_start(self, trial: TrialInfo) -> None:
        import tensorboardX  # noqa: F401 - fail here (logged once) rather than at the first result

        claim(self, trial.local_path)
        self._trial_writers()[trial] = _TrialWriter()

    def log_trial_results(self, trial: TrialInfo, records: list[ResultRecord]) -> None:
        from tensorboardX import SummaryWriter

        state = self._trial_writers()[trial]
        for record in records:
            if state.writer is None or record.iteration <= state.last_step:
                # The first result, or one redone after a restart: TensorBoard discards the steps from
                # ``purge_step`` on that earlier files of the directory hold.
                if state.writer is not None:
                    state.writer.close()
                purge = record.iteration if record.iteration > 1 else None
                # tensorboardX names files by the second: a later writer's file needs a suffix, one
                # that sorts after the earlier ones (TensorBoard reads the files in name order).
                suffix = f".{state.writers:04d}" if state.writers else ""
                state.writers += 1
                state.writer = SummaryWriter(
                    logdir=trial.local_path, purge_step=purge, flush_secs=FLUSH_SECS, filename_suffix=suffix
                )
            metrics = numeric_metrics(record.metrics)
            for tag, value in metrics.items():
                state.writer.add_scalar(tag, value, global_step=record.iteration, walltime=record.timestamp)
            state.last_step = record.iteration
            state.last_metrics = metrics
        if state.writer is not None:
            state.writer.flush()

    def log_trial_result(self, iteration: int, trial: TrialInfo, result: dict[str, Any]) -> None:
        self.log_trial_results(trial, [ResultRecord(iteration, result, 0.0)])

    def log_trial_end(self, trial: TrialInfo, failed: bool = False) -> None:
        state = self._trial_writers().pop(trial, None)
        if state is None:
            return
        release(self, trial.local_path)
        if state.writer is None:
            return
        try:
            if trial.config and state.last_metrics:
                _write_hparams(state.writer, trial.config, state.last_metrics)
        finally:
            state.writer.close()


def _write_hparams(writer: Any, config: dict[str, Any], metrics: dict[str, float]) -> None:
    from tensorboardX.summary import hparams

    params: dict[str, Any] = {}
    for key, value in flatten(config).items():
        number = as_number(value)
        params[key] = (
            value if isinstance(value, (bool, str)) else number if number is not None else str(value)
        )
    finite = {k: v for k, v in metrics.items() if math.isfinite(v)}
    file_writer = writer._get_file_writer()
    for summary in hparams(params, finite):
        file_writer.add_summary(summary)
