"""ASHA and HyperBand: successive halving, decided by Optuna's SuccessiveHalving/Hyperband pruners."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from trainforge.tune.schedulers._pruning import PrunerScheduler

if TYPE_CHECKING:
    import optuna


def _check_reduction_factor(owner: str, reduction_factor: float) -> int:
    if isinstance(reduction_factor, bool) or not float(reduction_factor).is_integer() or reduction_factor < 2:
        raise ValueError(
            f"{owner}(reduction_factor=...) must be a whole number >= 2 (Optuna's successive halving "
            f"keeps the top 1/reduction_factor of trials), got {reduction_factor!r}."
        )
    return int(reduction_factor)


class ASHAScheduler(PrunerScheduler):
    """Asynchronous successive halving (Ray Tune's ``ASHAScheduler``/``AsyncHyperBandScheduler``).

    Rungs sit at ``grace_period * reduction_factor**k < max_t`` (in ``time_attr`` units). The first
    result of a trial at or past a rung records its metric there; the trial is stopped unless it is
    in the top ``1/reduction_factor`` of the values recorded at that rung so far, its own included.
    A result at ``time_attr >= max_t`` stops the trial (it is finished). Trials are never paused or
    promoted later: a stopped trial stays stopped. Results lacking ``time_attr`` or the metric are
    ignored (``CONTINUE``).

    The decision is Optuna's ``SuccessiveHalvingPruner(min_resource=1, reduction_factor,
    min_early_stopping_rate=bracket)`` with steps counted in units of ``grace_period`` (so float
    time attributes such as ``time_total_s`` work), precisely:

    - "top 1/rf" of the ``n`` values recorded at a rung means: fewer than ``max(1, n // rf)`` of them
      are strictly better. The first trial at a rung always continues, and while ``n < 2 * rf`` only
      the best so far does; ties continue.
    - Ray instead compares the value with the ``1 - 1/rf`` percentile (interpolated) of the values
      recorded *before* it. Ray's rule is more lenient: a trial this scheduler keeps, Ray keeps too,
      but Ray also keeps some trials just below the cut (with 7 values at a rung and rf=4, Ray can
      keep the third best, this scheduler only the best).
    - A NaN metric at a rung stops the trial and is not recorded (Ray lets it continue).
    - A result that crosses several rungs at once (a float time attribute that jumps) is checked at
      each of them in turn; Ray checks only the highest.
    - ``brackets > 1``: bracket ``s`` has its first rung at ``grace_period * rf**s``; a new trial goes
      to the bracket that is most behind its share, the shares being Ray's softmax weights of the
      brackets' rung counts (Ray draws the bracket at random with those weights).
    - ``reduction_factor`` must be a whole number (Ray accepts any float > 1).

    Example::

        ASHAScheduler(metric="loss", mode="min", max_t=100, grace_period=1, reduction_factor=4)
    """

    def __init__(
        self,
        time_attr: str = "training_iteration",
        metric: str | None = None,
        mode: str | None = None,
        max_t: float = 100,
        grace_period: float = 1,
        reduction_factor: float = 4,
        brackets: int = 1,
    ) -> None:
        owner = type(self).__name__
        if not max_t > 0:
            raise ValueError(f"{owner}(max_t=...) must be > 0, got {max_t!r}.")
        if not 0 < grace_period <= max_t:
            raise ValueError(
                f"{owner}(grace_period=...) must be > 0 and <= max_t ({max_t!r}), got {grace_period!r}."
            )
        if isinstance(brackets, bool) or not isinstance(brackets, int) or brackets < 1:
            raise ValueError(f"{owner}(brackets=...) must be an int >= 1, got {brackets!r}.")
        self._rf = _check_reduction_factor(owner, reduction_factor)
        self._grace_period = grace_period
        self._brackets = brackets
        super().__init__(time_attr, metric, mode, max_t, unit=grace_period)

    def _n_brackets(self) -> int:
        return self._brackets

    def _make_pruners(self) -> list[optuna.pruners.BasePruner]:
        pruners = self._optuna.pruners
        return [
            pruners.SuccessiveHalvingPruner(
                min_resource=1, reduction_factor=self._rf, min_early_stopping_rate=s
            )
            for s in range(self._brackets)
        ]

    def _rung_at(self, rung: int, bracket: int) -> float | None:
        return float(self._grace_period * self._rf ** (bracket + rung))

    def _choose_bracket(self, counts: list[int]) -> int:
        # Ray's bracket weights: softmax of each bracket's number of rungs.
        total = math.log(self._max_t / self._grace_period) / math.log(self._rf)
        sizes = [int(total - s + 1) for s in range(self._brackets)]
        weights = [math.exp(size - max(sizes)) for size in sizes]
        return min(range(self._brackets), key=lambda s: ((counts[s] + 1) / weights[s], s))


AsyncHyperBandScheduler = ASHAScheduler


class HyperBandScheduler(PrunerScheduler):
    """HyperBand (Ray Tune's ``HyperBandScheduler``), as Optuna's asynchronous variant.

    Optuna's ``HyperbandPruner(min_resource=1, max_resource=max_t, reduction_factor)``: each trial is
    assigned a bracket (by a hash of its position, weighted by the brackets' budgets as in the paper)
    and is then under asynchronous successive halving within that bracket (see
    :class:`ASHAScheduler` for the rung rule). A result at ``time_attr >= max_t`` stops the trial.

    Differences from Ray: Ray's HyperBand is synchronous (it pauses trials at a rung until the whole
    bracket has reported, then promotes the best ones); this one never pauses, and decides with the
    trials that have reached the rung so far. ``max_t`` must be a whole number of ``time_attr`` units
    (Optuna's ``max_resource``) and steps are ``floor(time_attr)``.
    """

    def __init__(
        self,
        time_attr: str = "training_iteration",
        metric: str | None = None,
        mode: str | None = None,
        max_t: int = 81,
        reduction_factor: float = 3,
    ) -> None:
        owner = type(self).__name__
        if isinstance(max_t, bool) or not float(max_t).is_integer() or max_t < 1:
            raise ValueError(f"{owner}(max_t=...) must be a whole number >= 1, got {max_t!r}.")
        self._rf = _check_reduction_factor(owner, reduction_factor)
        super().__init__(time_attr, metric, mode, int(max_t), unit=1)

    def _make_pruners(self) -> list[optuna.pruners.BasePruner]:
        return [
            self._optuna.pruners.HyperbandPruner(
                min_resource=1, max_resource=int(self._max_t), reduction_factor=self._rf
            )
        ]
