"""``RayTrainReportCallback`` for ``lightgbm.train``: every round's evaluation metrics are reported;
the booster is checkpointed every ``frequency`` rounds and after the last one, by rank 0 only."""

from __future__ import annotations

from typing import Any

from trainforge import Checkpoint
from trainforge._internal.extras import import_lightgbm
from trainforge._internal.gbdt import ReportCallback, checkpoint_file, report_dict, report_with_model


class RayTrainReportCallback(ReportCallback):
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
    booster's file in the checkpoint (default ``model.txt``). ``frequency``: checkpoint every that many
    rounds (0: none during training). ``checkpoint_at_end``: checkpoint after the last round too.
    ``results_postprocessing_fn``: maps the dict before it is reported. Every rank reports each
    round; rank 0 alone writes the checkpoint.
    """

    CHECKPOINT_NAME = "model.txt"
    order = 20  # LightGBM runs callbacks in this order: after its log_evaluation (10), before early stopping (30)
    before_iteration = False

    @staticmethod
    def _import_framework() -> None:
        import_lightgbm()

    @classmethod
    def get_model(cls, checkpoint: Checkpoint, filename: str = CHECKPOINT_NAME) -> Any:
        """The ``lightgbm.Booster`` saved in ``checkpoint``."""
        lightgbm = import_lightgbm()
        with checkpoint_file(checkpoint, filename, f"{cls.__name__}.get_model") as path:
            return lightgbm.Booster(model_file=path)

    @staticmethod
    def rounds_of(booster: Any) -> int:
        return int(booster.current_iteration())

    def __call__(self, env: Any) -> None:
        evals = ((item[0], item[1], item[2]) for item in env.evaluation_result_list or ())
        metrics = report_dict(evals, self._metrics, self._postprocess)
        done = env.iteration + 1
        checkpoint = (self._frequency > 0 and done % self._frequency == 0) or (
            self._checkpoint_at_end and done == env.end_iteration
        )
        report_with_model(metrics, (lambda directory: self._save(env.model, directory)) if checkpoint else None)
