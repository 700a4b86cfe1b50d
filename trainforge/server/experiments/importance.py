"""Parameter importance of a Tune experiment, computed on the server with Optuna's evaluators over its
finished trials (those that ran to their end: not pruned, errored or stopped), the metric's latest
value of each.

- ``ped_anova`` (the default; Optuna's ``PedAnovaImportanceEvaluator``): which parameters it took to
  reach the best trials; milliseconds for 1,000 trials, no scikit-learn. Its top quantile holds at
  least 5 trials where there are enough (``target_quantile`` = 5/n, between 0.1 and 0.5): with 10%
  of a small experiment it rests on one or two trials, and ranks by chance.
- ``fanova`` (opt-in; ``FanovaImportanceEvaluator(n_trees=16, max_depth=8)``, needs scikit-learn): the
  variance of the metric each parameter explains, over the whole space; about 2 s for 1,000 trials
  (Optuna's defaults take a minute), the same ranking. Only parameters every trial has count.

Each parameter's distribution is the search space's (``TrialTagIn.space``: its range, log scale or
choices) when its values fit in it, else what the values show (numbers: their range; anything else:
its values as choices). Parameters with one value, or values that are not JSON scalars, are left out
and said so (``skipped``). Values are plain floats in the answer. A result is kept until one of the
experiment's trials ends (:class:`ImportanceCache`).
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Sequence
from typing import Any, Literal

EVALUATORS = ("ped_anova", "fanova")
MIN_TRIALS = 3  # finished trials it takes


class OptunaMissing(RuntimeError):
    """Optuna (or, for fANOVA, scikit-learn) is not installed on the server (HTTP 503)."""


def warm_up() -> None:
    """Import Optuna's importance evaluators now (a second or more), if they are installed."""
    try:
        import optuna.importance  # noqa: F401
    except ImportError:
        pass


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def distributions(trials: Sequence[dict[str, Any]], space: dict[str, dict[str, Any]], optuna: Any, *,
                  every_trial: bool) -> tuple[dict[str, Any], dict[str, str]]:  # fmt: skip
    """Each parameter's Optuna distribution, and the parameters left out with why."""
    d = optuna.distributions
    names = sorted({k for t in trials for k in t["config"]})
    out: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for name in names:
        values = [t["config"][name] for t in trials if name in t["config"]]
        if every_trial and len(values) < len(trials):
            skipped[name] = f"in {len(values)} of {len(trials)} trials (fANOVA takes only parameters every trial has)"
            continue
        if any(v is not None and not isinstance(v, (bool, int, float, str)) for v in values):
            skipped[name] = "not a number, text or boolean"
            continue
        distinct = set(map(repr, values))
        if len(distinct) < 2:
            skipped[name] = "the same value in every trial"
            continue
        spec = space.get(name) or {}
        numbers = all(_is_number(v) for v in values)
        dist: Any = None
        if spec.get("kind") in ("float", "int") and numbers and spec.get("low") is not None and spec.get("high") is not None:
            low, high, log = float(spec["low"]), float(spec["high"]), bool(spec.get("log"))
            if low < high and all(low <= float(v) <= high for v in values) and (not log or low > 0):
                dist = d.FloatDistribution(low, high, log=log)
        elif spec.get("kind") == "categorical" and spec.get("choices"):
            choices = list(spec["choices"])
            if all(any(v == c and type(v) is type(c) for c in choices) for v in values):
                dist = d.CategoricalDistribution(choices)
        if dist is None and numbers:
            low, high = min(map(float, values)), max(map(float, values))
            dist = d.FloatDistribution(low, high)
        elif dist is None:
            dist = d.CategoricalDistribution(sorted({v for v in values}, key=repr))
        out[name] = dist
    return out, skipped


def compute(trials: Sequence[dict[str, Any]], space: dict[str, dict[str, Any]], mode: str | None,
            evaluator: str) -> dict[str, Any]:  # fmt: skip
    """``{"importances", "trials", "skipped", "notes"}`` over ``trials`` (each ``{"config", "value"}``,
    finished, with a finite value)."""
    try:
        import optuna
    except ImportError as exc:
        raise OptunaMissing('parameter importance needs Optuna on the server: pip install optuna (the "tune" extra)') from exc
    if evaluator == "fanova":
        try:
            import sklearn  # noqa: F401
        except ImportError as exc:
            raise OptunaMissing('fANOVA needs scikit-learn on the server: pip install scikit-learn '
                                '(or use evaluator=ped_anova, which does not)') from exc  # fmt: skip
    notes: list[str] = []
    if len(trials) < MIN_TRIALS:
        return {"importances": {}, "trials": len(trials), "skipped": {},
                "notes": [f"{len(trials)} finished trial(s): importance needs at least {MIN_TRIALS}"]}  # fmt: skip
    dists, skipped = distributions(trials, space, optuna, every_trial=evaluator == "fanova")
    if not dists:
        return {"importances": {}, "trials": len(trials), "skipped": skipped, "notes": ["no parameter varies"]}
    if evaluator == "fanova":
        chosen: Any = optuna.importance.FanovaImportanceEvaluator(n_trees=16, max_depth=8, seed=0)
    else:
        quantile = min(0.5, max(0.1, 5 / len(trials)))
        chosen = optuna.importance.PedAnovaImportanceEvaluator(target_quantile=quantile)
        notes.append(f"PED-ANOVA: what it took to reach the top {quantile:.0%} of {len(trials)} trials")
    direction: Literal["minimize", "maximize"] = "maximize" if mode == "max" else "minimize"
    made = []
    for t in trials:
        params = {k: (float(v) if isinstance(dists[k], optuna.distributions.FloatDistribution) else v)
                  for k, v in t["config"].items() if k in dists}  # fmt: skip
        made.append(optuna.trial.create_trial(params=params, distributions={k: dists[k] for k in params},
                                              value=float(t["value"])))  # fmt: skip
    storage_logger = logging.getLogger("optuna")
    level = storage_logger.level
    storage_logger.setLevel(logging.WARNING)  # "A new study created in memory": noise here
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            study = optuna.create_study(direction=direction)
            study.add_trials(made)
            raw = optuna.importance.get_param_importances(study, evaluator=chosen, normalize=True)
    finally:
        storage_logger.setLevel(level)
    notes += sorted({str(w.message).splitlines()[0] for w in caught if "experimental" not in str(w.message).lower()})
    return {"importances": {k: float(v) for k, v in raw.items()}, "trials": len(trials), "skipped": skipped,
            "notes": notes}  # fmt: skip


class ImportanceCache:
    """Results by experiment and evaluator, each kept while the experiment's finished trials are the
    same (its ``key``: how many have ended, and the latest change of one)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._results: dict[tuple[int, str], tuple[Any, dict[str, Any]]] = {}
        self._computing: dict[tuple[int, str], threading.Lock] = {}

    def get(self, experiment_id: int, evaluator: str, key: Any, make: Any) -> tuple[dict[str, Any], bool]:
        """The result for ``key`` (computed by ``make()`` once, however many ask at once), and
        whether it was cached."""
        slot = (experiment_id, evaluator)
        with self._lock:
            lock = self._computing.setdefault(slot, threading.Lock())
        with lock:
            with self._lock:
                held = self._results.get(slot)
            if held is not None and held[0] == key:
                return held[1], True
            t0 = time.perf_counter()
            result = make()
            result["computed_ms"] = (time.perf_counter() - t0) * 1e3
            with self._lock:
                self._results[slot] = (key, result)
            return result, False
