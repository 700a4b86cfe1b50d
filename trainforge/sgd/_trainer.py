"""RaySGD's ``TorchTrainer`` (Ray <= 1.12): its constructor and driver methods over a
:class:`ModelTrainer` run driven one epoch at a time.

    RaySGD                                        here
    TorchTrainer(training_operator_cls, ...)      a ModelTrainer of the operator class; workers start
                                                  at the first train()/validate()/save()
    num_workers, num_cpus_per_worker, use_gpu     ScalingConfig(num_workers, use_gpu, {"CPU": n})
    backend, timeout_s                            TorchConfig(backend, timeout_s)
    use_fp16 (True: native amp)                   LoopConfig(use_fp16=True): float16 + scaler on a
                                                  GPU, bfloat16 on the CPU; "apex" is not supported
    scheduler_step_freq ("batch"/"epoch"/"manual") the same (None with schedulers: RaySGD's error)
    wrap_ddp, add_dist_sampler                    the same
    initialization_hook                           worker_init_fn
    train(num_steps, profile, reduce_results, max_retries, info)   one driven epoch; restarts follow
                                                  FailureConfig(max_failures) of the run (default 3,
                                                  RaySGD's max_retries default), not per call
    validate(...), update_scheduler(metric), apply_all_operators(fn), apply_all_workers(fn)
    get_model(to_cpu)                             the registered network(s), unwrapped, on the CPU
    save(path) / load(path)                       one file (a tar of a checkpoint); load() resumes
                                                  the workers from it
    shutdown(force)                               stops the workers
    use_tqdm, use_local                           accepted, no effect
"""

from __future__ import annotations

import inspect
import logging
import os
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from typing import Any

from trainforge import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from trainforge.model import BATCH_SIZE, LoopConfig, ModelTrainer
from trainforge.sgd._operator import TrainingOperator
from trainforge.torch import TorchConfig

logger = logging.getLogger("trainforge")

VALID_SCHEDULER_STEP = ("batch", "epoch", "manual", None)
_CREATORS = ("model_creator", "data_creator", "optimizer_creator", "scheduler_creator", "loss_creator")
_GONE = ("num_replicas", "batch_size", "serialize_data_creation", "data_loader_args", "apex_args")


class _OperatorTrainer(ModelTrainer):
    """A ModelTrainer with RaySGD's loop options (wrap_ddp, add_dist_sampler, scheduler_step_freq)."""

    def __init__(self, model_cls: type[TrainingOperator], *, options: dict[str, Any], **kwargs: Any):
        self._options = dict(options)
        super().__init__(model_cls, **kwargs)

    def _loop_options(self) -> dict[str, Any]:
        return self._options

    def _constructor_state(self) -> dict[str, Any]:
        return {**super()._constructor_state(), "options": self._options}


class TorchTrainer:
    """Train a RaySGD ``TrainingOperator`` on N workers, one epoch per ``train()`` call.

    Example (RaySGD's, with only its imports changed to ``trainforge.sgd``)::

        trainer = TorchTrainer(training_operator_cls=MyTrainingOperator, num_workers=2,
                               config={"lr": 1e-2, BATCH_SIZE: 64}, scheduler_step_freq="epoch")
        for i in range(5):
            print(trainer.train())
        print(trainer.validate())
        model = trainer.get_model()
        trainer.shutdown()

    ``run_config`` (trainforge extension): where the run is kept, its ``FailureConfig``; default
    ``RunConfig(verbose=0, failure_config=FailureConfig(max_failures=3))``.
    """

    def __init__(
        self,
        *,
        training_operator_cls: type[TrainingOperator],
        initialization_hook: Callable[[], Any] | None = None,
        config: dict[str, Any] | None = None,
        num_workers: int = 1,
        num_cpus_per_worker: float = 1,
        use_gpu: bool | str = "auto",
        backend: str = "auto",
        wrap_ddp: bool = True,
        timeout_s: float = 1800,
        use_fp16: bool | str = False,
        use_tqdm: bool = False,
        add_dist_sampler: bool = True,
        scheduler_step_freq: str | None = None,
        use_local: bool = False,
        run_config: RunConfig | None = None,
        **removed: Any,
    ):
        creators = sorted(k for k in removed if k in _CREATORS)
        if creators:
            raise ValueError(
                f"TorchTrainer({', '.join(f'{k}=' for k in creators)}): creator functions are deprecated (as in "
                "RaySGD >= 1.0): CustomOperator = TrainingOperator.from_creators(model_creator, ...), then "
                "TorchTrainer(training_operator_cls=CustomOperator, ...)."
            )
        gone = sorted(k for k in removed if k in _GONE)
        if gone:
            raise ValueError(
                f"TorchTrainer({', '.join(f'{k}=' for k in gone)}) is deprecated: use config={{BATCH_SIZE: N}} for a "
                "global batch size, num_workers= for the workers, DataLoaders built in setup()."
            )
        if removed:
            raise TypeError(f"TorchTrainer() got unexpected keyword argument(s) {sorted(removed)}")
        if not (inspect.isclass(training_operator_cls) and issubclass(training_operator_cls, TrainingOperator)):
            raise ValueError(
                f"training_operator_cls={training_operator_cls!r} is not valid: pass a subclass of "
                "trainforge.sgd.torch.TrainingOperator that overrides setup(config)."
            )
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers <= 0:
            raise ValueError(f"The number of workers must be greater than 0. Received num_workers={num_workers}")
        if scheduler_step_freq not in VALID_SCHEDULER_STEP:
            raise ValueError(f"Scheduler step freq must be in {VALID_SCHEDULER_STEP}. Got {scheduler_step_freq}")
        if use_fp16 == "apex":
            raise ValueError("use_fp16='apex' is not supported: use_fp16=True uses torch's native mixed precision.")
        if use_gpu == "auto":
            from trainforge._internal.resources import local_available

            use_gpu = local_available().get("GPU", 0) > 0
        if backend not in ("auto", "gloo", "nccl"):
            raise ValueError(f"backend={backend!r} is not valid: use 'auto', 'gloo' or 'nccl'")
        self.config = dict(config or {})
        if BATCH_SIZE in self.config and isinstance(self.config[BATCH_SIZE], int) and self.config[BATCH_SIZE] % num_workers:
            new = self.config[BATCH_SIZE] // num_workers * num_workers
            logger.warning("Changing batch size from %d to %d to evenly distribute batches across %d workers.",
                           self.config[BATCH_SIZE], new, num_workers)  # fmt: skip
            self.config[BATCH_SIZE] = new
        self.training_operator_cls = training_operator_cls
        self.num_workers = num_workers
        self.use_gpu = bool(use_gpu)
        self.use_fp16 = bool(use_fp16)
        self.scheduler_step_freq = scheduler_step_freq
        self._tmp_dirs: list[str] = []
        resources = {"CPU": float(num_cpus_per_worker), **({"GPU": 1.0} if self.use_gpu else {})}
        self._trainer = _OperatorTrainer(
            training_operator_cls,
            options={"wrap_ddp": wrap_ddp, "add_dist_sampler": add_dist_sampler, "scheduler_step_freq": scheduler_step_freq},
            config=self.config,
            loop_config=LoopConfig(use_fp16=self.use_fp16, scheduler_step_freq=scheduler_step_freq or "manual"),
            scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=self.use_gpu, resources_per_worker=resources),
            run_config=run_config or RunConfig(verbose=0, failure_config=FailureConfig(max_failures=3)),
            torch_config=TorchConfig(backend=None if backend == "auto" else backend, timeout_s=int(timeout_s)),
            worker_init_fn=initialization_hook,
        )

    @property
    def model_trainer(self) -> ModelTrainer:
        """The :class:`trainforge.model.ModelTrainer` behind it (its run, ``get_model()``, ...)."""
        return self._trainer

    def train(
        self, num_steps: int | None = None, profile: bool = False, reduce_results: bool = True,
        max_retries: int = 3, info: dict[str, Any] | None = None, dataset: Any = None,
    ) -> dict[str, Any] | list[dict[str, Any]]:  # fmt: skip
        """One training epoch (``num_steps``: at most that many batches per worker): ``num_samples``,
        ``epoch``, ``batch_count``, ``train_loss``, ``last_train_loss`` averaged over the workers (a
        list of per-worker dicts with ``reduce_results=False``)."""
        if max_retries < 0:
            raise ValueError("`max_retries` must be non-negative.")
        if dataset is not None:
            raise ValueError("train(dataset=...) (RaySGD's sgd.Dataset) is not supported: register a DataLoader in setup()")
        return self._trainer.train(num_steps, reduce_results=reduce_results, profile=profile, info=info)

    def validate(
        self, num_steps: int | None = None, profile: bool = False, reduce_results: bool = True,
        info: dict[str, Any] | None = None,
    ) -> dict[str, Any] | list[dict[str, Any]]:  # fmt: skip
        """One pass over the validation data: ``batch_count``, ``num_samples``, ``val_loss``,
        ``val_accuracy``, ``last_val_loss``, ``last_val_accuracy``."""
        return self._trainer.validate(num_steps, reduce_results=reduce_results, profile=profile, info=info)

    def update_scheduler(self, metric: Any) -> None:
        """``scheduler.step(metric)`` on every worker's schedulers (e.g. ``ReduceLROnPlateau``)."""
        self.apply_all_operators(lambda op: [s.step(metric) for s in op.schedulers])

    def apply_all_operators(self, fn: Callable[[TrainingOperator], Any]) -> list[Any]:
        """``fn(operator)`` on every worker; the results in rank order."""
        return self._trainer.apply(fn)  # type: ignore[arg-type]

    def apply_all_workers(self, fn: Callable[[], Any]) -> list[Any]:
        """``fn()`` in every worker process; the results in rank order."""
        return self._trainer.apply_workers(fn)

    def get_model(self, to_cpu: bool = False) -> Any:
        """The trained network (a list if several were registered), unwrapped from DDP, on the CPU."""
        models = self._trainer.get_model().models
        return models[0] if len(models) == 1 else models

    def get_local_operator(self) -> TrainingOperator:
        raise NotImplementedError(
            "get_local_operator(): every operator lives in a worker process here; use apply_all_operators(fn) "
            "or get_model()."
        )

    def save(self, checkpoint: str) -> str:
        """Save the workers' state (model, optimizers, schedulers, epoch) to the file ``checkpoint``."""
        self._trainer._drive()  # RaySGD's workers exist from the constructor on
        source = self._trainer.current_checkpoint()
        with source.as_directory() as directory, tarfile.open(checkpoint, "w") as tar:
            tar.add(directory, arcname="checkpoint")
        return checkpoint

    def load(self, checkpoint: str) -> None:
        """Load a file written by :meth:`save`: the workers (re)start from it at the next call."""
        tmp = tempfile.mkdtemp(prefix="trainforge-sgd-load-")
        self._tmp_dirs.append(tmp)
        with tarfile.open(checkpoint) as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(tmp, filter="data")
            else:  # Python without extraction filters
                tar.extractall(tmp)  # noqa: S202 - a file written by save()
        self._trainer.shutdown()
        self._trainer.resume_from_checkpoint = Checkpoint.from_directory(os.path.join(tmp, "checkpoint"))

    def shutdown(self, force: bool = False) -> None:
        """Stop the workers and release their resources."""
        try:
            self._trainer.shutdown()
        finally:
            for tmp in self._tmp_dirs:
                shutil.rmtree(tmp, ignore_errors=True)
            self._tmp_dirs = []

    @classmethod
    def as_trainable(cls, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "TorchTrainer.as_trainable(): tune the operator with trainforge's Tuner instead: "
            "Tuner(ModelTrainer(MyTrainingOperator, config=...), param_space={'train_loop_config': {...}})."
        )

    def __enter__(self) -> TorchTrainer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
