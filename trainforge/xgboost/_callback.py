"""``RayTrainReportCallback`` for ``xgboost.train``: every boosting round's evaluation metrics are
reported; the booster is checkpointed every ``frequency`` rounds and at the end, by rank 0 only
(the booster is the same on every rank)."""

from __future__ import annotations

from typing import Any

from trainforge import Checkpoint
from trainforge._internal.extras import import_xgboost
from trainforge._internal.gbdt import ReportCallback, checkpoint_file, report_dict, report_with_model

xgboost = import_xgboost()


class RayTrainReportCallback(ReportCallback, xgboost.callback.TrainingCallback):  # type: ignore[misc,name-defined]
    """Report ``xgboost.train``'s evaluation metrics after every round, and checkpoint the booster.

    Example::

        def train_loop(config):
            dtrain = xgboost.DMatrix(...)  # from trainforge.get_dataset_shard("train")
            start, rounds = None, config["num_boost_round"]
            checkpoint = trainforge.get_checkpoint()
            if checkpoint:  # a restart or restore: continue boosting from the last checkpoint
                start = RayTrainReportCallback.get_model(checkpoint)
                rounds -= start.num_boosted_rounds()
            xgboost.train(config["params"], dtrain, num_boost_round=rounds, xgb_model=start,
                          evals=[(dtrain, "train"), (dvalid, "valid")],
                          callbacks=[RayTrainReportCallback(frequency=10)])

    Metrics are named ``"<eval name>-<metric>"`` (``valid-logloss``), as in ``evals_log``.
    ``metrics``: report only these keys (a str or list), or ``{reported_name: key}`` to rename.
    ``filename``: the booster's file in the checkpoint (default ``model.ubj``; ``.json`` saves JSON).
    ``frequency``: checkpoint whenever the booster's round count is a multiple of it (0: none
    during training); counted over the booster's life, so a continued run keeps the schedule.
    ``checkpoint_at_end``: checkpoint after the last round too (unless that round was just saved);
    XGBoost does not tell a callback which round is the last, so this is one more report, repeating
    the last round's metrics, with the checkpoint (as in Ray Train).
    ``results_postprocessing_fn``: maps the dict before it is reported.
    Every rank reports each round; rank 0 alone writes the checkpoint.
    """

    CHECKPOINT_NAME = "model.ubj"

    _evals_log: Any = None
    _last_checkpoint_rounds: int | None = None
    # The booster's rounds at the end when the caller knows them (the params= form's loop): the last
    # round's report then carries the end's checkpoint, instead of after_training adding a report that
    # repeats it.
    _final_rounds: int | None = None

    @classmethod
    def get_model(cls, checkpoint: Checkpoint, filename: str = CHECKPOINT_NAME) -> Any:
        """The ``xgboost.Booster`` saved in ``checkpoint``."""
        with checkpoint_file(checkpoint, filename, f"{cls.__name__}.get_model") as path:
            booster = xgboost.Booster()
            booster.load_model(path)
            return booster

    @staticmethod
    def rounds_of(booster: Any) -> int:
        return int(booster.num_boosted_rounds())

    def _report(self, model: Any, checkpoint: bool) -> None:
        evals = (
            (data, metric, log[-1])
            for data, by_metric in (self._evals_log or {}).items()
            for metric, log in by_metric.items()
            if len(log)
        )
        metrics = report_dict(evals, self._metrics, self._postprocess)
        report_with_model(metrics, (lambda directory: self._save(model, directory)) if checkpoint else None)

    def after_iteration(self, model: Any, epoch: int, evals_log: Any) -> bool:
        self._evals_log = evals_log
        # Rounds counted over the booster's life: ``epoch`` restarts at 0 when training continues
        # from a checkpoint (xgb_model=), the checkpoints' schedule does not.
        rounds = model.num_boosted_rounds()
        checkpoint = (self._frequency > 0 and rounds % self._frequency == 0) or (
            self._checkpoint_at_end and rounds == self._final_rounds
        )
        if checkpoint:
            self._last_checkpoint_rounds = rounds
        self._report(model, checkpoint)
        return False  # never stops training

    def after_training(self, model: Any) -> Any:
        if self._checkpoint_at_end and self._last_checkpoint_rounds != model.num_boosted_rounds():
            self._report(model, checkpoint=True)
        return model
