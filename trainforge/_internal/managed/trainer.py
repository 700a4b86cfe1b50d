"""``ModelTrainer``: a ``trainforge.torch.TorchTrainer`` whose train loop is the managed loop.

Everything a TorchTrainer does works unchanged (``fit()``, ``fit_iter()``, ``restore()``,
``submit()``, a tuner's trial): its ``train_loop_per_worker`` is :class:`ManagedTrainFn` (the model
class and the loop config) and its ``train_loop_config`` is the model's config. On top of that,
``train()`` / ``validate()`` drive the run one epoch at a time (RaySGD's driver API; driven.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainforge._internal.config import RunConfig, ScalingConfig
from trainforge._internal.managed.commands import (
    DRIVER_KEY,
    INTERNAL_KEYS,
    LOCAL_KEY,
    RESULT_KEY,
    CommandServer,
)
from trainforge._internal.managed.config import LoopConfig
from trainforge._internal.managed.driven import DrivenRun, finalizer
from trainforge._internal.managed.model import Model, check_model_class
from trainforge._internal.result import Result
from trainforge._internal.torch.config import TorchConfig
from trainforge._internal.torch.trainer import TorchTrainer


class ManagedTrainFn:
    """The ``train_loop_per_worker`` of a ModelTrainer: ``run_managed(model_cls, loop_config, config)``
    on each worker (a picklable object; torch is imported only there)."""

    def __init__(self, model_cls: type[Model], loop_config: LoopConfig, options: dict[str, Any] | None = None):
        self.model_cls = model_cls
        self.loop_config = loop_config
        self.options = dict(options or {})

    def __call__(self, config: dict[str, Any]) -> None:
        from trainforge._internal.managed.loop import run_managed

        run_managed(self.model_cls, self.loop_config, config, self.options)

    def __repr__(self) -> str:
        return f"<managed loop of {self.model_cls.__qualname__}>"


class ModelTrainer(TorchTrainer):
    """Train a :class:`~trainforge.model.Model` subclass with the managed loop on N workers.

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

    ``config`` is the model's (``setup(config)``); ``config[BATCH_SIZE]`` ("batch_size") is the
    global batch size, divided among the workers. ``loop_config``: a :class:`LoopConfig`. The other
    arguments are :class:`trainforge.torch.TorchTrainer`'s. ``Tuner(ModelTrainer(...))`` tunes
    ``param_space={"train_loop_config": {...}}``, the model's config.
    """

    def __init__(
        self,
        model_cls: type[Model],
        *,
        config: dict[str, Any] | None = None,
        loop_config: LoopConfig | None = None,
        scaling_config: ScalingConfig | None = None,
        run_config: RunConfig | None = None,
        datasets: dict[str, Any] | None = None,
        resume_from_checkpoint: Any = None,
        torch_config: TorchConfig | None = None,
        metadata: dict[str, Any] | None = None,
        worker_init_fn: Callable[[], Any] | None = None,
    ):
        check_model_class(model_cls, type(self).__name__)
        if loop_config is None:
            loop_config = LoopConfig()
        elif not isinstance(loop_config, LoopConfig):
            raise TypeError(f"{type(self).__name__}(loop_config={loop_config!r}) must be a trainforge.model.LoopConfig.")
        if config is not None and not isinstance(config, dict):
            raise TypeError(f"{type(self).__name__}(config={config!r}) must be a dict (or None).")
        if config and DRIVER_KEY in config:
            raise ValueError(f"config key {DRIVER_KEY!r} is reserved for trainforge")
        self.model_cls = model_cls
        self.loop_config = loop_config
        super().__init__(
            ManagedTrainFn(model_cls, loop_config, self._loop_options()),
            train_loop_config=dict(config or {}),
            torch_config=torch_config,
            scaling_config=scaling_config,
            run_config=run_config,
            datasets=datasets,
            metadata=metadata,
            resume_from_checkpoint=resume_from_checkpoint,
            worker_init_fn=worker_init_fn,
        )
        self._driven: DrivenRun | None = None
        self._result: Result | None = None

    def _loop_options(self) -> dict[str, Any]:
        """Options of the loop that only adapters set (the RaySGD TorchTrainer: wrap_ddp, ...)."""
        return {}

    @property
    def config(self) -> dict[str, Any]:
        """The model's config (what ``setup(config)`` gets, before the batch size is divided)."""
        return {k: v for k, v in (self.train_loop_config or {}).items() if k != DRIVER_KEY}

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
        import cloudpickle

        report = self._drive().call("apply", fn=cloudpickle.dumps(fn), target="model")
        return [m.get(RESULT_KEY) for m in report.all_metrics]

    def apply_workers(self, fn: Callable[[], Any]) -> list[Any]:
        """Run ``fn()`` in every worker process (a driven run); the return values in rank order."""
        import cloudpickle

        report = self._drive().call("apply", fn=cloudpickle.dumps(fn), target="worker")
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
        server = CommandServer(_driver_host(self.scaling_config))
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
        return self.model_cls.load(checkpoint)

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
            "model_cls": self.model_cls,
            "config": self.config,
            "loop_config": self.loop_config,
            "scaling_config": self.scaling_config,
            "run_config": self.run_config,
            "metadata": self.metadata,
            "worker_init_fn": self.worker_init_fn,
            "torch_config": self.backend_config,
        }


def _driver_host(scaling: ScalingConfig) -> str:
    """Where workers reach the driver: 127.0.0.1, or the driver's Ray node IP for Ray actors."""
    from trainforge._internal.worker_group.executor import executor_kind

    if executor_kind(scaling) != "ray":
        return "127.0.0.1"
    from trainforge._internal.ray_utils import ensure_connected

    ray = ensure_connected()
    return str(ray.util.get_node_ip_address())


def _answer(report: Any, reduce_results: bool) -> dict[str, Any] | list[dict[str, Any]]:
    if not reduce_results:
        return [dict(m.get(LOCAL_KEY) or {}) for m in report.all_metrics]
    return {k: v for k, v in report.metrics.items() if k not in INTERNAL_KEYS}
