"""``DataParallelTrainer``: the public entry point that wires configs into a controller run."""

from __future__ import annotations

import datetime
import functools
import json
import logging
import os
import secrets
import signal
import threading
from collections.abc import Callable, Generator
from typing import Any

from trainforge._internal.backend import BackendConfig, resolve_backend
from trainforge._internal.callback import run_starting
from trainforge._internal.checkpoint import Checkpoint
from trainforge._internal.checkpoint_manager import CheckpointManager
from trainforge._internal.config import RunConfig, ScalingConfig
from trainforge._internal.controller import Controller
from trainforge._internal.controller_hooks import ControllerHooks
from trainforge._internal.exceptions import StorageError, WorkerFailure
from trainforge._internal.failure_log import mark_rank_logs
from trainforge._internal.failure_policy import FailurePolicy
from trainforge._internal.metrics_log import MetricsLog
from trainforge._internal.progress import ProgressReporter, console, console_warnings
from trainforge._internal.result import Result, TrainingReport
from trainforge._internal.storage import RUN_STATE_FILE, StorageContext
from trainforge._internal.train_fn import check_train_loop
from trainforge._internal.trainer_state import can_restore, load_trainer, save_trainer, write_run_state
from trainforge._internal.training_iterator import TrainingIterator
from trainforge._internal.worker_group.executor import Executor, executor_kind, make_executor
from trainforge._internal.worker_payloads import MakePayloads, datasets_to_split, payload_maker

logger = logging.getLogger("trainforge")


class _TerminateSignal:
    """During a run in the main thread, SIGTERM raises SystemExit so the workers are stopped in
    ``finally`` blocks (Ctrl-C already raises KeyboardInterrupt)."""

    def __init__(self) -> None:
        self._previous: Any = None
        self._active = False

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.getsignal(signal.SIGTERM)
            signal.signal(signal.SIGTERM, self._handle)
            self._active = True

    @staticmethod
    def _handle(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    def restore(self) -> None:
        if self._active:
            signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)
            self._active = False


class DataParallelTrainer:
    """Run ``train_loop_per_worker`` on ``scaling_config.num_workers`` worker processes.

    Example::

        def train_loop(config):
            ctx = trainforge.get_context()
            for epoch in range(config["epochs"]):
                trainforge.report({"epoch": epoch, "rank": ctx.get_world_rank()})

        result = DataParallelTrainer(
            train_loop, train_loop_config={"epochs": 2}, scaling_config=ScalingConfig(num_workers=2)
        ).fit()

    ``metadata``: a JSON-serializable dict, available on the workers as
    ``get_context().get_metadata()`` and merged into ``get_metadata()`` of every checkpoint this run
    commits (on any storage, and after ``restore()``); a key that a worker set on the checkpoint
    itself (``checkpoint.set_metadata`` / ``update_metadata``) wins over the trainer's.

    ``worker_init_fn`` (trainforge extension): a function of no arguments run in every worker
    process before the backend starts and before the loop (set environment variables, seed RNGs).
    """

    # Modules every worker imports at start-up, in parallel with the driver's set-up (TorchTrainer: torch).
    _preload_modules: tuple[str, ...] = ()

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        train_loop_config: dict[str, Any] | None = None,
        backend_config: BackendConfig | None = None,
        scaling_config: ScalingConfig | None = None,
        run_config: RunConfig | None = None,
        datasets: dict[str, Any] | None = None,
        dataset_config: Any = None,
        metadata: dict[str, Any] | None = None,
        resume_from_checkpoint: Checkpoint | str | None = None,
        worker_init_fn: Callable[[], Any] | None = None,
    ):
        from trainforge._internal.datasets import check_datasets

        self._takes_config = check_train_loop(train_loop_per_worker)
        self.train_loop_per_worker = train_loop_per_worker
        if train_loop_config is not None and not isinstance(train_loop_config, dict):
            raise TypeError(f"train_loop_config={train_loop_config!r} must be a dict (or None).")
        self.train_loop_config = train_loop_config
        self.backend_config = backend_config if backend_config is not None else BackendConfig()
        self._backend = resolve_backend(self.backend_config)
        self.scaling_config = scaling_config if scaling_config is not None else ScalingConfig()
        if not isinstance(self.scaling_config, ScalingConfig):
            raise TypeError(f"scaling_config={self.scaling_config!r} must be a trainforge.ScalingConfig.")
        self.run_config = run_config if run_config is not None else RunConfig()
        if not isinstance(self.run_config, RunConfig):
            raise TypeError(f"run_config={self.run_config!r} must be a trainforge.RunConfig.")
        check_datasets(datasets, allow_ray=executor_kind(self.scaling_config) == "ray")
        self.datasets = datasets
        self.dataset_config = dataset_config
        self._datasets_to_split = datasets_to_split(dataset_config)
        if metadata is not None and not isinstance(metadata, dict):
            raise TypeError(f"metadata={metadata!r} must be a dict (or None).")
        try:
            self.metadata = json.loads(json.dumps(metadata or {}))
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"metadata={metadata!r} must be JSON-serializable (it is saved in every checkpoint's "
                f"metadata): {exc}. Pass strings, numbers, booleans, None, lists and dicts of them."
            ) from exc
        if isinstance(resume_from_checkpoint, str) and resume_from_checkpoint.startswith("models:/"):
            resume_from_checkpoint = Checkpoint.from_uri(resume_from_checkpoint)  # a registered version
        if resume_from_checkpoint is not None and not isinstance(resume_from_checkpoint, Checkpoint):
            raise TypeError(
                f"resume_from_checkpoint={resume_from_checkpoint!r} must be a trainforge.Checkpoint "
                "(e.g. Result.from_path(path).checkpoint or Checkpoint.from_directory(dir)) or a registered "
                "model's URI ('models:/name/3', 'models:/name@production')."
            )
        self.resume_from_checkpoint = resume_from_checkpoint
        if worker_init_fn is not None and not callable(worker_init_fn):
            raise TypeError(f"worker_init_fn={worker_init_fn!r} must be a function taking no arguments.")
        self.worker_init_fn = worker_init_fn
        if executor_kind(self.scaling_config) == "local":
            from trainforge._internal.devices import local_gpu_groups

            # Fail now, not after start-up, if even the minimum number of workers cannot get its GPUs.
            # (On Ray, fit() checks the request against the cluster before any worker starts.)
            local_gpu_groups(self.scaling_config, self.scaling_config.min_workers)

    # -- public -----------------------------------------------------------------------------------
    def fit(self) -> Result:
        """Run training to the end. Raises :class:`TrainingFailedError` if the workers failed more
        often than ``FailureConfig.max_failures`` allows; otherwise returns the :class:`Result`.
        Ctrl-C stops every worker, prints one line naming the run directory, and raises
        ``KeyboardInterrupt`` (resume with :meth:`restore`)."""
        run = self.fit_iter()
        try:
            for _ in run:
                pass
        except KeyboardInterrupt as exc:
            # The workers are stopped; the traceback starts here, not deep inside the run's loop.
            raise exc.with_traceback(None) from None
        assert run.result is not None
        if run.result.error is not None:
            raise run.result.error
        return run.result

    def fit_iter(self) -> TrainingIterator:
        """Like :meth:`fit`, but yields each report as it arrives (see :class:`TrainingIterator`).
        A failure does not raise here: it is in ``.result.error``."""
        stop = threading.Event()
        return TrainingIterator(self._run(stop), stop)

    def submit(
        self,
        *,
        wait: bool = False,
        callback: Callable[[Result], Any] | None = None,
        address: str | None = None,
        name: str | None = None,
        priority: int = 0,
        hold: bool = False,
        max_retries: int = 1,
        env: dict[str, str] | None = None,
        preemptible: bool = False,
    ) -> Any:
        """Queue this trainer's run on a train server (``trainforge[server]``) and return its job
        handle (:class:`trainforge.server.Job`: ``status()``, ``wait()``, ``result()`` -- the Result
        ``fit()`` would return --, ``reports()``, ``logs()``, ``stop()``). The server on this machine
        is used (``address`` or ``$TRAINFORGE_ADDRESS`` for another); if none runs, one is started
        in the background, and this says so. ``wait=True`` streams the job's output here until it
        ends (Ctrl-C detaches; the job goes on); ``callback`` is called with the Result when it
        ends. ``max_retries``: times the job is requeued if its runner is lost (worker failures
        are ``FailureConfig``'s, inside the job). ``preemptible``: the server may ask it to give its
        resources back to a higher-priority job (it stops as after Ctrl-C, is requeued and resumes
        from its latest checkpoint). ``fit()`` is unchanged and stays local."""
        from trainforge._internal.extensions import SUBMITTERS, lookup

        submit_trainer = lookup(SUBMITTERS, "server")
        if submit_trainer is None:
            raise ImportError("trainer.submit() needs the train server's client: pip install 'trainforge[server]' "
                              "(from a checkout on PYTHONPATH: have `trainforge.server` imported first)")  # fmt: skip
        return submit_trainer(
            self, wait=wait, callback=callback, address=address, name=name, priority=priority, hold=hold,
            max_retries=max_retries, env=env, preemptible=preemptible,
        )  # fmt: skip

    @classmethod
    def can_restore(cls, path: str | os.PathLike, storage_filesystem: Any = None) -> bool:
        """True if ``path`` is a run directory that :meth:`restore` can resume."""
        return can_restore(path, storage_filesystem)

    @classmethod
    def restore(cls, path: str | os.PathLike, storage_filesystem: Any = None, **overrides: Any) -> DataParallelTrainer:
        """Rebuild the trainer of an interrupted run; ``fit()`` then resumes from its latest committed
        checkpoint, continuing its metrics history. Datasets are not stored: pass ``datasets=`` again.
        Any constructor argument may be overridden (e.g. ``train_loop_per_worker=``)."""
        trainer: DataParallelTrainer = load_trainer(cls, path, storage_filesystem, overrides)
        return trainer

    # -- internals --------------------------------------------------------------------------------
    def _constructor_state(self) -> dict[str, Any]:
        state = {
            "trainer_cls": type(self),
            "train_loop_per_worker": self.train_loop_per_worker,
            "train_loop_config": self.train_loop_config,
            "scaling_config": self.scaling_config,
            "run_config": self.run_config,
            "dataset_config": self.dataset_config,
            "metadata": self.metadata,
            "worker_init_fn": self.worker_init_fn,
        }
        state.update(self._backend_state())
        return state

    def _backend_state(self) -> dict[str, Any]:
        return {"backend_config": self.backend_config}

    def _make_storage(self) -> StorageContext:
        rc = self.run_config
        from trainforge._internal.constants import default_storage_path

        name = rc.name or (
            f"{type(self).__name__}_{datetime.datetime.now():%Y-%m-%d_%H-%M-%S}_{secrets.token_hex(2)}"
        )
        storage = StorageContext(
            rc.storage_path or default_storage_path(), name, rc.storage_filesystem, trainer_metadata=self.metadata
        )
        storage.prepare()
        return storage

    def _save_state(
        self,
        storage: StorageContext,
        status: str,
        error: BaseException | None = None,
        failures: list[list[WorkerFailure]] | None = None,
    ) -> None:
        cc = self.run_config.checkpoint_config
        assert cc is not None
        write_run_state(storage, type(self).__name__, self.scaling_config.num_workers, cc, status, error, failures)

    def _record_failures(
        self, storage: StorageContext, log_dir: str | None, controller: Controller, failures: list[WorkerFailure]
    ) -> None:
        """A failed attempt (recovered from or not) is kept in the rank's log and in run_state.json."""
        mark_rank_logs(log_dir, failures)
        try:
            self._save_state(storage, "running", failures=controller.failures)
        except StorageError as exc:  # the run goes on; the record is also in Result.failures
            logger.warning("could not record the failure in %s: %s", storage.path(RUN_STATE_FILE), exc)

    def _interrupted(self, storage: StorageContext, controller: Controller, restorable: bool) -> KeyboardInterrupt:
        """Ctrl-C: one console line saying what was stopped and where the run is; the exception to
        raise instead of the one from deep inside the controller."""
        stopped = controller.sizes[-1] if controller.group is not None and controller.sizes else 0
        latest = controller.checkpoints.latest
        where = f"run directory: {storage.run_path}"
        if restorable:
            where += f" (resume with {type(self).__name__}.restore({storage.run_path!r}))"
        ckpt = f"latest {latest.path.rstrip('/').rsplit('/', 1)[-1]}" if latest is not None else "no checkpoint"
        line = (
            f"interrupted: stopped {stopped} worker(s) of run {storage.name!r} (attempt {controller.attempt}, "
            f"{len(controller.metrics.rows)} report(s), {ckpt}); {where}"
        )
        if self.run_config.verbose:
            console(line)
        return KeyboardInterrupt(f"fit() was interrupted; {where}")

    def _make_payloads(self, storage: StorageContext, executor: Executor) -> MakePayloads:
        return payload_maker(
            storage=storage, executor=executor, train_fn=self.train_loop_per_worker, takes_config=self._takes_config,
            config=self.train_loop_config, metadata=self.metadata, datasets=self.datasets,
            to_split=self._datasets_to_split, backend_config=self.backend_config, run_config=self.run_config,
        )  # fmt: skip

    def _run(self, stop: threading.Event | None = None) -> Generator[TrainingReport, None, Result]:
        # trainforge's warnings (restarts, storage retries, ...) as console lines while the run goes.
        with console_warnings(self.run_config.verbose >= 1):
            return (yield from self._run_steps(stop))

    def _run_steps(self, stop: threading.Event | None = None) -> Generator[TrainingReport, None, Result]:
        from trainforge._internal.job_events import job_events_callback
        from trainforge._internal.scaling_policy import ScalingPolicy
        from trainforge._internal.stop_criteria import make_stopper

        rc = self.run_config
        storage = self._make_storage()
        callbacks = list(rc.callbacks or [])
        job_events = job_events_callback()  # inside a train-server job: the server reads them
        if job_events is not None:
            callbacks.append(job_events)
        if rc.verbose:
            from trainforge._internal.live_view import LiveView, live_view_available

            reporter = LiveView if live_view_available() else ProgressReporter
            callbacks.insert(0, reporter(rc.verbose, storage.name, executor_kind(self.scaling_config)))
        assert rc.checkpoint_config is not None and rc.failure_config is not None
        manager = CheckpointManager(rc.checkpoint_config, storage.delete_checkpoint)
        manager.load(storage.list_checkpoints())
        metrics_log = MetricsLog(storage)
        log_dir = storage.local_log_dir()
        may_restart = rc.failure_config.max_failures != 0 or self.scaling_config.elastic
        executor = make_executor(self.scaling_config, self._preload_modules, log_dir, rc.log_to_driver, storage,
                                 may_restart)  # fmt: skip
        try:  # from here the executor may hold processes (a zygote): closed below, or here on an error
            hooks = ControllerHooks(
                make_worker_group=executor.make_group,
                make_specs=executor.make_specs,
                make_payloads=self._make_payloads(storage, executor),
                worker_init_fn=self.worker_init_fn,
                preload=self._preload_modules,
                callbacks=callbacks,
                after_start=executor.after_start,
            )
            controller = Controller(
                hooks,
                self._backend,
                self.backend_config,
                storage,
                manager,
                FailurePolicy(rc.failure_config),
                metrics_log,
                initial_checkpoint=self.resume_from_checkpoint,
                scaling_policy=ScalingPolicy(self.scaling_config, executor.available, executor.name),
                hang_timeout_s=rc.failure_config.hang_timeout_s,
                stop_event=stop,
                stopper=make_stopper(rc.stop),
            )
            hooks.on_failure = functools.partial(self._record_failures, storage, log_dir, controller)
            self._save_state(storage, "running")
            restorable = save_trainer(storage, self._constructor_state)
            with run_starting(self, storage):
                for cb in callbacks:
                    cb.on_run_start(storage.run_path, self.scaling_config.num_workers)
            terminate = _TerminateSignal()
            terminate.install()
        except BaseException:
            executor.close()
            raise
        status = "interrupted"
        interrupted = False
        try:
            yield from controller.run_iter()
            status = "errored" if controller.error is not None else "stopped" if controller.stopped else "finished"
        except KeyboardInterrupt:
            interrupted = True  # raised again below, once the workers are stopped, from here
        finally:
            terminate.restore()
            executor.close()
            try:
                storage.upload_logs(log_dir)
                storage.remove_staging_if_empty()
                self._save_state(storage, status, controller.error, controller.failures)
            except StorageError as exc:  # never hide the run's own outcome behind this
                logger.warning("could not save the run's logs/state to %s: %s", storage.run_path, exc)
        if interrupted:
            # A short traceback (fit() down to here), not the controller's and selectors' frames.
            raise self._interrupted(storage, controller, restorable) from None
        result = controller.result()
        for cb in callbacks:
            cb.on_run_end(result)
        return result
