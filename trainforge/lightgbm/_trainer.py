"""``LightGBMTrainer``: a ``DataParallelTrainer`` whose workers form LightGBM's socket network, with
the built-in loop of Ray Train's ``params=`` / ``label_column=`` form."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from trainforge import Checkpoint, get_context
from trainforge._internal.extras import import_lightgbm, require
from trainforge._internal.gbdt import GBDTTrainer, legacy_start, shard_frame, split_label
from trainforge.lightgbm._config import LightGBMConfig, get_network_params

# LightGBM's names for its log level (``verbosity`` and its aliases): a level the params give is kept.
_VERBOSITY_KEYS = {"verbosity", "verbose"}


def _legacy_loop(config: dict[str, Any]) -> None:
    """The loop of the ``params=`` form: a ``lightgbm.Dataset`` per dataset (this worker's shard),
    every one a validation set, boosting resumed from the latest checkpoint."""
    lightgbm = import_lightgbm()
    from trainforge.lightgbm._callback import RayTrainReportCallback

    label = config["label_column"]
    dataset_params = config.get("dataset_params") or {}
    sets: list[Any] = []
    for name in config["dataset_names"]:
        features, labels = split_label(shard_frame(name), label, name)
        reference = sets[0] if sets else None
        sets.append(lightgbm.Dataset(features, label=labels, reference=reference, **dataset_params.get(name, {})))
    params = {"tree_learner": "data_parallel", "pre_partition": True, **config["params"], **get_network_params()}
    quiet = get_context().verbose == 0 and not _VERBOSITY_KEYS & set(params)
    if quiet:
        params["verbosity"] = -1  # RunConfig(verbose=0): no [LightGBM] [Info] lines from every worker
    start, rounds, callback = legacy_start(config, RayTrainReportCallback)
    with _silenced(lightgbm) if quiet else contextlib.nullcontext():
        lightgbm.train(
            params, sets[0], num_boost_round=rounds, valid_sets=sets, valid_names=config["dataset_names"],
            init_model=start, callbacks=[callback], **(config.get("train_kwargs") or {}),
        )  # fmt: skip


class _Quiet:
    def info(self, msg: str) -> None:
        pass

    def warning(self, msg: str) -> None:
        pass


@contextlib.contextmanager
def _silenced(lightgbm: Any) -> Iterator[None]:
    """LightGBM's log silenced: ``verbosity=-1`` takes effect only once the booster reads its
    params, after the network is set up (its "Trying to bind port" lines from every worker); its
    log goes through the logger registered in Python, a silent one here, the previous one after."""
    basic = lightgbm.basic
    previous = (getattr(basic, "_LOGGER", None), getattr(basic, "_INFO_METHOD_NAME", "info"),
                getattr(basic, "_WARNING_METHOD_NAME", "warning"))  # fmt: skip
    lightgbm.register_logger(_Quiet())
    try:
        yield
    finally:
        if previous[0] is not None:
            lightgbm.register_logger(*previous)


class LightGBMTrainer(GBDTTrainer):
    """Distributed LightGBM: each worker trains on its shard of the data, the workers connected by
    LightGBM's socket network (fresh ports on every attempt, a short ``time_out``).

    With a train loop (Ray Train's current form)::

        def train_loop(config):
            frame = ...  # trainforge.get_dataset_shard("train").iter_batches(batch_size=None, batch_format="pandas")
            train_set = lightgbm.Dataset(frame.drop(columns=["target"]), label=frame["target"])
            params = {**config["params"], **get_network_params(), "tree_learner": "data_parallel",
                      "pre_partition": True}
            lightgbm.train(params, train_set, num_boost_round=50, valid_sets=[train_set],
                           valid_names=["train"], callbacks=[RayTrainReportCallback(frequency=10)])

        LightGBMTrainer(train_loop, train_loop_config={"params": {"objective": "binary"}},
                        datasets={"train": df}, scaling_config=ScalingConfig(num_workers=2)).fit()

    Or without one (``params``, ``label_column``, ``num_boost_round``; every dataset is a
    validation set, "train" split across the workers, the others given whole to each;
    ``tree_learner="data_parallel"`` and
    ``pre_partition=True`` unless ``params`` says otherwise; checkpoints every
    ``CheckpointConfig.checkpoint_frequency`` rounds and at the end; a restart continues boosting
    from the latest)::

        LightGBMTrainer(params={"objective": "binary", "metric": ["binary_logloss"]},
                        label_column="target", num_boost_round=50,
                        datasets={"train": train_df, "valid": valid_df},
                        scaling_config=ScalingConfig(num_workers=2)).fit()

    ``RunConfig(verbose=0)`` silences LightGBM's log on every worker (``verbosity=-1``) unless
    ``params`` set ``verbosity``/``verbose``.
    ``dataset_params``: ``{dataset name: lightgbm.Dataset kwargs}``; further keyword arguments go to
    ``lightgbm.train``. The model: :meth:`get_model` of the result's checkpoint. LightGBM computes
    validation metrics on each worker's own data and the result holds rank 0's: a validation set
    given whole to every worker gives the exact metric, "train-..." metrics are rank 0's shard's.
    """

    _framework = "lightgbm"
    _config_cls = LightGBMConfig
    _preload_modules = ("lightgbm",)
    _legacy_loop = staticmethod(_legacy_loop)
    _legacy_split = ["train"]  # LightGBM's metrics are per worker: evaluate the whole validation sets

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any] | None = None,
        *,
        train_loop_config: dict[str, Any] | None = None,
        lightgbm_config: LightGBMConfig | None = None,
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
        dataset_params: dict[str, dict[str, Any]] | None = None,
        **train_kwargs: Any,
    ):
        legacy = {
            "label_column": label_column, "params": params, "num_boost_round": num_boost_round,
            "dataset_params": dataset_params, "train_kwargs": train_kwargs,
        }  # fmt: skip
        self._init_gbdt(
            train_loop_per_worker, legacy, lightgbm_config, train_loop_config=train_loop_config,
            datasets=datasets, dataset_config=dataset_config, run_config=run_config, scaling_config=scaling_config,
            metadata=metadata, resume_from_checkpoint=resume_from_checkpoint, worker_init_fn=worker_init_fn,
        )  # fmt: skip

    def _check_installed(self) -> None:
        # Checked, not imported: the driver never needs LightGBM itself (about a second), the workers do.
        require("lightgbm", "lightgbm", type(self).__name__)

    @classmethod
    def get_model(cls, checkpoint: Checkpoint) -> Any:
        """The ``lightgbm.Booster`` saved in ``checkpoint`` (by :class:`RayTrainReportCallback`)."""
        from trainforge.lightgbm._callback import RayTrainReportCallback

        return RayTrainReportCallback.get_model(checkpoint)
