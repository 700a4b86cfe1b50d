"""The tuner's loop: trials are train runs, started when all their workers fit, decided on at
every report, stopped with ``TrainingIterator.stop()``; the experiment's snapshot is saved after
every change.

Everything lives in the driver: a thread per running trial iterates its run (``fit_iter()``) and
hands each report to this loop through a queue; the searcher, the scheduler and the stop criteria
decide synchronously on it, so a decision takes the queue hop and nothing else.
"""

from __future__ import annotations

import base64
import logging
import math
import queue
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any

import cloudpickle

from trainforge import Checkpoint
from trainforge import RunConfig as TrainRunConfig
from trainforge._internal.metric_path import lookup
from trainforge.client import JobState, TrialDecision, TrialState, trial_state
from trainforge.tune._context import TUNE_KEY
from trainforge.tune._experiment import ERROR, PENDING, RUNNING, ExperimentStore, Trial
from trainforge.tune._experiment_info import experiment_info, experiment_tag
from trainforge.tune._server import ServerRun
from trainforge.tune._trainable import is_trainer, make_trial_trainer, trial_resources
from trainforge.tune._variants import merge_config
from trainforge.tune.schedulers import Exploit, TrialScheduler
from trainforge.tune.search import PRUNED_RESULT_KEY, Searcher

if TYPE_CHECKING:
    from trainforge.client import Client

logger = logging.getLogger("trainforge.tune")

INTERRUPTED = "Ctrl-C"  # a trial's stop_reason when the tuner was interrupted


class TrialError(RuntimeError):
    """A trial failed for good (after its retries); the original error is its ``__cause__`` and its
    text is in the message."""


class TuneController:
    def __init__(
        self, *, trainable: Any, searcher: Searcher, scheduler: TrialScheduler, stopper: Any,
        run_config: Any, store: ExperimentStore, experiment_name: str, experiment_id: str,
        metric: str | None, mode: str | None, max_concurrent: int | None, time_budget_s: float | None,
        capacity: dict[str, float], progress: Any = None, trials: list[Trial] | None = None,
        name_creator: Any = None, dirname_creator: Any = None, param_space: dict[str, Any] | None = None,
        server: Client | None = None,
    ):  # fmt: skip
        self.trainable = trainable
        self.searcher = searcher
        self.scheduler = scheduler
        self.stopper = stopper
        self.run_config = run_config
        self.store = store
        self.experiment_name = experiment_name
        self.experiment_id = experiment_id
        self.metric = metric
        self.mode = mode
        self.max_concurrent = max_concurrent
        self.time_budget_s = time_budget_s
        self.capacity = capacity
        self.free = dict(capacity)
        self.progress = progress
        self.trials: list[Trial] = list(trials or [])
        self.param_space = param_space or {}
        self.name_creator = name_creator
        self.dirname_creator = dirname_creator
        self.events: queue.Queue[tuple[str, Trial, Any, Any]] = queue.Queue()
        self.searcher_done = False
        self.stop_all = False
        self.threads: dict[str, threading.Thread] = {}
        self.server = server  # a train server's client: each trial is a job there (None: a local fit_iter())
        # What the experiment is (saved with it; each trial job carries it, for the server's Experiments pages).
        self.info = experiment_info(searcher=searcher, scheduler=scheduler, metric=metric, mode=mode,
                                    param_space=self.param_space, trainable=trainable)  # fmt: skip

    # -- the loop ---------------------------------------------------------------------------------
    def run(self) -> list[Trial]:
        start = time.monotonic()
        try:
            while True:
                if not self.stop_all and self.time_budget_s is not None and time.monotonic() - start > self.time_budget_s:
                    self._stop_everything("time budget")
                if not self.stop_all and self.stopper is not None and self.stopper.stop_all():
                    self._stop_everything("stop criteria")
                self._start_trials()
                if not self._running() and (self.stop_all or (self.searcher_done and not self._pending())):
                    break
                try:
                    event = self.events.get(timeout=0.2)
                except queue.Empty:
                    continue
                self._handle(event)
                while True:  # everything queued meanwhile, before starting more
                    try:
                        self._handle(self.events.get_nowait())
                    except queue.Empty:
                        break
        except KeyboardInterrupt:
            self._stop_everything(INTERRUPTED)
            self._join(timeout=30)
            for t in self.trials:
                if t.status == RUNNING:
                    t.status = PENDING  # continues on restore
            self.save()
            raise
        finally:
            if self.progress is not None:
                self.progress.close(self.trials)
        self.save()
        return self.trials

    def _running(self) -> list[Trial]:
        return [t for t in self.trials if t.status == RUNNING]

    def _pending(self) -> list[Trial]:
        return [t for t in self.trials if t.status == PENDING]

    # -- starting ----------------------------------------------------------------------------------
    def _start_trials(self) -> None:
        if self.stop_all:
            return
        while True:
            if self.max_concurrent is not None and len(self._running()) >= self.max_concurrent:
                return
            pending = self._pending()
            if not pending:
                if self.searcher_done or not self._suggest():
                    return
                continue
            trial = pending[0]
            workers, need = trial_resources(self.trainable, trial.config)
            gang = {k: v * workers for k, v in need.items()}
            never = {k: v for k, v in gang.items() if v > self.capacity.get(k, 0.0) + 1e-9}
            if never:
                have = {k: self.capacity.get(k, 0.0) for k in never}
                self._fail(trial, ValueError(
                    f"trial {trial.name} needs {workers} worker(s) x {need} = {gang}, more than "
                    f"{'the train server' if self.server is not None else 'this machine'} has ({have}): lower "
                    "the trial's resources (with_resources / scaling_config)"))  # fmt: skip
                continue
            if any(v > self.free.get(k, 0.0) + 1e-9 for k, v in gang.items()):
                return  # waits for its whole gang (trials start in order)
            for k, v in gang.items():
                self.free[k] = self.free.get(k, 0.0) - v
            trial.grant = gang
            self._launch(trial)

    def _suggest(self) -> bool:
        index = len(self.trials)
        trial_id = f"{self.experiment_id}_{index:05d}"
        suggestion = self.searcher.suggest(trial_id)
        if suggestion is None:
            return False
        if suggestion == Searcher.FINISHED:
            self.searcher_done = True
            return False
        assert isinstance(suggestion, dict)
        config = merge_config(self.param_space, suggestion)  # constants a searcher's own space lacks
        trial = Trial(trial_id=trial_id, config=config, name="", dirname="")
        base = _trainable_name(self.trainable)
        trial.name = str(self.name_creator(trial)) if self.name_creator else f"{base}_{trial_id}"
        trial.dirname = str(self.dirname_creator(trial)) if self.dirname_creator else trial.name
        self.trials.append(trial)
        self.scheduler.on_trial_add(trial_id, config)
        self.save()
        return True

    def _launch(self, trial: Trial) -> None:
        rc = self.run_config
        run_config = TrainRunConfig(
            name=trial.run_name, storage_path=self.store.path, storage_filesystem=rc.storage_filesystem,
            checkpoint_config=rc.checkpoint_config, failure_config=rc.failure_config, verbose=0,
            callbacks=list(rc.callbacks or []) if not is_trainer(self.trainable) else
            list(self.trainable.run_config.callbacks or []) + list(rc.callbacks or []),
        )  # fmt: skip
        _, need = trial_resources(self.trainable, trial.config)
        metadata = {TUNE_KEY: {"trial_id": trial.trial_id, "trial_name": trial.name,
                               "experiment_name": self.experiment_name, "resources": need}}  # fmt: skip
        resume = Checkpoint(trial.resume_from) if trial.resume_from else None
        trial.status = RUNNING
        trial.started = time.monotonic()
        trial.stopping = False
        trial.stop_reason = None
        trial.exploit = None
        try:
            trainer = make_trial_trainer(self.trainable, trial.config, run_config, metadata, resume)
            if self.server is None:
                trial.run = trainer.fit_iter()
            else:  # a job of the train server, named for its dashboard
                tag = experiment_tag(self.info, path=self.store.path, name=self.experiment_name,
                                     tune_id=self.experiment_id, trial_id=trial.trial_id)  # fmt: skip
                trial.run = ServerRun(self.server, trainer, name=f"{self.experiment_name}/{trial.name}", experiment=tag)
        except Exception as exc:  # a bad config for this trial: it errors, the others go on
            self._release(trial)
            self._fail(trial, exc)
            return
        thread = threading.Thread(target=self._iterate, args=(trial, trial.run), daemon=True,
                                  name=f"tune-{trial.trial_id}")  # fmt: skip
        self.threads[trial.trial_id] = thread
        thread.start()
        self.save()
        if self.progress is not None:
            self.progress.update(self.trials)

    def _iterate(self, trial: Trial, run: Any) -> None:
        try:
            for report in run:
                self.events.put(("report", trial, report, None))
            self.events.put(("end", trial, run.result, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the loop, which records it
            self.events.put(("end", trial, None, exc))

    # -- events -------------------------------------------------------------------------------------
    def _handle(self, event: tuple[str, Trial, Any, Any]) -> None:
        kind, trial, payload, extra = event
        if kind == "report":
            self._on_report(trial, payload)
        else:
            self._on_end(trial, payload, extra)
        if self.progress is not None:
            self.progress.update(self.trials)

    def _on_report(self, trial: Trial, report: Any) -> None:
        if trial.status != RUNNING or trial.stopping:
            return  # a stopped trial's last result is the one that stopped it (reports after it are late)
        result = dict(report.metrics)
        result.update(training_iteration=report.index + 1, trial_id=trial.trial_id,
                      time_total_s=trial.time_offset + time.monotonic() - trial.started,
                      timestamp=time.time(), done=False)  # fmt: skip
        trial.last_result = result
        trial.history.append(result)
        if report.checkpoint is not None:
            trial.checkpoint = report.checkpoint.path
            self.scheduler.on_trial_checkpoint(trial.trial_id)
        if self.metric is not None and lookup(result, self.metric) is None:
            self._stop(trial, decision={"kind": TrialDecision.ERROR}, error=ValueError(
                f"trial {trial.name} reported {sorted(report.metrics)} without the metric {self.metric!r} "
                f"that TuneConfig(metric=...) (or the searcher/scheduler) names: report it in every result, "
                "or fix the name"))  # fmt: skip
            return
        decision = self.scheduler.on_trial_result(trial.trial_id, result)
        self.searcher.on_trial_result(trial.trial_id, result)
        stop = self.stopper is not None and self.stopper(trial.trial_id, result)
        rule = type(self.scheduler).__name__
        if isinstance(decision, Exploit):
            source = next((t for t in self.trials if t.trial_id == decision.source_trial_id), None)
            if source is not None and source.checkpoint:
                trial.exploit = (source.checkpoint, decision.config)
                self._stop(trial, reason="exploit", decision={"kind": TrialDecision.EXPLOIT, "rule": rule,
                                                              "source_trial": decision.source_trial_id})  # fmt: skip
        elif decision == TrialScheduler.STOP:
            why = {"kind": TrialDecision.PRUNED, "rule": rule, **self.scheduler.explain(trial.trial_id)}
            if why["kind"] == TrialDecision.PRUNED:  # not a trial that used up its max_t: that one completed
                trial.last_result = {**result, PRUNED_RESULT_KEY: True}
            self._stop(trial, reason="scheduler", decision=why)
        elif stop:
            self._stop(trial, reason="stop criteria", decision={"kind": TrialDecision.STOPPER})

    def _stop(self, trial: Trial, *, reason: str = "", decision: dict[str, Any] | None = None,
              error: BaseException | None = None) -> None:  # fmt: skip
        """Stop the trial's run; ``decision``: why (a :class:`~trainforge.server.experiments.schemas.DecisionIn`'s
        fields: its kind, who decided, where), recorded with the iteration and metric it was taken at
        (in the experiment's snapshot; a train server's trial job gets it too)."""
        trial.stopping = True
        trial.stop_reason = reason or None
        if error is not None:
            trial.error = _error_text(error)
        recorded = None
        if decision is not None:
            last = trial.last_result or {}
            it, value = last.get("training_iteration"), lookup(last, self.metric) if self.metric else None
            recorded = {**decision, "t": time.time()}
            recorded.update({k: v for k, v in (("iteration", it), ("value", value)) if isinstance(v, (int, float))
                             and not isinstance(v, bool) and math.isfinite(v)})  # fmt: skip
            trial.decisions.append(recorded)
        if isinstance(trial.run, ServerRun):
            trial.run.stop(decision=recorded)
        elif trial.run is not None:
            trial.run.stop()

    def _stop_everything(self, reason: str) -> None:
        self.stop_all = True
        kind = {"time budget": TrialDecision.BUDGET, "stop criteria": TrialDecision.STOPPER,
                INTERRUPTED: TrialDecision.INTERRUPTED}.get(reason, TrialDecision.BUDGET)  # fmt: skip
        for trial in self._running():
            if not trial.stopping:
                self._stop(trial, reason=reason, decision={"kind": kind})

    def _on_end(self, trial: Trial, result: Any, exc: BaseException | None) -> None:
        self._release(trial)
        self.threads.pop(trial.trial_id, None)
        trial.time_offset += time.monotonic() - trial.started
        trial.run = None
        error: BaseException | None = exc if exc is not None else getattr(result, "error", None)
        if result is not None and result.checkpoint is not None:
            trial.checkpoint = result.checkpoint.path
        if error is not None and trial.error is None:
            trial.error = _error_text(error)
        state = trial_state(_run_end(trial, error), self._decision(trial))  # the one rule of every view
        if state == PENDING and trial.exploit is not None:
            checkpoint, config = trial.exploit
            trial.config = config
            trial.resume_from = checkpoint
            trial.run_index += 1
            trial.status = PENDING  # continues from the better trial's checkpoint, same id
        elif state == PENDING:
            trial.status = PENDING  # Ctrl-C: not finished; the next run of the experiment resumes it
        else:
            self._finish(trial, state)
        self.save()

    def _decision(self, trial: Trial) -> str | None:
        """The kind of the tuner's decision that stopped the trial's run (None: it took none). An
        exploit after the tuner began stopping everything ends the trial instead (as the budget does)."""
        if not trial.stopping or not trial.decisions:
            return None
        kind = trial.decisions[-1].get("kind")
        if kind == TrialDecision.EXPLOIT and self.stop_all:
            return TrialDecision.BUDGET
        return kind if kind in {d.value for d in TrialDecision} else TrialDecision.PRUNED  # a scheduler's own kind

    def _finish(self, trial: Trial, status: TrialState) -> None:
        trial.status = status
        if trial.last_result is not None:
            trial.last_result = {**trial.last_result, "done": True}
        if status == ERROR:
            self.scheduler.on_trial_error(trial.trial_id)
            self.searcher.on_trial_complete(trial.trial_id, trial.last_result, error=True)
        else:
            self.scheduler.on_trial_complete(trial.trial_id, trial.last_result)
            self.searcher.on_trial_complete(trial.trial_id, trial.last_result)

    def _fail(self, trial: Trial, exc: BaseException) -> None:
        trial.error = _error_text(exc)
        self._finish(trial, ERROR)
        self.save()

    def _release(self, trial: Trial) -> None:
        for k, v in trial.grant.items():
            self.free[k] = min(self.capacity.get(k, 0.0), self.free.get(k, 0.0) + v)
        trial.grant = {}

    def _join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self._running() and time.monotonic() < deadline:
            try:
                self._handle(self.events.get(timeout=0.2))
            except queue.Empty:
                pass

    # -- snapshot -----------------------------------------------------------------------------------
    def save(self) -> None:
        trials = []
        for t in self.trials:
            d = t.to_json()
            d["config_pickle"] = base64.b64encode(cloudpickle.dumps(t.config)).decode()
            trials.append(d)
        self.store.save_state({
            "experiment_name": self.experiment_name, "experiment_id": self.experiment_id,
            "trials": trials, "searcher": self.searcher.get_state(), "scheduler": self.scheduler.get_state(),
            "searcher_done": self.searcher_done, "info": self.info,
        })  # fmt: skip


def load_trials(state: dict[str, Any]) -> list[Trial]:
    out = []
    for d in state.get("trials", []):
        d = dict(d)
        config = cloudpickle.loads(base64.b64decode(d.pop("config_pickle")))
        out.append(Trial.from_json(d, config))
    return out


def _run_end(trial: Trial, error: BaseException | None) -> JobState:
    """How the trial's run ended, as a job's end (what :func:`~trainforge.client.trial_state` takes):
    failed, stopped by the tuner, or ran to its end."""
    if error is not None:
        return JobState.FAILED
    return JobState.STOPPED if trial.stopping else JobState.SUCCEEDED


def _error_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).strip() or repr(exc)


def _trainable_name(trainable: Any) -> str:
    if is_trainer(trainable):
        return type(trainable).__name__
    return getattr(trainable, "__name__", type(trainable).__name__)
