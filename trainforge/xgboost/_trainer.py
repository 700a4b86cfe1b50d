"""``XGBoostTrainer``: a ``DataParallelTrainer`` whose workers share XGBoost's collective, with the
built-in loop of Ray Train's ``params=`` / ``label_column=`` form."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainforge import Checkpoint, get_context
from trainforge._internal.extras import import_xgboost, require
from trainforge._internal.gbdt import (
    GBDTTrainer,
    import_in_background,
    legacy_start,
    shard_frame,
    split_label,
)
from trainforge.xgboost._config import XGBoostConfig


def _legacy_loop(config: dict[str, Any]) -> None:
    """The loop of the ``params=`` form: a DMatrix per dataset (this worker's shard), every one an
    evaluation set, boosting resumed from the latest checkpoint."""
    xgboost = import_xgboost()
    from trainforge.xgboost._callback import RayTrainReportCallback

    label = config["label_column"]
    dmatrix_params = config.get("dmatrix_params") or {}
    evals = []
    for name in config["dataset_names"]:
        features, labels = split_label(shard_frame(name), label, name)
        evals.append((xgboost.DMatrix(features, label=labels, **dmatrix_params.get(name, {})), name))
    start, rounds, callback = legacy_start(config, RayTrainReportCallback)
    callback._final_rounds = config["num_boost_round"]  # the end's checkpoint with the last round's report
    # XGBoost logs every round's evaluation (on rank 0 only): RunConfig(verbose=0) turns it off, unless
    # verbose_eval= was given to the trainer.
    train_kwargs = {"verbose_eval": get_context().verbose >= 1, **(config.get("train_kwargs") or {})}
    xgboost.train(
        config["params"], evals[0][0], num_boost_round=rounds, evals=evals, xgb_model=start,
        callbacks=[callback], **train_kwargs,
    )  # fmt: skip


class XGBoostTrainer(GBDTTrainer):
    """Distributed XGBoost: each worker trains on its shard of the data, the workers allreduce
    XGBoost's histograms through its collective (a tracker in the driver, fresh for every attempt).

    With a train loop (Ray Train's current form)::

        def train_loop(config):
            frame = ...  # trainforge.get_dataset_shard("train").iter_batches(batch_size=None, batch_format="pandas")
            dtrain = xgboost.DMatrix(frame.drop(columns=["target"]), label=frame["target"])
            xgboost.train(config["params"], dtrain, num_boost_round=50, evals=[(dtrain, "train")],
                          callbacks=[RayTrainReportCallback(frequency=10)])

        XGBoostTrainer(train_loop, train_loop_config={"params": {"objective": "binary:logistic"}},
                       datasets={"train": df}, scaling_config=ScalingConfig(num_workers=2)).fit()

    Or without one (``params``, ``label_column``, ``num_boost_round``; every dataset is an
    evaluation set, split across the workers; checkpoints every
    ``CheckpointConfig.checkpoint_frequency`` rounds and at the end; a restart continues boosting
    from the latest)::

        XGBoostTrainer(params={"objective": "binary:logistic", "eval_metric": ["logloss", "error"]},
                       label_column="target", num_boost_round=50,
                       datasets={"train": train_df, "valid": valid_df},
                       scaling_config=ScalingConfig(num_workers=2)).fit()

    ``dmatrix_params``: ``{dataset name: DMatrix kwargs}``; further keyword arguments go to
    ``xgboost.train``. XGBoost's per-round evaluation log (``verbose_eval``) is printed by rank 0
    as in Ray, and not at all with ``RunConfig(verbose=0)`` (an explicit ``verbose_eval=`` wins). The model: :meth:`get_model` of the result's checkpoint.
    """

    _framework = "xgboost"
    _config_cls = XGBoostConfig
    _preload_modules = ("xgboost",)
    _legacy_loop = staticmethod(_legacy_loop)

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any] | None = None,
        *,
        train_loop_config: dict[str, Any] | None = None,
        xgboost_config: XGBoostConfig | None = None,
        scaling_config: Any = None,
        run_config: Any = None,
        datasets: dict[str, Any] | None = None,
        dataset_config: Any = None,
        metadata: dict[str, Any] | None = None,
        resume_from_checkpoint: Any = None,
        worker_init_fn: Callable[[], Any] | None = None,
        label_column: str | None = None,
        params: dict[str, Any] | None = None,
        num_boost_round: int | None = None,
        dmatrix_params: dict[str, dict[str, Any]] | None = None,
        **train_kwargs: Any,
    ):
        legacy = {
            "label_column": label_column, "params": params, "num_boost_round": num_boost_round,
            "dmatrix_params": dmatrix_params, "train_kwargs": train_kwargs,
        }  # fmt: skip
        self._init_gbdt(
            train_loop_per_worker, legacy, xgboost_config, train_loop_config=train_loop_config,
            datasets=datasets, dataset_config=dataset_config, run_config=run_config, scaling_config=scaling_config,
            metadata=metadata, resume_from_checkpoint=resume_from_checkpoint, worker_init_fn=worker_init_fn,
        )  # fmt: skip

    def _check_installed(self) -> None:
        require("xgboost", "xgboost", type(self).__name__)
        import_in_background("xgboost.tracker")  # the backend's tracker, needed once the workers are up

    @classmethod
    def get_model(cls, checkpoint: Checkpoint) -> Any:
        """The ``xgboost.Booster`` saved in ``checkpoint`` (by :class:`RayTrainReportCallback`)."""
        from trainforge.xgboost._callback import RayTrainReportCallback

        return RayTrainReportCallback.get_model(checkpoint)
