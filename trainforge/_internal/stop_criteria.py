"""Stop criteria: the :class:`Stopper` interface and ``RunConfig(stop=...)`` made into one.

One rule for every run: a trainer's ``fit()`` and every Tune trial read ``RunConfig.stop`` through
:func:`make_stopper`. A stopper is called with every result (``stopper(trial_id, result)``: True ends
that run, this result being its last) and asked ``stop_all()`` after each result (True ends the whole
experiment). Tune's ready-made stoppers (its ``stopper`` module) build on :class:`Stopper`.
"""

from __future__ import annotations

import abc
import numbers
from collections.abc import Callable, Mapping
from typing import Any

from trainforge._internal.metric_path import lookup


class Stopper(abc.ABC):
    """Base class of stop criteria: ``__call__`` decides for one trial, ``stop_all`` for the experiment.

    Example::

        class StopOnTarget(Stopper):
            def __call__(self, trial_id, result):
                return result["accuracy"] >= 0.99

            def stop_all(self):
                return False
    """

    @abc.abstractmethod
    def __call__(self, trial_id: str, result: dict) -> bool:
        """True to stop this trial after this result."""

    @abc.abstractmethod
    def stop_all(self) -> bool:
        """True to stop the whole experiment."""


class FunctionStopper(Stopper):
    """Stops a trial when ``function(trial_id, result)`` returns True."""

    def __init__(self, function: Callable[[str, dict], bool]) -> None:
        self._fn = function

    def __call__(self, trial_id: str, result: dict) -> bool:
        return bool(self._fn(trial_id, result))

    def stop_all(self) -> bool:
        return False


class CriteriaStopper(Stopper):
    """``RunConfig(stop={key: value})``: stops a trial at its first result with ``result[key] >= value``
    for any key (``"a/b"`` reads a nested result). A result without a key is an error (as in Ray)."""

    def __init__(self, criteria: Mapping[str, float]) -> None:
        self._criteria = dict(criteria)

    def __call__(self, trial_id: str, result: dict) -> bool:
        for key, threshold in self._criteria.items():
            value = lookup(result, key)
            if value is None:
                raise ValueError(
                    f"RunConfig(stop=...) stops on {key!r}, which trial {trial_id!r} did not report: its "
                    f"result has {sorted(result)}. Report {key!r} or change the stop criterion."
                )
            if not _is_real(value):
                raise ValueError(f"RunConfig(stop=...): result[{key!r}] = {value!r} is not a number.")
            if value >= threshold:
                return True
        return False

    def stop_all(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"CriteriaStopper({self._criteria!r})"


def make_stopper(stop: Any) -> Stopper | None:
    """``RunConfig(stop=...)`` as a Stopper: a dict ``{key: threshold}``, a function
    ``f(trial_id, result) -> bool``, a Stopper, or None (no stopper)."""
    if stop is None or isinstance(stop, Stopper):
        return stop
    if isinstance(stop, Mapping):
        for key, threshold in stop.items():
            if not isinstance(key, str):
                raise ValueError(f"RunConfig(stop=...): the key {key!r} must be a result name (str).")
            if not _is_real(threshold):
                raise ValueError(
                    f"RunConfig(stop=...): {key!r} maps to {threshold!r}, which is not a number; a dict "
                    "stops a trial at its first result with result[key] >= value."
                )
        return CriteriaStopper(stop) if stop else None
    if isinstance(stop, type) and issubclass(stop, Stopper):
        raise ValueError(
            f"RunConfig(stop=...) got the class {stop.__name__}: pass an instance, {stop.__name__}(...)."
        )
    if callable(stop):
        if hasattr(stop, "stop_all"):
            raise ValueError(
                f"RunConfig(stop=...) got {stop!r}, which has stop_all() but is not a trainforge "
                "tune.Stopper: subclass tune.Stopper (from trainforge import tune)."
            )
        return FunctionStopper(stop)
    raise ValueError(
        f"RunConfig(stop=...) must be a dict {{result key: threshold}}, a function "
        f"f(trial_id, result) -> bool, or a tune.Stopper (from trainforge import tune); got {stop!r} ({type(stop).__name__})."
    )


def _is_real(value: object) -> bool:
    """A real number (numpy scalars included), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
