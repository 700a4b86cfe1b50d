"""The trial scheduler interface, its decision values, and the FIFO scheduler.

A scheduler sees every trial's results as they are reported and answers, for each one, whether the
trial goes on (``CONTINUE``), ends now (``STOP``), or restarts from another trial's checkpoint with a
new config (an :class:`Exploit`, PBT's answer). It never runs anything itself: the tuner calls it
and carries out its decisions. Everything here is pure and synchronous.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from trainforge._internal.metric_path import lookup
from trainforge.tune._metric_mode import MetricMode, check_mode


@dataclass(frozen=True)
class Exploit:
    """Stop the trial's current run and continue it from ``source_trial_id``'s latest checkpoint with
    ``config``, keeping the trial's own id (PBT's exploit + explore).

    Example::

        decision = scheduler.on_trial_result("t3", {"training_iteration": 8, "loss": 0.9, ...})
        if isinstance(decision, Exploit):
            restart("t3", checkpoint=latest_checkpoint(decision.source_trial_id), config=decision.config)
    """

    source_trial_id: str
    config: dict


class TrialScheduler(MetricMode):
    """Base class of trial schedulers (Ray Tune's ``TrialScheduler``).

    The tuner drives a scheduler through these calls, all on one thread, in this order:

    1. ``set_search_properties(metric, mode)`` once, before any trial, with ``TuneConfig``'s metric
       and mode (each may be None). It fills the scheduler's unset metric/mode. It raises
       ``ValueError`` if the scheduler needs a metric and a mode and still lacks one, or if the mode
       is not "min"/"max". It returns False when the scheduler was given its own metric or mode and
       TuneConfig names a different one (the tuner should then raise: the two disagree).
    2. ``set_state(state)``, only when restoring an experiment, with what ``get_state()`` returned.
    3. ``on_trial_add(trial_id, config)`` once per trial, before its first result. PBT may add the
       mutated keys that ``config`` lacks, in place (as Ray does), so start the trial afterwards.
       Calling it again for a known trial (after a restore) does nothing.
    4. For every ``report()`` of a trial, in report order: first ``on_trial_checkpoint(trial_id)`` if
       the report carried a checkpoint (after it was persisted), then
       ``on_trial_result(trial_id, result)``, which returns ``CONTINUE``, ``STOP`` (end the trial now:
       this result is its last) or an :class:`Exploit`. ``result`` is the reported metrics plus
       ``training_iteration`` (1-based count of reports) and ``time_total_s``. A decision is final:
       results of a trial already told ``STOP`` get ``STOP`` again.
    5. When a trial ends: ``on_trial_complete(trial_id, last_result_or_None)`` when it finished
       normally, was stopped (by the scheduler, a stopper or the time budget), including after a
       ``STOP`` from this scheduler; ``on_trial_error(trial_id)`` when it failed for good (retries
       exhausted; a retry from a checkpoint is not an end); ``on_trial_remove(trial_id)`` when the
       tuner drops it without a result. Each is idempotent and ignores unknown trials.
    6. ``get_state()`` whenever the tuner snapshots the experiment (in the same snapshot as the
       trial configs, since PBT changes them): a JSON-serialisable dict.

    Subclasses implement ``on_trial_result`` and, when they keep state, ``get_state``/``set_state``.
    """

    CONTINUE: ClassVar[str] = "CONTINUE"
    PAUSE: ClassVar[str] = "PAUSE"
    STOP: ClassVar[str] = "STOP"

    #: Whether this scheduler needs a metric and a mode to work.
    _needs_metric: ClassVar[bool] = True

    def __init__(self, metric: str | None = None, mode: str | None = None) -> None:
        if mode is not None:
            check_mode(mode, f"{type(self).__name__}(mode=...)")
        super().__init__(metric, mode)

    def set_search_properties(self, metric: str | None, mode: str | None) -> bool:
        """Fill the unset metric/mode from TuneConfig; False when they conflict with the scheduler's."""
        if mode is not None:
            check_mode(mode, "TuneConfig(mode=...)")
        agrees = (metric is None or self._metric in (None, metric)) and (
            mode is None or self._mode in (None, mode)
        )
        self._metric = self._metric or metric
        self._mode = self._mode or mode
        self._require_metric()
        return agrees

    def _require_metric(self) -> None:
        if self._needs_metric and (self._metric is None or self._mode is None):
            name = type(self).__name__
            raise ValueError(
                f"{name} needs a metric and a mode but has metric={self._metric!r}, mode={self._mode!r}: "
                f"set `metric`/`mode` on {name}(...) or on TuneConfig(metric=..., mode=...)."
            )

    def _observe(self, result: dict, time_attr: str) -> tuple[float, float] | None:
        """The result's time (``time_attr``) and metric value, both numbers, or None when either is
        missing (a result that reports something else); a non-number raises naming the key."""
        owner, metric = type(self).__name__, str(self._metric)
        t = number(result.get(time_attr), owner, time_attr)
        value = number(lookup(result, metric), owner, metric)
        return None if t is None or value is None else (t, value)

    def on_trial_add(self, trial_id: str, config: dict) -> None:
        """A new trial with this config is about to start."""

    def on_trial_result(self, trial_id: str, result: dict) -> str | Exploit:
        """Decide on one reported result: ``CONTINUE``, ``STOP`` or an :class:`Exploit`."""
        raise NotImplementedError

    def on_trial_checkpoint(self, trial_id: str) -> None:
        """The report about to be passed to ``on_trial_result`` carried a (persisted) checkpoint."""

    def explain(self, trial_id: str) -> dict[str, Any]:
        """Why the latest ``STOP`` of this trial, as data for a dashboard: ``kind`` ("pruned": stopped
        early; "max_t": its budget is used up), ``rule``, and where (``time_attr``, ``at``, ``rung``,
        ``rung_at``) when the scheduler knows; ``{}`` when it has nothing to add."""
        return {}

    def on_trial_complete(self, trial_id: str, result: dict | None) -> None:
        """The trial ended without an error; ``result`` is its last result (already seen), or None."""

    def on_trial_error(self, trial_id: str) -> None:
        """The trial failed for good."""

    def on_trial_remove(self, trial_id: str) -> None:
        """The trial was dropped by the tuner."""

    def get_state(self) -> dict:
        """A JSON-serialisable snapshot from which ``set_state`` rebuilds this scheduler's decisions."""
        return {}

    def set_state(self, state: dict) -> None:
        """Continue from a ``get_state()`` snapshot (taken by an instance built with the same arguments)."""

    def _check_state(self, state: dict) -> None:
        kind = state.get("scheduler")
        if kind != type(self).__name__:
            raise ValueError(
                f"{type(self).__name__}.set_state() got the state of a {kind!r}: restore an experiment "
                "with the scheduler it ran with."
            )
        self._metric = self._metric or state.get("metric")
        self._mode = self._mode or state.get("mode")

    def _base_state(self) -> dict[str, Any]:
        return {"scheduler": type(self).__name__, "metric": self._metric, "mode": self._mode}


class FIFOScheduler(TrialScheduler):
    """Runs every trial to its end: always ``CONTINUE`` (the default scheduler)."""

    _needs_metric = False

    def on_trial_result(self, trial_id: str, result: dict) -> str:
        return self.CONTINUE


def number(value: Any, owner: str, key: str) -> float | None:
    """A reported value as a float (NaN and inf kept), None when absent; ValueError if not a number."""
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{owner}: result[{key!r}] = {value!r} is not a number.") from None


def score(value: float, mode: str | None) -> float:
    """``value`` oriented so that higher is better, NaN counting as the worst value."""
    if math.isnan(value):
        return -math.inf
    return value if mode == "max" else -value


def to_json_float(value: float) -> float | str:
    """Finite floats as they are, NaN and infinities as strings (strict JSON has no such numbers)."""
    return value if math.isfinite(value) else repr(value)


def from_json_float(value: float | str) -> float:
    return float(value)
