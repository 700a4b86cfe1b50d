"""Schedulers whose stop decisions come from Optuna pruners, driven through private in-memory studies.

Each trial is an Optuna trial (``study.ask()`` on ``on_trial_add``); each result whose step is new is
``trial.report(value, step)`` then ``trial.should_prune()`` (True -> ``STOP``, told PRUNED); a result
at ``time_attr >= max_t`` is ``STOP`` and told COMPLETE; ``on_trial_complete`` tells COMPLETE and
``on_trial_error``/``on_trial_remove`` tell FAIL.

Steps: Optuna's are non-negative ints; a result's step is ``floor(time_attr / unit)`` (``unit`` is
the scheduler's grace period for ASHA, 1 for HyperBand), with a relative tolerance of 1e-9 so that
``0.3 / 0.1`` counts as 3. Only results that reach a new step are reported: the value at a step is
the first one reported there, and a time that goes back (a retry from a checkpoint) reports nothing
until it passes the highest step seen.

State: every event that changed a study is logged, and ``set_state`` replays the log into fresh
studies. Optuna's pruners are deterministic given the event order, so the rebuilt studies are the
same as the lost ones (the study names are fixed: HyperBand's bracket of a trial hashes them).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from trainforge.tune.schedulers._scheduler import (
    TrialScheduler,
    from_json_float,
    to_json_float,
)

if TYPE_CHECKING:
    import optuna

_STEP_TOLERANCE = 1e-9


def import_optuna(owner: str) -> ModuleType:
    try:
        import optuna
    except ImportError as exc:
        raise ImportError(
            f'{owner} uses Optuna\'s pruners; Optuna is not installed: pip install "trainforge[tune]"'
        ) from exc
    return optuna


class _DropStudyCreated(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("A new study created")


@dataclass
class _Tracked:
    trial: optuna.trial.Trial
    study: optuna.Study
    last_step: int = -1
    last_value: float | None = None
    done: bool = False
    stopped: bool = False
    ended: tuple[str, float] | None = None  # how the scheduler ended it ("pruned"/"max_t") and at which time


class PrunerScheduler(TrialScheduler):
    """Base of the Optuna-backed schedulers: subclasses give the pruners, brackets and step unit."""

    def __init__(
        self, time_attr: str, metric: str | None, mode: str | None, max_t: float, unit: float
    ) -> None:
        super().__init__(metric, mode)
        self._optuna = import_optuna(type(self).__name__)
        self._time_attr = time_attr
        self._max_t = max_t
        self._unit = unit
        self._studies: list[optuna.Study] = []
        self._counts: list[int] = []
        self._trials: dict[str, _Tracked] = {}
        self._events: list[list[Any]] = []
        self._reset()

    # -- subclass hooks -------------------------------------------------------------------------
    def _make_pruners(self) -> list[optuna.pruners.BasePruner]:
        """One pruner per bracket (a bracket is a study of its own)."""
        raise NotImplementedError

    def _choose_bracket(self, counts: list[int]) -> int:
        """The bracket of the next trial, given how many trials each bracket has (deterministic)."""
        return 0

    def _rung_at(self, rung: int, bracket: int) -> float | None:
        """Where rung ``rung`` of bracket ``bracket`` sits, in ``time_attr`` units (None: unknown)."""
        return None

    # -- the interface --------------------------------------------------------------------------
    def on_trial_add(self, trial_id: str, config: dict) -> None:
        if trial_id in self._trials:
            return
        self._require_metric()
        if not self._studies:
            self._studies = [self._new_study(i, p) for i, p in enumerate(self._make_pruners())]
        bracket = self._choose_bracket(self._counts)
        self._counts[bracket] += 1
        study = self._studies[bracket]
        self._events.append(["add", trial_id])
        self._trials[trial_id] = _Tracked(trial=study.ask(), study=study)

    def on_trial_result(self, trial_id: str, result: dict) -> str:
        if trial_id not in self._trials:
            self.on_trial_add(trial_id, {})
        tracked = self._trials[trial_id]
        if tracked.stopped:
            return self.STOP
        observed = self._observe(result, self._time_attr)
        if observed is None:
            return self.CONTINUE
        t, value = observed
        step = self._step(t)
        if t >= self._max_t:  # the trial is finished, whatever the pruner would say
            self._events.append(["result", trial_id, to_json_float(t), to_json_float(value)])
            if not tracked.done:
                if step > tracked.last_step:
                    tracked.trial.report(value, step)
                    tracked.last_value = value
                self._finish(tracked, "complete")
                tracked.ended = ("max_t", t)
            tracked.stopped = True
            return self.STOP
        if tracked.done or step <= tracked.last_step:
            return self.CONTINUE
        self._events.append(["result", trial_id, to_json_float(t), to_json_float(value)])
        tracked.trial.report(value, step)
        tracked.last_step, tracked.last_value = step, value
        if tracked.trial.should_prune():
            self._finish(tracked, "pruned")
            tracked.ended = ("pruned", t)
            return self.STOP
        return self.CONTINUE

    def explain(self, trial_id: str) -> dict[str, Any]:
        tracked = self._trials.get(trial_id)
        if tracked is None or tracked.ended is None:
            return {}
        how, t = tracked.ended
        out: dict[str, Any] = {"kind": how, "rule": type(self).__name__, "time_attr": self._time_attr, "at": t}
        if how == "max_t":
            return {**out, "text": f"{type(self).__name__}: reached max_t={self._max_t:g} ({self._time_attr} {t:g})"}
        frozen = tracked.study.get_trials(deepcopy=False)[tracked.trial.number]
        rungs = [int(k.rpartition("_")[2]) for k in frozen.system_attrs if k.startswith("completed_rung_")]
        if not rungs:
            return out
        rung = max(rungs)
        rung_at = self._rung_at(rung, self._studies.index(tracked.study))
        where = f"{self._time_attr} {rung_at:g}" if rung_at is not None else f"{self._time_attr} {t:g}"
        text = f"{type(self).__name__} stopped it at rung {rung} ({where}): not in the top of the trials there"
        return {**out, "rung": rung, "rung_at": rung_at, "text": text}

    def on_trial_complete(self, trial_id: str, result: dict | None) -> None:
        self._end(trial_id, "complete")

    def on_trial_error(self, trial_id: str) -> None:
        self._end(trial_id, "fail")

    def on_trial_remove(self, trial_id: str) -> None:
        self._end(trial_id, "fail")

    def get_state(self) -> dict:
        return {**self._base_state(), "events": [list(e) for e in self._events]}

    def set_state(self, state: dict) -> None:
        self._check_state(state)
        self._reset()
        for event in state["events"]:
            kind, trial_id = event[0], event[1]
            if kind == "add":
                self.on_trial_add(trial_id, {})
            elif kind == "result":
                t, value = from_json_float(event[2]), from_json_float(event[3])
                self.on_trial_result(trial_id, {self._time_attr: t, self._metric: value})
            else:
                self._end(trial_id, kind)

    # -- internals ------------------------------------------------------------------------------
    def _reset(self) -> None:
        self._studies = []
        self._counts = [0] * self._n_brackets()
        self._trials = {}
        self._events = []

    def _n_brackets(self) -> int:
        return 1

    def _step(self, t: float) -> int:
        x = t / self._unit
        return max(0, math.floor(x + abs(x) * _STEP_TOLERANCE))

    def _new_study(self, index: int, pruner: optuna.pruners.BasePruner) -> optuna.Study:
        optuna = self._optuna
        name = f"trainforge-{type(self).__name__}-{index}"
        direction = optuna.study.StudyDirection.MAXIMIZE if self._mode == "max" else None
        direction = direction or optuna.study.StudyDirection.MINIMIZE
        storage = optuna.storages.InMemoryStorage()
        # The in-memory storage logs "A new study created" at INFO: noise for a study nobody sees.
        storage_logger = logging.getLogger("optuna.storages._in_memory")
        quiet = _DropStudyCreated()
        storage_logger.addFilter(quiet)
        try:
            storage.create_new_study(directions=[direction], study_name=name)
        finally:
            storage_logger.removeFilter(quiet)
        sampler = optuna.samplers.RandomSampler(seed=0)  # nothing is sampled: the study only prunes
        return optuna.Study(study_name=name, storage=storage, sampler=sampler, pruner=pruner)

    def _end(self, trial_id: str, how: str) -> None:
        tracked = self._trials.get(trial_id)
        if tracked is None or tracked.done:
            return
        self._events.append([how, trial_id])
        self._finish(tracked, how)

    def _finish(self, tracked: _Tracked, how: str) -> None:
        states = self._optuna.trial.TrialState
        value = tracked.last_value
        if how == "pruned":
            tracked.study.tell(tracked.trial, state=states.PRUNED)
            tracked.stopped = True
        elif how == "complete" and value is not None and math.isfinite(value):
            tracked.study.tell(tracked.trial, value)
        else:
            tracked.study.tell(tracked.trial, state=states.FAIL)
        tracked.done = True
