"""The model object for XGBoost and LightGBM: :class:`XGBoostModel`, :class:`LightGBMModel`, and the
managed trainers ``ModelTrainer`` hands them to.

A GBDT model's ``setup(config)`` registers the booster's parameters and its number of rounds
(``self.register(params=..., num_boost_round=...)``); ``forward(features)`` is the trained booster's
prediction (XGBoost's ``inplace_predict``, LightGBM's ``predict``), so ``model(rows)`` is
``postprocess(predict(preprocess(rows)))``.

Training is the integration's own: the managed trainer is an ``XGBoostTrainer`` (``LightGBMTrainer``)
whose train loop builds the model on each worker (``setup(config)``: a trial's config gives other
parameters) and runs the integration's built-in loop of the ``params=`` form with them: a
``DMatrix`` (``lightgbm.Dataset``) per split from this worker's shard, every split an evaluation set
(``"valid-logloss"``), the framework's collective, checkpoints every
``CheckpointConfig.checkpoint_frequency`` rounds and at the end, a restart continuing from the
latest. The one thing added: each checkpoint also holds ``model.json``, so it is a model directory
(the registry registers and loads it without a ``loader=``).
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

from trainforge.lightgbm import LightGBMTrainer
from trainforge.model._artifact import write_manifest
from trainforge.model._base import FRAMEWORK_BASES, TRAINERS, BaseModel
from trainforge.model._dataset import label_column
from trainforge.model._managed import ManagedTrainer
from trainforge.xgboost import XGBoostTrainer

_TORCH_ONLY = ("loop_config", "torch_config", "datasets")


class GBDTModel(BaseModel):
    """What XGBoostModel and LightGBMModel share (see the module docstring)."""

    _filename: ClassVar[str] = ""
    _dataset_params_key: ClassVar[str] = ""  # the params= form's key for per-split constructor kwargs

    def _init_state(self) -> None:
        self.params: dict[str, Any] | None = None
        self.num_boost_round = 10
        self.dataset_params: dict[str, dict[str, Any]] = {}
        self.booster: Any = None

    def register(self, *, params: dict[str, Any], num_boost_round: int = 10,
                 dataset_params: dict[str, dict[str, Any]] | None = None) -> None:  # fmt: skip
        """Register the booster's parameters (call it in ``setup``): ``params`` (the framework's
        parameters), ``num_boost_round``, and ``dataset_params`` (``{split name: kwargs}`` of each
        ``DMatrix`` / ``lightgbm.Dataset``)."""
        who = type(self).__name__
        if not isinstance(params, dict):
            raise ValueError(f"{who}.register(params={params!r}) is not valid: give a dict of {self.framework} parameters")
        r = num_boost_round
        if isinstance(r, bool) or not isinstance(r, int) or r < 1:
            raise ValueError(f"{who}.register(num_boost_round={r!r}) is not valid: give an int >= 1")
        if dataset_params is not None and not isinstance(dataset_params, dict):
            raise ValueError(f"{who}.register(dataset_params={dataset_params!r}) is not valid: give {{split: kwargs}}")
        self.params, self.num_boost_round, self.dataset_params = dict(params), r, dict(dataset_params or {})

    def forward(self, features: Any) -> Any:
        """The trained booster's prediction for ``features`` (a 2-d array or a DataFrame)."""
        if self.booster is None:
            raise RuntimeError(f"{type(self).__name__} is not trained: train it with ModelTrainer, or load a trained one")
        return self._predict(features)

    def _predict(self, features: Any) -> Any:
        raise NotImplementedError

    def __repr__(self) -> str:
        state = "trained" if self.booster is not None else "untrained"
        return f"{type(self).__name__}(config={self.config!r}, {state})"

    # -- the backend ------------------------------------------------------------------------------
    def _save_files(self, directory: str) -> None:
        if self.booster is None:
            raise RuntimeError(f"{type(self).__name__}.save(): nothing is trained yet; train it with ModelTrainer")
        self.booster.save_model(os.path.join(directory, self._filename))

    def _default_input(self, instances: list[Any]) -> Any:
        import numpy as np

        try:
            return np.asarray(instances, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"the inputs are not a numeric table ({exc}); {type(self).__name__} has no preprocess(), so send "
                "rows of numbers of one length (or write preprocess(data) to take these)"
            ) from None


class XGBoostModel(GBDTModel):
    """An XGBoost model: ``setup(config)`` calls ``self.register(params=..., num_boost_round=...)``.

    Example::

        class Churn(XGBoostModel):
            def setup(self, config):
                self.register(params={"objective": "binary:logistic", "eval_metric": "logloss",
                                      "max_depth": config["max_depth"], "eta": config["eta"]},
                              num_boost_round=config.get("rounds", 50))

            def postprocess(self, probabilities):      # inference: the class
                return (probabilities > 0.5).astype(int)

            @classmethod
            def hyperparameter_space(cls):
                return {"max_depth": tune.randint(2, 8), "eta": tune.loguniform(0.01, 0.3)}

        trainer = ModelTrainer(Churn, data=ChurnData, config={"max_depth": 4, "eta": 0.1},
                               scaling_config=ScalingConfig(num_workers=2))
        trainer.fit()
        trainer.get_model()(rows)                      # preprocess -> booster prediction -> postprocess
    """

    framework = "xgboost"
    _filename = "model.ubj"  # XGBoostTrainer's checkpoint file (RayTrainReportCallback.CHECKPOINT_NAME)
    _dataset_params_key = "dmatrix_params"

    def _predict(self, features: Any) -> Any:
        return self.booster.inplace_predict(features)

    def _load_files(self, directory: str) -> None:
        from trainforge._internal.extras import import_xgboost

        booster = import_xgboost().Booster()
        booster.load_model(os.path.join(directory, self._filename))
        self.booster = booster

    @classmethod
    def _framework_versions(cls) -> dict[str, str]:
        from trainforge._internal.extras import import_xgboost

        return {"xgboost": str(import_xgboost().__version__)}


class LightGBMModel(GBDTModel):
    """A LightGBM model: ``setup(config)`` calls ``self.register(params=..., num_boost_round=...)``
    (``params``: LightGBM's; the trainer adds ``tree_learner="data_parallel"`` and the network
    parameters). See :class:`XGBoostModel` for an example."""

    framework = "lightgbm"
    _filename = "model.txt"  # LightGBMTrainer's checkpoint file
    _dataset_params_key = "dataset_params"

    def _predict(self, features: Any) -> Any:
        return self.booster.predict(features)

    def _load_files(self, directory: str) -> None:
        from trainforge._internal.extras import import_lightgbm

        self.booster = import_lightgbm().Booster(model_file=os.path.join(directory, self._filename))

    @classmethod
    def _framework_versions(cls) -> dict[str, str]:
        from trainforge._internal.extras import import_lightgbm

        return {"lightgbm": str(import_lightgbm().__version__)}


FRAMEWORK_BASES.update({GBDTModel, XGBoostModel, LightGBMModel})


class ManifestWriter:
    """Writes ``model.json`` for the model class and config into a checkpoint directory (picklable)."""

    def __init__(self, model_cls: type, config: dict[str, Any]):
        self.model_cls, self.config = model_cls, config

    def __call__(self, directory: str) -> None:
        write_manifest(self.model_cls, directory, self.config)


class GBDTModelLoop:
    """The train loop of a GBDT model's managed trainer, on each worker: the model's parameters from
    ``setup(config)``, then the integration's built-in loop with them (see the module docstring)."""

    def __init__(self, model_cls: type[GBDTModel], legacy_loop: Any, checkpoint: dict[str, Any],
                 names: list[str] | None = None, label: str | None = None):  # fmt: skip
        self.model_cls, self.legacy_loop, self.checkpoint = model_cls, legacy_loop, checkpoint
        self.names, self.label = names, label

    def with_data(self, names: list[str], label: str | None) -> GBDTModelLoop:
        return GBDTModelLoop(self.model_cls, self.legacy_loop, self.checkpoint, names, label)

    def __call__(self, config: dict[str, Any]) -> None:
        model = self.model_cls(config)
        if model.params is None:
            raise ValueError(f"{self.model_cls.__qualname__}.setup() registered nothing: call "
                             "self.register(params={...}, num_boost_round=...) there")  # fmt: skip
        assert self.names is not None, "the run's data was not set up"
        self.legacy_loop({
            "label_column": self.label, "params": model.params, "num_boost_round": model.num_boost_round,
            "dataset_names": self.names, model._dataset_params_key: model.dataset_params, "train_kwargs": {},
            **self.checkpoint, "model_files": ManifestWriter(self.model_cls, config),
        })  # fmt: skip

    def __repr__(self) -> str:
        return f"<{self.model_cls.framework} loop of {self.model_cls.__qualname__}>"


class _GBDTModelTrainer(ManagedTrainer):
    """``ModelTrainer`` for a GBDT model: the integration's trainer with the model's loop."""

    _config_arg: str
    _framework: str
    _legacy_loop: Any
    _legacy_split: Any
    _param_space_keys = ()  # Tune searches the model's config (train_loop_config) only
    train_loop_per_worker: Any

    def __init__(self, model_cls: Any, *, config: dict[str, Any] | None = None, data: Any = None,
                 scaling_config: Any = None, run_config: Any = None, metadata: dict[str, Any] | None = None,
                 resume_from_checkpoint: Any = None, worker_init_fn: Any = None, **options: Any):  # fmt: skip
        who = "ModelTrainer"
        backend_config = options.pop(self._config_arg, None)
        torch_only = sorted(k for k in options if k in _TORCH_ONLY and options[k] is not None)
        if torch_only or any(k not in _TORCH_ONLY for k in options):
            raise TypeError(
                f"{who}: {sorted(options)} are not arguments for a {self._framework} model ({', '.join(torch_only)} "
                f"are the PyTorch managed loop's); it takes config, data, scaling_config, run_config, metadata, "
                f"resume_from_checkpoint, worker_init_fn and {self._config_arg}"
            )
        config, metadata = self._init_managed(model_cls, config, data, metadata, None, who)
        if self.data is None:
            raise ValueError(f"{who}: a {self._framework} model trains on data=: give a trainforge.model.Data whose "
                             "setup(config) returns {'train': ..., 'valid': ...} and whose label_column names the "
                             "label")  # fmt: skip
        if label_column(self.data) is None:
            raise ValueError(f"{who}: {self.data!r} has no label_column: set label_column = '<the label's column>' "
                             "on the Data class")  # fmt: skip
        cc = getattr(run_config, "checkpoint_config", None)
        checkpoint = {"checkpoint_frequency": getattr(cc, "checkpoint_frequency", 0) or 0,
                      "checkpoint_at_end": getattr(cc, "checkpoint_at_end", None) is not False}  # fmt: skip
        super().__init__(  # type: ignore[call-arg]
            GBDTModelLoop(self.model_cls, type(self)._legacy_loop, checkpoint), train_loop_config=config,
            scaling_config=scaling_config, run_config=run_config, dataset_config={"datasets_to_split": self._legacy_split},
            metadata=metadata, resume_from_checkpoint=resume_from_checkpoint, worker_init_fn=worker_init_fn,
            **{self._config_arg: backend_config},
        )  # fmt: skip

    def _use_splits(self, splits: dict[str, Any]) -> dict[str, Any]:
        names = ["train", *(k for k in splits if k != "train")]  # the frameworks log evals in this order
        self.train_loop_per_worker = self.train_loop_per_worker.with_data(names, label_column(self.data))
        return splits

    def _constructor_state(self) -> dict[str, Any]:
        return {"trainer_cls": type(self), **self._managed_state(), "scaling_config": self.scaling_config,  # type: ignore[attr-defined]
                "run_config": self.run_config, "metadata": self.metadata, "worker_init_fn": self.worker_init_fn,  # type: ignore[attr-defined]
                **self._backend_state()}  # type: ignore[attr-defined]  # fmt: skip


# get_model(): the model object, from the last fit(), as every managed trainer's (XGBoostTrainer's classmethod
# get_model(checkpoint) gives the bare booster).
class XGBoostModelTrainer(_GBDTModelTrainer, XGBoostTrainer):  # type: ignore[misc]
    """``ModelTrainer(an XGBoostModel)``: an ``XGBoostTrainer`` (see the module docstring)."""


class LightGBMModelTrainer(_GBDTModelTrainer, LightGBMTrainer):  # type: ignore[misc]
    """``ModelTrainer(a LightGBMModel)``: a ``LightGBMTrainer`` (see the module docstring)."""


TRAINERS.update({"xgboost": XGBoostModelTrainer, "lightgbm": LightGBMModelTrainer})
