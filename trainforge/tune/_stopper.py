"""Ray Tune's stoppers (``trainforge.tune.stopper``), on :class:`Stopper` from
``trainforge._internal.stop_criteria`` (which also turns ``RunConfig(stop=...)`` into one).

A stopper is called with every result of every trial (``stopper(trial_id, result)``: True ends that
trial, this result being its last) and asked ``stop_all()`` after each result (True ends the whole
experiment; trials are stopped, not errored).
"""

from __future__ import annotations

import datetime
import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from trainforge._internal.metric_path import lookup
from trainforge._internal.stop_criteria import FunctionStopper, Stopper, _is_real, make_stopper
from trainforge.tune._metric_mode import check_mode

__all__ = [
    "CombinedStopper", "ExperimentPlateauStopper", "FunctionStopper", "MaximumIterationStopper", "NoopStopper",
    "Stopper", "TimeoutStopper", "TrialPlateauStopper", "make_stopper",
]


class NoopStopper(Stopper):
    """Never stops anything."""

    def __call__(self, trial_id: str, result: dict) -> bool:
        return False

    def stop_all(self) -> bool:
        return False


class CombinedStopper(Stopper):
    """Stops when any of ``stoppers`` does. Every stopper sees every result (Ray stops asking at the
    first True, so stateful stoppers after it miss results)."""

    def __init__(self, *stoppers: Stopper) -> None:
        self._stoppers = stoppers

    def __call__(self, trial_id: str, result: dict) -> bool:
        return any([stopper(trial_id, result) for stopper in self._stoppers])

    def stop_all(self) -> bool:
        return any([stopper.stop_all() for stopper in self._stoppers])


class MaximumIterationStopper(Stopper):
    """Stops a trial at its ``max_iter``-th result seen by this stopper (Ray counts calls, not
    ``training_iteration``: a trial resumed by a new tuner process counts from zero again)."""

    def __init__(self, max_iter: int) -> None:
        if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1:
            raise ValueError(f"MaximumIterationStopper(max_iter=...) must be an int >= 1, got {max_iter!r}.")
        self._max_iter = max_iter
        self._iter: dict[str, int] = {}

    def __call__(self, trial_id: str, result: dict) -> bool:
        self._iter[trial_id] = self._iter.get(trial_id, 0) + 1
        return self._iter[trial_id] >= self._max_iter

    def stop_all(self) -> bool:
        return False


class TimeoutStopper(Stopper):
    """Stops the experiment once ``timeout`` (seconds or a ``timedelta``) has passed since the first
    ``stop_all()`` call. The time is a budget: a pickled stopper resumes with what was left, the
    time while it was not running not counted (Ray's behaviour). ``clock`` is for tests."""

    def __init__(
        self, timeout: float | datetime.timedelta, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if isinstance(timeout, datetime.timedelta):
            seconds = timeout.total_seconds()
        elif _is_real(timeout):
            seconds = float(timeout)
        else:
            raise ValueError(
                f"TimeoutStopper(timeout=...) must be a number of seconds or a datetime.timedelta, got {timeout!r}."
            )
        if not seconds >= 0:
            raise ValueError(f"TimeoutStopper(timeout=...) must not be negative, got {timeout!r}.")
        self._timeout_s = seconds
        self._budget_s = seconds
        self._clock = clock
        self._last: float | None = None

    def __call__(self, trial_id: str, result: dict) -> bool:
        return False

    def stop_all(self) -> bool:
        now = self._clock()
        if self._last is not None:
            self._budget_s -= now - self._last
        self._last = now
        return self._budget_s <= 0

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_last": None}


class TrialPlateauStopper(Stopper):
    """Stops a trial whose last ``num_results`` values of ``metric`` have a standard deviation below
    ``std``, once it has at least ``grace_period`` results and, with ``metric_threshold``, its
    latest value is at or past the threshold (<= for ``mode="min"``, >= for ``"max"``). A missing or
    NaN value in the window prevents the stop."""

    def __init__(
        self,
        metric: str,
        std: float = 0.01,
        num_results: int = 4,
        grace_period: int = 4,
        metric_threshold: float | None = None,
        mode: str | None = None,
    ) -> None:
        if metric_threshold is not None:
            check_mode(mode, "TrialPlateauStopper(mode=...), needed with a metric_threshold,")
        if isinstance(num_results, bool) or not isinstance(num_results, int) or num_results < 1:
            raise ValueError(
                f"TrialPlateauStopper(num_results=...) must be an int >= 1, got {num_results!r}."
            )
        self._metric = metric
        self._std = std
        self._num_results = num_results
        self._grace_period = grace_period
        self._threshold = metric_threshold
        self._mode = mode
        self._iter: dict[str, int] = {}
        self._window: dict[str, deque[float]] = {}

    def __call__(self, trial_id: str, result: dict) -> bool:
        value = lookup(result, self._metric)
        value = float(value) if _is_real(value) else math.nan
        window = self._window.setdefault(trial_id, deque(maxlen=self._num_results))
        window.append(value)
        self._iter[trial_id] = self._iter.get(trial_id, 0) + 1
        if self._iter[trial_id] < self._grace_period or len(window) < self._num_results:
            return False
        if self._threshold is not None and not (
            value <= self._threshold if self._mode == "min" else value >= self._threshold
        ):
            return False
        return _std(window) < self._std

    def stop_all(self) -> bool:
        return False


class ExperimentPlateauStopper(Stopper):
    """Stops the experiment when the ``top`` best values of ``metric`` over all results have had a
    standard deviation of at most ``std`` for ``patience`` consecutive results (Ray's count: 0 and 1
    both stop at the first such result). Results without the metric, or with NaN, are ignored."""

    def __init__(
        self, metric: str, std: float = 0.001, top: int = 10, mode: str = "min", patience: int = 0
    ) -> None:
        check_mode(mode, "ExperimentPlateauStopper(mode=...)")
        if isinstance(top, bool) or not isinstance(top, int) or top <= 1:
            raise ValueError(f"ExperimentPlateauStopper(top=...) must be an int > 1, got {top!r}.")
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 0:
            raise ValueError(f"ExperimentPlateauStopper(patience=...) must be an int >= 0, got {patience!r}.")
        if not _is_real(std) or std <= 0:
            raise ValueError(f"ExperimentPlateauStopper(std=...) must be a number > 0, got {std!r}.")
        self._metric = metric
        self._std = std
        self._top = top
        self._mode = mode
        self._patience = patience
        self._iterations = 0
        self._top_values: list[float] = []

    def __call__(self, trial_id: str, result: dict) -> bool:
        value = lookup(result, self._metric)
        if not _is_real(value) or math.isnan(value):
            return self.stop_all()
        values = sorted([*self._top_values, float(value)])
        self._top_values = values[: self._top] if self._mode == "min" else values[-self._top :]
        self._iterations = self._iterations + 1 if self._has_plateaued() else 0
        return self.stop_all()

    def _has_plateaued(self) -> bool:
        return len(self._top_values) == self._top and _std(self._top_values) <= self._std

    def stop_all(self) -> bool:
        return self._has_plateaued() and self._iterations >= self._patience


def _std(values: Any) -> float:
    """Population standard deviation (numpy's default); NaN if a value is NaN or infinite."""
    values = list(values)
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
