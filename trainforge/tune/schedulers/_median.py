"""The median stopping rule (Vizier), as Ray Tune implements it."""

from __future__ import annotations

import math
import statistics
from typing import Any

from trainforge.tune.schedulers._scheduler import (
    TrialScheduler,
    from_json_float,
    score,
    to_json_float,
)


class MedianStoppingRule(TrialScheduler):
    """Stop a trial whose best result is worse than the median of the other trials' running means.

    On a result at time ``t >= grace_period`` (``time_attr`` units), the other trials whose latest
    result is at ``t`` or later are compared: each one's running mean is the mean of its metric over
    its results with ``grace_period <= time <= t``. With at least ``min_samples_required`` of them,
    the trial is stopped when its best metric so far (over all its results) is strictly worse than
    the median of those means. Completed and stopped trials keep counting as others. Results lacking
    ``time_attr`` or the metric are ignored; a NaN metric counts as the worst value.

    Ray's rule, implemented here rather than with Optuna's ``MedianPruner``, which differs in ways
    that matter: it compares with the *completed* trials only (running and pruned ones never count,
    so with asynchronous trials it has nothing to compare against for a long time), with their
    values at exactly the same integer step (results at float times such as ``time_total_s`` almost
    never share one), and with those values rather than running means since ``grace_period``.

    Differences from Ray: ``min_time_slice`` is accepted and ignored (Ray uses it only to pause a
    trial when samples are insufficient and others wait; trainforge's tuner never pauses), and
    ``hard_stop`` does not exist (always a hard stop). A trial with no result inside
    ``[grace_period, t]`` has no running mean at ``t`` and is left out (Ray averages nothing into a
    NaN, which then stops the trial being decided).

    Example::

        MedianStoppingRule(time_attr="training_iteration", metric="loss", mode="min", grace_period=5)
    """

    def __init__(
        self,
        time_attr: str = "time_total_s",
        metric: str | None = None,
        mode: str | None = None,
        grace_period: float = 60.0,
        min_samples_required: int = 3,
        min_time_slice: float = 0,
    ) -> None:
        super().__init__(metric, mode)
        owner = type(self).__name__
        if not grace_period >= 0:
            raise ValueError(f"{owner}(grace_period=...) must be >= 0, got {grace_period!r}.")
        if isinstance(min_samples_required, bool) or not isinstance(min_samples_required, int):
            raise ValueError(
                f"{owner}(min_samples_required=...) must be an int, got {min_samples_required!r}."
            )
        if min_samples_required < 1:
            raise ValueError(f"{owner}(min_samples_required=...) must be >= 1, got {min_samples_required!r}.")
        if not min_time_slice >= 0:
            raise ValueError(f"{owner}(min_time_slice=...) must be >= 0, got {min_time_slice!r}.")
        self._time_attr = time_attr
        self._grace_period = grace_period
        self._min_samples = min_samples_required
        self._min_time_slice = min_time_slice
        self._results: dict[str, list[tuple[float, float]]] = {}  # trial -> [(time, score)]
        self._stopped: set[str] = set()
        self._why: dict[str, dict[str, Any]] = {}  # trial -> why it was stopped (not in the state: for dashboards)

    def on_trial_result(self, trial_id: str, result: dict) -> str:
        self._require_metric()
        if trial_id in self._stopped:
            return self.STOP
        observed = self._observe(result, self._time_attr)
        if observed is None:
            return self.CONTINUE
        t, value = observed
        history = self._results.setdefault(trial_id, [])
        history.append((t, score(value, self._mode)))
        if t < self._grace_period:
            return self.CONTINUE
        means = []
        for other, results in self._results.items():
            if other != trial_id and results[-1][0] >= t:
                mean = self._running_mean(results, t)
                if mean is not None:
                    means.append(mean)
        if len(means) < self._min_samples:
            return self.CONTINUE
        if max(s for _, s in history) < statistics.median(means):
            self._stopped.add(trial_id)
            self._why[trial_id] = {"kind": "pruned", "rule": type(self).__name__, "time_attr": self._time_attr, "at": t,
                                   "text": f"{type(self).__name__} stopped it at {self._time_attr} {t:g}: its best "
                                   f"was worse than the median of {len(means)} other trials' running means"}  # fmt: skip
            return self.STOP
        return self.CONTINUE

    def explain(self, trial_id: str) -> dict[str, Any]:
        return dict(self._why.get(trial_id, {}))

    def _running_mean(self, results: list[tuple[float, float]], t: float) -> float | None:
        scores = [s for time, s in results if self._grace_period <= time <= t]
        if not scores:
            return None
        mean = sum(scores) / len(scores)
        return mean if not math.isnan(mean) else -math.inf  # +inf and -inf averaged: call it the worst

    def get_state(self) -> dict:
        results = {
            trial: [[to_json_float(t), to_json_float(s)] for t, s in history]
            for trial, history in self._results.items()
        }
        return {**self._base_state(), "results": results, "stopped": sorted(self._stopped)}

    def set_state(self, state: dict) -> None:
        self._check_state(state)
        self._results = {
            trial: [(from_json_float(t), from_json_float(s)) for t, s in history]
            for trial, history in state["results"].items()
        }
        self._stopped = set(state["stopped"])
