"""``ModelTrainer``: a ``trainforge.torch.TorchTrainer`` whose train loop is the managed loop, and the
one entry point for a model of any framework.

Everything a TorchTrainer does works unchanged (``fit()``, ``fit_iter()``, ``restore()``,
``submit()``, a tuner's trial): its ``train_loop_per_worker`` is :class:`ManagedTrainFn` (the model
class and the loop config) and its ``train_loop_config`` is the model's config. On top of that,
``train()`` / ``validate()`` drive the run one epoch at a time (RaySGD's driver API; driven.py).

``ModelTrainer(XGBoostModelSubclass, ...)`` (or a reference to one, ``"models:/churn"``) builds that
framework's managed trainer instead (``model_cls._trainer_cls()``: an ``XGBoostTrainer`` with the
model's loop), with the arguments that framework takes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainforge import Result, RunConfig, ScalingConfig
from trainforge.model._base import TRAINERS
from trainforge.model._commands import (
    DRIVER_KEY,
    INTERNAL_KEYS,
    LOCAL_KEY,
    RESULT_KEY,
    CommandServer,
    driver_host,
)
from trainforge.model._config import LoopConfig
from trainforge.model._dataset import TRAIN, VALID, is_torch_dataset, label_column
from trainforge.model._definition import ModelDefinition
from trainforge.model._driven import DrivenRun, finalizer
from trainforge.model._managed import ManagedTrainer, resolve
from trainforge.model._model import Model
from trainforge.torch import TorchConfig, TorchTrainer


class ManagedTrainFn:
    """The ``train_loop_per_worker`` of a ModelTrainer: ``run_managed(model_cls, loop_config, config)``
    on each worker (a picklable object; torch is imported only there)."""

    def __init__(self, model_cls: type[Model], loop_config: LoopConfig, options: dict[str, Any] | None = None):
        self.model_cls = model_cls
        self.loop_config = loop_config
        self.options = dict(options or {})

    def __call__(self, config: dict[str, Any]) -> None:
        from trainforge.model._loop import run_managed

        run_managed(self.model_cls, self.loop_config, config, self.options)

    def __repr__(self) -> str:
        return f"<managed loop of {self.model_cls.__qualname__}>"


class ModelTrainer(ManagedTrainer, TorchTrainer):
    """Train a :class:`~trainforge.model.Model` subclass with the managed loop on N workers (or a
    model of another framework with that framework's trainer: see the module docstring).

    Example::

        trainer = ModelTrainer(Digits, config={"lr": 1e-3, BATCH_SIZE: 64},
                               loop_config=LoopConfig(num_epochs=10, use_fp16=True),
                               scaling_config=ScalingConfig(num_workers=2))
        result = trainer.fit()                  # every epoch reported, checkpoints, restarts
        model = trainer.get_model()             # the trained model, on the CPU, ready for model(x)

        # or RaySGD style, one epoch per call on workers that stay up:
        with ModelTrainer(Digits, config=..., scaling_config=ScalingConfig(num_workers=2)) as trainer:
            for _ in range(3):
                print(trainer.train())          # {"epoch", "batch_count", "num_samples", "train_loss", ...}
            print(trainer.validate())           # {"batch_count", "num_samples", "val_loss", "val_accuracy", ...}

    ``model_cls``: the model class, or a registered definition's URI (``"models:/digits-net"``, its
    latest definition; ``"models:/digits-net/1"``), whose default config ``config`` updates.
    ``config`` is the model's (``setup(config)``); ``config[BATCH_SIZE]`` ("batch_size") is the
    global batch size, divided among the workers. ``data``: a :class:`~trainforge.model.Data` whose
    splits ("train", "valid") are the loaders (else ``setup_data`` registers them). ``loop_config``: a
    :class:`LoopConfig`. The other arguments are :class:`trainforge.torch.TorchTrainer`'s.
    ``Tuner(ModelTrainer(...))`` tunes ``param_space={"train_loop_config": {...}}``, the model's config.
    """

    _allowed_splits = (TRAIN, VALID)

    def __new__(cls, model_cls: Any = None, *args: Any, **kwargs: Any) -> Any:
        if cls is not ModelTrainer or model_cls is None:  # a subclass, or unpickling
            return super().__new__(cls)
        definition = resolve(model_cls, cls.__name__)
        trainer_cls = definition.model_cls._trainer_cls()  # type: ignore[attr-defined]
        if trainer_cls is ModelTrainer:
            obj = super().__new__(cls)
            obj.__dict__["_definition"] = definition  # resolved once: __init__ takes it
            return obj
        return trainer_cls(definition, *args, **kwargs)

    def __init__(
        self,
        model_cls: type[Model] | str | ModelDefinition,
        *,
        config: dict[str, Any] | None = None,
        data: Any = None,
        loop_config: LoopConfig | None = None,
        scaling_config: ScalingConfig | None = None,
        run_config: RunConfig | None = None,
        datasets: dict[str, Any] | None = None,
        resume_from_checkpoint: Any = None,
        torch_config: TorchConfig | None = None,
        metadata: dict[str, Any] | None = None,
        worker_init_fn: Callable[[], Any] | None = None,
    ):
        who = type(self).__name__
        model = self.__dict__.pop("_definition", None) or model_cls
        config, metadata = self._init_managed(model, config, data, metadata, datasets, who)
        if self.model_cls._trainer_cls() is not ModelTrainer:  # type: ignore[attr-defined]
            raise TypeError(f"{who}: {self.model_cls.__qualname__} is a {self.model_cls.framework} model: train it "  # type: ignore[attr-defined]
                            "with ModelTrainer(...), which hands it to its framework's trainer")  # fmt: skip
        if loop_config is None:
            loop_config = LoopConfig()
        elif not isinstance(loop_config, LoopConfig):
            raise TypeError(f"{who}(loop_config={loop_config!r}) must be a trainforge.model.LoopConfig.")
        self.loop_config = loop_config
        super().__init__(
            ManagedTrainFn(self.model_cls, loop_config, self._loop_options()),
            train_loop_config=config,
            torch_config=torch_config,
            scaling_config=scaling_config,
            run_config=run_config,
            datasets=datasets,
            # a Data object's splits: every one divided among the workers ("valid" too, as the loop's
            # DistributedSampler divides a validation loader), each row seen once per epoch
            dataset_config={"datasets_to_split": "all"} if self.data is not None else None,
            metadata=metadata,
            resume_from_checkpoint=resume_from_checkpoint,
            worker_init_fn=worker_init_fn,
        )
        self._driven: DrivenRun | None = None
        self._result: Result | None = None

    def _loop_options(self) -> dict[str, Any]:
        """Options of the loop that only adapters set (the RaySGD TorchTrainer: wrap_ddp, ...)."""
        return {}

    def _use_splits(self, splits: dict[str, Any]) -> dict[str, Any]:
        """A torch ``Dataset`` becomes a loader on each worker (split there by a DistributedSampler, read
        lazily); any other split goes to the core, which gives each worker its share."""
        loaders = {k: v for k, v in splits.items() if is_torch_dataset(v)}
        data = {"torch": loaders, "shards": sorted(set(splits) - set(loaders)), "label_column": label_column(self.data)}
        fn = self.train_loop_per_worker
        assert isinstance(fn, ManagedTrainFn)
        self.train_loop_per_worker = ManagedTrainFn(fn.model_cls, fn.loop_config, {**fn.options, "data": data})
        return {k: v for k, v in splits.items() if k not in loaders}

    # -- fit --------------------------------------------------------------------------------------
    def fit(self) -> Result:
        """Run ``loop_config.num_epochs`` epochs (see :meth:`trainforge.DataParallelTrainer.fit`)."""
        self._not_driven("fit")
        self._result = super().fit()
        return self._result

    def _not_driven(self, what: str) -> None:
        if self._driven is not None and not self._driven.closed:
            raise RuntimeError(
                f"{what}(): this trainer is being driven with train()/validate(); call shutdown() first."
            )

    # -- driven: one epoch per call -----------------------------------------------------------------
    def train(
        self, num_steps: int | None = None, *, reduce_results: bool = True, profile: bool = False,
        info: dict[str, Any] | None = None,
    ) -> dict[str, Any] | list[dict[str, Any]]:  # fmt: skip
        """Run one training epoch on the workers (started by the first call, kept up until
        :meth:`shutdown`) and return its metrics averaged over the workers: ``epoch``,
        ``batch_count``, ``num_samples``, ``train_loss``, ``last_train_loss``, ... ``num_steps``: stop
        after that many batches per worker. ``reduce_results=False``: one dict per worker.
        ``profile=True`` adds ``profile`` (seconds rank 0 spent). ``info`` reaches the steps."""
        report = self._drive().call("train", num_steps=num_steps, info=info, profile=profile, reduce=reduce_results)
        return _answer(report, reduce_results)

    def validate(
        self, num_steps: int | None = None, *, reduce_results: bool = True, profile: bool = False,
        info: dict[str, Any] | None = None,
    ) -> dict[str, Any] | list[dict[str, Any]]:  # fmt: skip
        """Run the validation loader once on the workers: ``batch_count``, ``num_samples``,
        ``val_loss``, ``val_accuracy`` (a classifier), ``last_val_loss``, ..."""
        report = self._drive().call("validate", num_steps=num_steps, info=info, profile=profile, reduce=reduce_results)
        return _answer(report, reduce_results)

    def apply(self, fn: Callable[[Model], Any]) -> list[Any]:
        """Run ``fn(model)`` on every worker's model (a driven run); their return values in rank order."""
        from trainforge._internal import code_pickle

        report = self._drive().call("apply", fn=code_pickle.dumps(fn), target="model")
        return [m.get(RESULT_KEY) for m in report.all_metrics]

    def apply_workers(self, fn: Callable[[], Any]) -> list[Any]:
        """Run ``fn()`` in every worker process (a driven run); the return values in rank order."""
        from trainforge._internal import code_pickle

        report = self._drive().call("apply", fn=code_pickle.dumps(fn), target="worker")
        return [m.get(RESULT_KEY) for m in report.all_metrics]

    def shutdown(self) -> Result | None:
        """End a driven run: the workers checkpoint what they trained since the last checkpoint and
        stop. Returns the run's Result (None when nothing ran). Idempotent."""
        driven, self._driven = self._driven, None
        if driven is None:
            return self._result
        try:
            result = driven.close()
        finally:
            self.train_loop_config = self.config  # without the command channel
            self._finalizer.detach()
        self._result = result
        return result

    def __enter__(self) -> ModelTrainer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def _drive(self) -> DrivenRun:
        if self._driven is not None and not self._driven.closed:
            return self._driven
        if self._driven is not None:  # it failed for good: a new run continues from its latest checkpoint
            latest = self._driven.latest_checkpoint
            self.shutdown()
            if latest is not None:
                self.resume_from_checkpoint = latest
        fc = self.run_config.failure_config
        if fc is not None and fc.hang_timeout_s is not None:
            raise ValueError(
                f"FailureConfig.hang_timeout_s={fc.hang_timeout_s!r} does not work with train()/validate(): between "
                "calls the workers wait for the next command without progress and would be declared hung. Set it "
                "to None for a driven run (or use fit())."
            )
        server = CommandServer(driver_host(self.scaling_config))
        self.train_loop_config = {**self.config, DRIVER_KEY: server.worker_info()}
        try:
            run = DrivenRun(self.fit_iter(), server)
        except BaseException:
            server.close()
            self.train_loop_config = self.config
            raise
        self._driven = run
        self._finalizer = finalizer(self, run, server)
        return run

    # -- the trained model ------------------------------------------------------------------------
    def get_model(self) -> Model:
        """The trained model, ready for inference (unwrapped from DDP, on the CPU, eval mode): from a
        driven run's current state, else from the last ``fit()``'s latest checkpoint."""
        checkpoint = self.current_checkpoint()
        return self.model_cls.load(checkpoint)  # type: ignore[attr-defined,no-any-return]

    def current_checkpoint(self) -> Any:
        """The checkpoint holding the latest trained state (a driven run checkpoints now if needed)."""
        if self._driven is not None and not self._driven.closed:
            checkpoint = self._driven.checkpoint()
        elif self._result is not None:
            checkpoint = self._result.checkpoint
        else:
            checkpoint = None
        if checkpoint is None:
            raise RuntimeError(
                "no trained model yet: call fit() or train() first (the model is read from the run's latest "
                "checkpoint)."
            )
        return checkpoint

    # -- restore() --------------------------------------------------------------------------------
    def _constructor_state(self) -> dict[str, Any]:
        return {
            "trainer_cls": type(self),
            **self._managed_state(),
            "loop_config": self.loop_config,
            "scaling_config": self.scaling_config,
            "run_config": self.run_config,
            "metadata": self.metadata,
            "worker_init_fn": self.worker_init_fn,
            "torch_config": self.backend_config,
        }


def _answer(report: Any, reduce_results: bool) -> dict[str, Any] | list[dict[str, Any]]:
    if not reduce_results:
        return [dict(m.get(LOCAL_KEY) or {}) for m in report.all_metrics]
    return {k: v for k, v in report.metrics.items() if k not in INTERNAL_KEYS}


TRAINERS["torch"] = ModelTrainer
