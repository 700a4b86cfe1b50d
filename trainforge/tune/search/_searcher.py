"""The ``Searcher`` interface (Ray Tune's), the default ``BasicVariantGenerator`` and ``ConcurrencyLimiter``.

How the tuner drives a searcher:

1. ``set_search_properties(metric, mode, param_space, num_samples=N)`` once, before anything else. It
   returns False when the searcher already had its own space and ``param_space`` was not adopted: the
   tuner then refuses a ``param_space`` that still has domains (``has_unresolved``), as Ray does, and
   builds each trial's config as ``merge_config(param_space, suggestion)`` either way.
2. ``suggest(trial_id)`` whenever a trial could start: a config dict, ``None`` (nothing now: ask again
   after a trial completes), or ``Searcher.FINISHED`` (no more trials, ever).
3. ``on_trial_result(trial_id, result)`` for every result; ``on_trial_complete(trial_id, result, error)``
   once at the end, with the last result. A trial stopped early by a scheduler is completed with
   ``result[PRUNED_RESULT_KEY] = True`` (OptunaSearch tells it PRUNED; other searchers ignore the key).
4. ``get_state()`` after each change, saved with the tuner's snapshot (JSON-serialisable). To restore:
   build the searcher as before, call ``set_search_properties`` as in 1, then ``set_state(state)``.
   Trials that were live when the state was saved are live again: resume them (``suggest(trial_id)``
   with the same id hands back the same config and starts nothing new) or end them with
   ``on_trial_complete(trial_id, error=True)``.
"""

from __future__ import annotations

import logging
import random
import secrets
from collections.abc import Mapping
from typing import Any

from trainforge.tune._metric_mode import MetricMode
from trainforge.tune._variants import (
    count_variants,
    merge_point,
    normalize_num_samples,
    resolve_variant,
    validate_param_space,
)

__all__ = ["PRUNED_RESULT_KEY", "BasicVariantGenerator", "ConcurrencyLimiter", "Searcher", "check_mode"]

logger = logging.getLogger(__name__)

PRUNED_RESULT_KEY = "pruned"
"""Result key the tuner sets (True) in the last result of a trial a scheduler stopped early."""

_MODES = ("min", "max")


def check_mode(mode: Any, where: str) -> str | None:
    """``mode`` if it is None, "min" or "max"; else ``ValueError`` naming the value."""
    if mode is not None and mode not in _MODES:
        raise ValueError(f"{where}: mode must be 'min' or 'max', got {mode!r}")
    return mode


class Searcher(MetricMode):
    """Suggests trial configs and learns from their results (Ray Tune's ``Searcher`` API).

    The base ``set_search_properties`` fills ``metric``/``mode`` when unset (a different value than
    one already set raises ``ValueError``), records ``num_samples`` (default 1) and adopts ``config`` as
    the search space when the searcher has none; subclasses extend it and implement ``suggest``,
    ``on_trial_complete``, ``get_state`` and ``set_state``.
    """

    FINISHED = "FINISHED"

    def __init__(self, metric: str | None = None, mode: str | None = None):
        super().__init__(metric, check_mode(mode, type(self).__name__))
        self._space: dict[str, Any] | None = None
        self._num_samples = 1

    def set_search_properties(
        self, metric: str | None, mode: str | None, config: Mapping[str, Any] | None, **spec: Any
    ) -> bool:
        """Pass the tuner's metric, mode, ``param_space`` and ``num_samples``. False: the searcher
        already had a search space and ``config`` (non-empty) was not adopted."""
        name = type(self).__name__
        check_mode(mode, f"{name}.set_search_properties")
        for attr, value in (("_metric", metric), ("_mode", mode)):
            current = getattr(self, attr)
            if value is not None and current is not None and value != current:
                raise ValueError(
                    f"{name} was created with {attr[1:]}={current!r} but the tuner passes {attr[1:]}={value!r}; "
                    "set it in one place (TuneConfig or the searcher)"
                )
            if current is None:
                setattr(self, attr, value)
        if "num_samples" in spec:
            self._num_samples = normalize_num_samples(spec["num_samples"])
        if self._space is not None:
            return not config
        validate_param_space(config or {})
        self._space = dict(config or {})
        return True

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        """True if the searcher limits concurrency itself (then ConcurrencyLimiter does not)."""
        return False

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        """A config for a new trial, ``None`` (nothing now) or ``Searcher.FINISHED``."""
        raise NotImplementedError

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        """An intermediate result of a trial."""

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        """The trial ended: ``result`` is its last result (None if it never reported)."""
        raise NotImplementedError

    def get_state(self) -> dict[str, Any]:
        """JSON-serialisable state for the tuner's snapshot."""
        raise NotImplementedError

    def set_state(self, state: dict[str, Any]) -> None:
        """Continue from ``get_state()``'s output (after ``set_search_properties``)."""
        raise NotImplementedError


def _seed_from(random_state: Any) -> int:
    if random_state is None:
        return secrets.randbits(63)
    if isinstance(random_state, random.Random):
        return random_state.getrandbits(63)
    if isinstance(random_state, int) and not isinstance(random_state, bool):
        return random_state
    raise TypeError(
        f"random_state must be None, an int seed or a random.Random, got {type(random_state).__name__}"
    )


class BasicVariantGenerator(Searcher):
    """The default searcher: ``points_to_evaluate`` first, then grid × ``num_samples`` random variants.

    As in Ray, each point is merged over ``param_space`` (what it leaves out is sampled; grid axes it
    leaves out are expanded, one trial per grid point) and uses up one of ``num_samples``; then
    ``max(0, num_samples - len(points))`` passes over the whole grid follow; then ``FINISHED``.

    Randomness: variant ``k`` is sampled from ``random.Random(f"{seed}:{k}")`` (``seed`` from
    ``random_state``: an int, a ``random.Random`` or None for a random seed). So the state is just the
    seed and counters, and a restored searcher continues exactly where it stopped.
    """

    def __init__(
        self,
        points_to_evaluate: list[Mapping[str, Any]] | None = None,
        max_concurrent: int = 0,
        random_state: int | random.Random | None = None,
    ):
        super().__init__()
        if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int) or max_concurrent < 0:
            raise ValueError(
                f"BasicVariantGenerator: max_concurrent must be an int >= 0 (0: no limit), got {max_concurrent!r}"
            )
        self._points = list(points_to_evaluate or [])
        self._max_concurrent = max_concurrent
        self._seed = _seed_from(random_state)
        self._segments: list[tuple[dict[str, Any], int]] = []  # (space, variant count)
        self._total = 0
        self._next = 0
        self._trials: dict[str, int] = {}  # trial id -> variant index, for every trial handed out
        self._live: set[str] = set()

    def set_search_properties(
        self, metric: str | None, mode: str | None, config: Mapping[str, Any] | None, **spec: Any
    ) -> bool:
        if not super().set_search_properties(metric, mode, config, **spec):
            return False
        assert self._space is not None
        self._segments = []
        for i, point in enumerate(self._points):
            space = merge_point(self._space, point, f"points_to_evaluate[{i}]")
            self._segments.append((space, count_variants(space, 1)))
        passes = max(0, self._num_samples - len(self._points))
        if passes:
            self._segments.append((self._space, count_variants(self._space, 1) * passes))
        self._total = sum(count for _, count in self._segments)
        return True

    @property
    def total(self) -> int:
        """How many variants this searcher hands out in all."""
        return self._total

    def _variant(self, index: int) -> dict[str, Any]:
        local = index
        for space, count in self._segments:
            if local < count:
                return resolve_variant(space, local, random.Random(f"{self._seed}:{index}"))
            local -= count
        raise IndexError(index)

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        if self._space is None:
            raise RuntimeError(
                "BasicVariantGenerator has no search space yet: call "
                "set_search_properties(metric, mode, param_space, num_samples=N) first"
            )
        at_cap = bool(self._max_concurrent) and len(self._live) >= self._max_concurrent
        if trial_id in self._trials:  # re-asked (after a restore): the same variant again
            if trial_id not in self._live:
                if at_cap:
                    return None
                self._live.add(trial_id)
            return self._variant(self._trials[trial_id])
        if self._next >= self._total:
            return Searcher.FINISHED
        if at_cap:
            return None
        index = self._next
        config = self._variant(index)
        self._next += 1
        self._trials[trial_id] = index
        self._live.add(trial_id)
        return config

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        self._live.discard(trial_id)

    def get_state(self) -> dict[str, Any]:
        return {
            "seed": self._seed,
            "next": self._next,
            "total": self._total,
            "trials": dict(self._trials),
            "live": sorted(self._live),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        if self._space is None:
            raise RuntimeError("BasicVariantGenerator.set_state: call set_search_properties first")
        if state["total"] != self._total:
            raise ValueError(
                f"BasicVariantGenerator.set_state: the state was saved for {state['total']} variants but "
                f"param_space, num_samples and points_to_evaluate now give {self._total}; restore with the "
                "same ones"
            )
        self._seed = int(state["seed"])
        self._next = int(state["next"])
        self._trials = {str(k): int(v) for k, v in state["trials"].items()}
        self._live = set(state["live"])


class ConcurrencyLimiter(Searcher):
    """At most ``max_concurrent`` live (suggested, not completed) trials of ``searcher``.

    ``batch=True``: wait until the whole batch of ``max_concurrent`` trials has completed, then pass
    their completions on together. A searcher whose ``set_max_concurrency`` returns True limits itself.
    """

    def __init__(self, searcher: Searcher, max_concurrent: int, batch: bool = False):
        if not isinstance(searcher, Searcher):
            raise TypeError(f"ConcurrencyLimiter: searcher must be a Searcher, got {type(searcher).__name__}")
        if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int) or max_concurrent < 1:
            raise ValueError(
                f"ConcurrencyLimiter: max_concurrent must be an int >= 1, got {max_concurrent!r}"
            )
        super().__init__(searcher.metric, searcher.mode)
        self.searcher = searcher
        self.max_concurrent = max_concurrent
        self.batch = batch
        self._live: set[str] = set()
        self._cached: dict[str, tuple[dict[str, Any] | None, bool]] = {}
        self._limit = True

    @property
    def metric(self) -> str | None:
        return self.searcher.metric

    @property
    def mode(self) -> str | None:
        return self.searcher.mode

    def set_search_properties(
        self, metric: str | None, mode: str | None, config: Mapping[str, Any] | None, **spec: Any
    ) -> bool:
        self._limit = not self.searcher.set_max_concurrency(self.max_concurrent)
        return self.searcher.set_search_properties(metric, mode, config, **spec)

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        self.max_concurrent = max_concurrent
        return True

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        if not self._limit or trial_id in self._live:
            return self.searcher.suggest(trial_id)
        if len(self._live) >= self.max_concurrent:
            return None
        suggestion = self.searcher.suggest(trial_id)
        if isinstance(suggestion, dict):
            self._live.add(trial_id)
        return suggestion

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        self.searcher.on_trial_result(trial_id, result)

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        if not self._limit:
            self.searcher.on_trial_complete(trial_id, result=result, error=error)
            return
        if trial_id not in self._live or trial_id in self._cached:
            return
        if not self.batch:
            self.searcher.on_trial_complete(trial_id, result=result, error=error)
            self._live.discard(trial_id)
            return
        self._cached[trial_id] = (result, error)
        if len(self._cached) < len(self._live):
            return
        for cached_id, (cached_result, cached_error) in self._cached.items():
            self.searcher.on_trial_complete(cached_id, result=cached_result, error=cached_error)
        self._live.clear()
        self._cached.clear()

    def get_state(self) -> dict[str, Any]:
        return {
            "live": sorted(self._live),
            "cached": {k: [result, error] for k, (result, error) in self._cached.items()},
            "searcher": self.searcher.get_state(),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        self.searcher.set_state(state["searcher"])
        self._live = set(state["live"])
        self._cached = {k: (v[0], bool(v[1])) for k, v in state["cached"].items()}
