"""``Tuner``: run trials of a trainable over a search space; every trial is a train run."""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Any

import cloudpickle

from trainforge.tune._config import RunConfig, TuneConfig
from trainforge.tune._controller import TuneController, load_trials
from trainforge.tune._experiment import (
    ERROR,
    PENDING,
    RUNNING,
    TERMINATED,
    TUNER_FILE,
    ExperimentStore,
    Trial,
    new_experiment_id,
)
from trainforge.tune._progress import ProgressTable
from trainforge.tune._result import Result, ResultGrid
from trainforge.tune._server import connect as connect_server
from trainforge.tune._stopper import make_stopper
from trainforge.tune._trainable import as_model_trainer, check_trainable, is_trainer
from trainforge.tune._variants import has_unresolved, validate_param_space
from trainforge.tune._warm import warm_processes
from trainforge.tune.schedulers import FIFOScheduler
from trainforge.tune.search import BasicVariantGenerator, ConcurrencyLimiter, Searcher

if TYPE_CHECKING:
    from trainforge.client import Client

logger = logging.getLogger("trainforge.tune")

DEFAULT_STORAGE = os.path.join(os.path.expanduser("~"), "trainforge_results")


class Tuner:
    """Search ``param_space`` for the best configuration of ``trainable`` (Ray Tune's ``Tuner``).

    ``trainable``: a function ``f(config)`` (or ``async def``) calling ``tune.report``, or a trainer
    (``param_space={"train_loop_config": {...}, "scaling_config": ScalingConfig(...)}``), or a
    model class of any framework or a registered definition (``"models:/digits-net"``), trained by
    ``ModelTrainer(MyModel, data=data)``; without ``param_space``, ``MyModel.hyperparameter_space()``
    (a definition's stored space) is the search space of its config. Every trial
    is a train run in ``{storage_path}/{name}/{trial}``. Running a tuner whose experiment directory
    already holds an unfinished experiment continues it (as :meth:`restore`): finished trials are
    kept, unfinished ones resume from their latest checkpoint.

    Example::

        tuner = Tuner(train_fn, param_space={"lr": tune.loguniform(1e-4, 1e-1)},
                      tune_config=TuneConfig(metric="loss", mode="min", num_samples=20))
        best = tuner.fit().get_best_result()
    """

    def __init__(self, trainable: Any, *, param_space: dict[str, Any] | None = None,
                 tune_config: TuneConfig | None = None, run_config: Any = None, data: Any = None,
                 _restored: dict[str, Any] | None = None):  # fmt: skip
        trainable, param_space = as_model_trainer(trainable, param_space, data)
        check_trainable(trainable)
        self.trainable = trainable
        self.param_space = dict(param_space or {})
        validate_param_space(self.param_space)
        self.tune_config = tune_config or TuneConfig()
        if not isinstance(self.tune_config, TuneConfig):
            raise ValueError(f"tune_config={tune_config!r} is not valid: use trainforge.tune.TuneConfig(...)")
        if run_config is None:
            run_config = RunConfig()
        if not isinstance(run_config, RunConfig):  # train's RunConfig: take its fields, stop included
            from dataclasses import fields

            run_config = RunConfig(**{f.name: getattr(run_config, f.name) for f in fields(run_config)})
        self.run_config = run_config
        base = run_config.storage_path or os.environ.get("TRAINFORGE_STORAGE_PATH") or DEFAULT_STORAGE
        self.experiment_name = run_config.name or f"{_name(trainable)}_{_timestamp()}"
        self.experiment_path = f"{base.rstrip('/')}/{self.experiment_name}"
        self._restored = _restored
        self._results: ResultGrid | None = None
        self.last_controller: TuneController | None = None

    # -- Ray's API ---------------------------------------------------------------------------------
    def fit(self) -> ResultGrid:
        """Run the experiment to its end and return every trial's result (a failed trial's error is in
        the grid, not raised)."""
        store = ExperimentStore(self.experiment_path, self.run_config.storage_filesystem)
        state = self._restored if self._restored is not None else store.load_state()
        tc = self.tune_config
        searcher = tc.search_alg if tc.search_alg is not None else BasicVariantGenerator()
        if not isinstance(searcher, Searcher):
            raise ValueError(f"TuneConfig.search_alg={searcher!r} is not valid: use a trainforge.tune.search Searcher")
        if tc.max_concurrent_trials is not None and tc.search_alg is not None and not isinstance(searcher, ConcurrencyLimiter):
            searcher = ConcurrencyLimiter(searcher, tc.max_concurrent_trials)
        adopted = searcher.set_search_properties(tc.metric, tc.mode, self.param_space, num_samples=tc.num_samples)
        if not adopted and has_unresolved(self.param_space):
            raise ValueError(
                f"TuneConfig.search_alg={searcher!r} has a search space of its own: param_space may then hold "
                "only constants (move the search-space entries into one of the two)"
            )

        scheduler = tc.scheduler if tc.scheduler is not None else FIFOScheduler()
        if not scheduler.set_search_properties(tc.metric, tc.mode):
            raise ValueError(
                f"TuneConfig.scheduler={scheduler!r} has metric/mode {scheduler.metric!r}/{scheduler.mode!r}, "
                f"TuneConfig says {tc.metric!r}/{tc.mode!r}: give them in one place"
            )
        metric = tc.metric or searcher.metric or getattr(scheduler, "metric", None)
        mode = tc.mode or searcher.mode or getattr(scheduler, "mode", None)
        trials: list[Trial] = []
        experiment_id = new_experiment_id()
        if state is not None:
            trials = load_trials(state)
            experiment_id = state.get("experiment_id", experiment_id)
            if state.get("searcher"):
                searcher.set_state(state["searcher"])
            if state.get("scheduler"):
                scheduler.set_state(state["scheduler"])
            resumed = [t for t in trials if t.status in (PENDING, RUNNING)]
            for t in resumed:
                t.status = PENDING  # continues from its run directory's latest checkpoint
            if resumed or any(t.status == TERMINATED for t in trials):
                print(f"tune: continuing {self.experiment_path}: {sum(t.status == TERMINATED for t in trials)} "
                      f"finished trial(s) kept, {len(resumed)} resumed", flush=True)  # fmt: skip
        server = connect_server(tc.server, announce=bool(self.run_config.verbose))
        store.write(TUNER_FILE, _pickled(self))
        controller = TuneController(
            trainable=self.trainable, searcher=searcher, scheduler=scheduler,
            stopper=make_stopper(self.run_config.stop), run_config=self.run_config, store=store,
            experiment_name=self.experiment_name, experiment_id=experiment_id, metric=metric, mode=mode,
            max_concurrent=tc.max_concurrent_trials, time_budget_s=tc.time_budget_s, capacity=_capacity(server),
            progress=ProgressTable(self.experiment_path, metric, mode) if self.run_config.verbose else None,
            trials=trials, name_creator=tc.trial_name_creator, dirname_creator=tc.trial_dirname_creator,
            param_space=self.param_space, server=server,
        )  # fmt: skip
        if state is not None:
            controller.searcher_done = bool(state.get("searcher_done"))
        self.last_controller = controller
        if "optuna" in sys.modules:  # Optuna logs every trial it creates at INFO: the table says it all
            sys.modules["optuna"].logging.set_verbosity(sys.modules["optuna"].logging.WARNING)
        # Trials' workers forked from warm processes (reuse_actors; not when a train server runs them).
        with warm_processes(self.trainable, tc.reuse_actors is not False and getattr(controller, "server", None) is None):
            controller.run()
        self._results = ResultGrid([_result(store, t) for t in controller.trials], self.experiment_path,
                                   metric, mode)  # fmt: skip
        return self._results

    def get_results(self) -> ResultGrid:
        """The results of the last ``fit()``, or of the restored experiment as saved."""
        if self._results is not None:
            return self._results
        store = ExperimentStore(self.experiment_path, self.run_config.storage_filesystem)
        state = self._restored or store.load_state() or {}
        tc = self.tune_config
        return ResultGrid([_result(store, t) for t in load_trials(state)], self.experiment_path, tc.metric, tc.mode)

    @classmethod
    def can_restore(cls, path: str | os.PathLike[str], storage_filesystem: Any = None) -> bool:
        """True if ``path`` holds a tune experiment (its ``experiment_state.json``)."""
        return ExperimentStore(os.fspath(path), storage_filesystem).exists()

    @classmethod
    def restore(cls, path: str | os.PathLike[str], trainable: Any, *, resume_unfinished: bool = True,
                resume_errored: bool = False, restart_errored: bool = False, param_space: dict[str, Any] | None = None,
                storage_filesystem: Any = None) -> Tuner:  # fmt: skip
        """The tuner of the experiment at ``path``, to continue with ``fit()``: finished trials are not
        rerun; unfinished ones resume from their latest checkpoint (``resume_unfinished``); errored
        ones stay errored unless ``resume_errored`` (from their checkpoint) or ``restart_errored``
        (from scratch, in a fresh run directory). The search space cannot change."""
        path = os.fspath(path).rstrip("/")
        store = ExperimentStore(path, storage_filesystem)
        state = store.load_state()
        if state is None:
            raise ValueError(f"Tuner.restore({path!r}): no experiment there ({path}/experiment_state.json missing)")
        data = store.read(TUNER_FILE)
        saved = cloudpickle.loads(data) if data else {}
        run_config = saved.get("run_config") or RunConfig()
        parent, _, name = path.rpartition("/")
        from dataclasses import replace

        run_config = replace(run_config, storage_path=parent, name=name, storage_filesystem=storage_filesystem)
        for t in state.get("trials", []):
            if t["status"] in (PENDING, RUNNING) and not resume_unfinished:
                t["status"] = TERMINATED
            elif t["status"] == ERROR and (resume_errored or restart_errored):
                t["status"], t["error"] = PENDING, None
                if restart_errored:
                    t["run_index"] = t.get("run_index", 0) + 1
                    t["resume_from"] = None
        return cls(trainable, param_space=param_space if param_space is not None else saved.get("param_space"),
                   tune_config=saved.get("tune_config"), run_config=run_config, _restored=state)  # fmt: skip


def _pickled(tuner: Tuner) -> bytes:
    from dataclasses import replace

    run_config = replace(tuner.run_config, callbacks=None, storage_filesystem=None)
    try:
        return cloudpickle.dumps({"param_space": tuner.param_space, "tune_config": tuner.tune_config,
                                  "run_config": run_config})  # fmt: skip
    except Exception:  # noqa: BLE001 - a search space with unpicklable parts: restore needs param_space=
        return cloudpickle.dumps({"run_config": run_config})


def _result(store: ExperimentStore, trial: Trial) -> Result:
    from trainforge import Result as TrainResult

    path = f"{store.path}/{trial.run_name}"
    try:
        train = TrainResult.from_path(path, store.fs if not store.local else None)
        history, best, checkpoint = train.metrics_history, train.best_checkpoints, train.checkpoint
    except (ValueError, FileNotFoundError, OSError):
        history, best, checkpoint = [], [], None
    if trial.history:
        history = trial.history
    else:
        history = [{**row, "training_iteration": i + 1, "trial_id": trial.trial_id} for i, row in enumerate(history)]
    error = None
    if trial.status == ERROR:
        from trainforge.tune._controller import TrialError

        error = TrialError(f"trial {trial.name} ({trial.trial_id}) failed:\n{trial.error}")
    return Result(metrics=trial.last_result or (history[-1] if history else None), checkpoint=checkpoint,
                  error=error, path=path, best_checkpoints=best, metrics_history=history,
                  config=trial.config, state=trial.status)  # fmt: skip


def _capacity(server: Client | None = None) -> dict[str, float]:
    """What trials' gangs are packed against: the train server's capacity (it queues them with its
    other jobs), else this machine's."""
    if server is not None:
        return {k: float(v) for k, v in server.resources()["capacity"].items()}
    from trainforge._internal.resources import local_available

    return local_available()


def _name(trainable: Any) -> str:
    model_cls = getattr(trainable, "model_cls", None)  # a ModelTrainer: named after its model
    if is_trainer(trainable) and model_cls is not None:
        return str(model_cls.__name__)
    if is_trainer(trainable):
        return type(trainable).__name__
    return getattr(trainable, "__name__", "trainable")


def _timestamp() -> str:
    import datetime

    return datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
