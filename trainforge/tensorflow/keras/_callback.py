"""``ReportCheckpointCallback``: Keras ``fit()`` reports its logs (and the model) to trainforge.

Imports tf-keras: the subpackage's ``__getattr__`` loads this module on first use.
"""

from __future__ import annotations

import shutil
from typing import Any

from trainforge import get_context, report
from trainforge.tensorflow._checkpoint import TensorflowCheckpoint
from trainforge.tensorflow.env import import_tf_keras

_KerasCallback: Any = import_tf_keras().callbacks.Callback  # type: ignore[attr-defined]

HOOKS = ("epoch_end", "train_batch_end")


def _hooks(name: str, value: Any) -> tuple[str, ...]:
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, (list, tuple)) or not values or any(v not in HOOKS for v in values):
        raise ValueError(
            f"ReportCheckpointCallback({name}={value!r}) is not valid: use one of {HOOKS}, or a list of them."
        )
    return tuple(values)


def _check_metrics(metrics: Any) -> None:
    ok = (
        metrics is None
        or isinstance(metrics, str)
        or (isinstance(metrics, (list, tuple)) and all(isinstance(m, str) for m in metrics))
        or (isinstance(metrics, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in metrics.items()))
    )
    if not ok:
        raise ValueError(
            f"ReportCheckpointCallback(metrics={metrics!r}) is not valid: use None (every Keras log), a log "
            "name, a list of log names, or a dict {reported name: log name}."
        )


def _plain(value: Any) -> Any:
    """A number Keras logged (a numpy scalar or a 0-d array) as a Python number."""
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        return value.item()
    return value


class ReportCheckpointCallback(_KerasCallback):  # type: ignore[misc]
    """Report Keras logs as metrics, with the model as a checkpoint, from ``model.fit()`` in the train
    loop of a :class:`trainforge.tensorflow.TensorflowTrainer` (Ray Train's Keras callback).

    Example::

        from trainforge.tensorflow.keras import ReportCheckpointCallback

        model.fit(dataset, epochs=5, callbacks=[ReportCheckpointCallback()])

    ``checkpoint_on`` / ``report_metrics_on``: ``"epoch_end"`` (default) or ``"train_batch_end"``, or a
    list of both: when to report a checkpoint, and when to report metrics (a checkpoint is always
    reported with the metrics of that moment). ``metrics``: which Keras logs to report: ``None`` (all
    of them: ``loss``, the compiled metrics, ``val_*``), a log name, a list of names, or a dict
    ``{reported name: log name}``.

    The checkpoint is a :class:`trainforge.tensorflow.TensorflowCheckpoint`: every worker saves the
    model (under ``MultiWorkerMirroredStrategy`` saving is a collective), rank 0's copy is reported
    and the others are deleted. Its metadata holds ``epoch`` (0-based; ``batch`` too at a batch's
    end); to resume after a restart::

        checkpoint = trainforge.get_checkpoint()
        if checkpoint:
            with strategy.scope():
                model = TensorflowCheckpoint(checkpoint.path, checkpoint.filesystem).get_model()
            initial_epoch = checkpoint.get_metadata()["epoch"] + 1
        model.fit(dataset, epochs=epochs, initial_epoch=initial_epoch, callbacks=[ReportCheckpointCallback()])

    Needs tf-keras (Keras 2) matching TensorFlow's minor version: the callback is a
    ``tf_keras.callbacks.Callback``, which is ``tf.keras.callbacks.Callback`` on the workers.
    """

    def __init__(
        self,
        checkpoint_on: str | list[str] = "epoch_end",
        report_metrics_on: str | list[str] = "epoch_end",
        metrics: str | list[str] | dict[str, str] | None = None,
    ) -> None:
        super().__init__()
        self._checkpoint_on = _hooks("checkpoint_on", checkpoint_on)
        self._report_metrics_on = _hooks("report_metrics_on", report_metrics_on)
        _check_metrics(metrics)
        self._metrics = metrics
        self._epoch = 0
        # Files to write beside the model in each checkpoint (the model object's model.json, so that a
        # checkpoint of ModelTrainer(a KerasModel) is a model directory): set by that trainer's loop.
        self._model_files: Any = None

    # -- Keras hooks ----------------------------------------------------------------------------
    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._handle("epoch_end", logs, {"epoch": epoch})

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._handle("train_batch_end", logs, {"epoch": self._epoch, "batch": batch})

    def _implements_train_batch_hooks(self) -> bool:
        # Keras calls batch hooks (and fetches every batch's logs from the device) only for callbacks
        # that say they implement them: only when asked to report at a batch's end.
        return "train_batch_end" in self._checkpoint_on + self._report_metrics_on

    # -- reporting ------------------------------------------------------------------------------
    def _handle(self, when: str, logs: dict[str, Any] | None, position: dict[str, int]) -> None:
        checkpoint_now = when in self._checkpoint_on
        if not checkpoint_now and when not in self._report_metrics_on:
            return
        metrics = self._reported_metrics(when, logs or {})
        if not checkpoint_now:
            report(metrics)
            return
        checkpoint = TensorflowCheckpoint.from_model(self.model)  # on every rank: a collective
        try:
            if self._model_files is not None:
                self._model_files(checkpoint.path)
            checkpoint.update_metadata(position)
            report(metrics, checkpoint=checkpoint if get_context().get_world_rank() == 0 else None)
        finally:
            shutil.rmtree(checkpoint.path, ignore_errors=True)  # report() copied it

    def _reported_metrics(self, when: str, logs: dict[str, Any]) -> dict[str, Any]:
        names = self._metrics
        if names is None:
            return {key: _plain(value) for key, value in logs.items()}
        if isinstance(names, str):
            names = [names]
        pairs = names.items() if isinstance(names, dict) else [(name, name) for name in names]
        missing = [log for _, log in pairs if log not in logs]
        if missing:
            raise KeyError(
                f"ReportCheckpointCallback(metrics={self._metrics!r}): Keras logged no {missing} at {when} "
                f"(it logged {sorted(logs)})."
            )
        return {key: _plain(logs[log]) for key, log in pairs}
