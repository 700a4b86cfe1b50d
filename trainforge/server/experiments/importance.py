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
and said so (``skipped``; the ones with one value also in ``constant`` and a note). Values are plain
floats in the answer. Under :data:`SMALL_SAMPLE` finished trials the answer carries a ``warning`` and
the figures of :data:`RESAMPLES` bootstrap resamples (:func:`_stability`: ``intervals``, ``stability``). A result is kept until one of the
experiment's trials ends (:class:`ImportanceCache`).
"""

from __future__ import annotations

import logging
import random
import threading
import time
import warnings
from collections.abc import Sequence
from typing import Any, Literal

EVALUATORS = ("ped_anova", "fanova")
MIN_TRIALS = 3  # finished trials it takes
# Under this many finished trials the answer carries a warning and a bootstrap's intervals: fANOVA gave
# a parameter the objective never reads 0.24-0.56 at 5 trials, ~0 from 20 on (docs/experiments.md).
# Below 20 a resample costs milliseconds (PED-ANOVA) to ~0.1 s (fANOVA), so 10 of them stay cheap;
# above, none is drawn (a 700-trial search takes 0.15-0.7 s once: ten more would be ten times that).
SMALL_SAMPLE = 20
RESAMPLES = 10
CONSTANT = "the same value in every trial"


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
            skipped[name] = CONSTANT
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
    """``{"importances", "trials", "skipped", "constant", "warning", "stability", "intervals", "resamples",
    "notes"}`` over ``trials`` (each ``{"config", "value"}``, finished, with a finite value)."""
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
    n = len(trials)
    answer: dict[str, Any] = {"importances": {}, "trials": n, "skipped": {}, "constant": [], "warning": None,
                              "stability": None, "intervals": {}, "resamples": 0, "notes": []}  # fmt: skip
    if n < MIN_TRIALS:
        answer["notes"] = [f"{n} finished trial(s): importance needs at least {MIN_TRIALS}"]
        return answer
    dists, skipped = distributions(trials, space, optuna, every_trial=evaluator == "fanova")
    constant = sorted(k for k, why in skipped.items() if why == CONSTANT)
    answer.update(skipped=skipped, constant=constant)
    notes: list[str] = [f"constant: {', '.join(constant)} (left out: a parameter that never changed explains nothing)"] \
        if constant else []  # fmt: skip
    if not dists:
        answer["notes"] = [*notes, "no parameter varies"]
        return answer
    if n < SMALL_SAMPLE:
        answer["warning"] = (f"only {n} completed trial(s): with fewer than {SMALL_SAMPLE}, importance ranks parameters "
                             "by chance (even one the objective never reads); read the intervals, not the ranking")  # fmt: skip
    quantile = min(0.5, max(0.1, 5 / n))
    if evaluator == "ped_anova":
        notes.append(f"PED-ANOVA: what it took to reach the top {quantile:.0%} of {n} trials")
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
            raw = _evaluate(optuna, made, direction, evaluator, quantile)
            if n < SMALL_SAMPLE:
                answer.update(_stability(optuna, made, direction, evaluator, quantile, raw))
    finally:
        storage_logger.setLevel(level)
    notes += sorted({str(w.message).splitlines()[0] for w in caught if "experimental" not in str(w.message).lower()})
    answer.update(importances=raw, notes=notes)
    return answer


def _evaluate(optuna: Any, made: Sequence[Any], direction: str, evaluator: str, quantile: float) -> dict[str, float]:
    """Normalized importances of the frozen trials ``made``, most important first."""
    if evaluator == "fanova":
        chosen: Any = optuna.importance.FanovaImportanceEvaluator(n_trees=16, max_depth=8, seed=0)
    else:
        chosen = optuna.importance.PedAnovaImportanceEvaluator(target_quantile=quantile)
    study = optuna.create_study(direction=direction)
    study.add_trials(made)
    raw = optuna.importance.get_param_importances(study, evaluator=chosen, normalize=True)
    return {k: float(v) for k, v in raw.items()}


def _stability(optuna: Any, made: Sequence[Any], direction: str, evaluator: str, quantile: float,
               full: dict[str, float]) -> dict[str, Any]:  # fmt: skip
    """Importance recomputed on :data:`RESAMPLES` bootstrap resamples of the trials (drawn with
    replacement, seed 0: the same trials, in any order, give the same figures): each parameter's 10-90% interval,
    and ``stability``, the share of resamples whose top parameter is the full set's. A resample the
    evaluator cannot rank (every value the same) is left out of both."""
    rng = random.Random(0)
    made = sorted(made, key=lambda t: (t.value, repr(sorted(t.params.items()))))  # the same draws, in any order
    names = list(full)
    runs: list[dict[str, float]] = []
    for _ in range(RESAMPLES):
        sample = [made[rng.randrange(len(made))] for _ in made]
        if len({t.value for t in sample}) < 2:
            continue
        try:
            got = _evaluate(optuna, sample, direction, evaluator, quantile)
        except (ValueError, RuntimeError):  # a parameter with one value left in the resample, and the like
            continue
        runs.append({k: got.get(k, 0.0) for k in names})
    if not runs:
        return {}
    top = names[0]
    intervals = {}
    for k in names:
        values = sorted(r[k] for r in runs)
        intervals[k] = [_quantile(values, 0.1), _quantile(values, 0.9)]
    stable = sum(max(r, key=lambda k: r[k]) == top for r in runs) / len(runs)
    return {"stability": stable, "intervals": intervals, "resamples": len(runs)}


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``sorted_values`` (linear between the nearest two)."""
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo))


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
