"""``RayTrainReportCallback`` for ``lightgbm.train``: every round's evaluation metrics are reported;
the booster is checkpointed every ``frequency`` rounds and after the last one, by rank 0 only."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from trainforge import Checkpoint
from trainforge._internal.gbdt import check_callback_args, checkpoint_file, report_dict, report_with_model
from trainforge.lightgbm._imports import import_lightgbm


class RayTrainReportCallback:
    """Report ``lightgbm.train``'s evaluation metrics after every round, and checkpoint the booster.

    Example::

        def train_loop(config):
            params = {**config["params"], **trainforge.lightgbm.get_network_params(),
                      "tree_learner": "data_parallel", "pre_partition": True}
            start, rounds = None, config["num_boost_round"]
            checkpoint = trainforge.get_checkpoint()
            if checkpoint:  # a restart or restore: continue boosting from the last checkpoint
                start = RayTrainReportCallback.get_model(checkpoint)
                rounds -= start.current_iteration()
            lightgbm.train(params, train_set, num_boost_round=rounds, init_model=start,
                           valid_sets=[valid_set], valid_names=["valid"],
                           callbacks=[RayTrainReportCallback(frequency=10)])

    Metrics are named ``"<valid name>-<metric>"`` (``valid-binary_logloss``). ``metrics``: report
    only these keys (a str or list), or ``{reported_name: key}`` to rename. ``filename``: the
    booster's file in the checkpoint (``model.txt``). ``frequency``: checkpoint every that many
    rounds (0: none during training). ``checkpoint_at_end``: checkpoint after the last round too.
    ``results_postprocessing_fn``: maps the dict before it is reported. Every rank reports each
    round; rank 0 alone writes the checkpoint.
    """

    CHECKPOINT_NAME = "model.txt"
    order = 20  # LightGBM runs callbacks in this order: after its log_evaluation (10), before early stopping (30)
    before_iteration = False

    def __init__(
        self,
        metrics: str | list[str] | dict[str, str] | None = None,
        filename: str = CHECKPOINT_NAME,
        frequency: int = 0,
        checkpoint_at_end: bool = True,
        results_postprocessing_fn: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        check_callback_args(type(self).__name__, metrics, frequency)
        import_lightgbm()
        self._metrics = metrics
        self._filename = filename
        self._frequency = frequency
        self._checkpoint_at_end = checkpoint_at_end
        self._postprocess = results_postprocessing_fn
        # Files to write beside the booster in each checkpoint (the params= form's "model_files": the
        # model object's model.json, so that a checkpoint of ModelTrainer is a model directory).
        self._model_files: Callable[[str], None] | None = None

    @classmethod
    def get_model(cls, checkpoint: Checkpoint, filename: str = CHECKPOINT_NAME) -> Any:
        """The ``lightgbm.Booster`` saved in ``checkpoint``."""
        lightgbm = import_lightgbm()
        with checkpoint_file(checkpoint, filename, f"{cls.__name__}.get_model") as path:
            return lightgbm.Booster(model_file=path)

    def __call__(self, env: Any) -> None:
        evals = ((item[0], item[1], item[2]) for item in env.evaluation_result_list or ())
        metrics = report_dict(evals, self._metrics, self._postprocess)
        done = env.iteration + 1
        checkpoint = (self._frequency > 0 and done % self._frequency == 0) or (
            self._checkpoint_at_end and done == env.end_iteration
        )
        report_with_model(metrics, (lambda directory: self._save(env.model, directory)) if checkpoint else None)

    def _save(self, model: Any, directory: str) -> None:
        model.save_model(os.path.join(directory, self._filename))
        if self._model_files is not None:
            self._model_files(directory)
