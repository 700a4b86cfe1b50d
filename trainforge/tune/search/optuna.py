"""``OptunaSearch``: Optuna's samplers (TPE by default) over a Ray-style search space, through ask/tell.

The loop is the caller's (``study.ask`` in ``suggest``, ``trial.report`` in ``on_trial_result``,
``study.tell`` in ``on_trial_complete``); ``study.optimize`` is never used. Optuna is imported when an
``OptunaSearch`` is created, never by importing this module.

Search space (``param_space`` or ``space=``), converted to Optuna distributions:

======================  =====================================================================
``uniform(l, u)``       ``FloatDistribution(l, u)``; ``loguniform``: ``log=True``
``quniform(l, u, q)``   ``FloatDistribution(ql, qu, step=q)`` (``ql``/``qu``: the outer multiples of q)
``randint(l, u)``       ``IntDistribution(l, u - 1)`` (``[l, u)``); ``lograndint``: ``log=True``
``qrandint(l, u, q)``   ``IntDistribution(ql, qu, step=q)`` (``[l, u]``)
``qloguniform``,        Optuna cannot combine ``log`` and ``step``: sampled with ``log=True`` on
``qlograndint``         ``[ql, qu]`` and rounded to a multiple of q in the config (Ray drops the q)
``choice(cs)``          ``CategoricalDistribution(cs)``; when a category is not None/bool/int/float/str
                        (which Optuna's storages cannot hold), the distribution is over the indices
                        ``0..n-1`` and the config gets ``cs[i]``
``grid_search(vs)``     a categorical over ``vs``, whose value is fixed per trial (below)
Optuna distributions    used as they are (in ``space=`` only)
constants               copied into every config
``randn``,              ``ValueError``: Optuna has no normal distribution, and a ``sample_from``
``sample_from``         function is not something a sampler can model
======================  =====================================================================

Nested dicts are flattened to ``a/b`` parameter names and the returned config is nested again.

Trial count: ``num_samples`` (from ``set_search_properties(..., num_samples=N)``, default 1) times
the grid size; after that many suggestions ``suggest`` returns ``FINISHED``. Grid axes: suggestion
``k`` has the grid point ``k mod grid size`` (the variant generator's order) fixed through
``study.enqueue_trial`` just before its ``ask``, so every grid point is evaluated ``num_samples``
times while the sampler picks the other parameters (Ray's OptunaSearch rejects grid axes).

``points_to_evaluate`` are the first suggestions, verbatim (answering ray#35319, where Ray ignored
them): their values are fixed through ``enqueue_trial`` and put into the config as given (a value
outside its range is used, with Optuna's warning; one not among a choice's categories raises). They
count towards the total, which is ``max(len(points), grid size × num_samples)``. With
``evaluated_rewards`` they are instead added to the study as completed trials and not run (Ray).

Results: ``on_trial_result`` reports ``result[metric]`` at step ``result["training_iteration"]``
(else the count of results so far). ``on_trial_complete`` tells the study: ``FAIL`` when ``error``;
``PRUNED`` when ``pruned=True`` or ``result["pruned"]`` is true (what the tuner sets for a trial a
scheduler stopped); else ``COMPLETE`` with the last ``metric`` value (``FAIL``, with a warning,
when the trial never reported it).

State: ``get_state()`` holds the study name, the count of suggestions and, per trial id, the Optuna
parameters, intermediate values and outcome. ``set_state`` (after ``set_search_properties``) rebuilds
the study: completed trials are re-added with ``study.add_trial(optuna.trial.create_trial(...))``
unless the study (a persistent ``storage``) already has them, and trials that were live are asked
again with their parameters fixed and their intermediate values re-reported (a stale RUNNING copy in
a persistent storage is told FAIL). Trials are matched through the user attribute
``trainforge_trial_id``. So that a seeded sampler does not replay its first draws, a restored search
gets a TPE sampler seeded from ``(seed, suggestions so far)``, or ``sampler.reseed_rng()`` for a
sampler of yours. ``storage``/``study_name`` pass through to ``optuna.create_study(...,
load_if_exists=True)`` (ray#48500): an RDB URL or a storage object; without a ``study_name`` Optuna
picks one, which the state remembers.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from trainforge.tune._variants import Path, grid_point, point_overrides, validate_param_space
from trainforge.tune.search._optuna_space import OptunaSpace
from trainforge.tune.search._searcher import PRUNED_RESULT_KEY, Searcher

__all__ = ["OptunaSearch"]

logger = logging.getLogger(__name__)

TRIAL_ID_ATTR = "trainforge_trial_id"


def _import_optuna() -> ModuleType:
    try:
        import optuna
    except ImportError as exc:
        raise ImportError(
            'OptunaSearch needs Optuna, which is not installed: pip install "trainforge[tune]"'
        ) from exc
    return optuna


@dataclass
class _Trial:
    """What OptunaSearch keeps per trial id."""

    index: int  # the suggestion's number (which point / grid point it had)
    params: dict[str, Any]
    trial: Any = None  # the live optuna Trial; None once told
    intermediate: dict[int, float] = field(default_factory=dict)
    reports: int = 0
    last_value: float | None = None
    state: str = "RUNNING"
    value: float | None = None


class OptunaSearch(Searcher):
    """Optuna's samplers through ask/tell over a Ray-style search space (see the module docstring)."""

    def __init__(
        self,
        space: Mapping[str, Any] | None = None,
        metric: str | None = None,
        mode: str | None = None,
        points_to_evaluate: list[Mapping[str, Any]] | None = None,
        sampler: Any = None,
        seed: int | None = None,
        evaluated_rewards: list[float] | None = None,
        storage: Any = None,
        study_name: str | None = None,
    ):
        self._optuna = _import_optuna()
        super().__init__(metric, mode)
        if metric is not None and not isinstance(metric, str):
            raise ValueError(f"OptunaSearch: metric must be one metric name (a str), got {metric!r}")
        if space is not None and not isinstance(space, Mapping):
            raise TypeError(
                f"OptunaSearch(space=...) must be a dict of search spaces, got {type(space).__name__} "
                "(define-by-run functions are not supported)"
            )
        points = list(points_to_evaluate or [])
        if evaluated_rewards is not None and len(evaluated_rewards) != len(points):
            raise ValueError(
                f"OptunaSearch: evaluated_rewards has {len(evaluated_rewards)} values for "
                f"{len(points)} points_to_evaluate; give one reward per point"
            )
        if sampler is not None and seed is not None:
            logger.warning(
                "OptunaSearch: seed=%r is ignored because a sampler was passed; seed the sampler", seed
            )
        self._points = points
        self._rewards = list(evaluated_rewards) if evaluated_rewards is not None else None
        self._sampler = sampler
        self._seed = seed
        self._storage = storage
        self._study_name = study_name
        self._study: Any = None
        self._converted: OptunaSpace | None = None
        self._overrides: list[list[tuple[Path, Any]]] = []
        self._fixed_points: list[dict[str, Any]] = []
        self._next = 0
        self._trials: dict[str, _Trial] = {}
        if space:
            self._adopt(space, "space")

    @property
    def study(self) -> Any:
        """The Optuna study (created on first use)."""
        return self._ensure_study()

    def _adopt(self, space: Mapping[str, Any], root: str) -> None:
        validate_param_space(space, root, allow_optuna=True)
        converted = OptunaSpace(self._optuna, space, root)
        self._overrides, self._fixed_points = [], []
        for i, point in enumerate(self._points):
            where = f"points_to_evaluate[{i}]"
            overrides = point_overrides(space, point, where)
            self._overrides.append(overrides)
            self._fixed_points.append(converted.fixed(overrides, where))
        self._space = dict(space)
        self._converted = converted

    def set_search_properties(
        self, metric: str | None, mode: str | None, config: Mapping[str, Any] | None, **spec: Any
    ) -> bool:
        had_space = self._space is not None
        super().set_search_properties(metric, mode, {} if had_space else config, **spec)
        if had_space:
            return not config
        assert self._space is not None
        self._adopt(self._space, "param_space")
        return True

    @property
    def total(self) -> int:
        """How many suggestions in all: ``max(len(points), grid size × num_samples)`` (0 before a space)."""
        if self._converted is None:
            return 0
        grid = 1
        for _, values in self._converted.axes:
            grid *= len(values)
        runs = 0 if self._rewards is not None else len(self._points)
        return max(runs, grid * self._num_samples)

    def _require(self) -> OptunaSpace:
        if self._converted is None:
            raise RuntimeError(
                "OptunaSearch has no search space: pass space=... or let the tuner call "
                "set_search_properties(metric, mode, param_space, num_samples=N)"
            )
        if self._metric is None or self._mode is None:
            raise ValueError(
                f"OptunaSearch needs a metric and a mode (got metric={self._metric!r}, mode={self._mode!r}): "
                "pass them to OptunaSearch(...) or to TuneConfig(...)"
            )
        return self._converted

    def _ensure_study(self) -> Any:
        if self._study is not None:
            return self._study
        space = self._require()
        optuna = self._optuna
        sampler = self._sampler or optuna.samplers.TPESampler(seed=self._seed)
        self._study = optuna.create_study(
            storage=self._storage,
            sampler=sampler,
            study_name=self._study_name,
            direction="minimize" if self._mode == "min" else "maximize",
            load_if_exists=True,
        )
        if self._rewards is not None:
            known = self._known_trials()
            for i, (fixed, reward) in enumerate(zip(self._fixed_points, self._rewards, strict=True)):
                tid = f"points_to_evaluate[{i}]"
                if tid not in known:
                    dists = {name: space.distributions[name] for name in fixed}
                    frozen = optuna.trial.create_trial(
                        params=fixed,
                        distributions=dists,
                        value=float(reward),
                        user_attrs={TRIAL_ID_ATTR: tid},
                    )
                    self._study.add_trial(frozen)
        return self._study

    def _known_trials(self) -> dict[str, Any]:
        """The study's latest trial per trainforge trial id."""
        known = {}
        for frozen in self._study.get_trials(deepcopy=False):
            tid = frozen.user_attrs.get(TRIAL_ID_ATTR)
            if tid is not None:
                known[tid] = frozen
        return known

    def _ask(self, trial_id: str, fixed: dict[str, Any]) -> Any:
        study = self._ensure_study()
        assert self._converted is not None
        if fixed:
            study.enqueue_trial(fixed, user_attrs={TRIAL_ID_ATTR: trial_id})
        trial = study.ask(self._converted.distributions)
        trial.set_user_attr(TRIAL_ID_ATTR, trial_id)
        return trial

    def _config(self, record: _Trial) -> dict[str, Any]:
        assert self._converted is not None
        overrides = (
            self._overrides[record.index]
            if record.index < len(self._overrides) and self._rewards is None
            else []
        )
        return self._converted.config(record.params, overrides)

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        space = self._require()
        record = self._trials.get(trial_id)
        if record is not None:  # asked again under the same id: the same config, nothing new
            if record.trial is None:  # it had ended: an ended trial is rerun as a new Optuna trial
                record.trial = self._ask(trial_id, dict(record.params))
                record.intermediate, record.reports, record.last_value = {}, 0, None
                record.state, record.value = "RUNNING", None
            return self._config(record)
        if self._next >= self.total:
            return Searcher.FINISHED
        index = self._next
        fixed: dict[str, Any] = {}
        if self._rewards is None and index < len(self._fixed_points):
            fixed.update(self._fixed_points[index])
        for path, value in grid_point(space.axes, index).items():
            param = space.by_path[path]
            fixed.setdefault(param.name, param.encode(value))
        trial = self._ask(trial_id, fixed)
        self._next += 1
        record = _Trial(index=index, params=dict(trial.params), trial=trial)
        self._trials[trial_id] = record
        return self._config(record)

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        record = self._trials.get(trial_id)
        if record is None or record.trial is None:
            return
        record.reports += 1
        value = _number(result.get(self._metric)) if self._metric else None
        if value is None:
            return
        record.last_value = value
        step = result.get("training_iteration")
        step = int(step) if isinstance(step, (int, float)) and not isinstance(step, bool) else record.reports
        if step not in record.intermediate:
            record.trial.report(value, step)
            record.intermediate[step] = value

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False, pruned: bool = False
    ) -> None:
        record = self._trials.get(trial_id)
        if record is None or record.trial is None:
            return
        states = self._optuna.trial.TrialState
        value = _number(result.get(self._metric)) if result and self._metric else None
        if value is None:
            value = record.last_value
        pruned = pruned or bool(result and result.get(PRUNED_RESULT_KEY))
        if error:
            state, values = states.FAIL, None
        elif pruned:
            state, values = states.PRUNED, None
        elif value is None:
            logger.warning(
                "OptunaSearch: trial %s ended without reporting %r; told FAIL", trial_id, self._metric
            )
            state, values = states.FAIL, None
        else:
            state, values = states.COMPLETE, value
        frozen = self._study.tell(record.trial, values, state=state)
        record.trial, record.state, record.value = None, frozen.state.name, frozen.value

    def get_state(self) -> dict[str, Any]:
        return {
            "study_name": self._study.study_name if self._study is not None else self._study_name,
            "next": self._next,
            "total": self.total,
            "trials": {
                tid: {
                    "index": r.index,
                    "params": r.params,
                    "intermediate": {str(step): v for step, v in r.intermediate.items()},
                    "reports": r.reports,
                    "last_value": r.last_value,
                    "state": r.state,
                    "value": r.value,
                }
                for tid, r in self._trials.items()
            },
        }

    def set_state(self, state: dict[str, Any]) -> None:
        space = self._require()
        if state["total"] != self.total:
            raise ValueError(
                f"OptunaSearch.set_state: the state was saved for {state['total']} suggestions but the search "
                f"space, num_samples and points_to_evaluate now give {self.total}; restore with the same ones"
            )
        if self._study is None and self._study_name is None:
            self._study_name = state["study_name"]
        study = self._ensure_study()
        optuna, states = self._optuna, self._optuna.trial.TrialState
        known = self._known_trials()
        self._next = int(state["next"])
        self._trials = {}
        for tid, saved in state["trials"].items():
            record = _Trial(
                index=int(saved["index"]),
                params=dict(saved["params"]),
                intermediate={int(step): v for step, v in saved["intermediate"].items()},
                reports=int(saved["reports"]),
                last_value=saved["last_value"],
                state=saved["state"],
                value=saved["value"],
            )
            found = known.get(tid)
            stale = found is not None and found.state == states.RUNNING
            if found is not None and stale:  # live in a persistent storage when the tuner stopped
                study.tell(found.number, state=states.FAIL)
            if record.state == "RUNNING":
                record.trial = self._ask(tid, dict(record.params))
                for step, value in sorted(record.intermediate.items()):
                    record.trial.report(value, step)
            elif found is None or stale:
                study.add_trial(self._frozen(optuna, tid, record, space))
            self._trials[tid] = record
        if self._next:
            if self._sampler is None:
                seed = None if self._seed is None else (self._seed * 1_000_003 + self._next) % 2**32
                study.sampler = optuna.samplers.TPESampler(seed=seed)
            else:
                study.sampler.reseed_rng()

    def _frozen(self, optuna: ModuleType, tid: str, record: _Trial, space: OptunaSpace) -> Any:
        params, dists = {}, {}
        for name, value in record.params.items():
            dist = space.distributions[name]
            if dist._contains(dist.to_internal_repr(value)):
                params[name], dists[name] = value, dist
            else:  # a point's value outside the range: Optuna cannot store it in a created trial
                logger.warning(
                    "OptunaSearch: restoring trial %s without %s=%r (outside %s)", tid, name, value, dist
                )
        state = optuna.trial.TrialState[record.state]
        value = (
            record.value
            if state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
            else None
        )
        return optuna.trial.create_trial(
            state=state,
            value=value,
            params=params,
            distributions=dists,
            user_attrs={TRIAL_ID_ATTR: tid},
            intermediate_values=record.intermediate,
        )


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
