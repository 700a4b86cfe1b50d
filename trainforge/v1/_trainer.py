"""Ray Train 1.x's ``Trainer`` on trainforge's core.

    Ray Train 1.x                               here
    Trainer(backend, num_workers, use_gpu,      a core trainer of the backend (TorchTrainer,
            resources_per_worker, logdir,       TensorflowTrainer, DataParallelTrainer) with
            max_retries)                        ScalingConfig(num_workers, use_gpu, resources) and
                                                FailureConfig(max_failures=max_retries)
    start(initialization_hook)                  its workers start (worker_init_fn=hook) and stay up
                                                until shutdown(): one core run, driven (_group.py)
    run / run_iterator(train_func, config, ...) one "run" command; results, checkpoints and return
                                                values come back as the run goes (_iterator.py)
    logdir/run_NNN/checkpoints/checkpoint_NNNNNN  written by the driver (_checkpoint.py)
    to_tune_trainable(train_func)               a core trainer whose loop runs train_func once per
                                                trial: Tuner(trainable, param_space={"train_loop_config": ...})
    to_worker_group(...)                        not supported (NotImplementedError says why)
"""

from __future__ import annotations

import inspect
import logging
import os
import secrets
import shutil
import weakref
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from trainforge import CheckpointConfig, DataParallelTrainer, FailureConfig, RunConfig, ScalingConfig
from trainforge._internal import code_pickle
from trainforge.backend import BackendConfig
from trainforge.model import driver_host
from trainforge.tensorflow import TensorflowConfig, TensorflowTrainer
from trainforge.torch import TorchConfig, TorchTrainer
from trainforge.v1._checkpoint import CheckpointManager, CheckpointStrategy, load_checkpoint_from_path
from trainforge.v1._constants import (
    DEFAULT_LOGDIR_FORMAT,
    GROUP_NAME_FORMAT,
    GROUP_STORAGE_DIR,
    RUN_DIR_FORMAT,
)
from trainforge.v1._data import check_dataset, executor_is_ray, split_dataset
from trainforge.v1._group import BUSY, WorkerGroup
from trainforge.v1._iterator import TrainingIterator
from trainforge.v1._protocol import RUN, RunPayload
from trainforge.v1._worker import TuneLoop, serve

logger = logging.getLogger("trainforge")

BACKENDS: dict[str, Callable[[], BackendConfig]] = {"torch": TorchConfig, "tensorflow": TensorflowConfig}
NOT_ACTIVE = (
    "This Trainer is not active. It is either shutdown already or never started in the first place. Either create a "
    "new Trainer or start this one."
)


class Trainer:
    """Run a training function on ``num_workers`` workers that stay up between runs (Ray Train 1.x).

    Example (Ray's, with ``ray.train`` changed to ``trainforge.v1``)::

        from trainforge import v1 as train
        from trainforge.v1 import Trainer
        from trainforge.v1.callbacks import JsonLoggerCallback

        def train_func(config):
            for epoch in range(config["epochs"]):
                ...
                train.report(loss=loss, epoch=epoch)
                train.save_checkpoint(epoch=epoch, model=model.state_dict())
            return model.state_dict()

        trainer = Trainer(backend="torch", num_workers=2)
        trainer.start()
        results = trainer.run(train_func, config={"epochs": 3}, callbacks=[JsonLoggerCallback()])
        trainer.shutdown()

    ``backend``: "torch", "tensorflow", or a config (``trainforge.v1.torch.TorchConfig(...)``, ...).
    ``resources_per_worker``: e.g. ``{"CPU": 2, "GPU": 1}`` (CPU and GPU override the defaults, 1 CPU
    and, with ``use_gpu``, 1 GPU). ``logdir``: where runs are kept (default
    ``~/trainforge_results/train_<date>``, or under ``$TRAINFORGE_STORAGE_PATH``; a relative path is
    taken under it too, as 1.x did under ``~/ray_results``). ``max_retries``: restarts of the workers
    after failures, from the latest checkpoint (-1: no limit). The workers are local processes, or
    Ray actors when this process is connected to Ray (``ray.init()`` first).
    """

    def __init__(
        self,
        backend: str | BackendConfig,
        num_workers: int,
        use_gpu: bool = False,
        resources_per_worker: dict[str, float] | None = None,
        logdir: str | os.PathLike | None = None,
        max_retries: int = 3,
    ):
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers <= 0:
            raise ValueError(f"`num_workers` must be a positive integer, got num_workers={num_workers!r}.")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < -1:
            raise ValueError(
                f"max_retries={max_retries!r} is not valid: use a number of restarts >= 0, or -1 for no limit."
            )
        self._backend_config = _backend_config(backend)
        self._num_workers = num_workers
        self._scaling = _scaling_config(num_workers, bool(use_gpu), resources_per_worker)
        self._max_retries = max_retries
        self.logdir = _create_logdir(logdir)
        self._run_id = 0
        self.checkpoint_manager = CheckpointManager()
        self._group: WorkerGroup | None = None
        self._group_dir: Path | None = None  # the core run of the current group
        self._active = False
        self._initialization_hook: Callable[[], Any] | None = None
        self._finalizer: weakref.finalize | None = None

    # -- the worker group --------------------------------------------------------------------------
    def start(self, initialization_hook: Callable[[], Any] | None = None) -> None:
        """Start the workers (``initialization_hook()`` runs in each one first); they stay up for every
        ``run()`` until :meth:`shutdown`."""
        if self._active:
            raise RuntimeError("This Trainer is already started: call shutdown() before start() again.")
        if initialization_hook is not None and not callable(initialization_hook):
            raise TypeError(f"initialization_hook={initialization_hook!r} must be a function taking no arguments.")
        self._initialization_hook = initialization_hook
        self._start_group()
        self._active = True

    def _start_group(self) -> None:
        name = GROUP_NAME_FORMAT.format(datetime.now(), secrets.token_hex(3))  # never an older run's directory
        run_config = RunConfig(
            name=name, storage_path=str(self.logdir / GROUP_STORAGE_DIR), verbose=0,
            checkpoint_config=CheckpointConfig(num_to_keep=1),  # the latest: what a restart resumes from
            failure_config=FailureConfig(max_failures=self._max_retries),
        )  # fmt: skip

        def make_trainer(loop_config: dict[str, Any]) -> DataParallelTrainer:
            return _core_trainer(self._backend_config, serve, loop_config, self._scaling, run_config,
                                 self._initialization_hook)  # fmt: skip

        group = WorkerGroup.start(make_trainer, driver_host(self._scaling))
        self._group = group
        self._group_dir = self.logdir / GROUP_STORAGE_DIR / name
        self._finalizer = weakref.finalize(self, group.abort)  # collected or the interpreter exits: stop them

    def _ready_group(self) -> WorkerGroup:
        if not self._active:
            raise RuntimeError(NOT_ACTIVE)
        if self._group is None or self._group.closed:
            logger.warning("the worker group of this Trainer stopped after a failure: starting a new one")
            self._start_group()
        assert self._group is not None
        return self._group

    def shutdown(self) -> None:
        """Stop the workers. A later ``start()`` starts new ones."""
        self._active = False
        group, self._group = self._group, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if group is None:
            return
        result = group.close()
        if result is not None and result.error is None and self._group_dir is not None:
            # a clean end: its core run (the restart checkpoint, the worker logs) is no longer needed
            shutil.rmtree(self._group_dir, ignore_errors=True)
            try:
                os.rmdir(self.logdir / GROUP_STORAGE_DIR)
            except OSError:
                pass  # another group's run is kept there

    # -- runs ---------------------------------------------------------------------------------------
    def run(
        self,
        train_func: Callable[..., Any],
        config: dict[str, Any] | None = None,
        callbacks: list[Any] | None = None,
        dataset: Any = None,
        checkpoint: dict[str, Any] | str | os.PathLike | None = None,
        checkpoint_strategy: CheckpointStrategy | None = None,
    ) -> list[Any]:
        """Run ``train_func`` (taking ``config`` or nothing) on every worker; return each worker's
        return value. ``callbacks``: :class:`trainforge.v1.TrainingCallback` s, given every result.
        ``dataset``: a dataset or a dict of them, split among the workers
        (``train.get_dataset_shard(name)``). ``checkpoint``: a dict, or the path of a checkpoint file,
        that ``train.load_checkpoint()`` returns. ``checkpoint_strategy``: which checkpoints to keep."""
        callbacks = list(callbacks or [])
        for cb in callbacks:
            if not callable(getattr(cb, "handle_result", None)):
                raise TypeError(f"callbacks: {cb!r} is not a trainforge.v1.TrainingCallback")
        payload = self._payload(train_func, config, dataset, checkpoint, checkpoint_strategy)
        run_dir = self._new_run_dir(checkpoint_strategy)
        error = False
        for cb in callbacks:
            cb.start_training(logdir=str(run_dir), config=config or {})
        iterator: TrainingIterator | None = None
        try:
            iterator = self._begin(payload)
            for results in iterator:
                for cb in callbacks:
                    cb.process_results(results)
            final = iterator.get_final_results()
            assert final is not None
            return final
        except BaseException:
            error = True
            if iterator is not None:
                iterator.abandon()
            raise
        finally:
            for cb in callbacks:
                cb.finish_training(error=error, run_dir=str(run_dir))

    def run_iterator(
        self,
        train_func: Callable[..., Any],
        config: dict[str, Any] | None = None,
        dataset: Any = None,
        checkpoint: dict[str, Any] | str | os.PathLike | None = None,
        checkpoint_strategy: CheckpointStrategy | None = None,
    ) -> TrainingIterator:
        """Like :meth:`run`, but return an iterator over the results (a list of one dict per worker for
        each ``train.report()``); ``get_final_results()`` then gives the return values."""
        payload = self._payload(train_func, config, dataset, checkpoint, checkpoint_strategy)
        self._new_run_dir(checkpoint_strategy)
        return self._begin(payload)

    def _payload(self, train_func: Callable[..., Any], config: dict[str, Any] | None, dataset: Any,
                 checkpoint: Any, strategy: Any) -> bytes:  # fmt: skip
        """Check a run's arguments (before anything of it happens) and pickle what the workers get."""
        if not self._active:
            raise RuntimeError(NOT_ACTIVE)
        if self._group is not None and self._group.busy is not None:
            raise RuntimeError(BUSY)
        takes_config = _check_train_func(train_func)
        if strategy is not None and not isinstance(strategy, CheckpointStrategy):
            raise TypeError(f"checkpoint_strategy={strategy!r} must be a trainforge.v1.CheckpointStrategy (or None).")
        if config is not None and not isinstance(config, dict):
            raise TypeError(f"config={config!r} must be a dict (or None).")
        check_dataset(dataset, on_ray=executor_is_ray())
        if checkpoint is not None and not isinstance(checkpoint, dict):
            if not isinstance(checkpoint, (str, os.PathLike)):
                raise TypeError(f"checkpoint={checkpoint!r} must be a dict, the path of a checkpoint file, or None.")
            checkpoint = load_checkpoint_from_path(checkpoint)
        payload = RunPayload(train_func, takes_config, dict(config or {}), checkpoint,
                             split_dataset(dataset, self._num_workers))  # fmt: skip
        try:
            return code_pickle.dumps(payload)
        except Exception as exc:
            raise TypeError(
                f"run(): the train function, its config, dataset and checkpoint must be picklable (cloudpickle) to "
                f"reach the workers: {exc}"
            ) from exc

    def _new_run_dir(self, strategy: CheckpointStrategy | None) -> Path:
        self._run_id += 1
        run_dir = self.latest_run_dir
        assert run_dir is not None
        run_dir.mkdir(parents=True, exist_ok=True)
        logger.info("Run results will be logged in: %s", run_dir)
        self.checkpoint_manager.start_run(run_dir, strategy)
        return run_dir

    def _begin(self, payload: bytes) -> TrainingIterator:
        group = self._ready_group()
        group.begin(RUN, payload)
        return TrainingIterator(group, self.checkpoint_manager)

    # -- where things are ---------------------------------------------------------------------------
    @property
    def latest_run_dir(self) -> Path | None:
        """``{logdir}/run_NNN`` of the latest ``run()`` / ``run_iterator()`` (None before the first)."""
        return self.logdir / RUN_DIR_FORMAT.format(self._run_id) if self._run_id > 0 else None

    @property
    def latest_checkpoint_dir(self) -> Path | None:
        """``{latest_run_dir}/checkpoints``."""
        return self.checkpoint_manager.latest_checkpoint_dir

    @property
    def best_checkpoint_path(self) -> Path | None:
        """The file of the latest run's best checkpoint on disk, by its ``CheckpointStrategy`` (the
        newest by default); None if it wrote none."""
        return self.checkpoint_manager.best_checkpoint_path

    @property
    def latest_checkpoint(self) -> dict[str, Any] | None:
        """The latest checkpoint saved (in memory: it may not have been written to disk)."""
        return self.checkpoint_manager.latest_checkpoint

    @property
    def best_checkpoint(self) -> dict[str, Any] | None:
        """The dict of :attr:`best_checkpoint_path`."""
        path = self.best_checkpoint_path
        return None if path is None else load_checkpoint_from_path(path)

    @staticmethod
    def load_checkpoint(checkpoint_file_path: str | os.PathLike) -> dict[str, Any]:
        """The dict in a checkpoint file written by a run."""
        return load_checkpoint_from_path(checkpoint_file_path)

    # -- Tune and worker groups ---------------------------------------------------------------------
    def to_tune_trainable(self, train_func: Callable[..., Any], dataset: Any = None) -> DataParallelTrainer:
        """A trainable for the tune package's ``Tuner``: every trial runs ``train_func`` on this trainer's
        workers (num_workers, resources), with the trial's ``param_space["train_loop_config"]`` as its
        config; rank 0's ``train.report()`` s are the trial's results, ``train.save_checkpoint()`` its
        checkpoints (``train.load_checkpoint()`` returns the latest when a trial is retried or restored).

        Example::

            trainable = trainer.to_tune_trainable(train_func)
            tuner = tune.Tuner(trainable, param_space={"train_loop_config": {"lr": tune.loguniform(1e-4, 1e-1)}},
                               tune_config=tune.TuneConfig(metric="loss", mode="min", num_samples=4))
            best = tuner.fit().get_best_result()
        """
        if self._active:
            raise RuntimeError(
                "The Trainer must not be active to use `to_tune_trainable`. Either shutdown the Trainer or don't "
                "start it in the first place."
            )
        takes_config = _check_train_func(train_func)
        check_dataset(dataset, on_ray=executor_is_ray())
        return _core_trainer(self._backend_config, TuneLoop(train_func, takes_config, dataset), {}, self._scaling,
                             RunConfig(verbose=0), None)  # fmt: skip

    def to_worker_group(self, train_cls: type, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "Trainer.to_worker_group() returns Ray actor handles of train_cls, which trainforge's workers are not: "
            "run the class's methods inside a train function instead (trainer.run(lambda: train_cls(...).method())), "
            "or use Ray actors directly."
        )


def _backend_config(backend: str | BackendConfig) -> BackendConfig:
    if isinstance(backend, BackendConfig):
        return backend
    if isinstance(backend, str):
        if backend == "horovod":
            raise ValueError(
                "backend='horovod' is not supported by trainforge.v1: use backend='torch' (DistributedDataParallel) "
                "or backend='tensorflow' (MultiWorkerMirroredStrategy)."
            )
        if backend not in BACKENDS:
            raise ValueError(f"Invalid backend: {backend!r}. Supported string values are: {sorted(BACKENDS)}.")
        return BACKENDS[backend]()
    raise TypeError(f"Invalid type for backend: {type(backend).__name__}: use 'torch', 'tensorflow' or a BackendConfig.")


def _scaling_config(num_workers: int, use_gpu: bool, resources: dict[str, float] | None) -> ScalingConfig:
    extra = dict(resources or {})
    cpus = extra.pop("CPU", 1)
    gpus = extra.pop("GPU", int(use_gpu))
    if not use_gpu and gpus > 0:
        raise ValueError(
            f"`use_gpu` is False but `GPU` was found in `resources_per_worker` ({gpus!r}). Either set `use_gpu` to "
            "True or remove `GPU` from `resources_per_worker`."
        )
    if use_gpu and gpus == 0:
        raise ValueError(
            "`use_gpu` is True but `GPU` is set to 0 in `resources_per_worker`. Either set `use_gpu` to False or "
            "request a positive number of `GPU` in `resources_per_worker`."
        )
    per_worker = {"CPU": cpus, **({"GPU": gpus} if gpus else {}), **extra}
    return ScalingConfig(num_workers=num_workers, use_gpu=use_gpu, resources_per_worker=per_worker)


def _create_logdir(logdir: str | os.PathLike | None) -> Path:
    from trainforge._internal.constants import DEFAULT_STORAGE_DIRNAME, default_storage_path

    base = default_storage_path()
    if "://" in base:  # a remote default for core runs: 1.x's logdir is a local directory
        base = str(Path.home() / DEFAULT_STORAGE_DIRNAME)
    path = Path(logdir).expanduser() if logdir else Path(DEFAULT_LOGDIR_FORMAT.format(datetime.now()))
    if not path.is_absolute():
        path = Path(base).expanduser() / path
    path.mkdir(parents=True, exist_ok=True)
    logger.info("Trainer logs will be logged in: %s", path)
    return path


def _check_train_func(train_func: Any) -> bool:
    """True when ``train_func`` takes the config (1.x: 0 or 1 parameters)."""
    if not callable(train_func):
        raise TypeError(f"train_func={train_func!r} must be a function taking 0 or 1 argument (the config).")
    try:
        params = inspect.signature(train_func).parameters
    except (TypeError, ValueError):
        return True
    if len(params) > 1:
        raise ValueError(f"train_func should take in a 0 or 1 arguments, {getattr(train_func, '__name__', train_func)} "
                         f"takes {len(params)}: pass values through config={{...}}.")  # fmt: skip
    return len(params) == 1


def _core_trainer(backend: BackendConfig, loop: Callable[..., Any], loop_config: dict[str, Any],
                  scaling: ScalingConfig, run_config: RunConfig,
                  worker_init_fn: Callable[[], Any] | None) -> DataParallelTrainer:  # fmt: skip
    """The core trainer of ``backend`` running ``loop``."""
    if isinstance(backend, TorchConfig):
        return TorchTrainer(loop, train_loop_config=loop_config, torch_config=backend, scaling_config=scaling,
                            run_config=run_config, worker_init_fn=worker_init_fn)  # fmt: skip
    if isinstance(backend, TensorflowConfig):
        return TensorflowTrainer(loop, train_loop_config=loop_config, tensorflow_config=backend, scaling_config=scaling,
                                 run_config=run_config, worker_init_fn=worker_init_fn)  # fmt: skip
    return DataParallelTrainer(loop, train_loop_config=loop_config, backend_config=backend, scaling_config=scaling,
                               run_config=run_config, worker_init_fn=worker_init_fn)  # fmt: skip
