"""Population based training: bottom trials continue from top trials' checkpoints with perturbed configs."""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass

from trainforge._internal.metric_path import lookup
from trainforge.tune.schedulers._explore import check_mutations, explore, fill_missing
from trainforge.tune.schedulers._scheduler import (
    Exploit,
    TrialScheduler,
    from_json_float,
    number,
    score,
    to_json_float,
)


@dataclass
class _Member:
    config: dict
    score: float | None = None  # the latest metric, higher is better
    last_perturbation_time: float = 0.0
    has_checkpoint: bool = False
    checkpoint_time: float | None = None  # time_attr of the latest checkpoint
    checkpoint_pending: bool = False  # on_trial_checkpoint seen, its result not yet
    done: bool = False


class PopulationBasedTraining(TrialScheduler):
    """Population based training (Ray Tune's ``PopulationBasedTraining``, asynchronous).

    Every ``perturbation_interval`` of a trial's ``time_attr`` (first at ``perturbation_interval``,
    never before ``burn_in_period``), the live trials that have reported are ranked by their latest
    metric. If the trial is in the bottom ``quantile_fraction`` (at most half the population, as in
    Ray), it gets an :class:`Exploit`: continue from the latest checkpoint of a random top-quantile
    trial, with that trial's config explored (see ``_explore``: list values move to a neighbour or
    are resampled with ``resample_probability``, domain and function values are resampled or
    multiplied by a ``perturbation_factors`` element, nested dicts likewise, ``custom_explore_fn``
    last). Top trials that have never reported a checkpoint cannot be sources; with none, the trial
    continues. A trial that has just exploited has no checkpoint of its own until it reports one.
    Mutated keys missing from a trial's config are sampled into it by ``on_trial_add``, in place.

    ``exploit_history`` lists every exploit (trial, source, times, configs before/after, what was
    done to each key) for the tuner to log; ``get_state``/``set_state`` carry the whole population
    and the random state, so a restored scheduler continues with the same draws (configs must be
    JSON-serialisable, as the tuner needs anyway).

    Differences from Ray: the ranking uses each trial's latest result (Ray's, the result at its last
    perturbation); the source is drawn among top trials that have a checkpoint (Ray draws among all
    top trials, then skips the exploit if the one drawn has no checkpoint it forced at its last
    perturbation: trainforge's scheduler cannot force checkpoints); ``tune.choice`` domains move
    between neighbours like lists and products are clipped into domains (Ray multiplies choices and
    lets values drift out of a domain); after an exploit the next perturbation is due
    ``perturbation_interval`` after the exploit, and if a trial's ``time_attr`` ever goes back (the
    tuner restored a checkpoint's counters) the interval is measured from that result (Ray copies the
    source's last perturbation time); results lacking ``time_attr`` or the metric are ignored (Ray
    raises unless ``require_attrs=False``); ``synch=True`` is not supported (it needs paused trials).

    Example::

        PopulationBasedTraining(
            time_attr="training_iteration", metric="loss", mode="min", perturbation_interval=5,
            hyperparam_mutations={"lr": tune.loguniform(1e-4, 1e-1), "batch_size": [16, 32, 64]},
        )
    """

    def __init__(
        self,
        time_attr: str = "time_total_s",
        metric: str | None = None,
        mode: str | None = None,
        perturbation_interval: float = 60.0,
        burn_in_period: float = 0.0,
        hyperparam_mutations: dict | None = None,
        quantile_fraction: float = 0.25,
        resample_probability: float = 0.25,
        perturbation_factors: tuple[float, ...] = (1.2, 0.8),
        custom_explore_fn: Callable[[dict], dict] | None = None,
        synch: bool = False,
        seed: int | None = None,
    ) -> None:
        super().__init__(metric, mode)
        owner = type(self).__name__
        mutations = hyperparam_mutations or {}
        if not isinstance(mutations, dict):
            raise ValueError(f"{owner}(hyperparam_mutations=...) must be a dict, got {mutations!r}.")
        if not mutations and custom_explore_fn is None:
            raise ValueError(
                f"{owner} needs something to explore: set `hyperparam_mutations` (non-empty) or "
                "`custom_explore_fn`."
            )
        check_mutations(mutations, owner)
        checks = [
            ("perturbation_interval", perturbation_interval, perturbation_interval > 0, "> 0"),
            ("burn_in_period", burn_in_period, burn_in_period >= 0, ">= 0"),
            ("quantile_fraction", quantile_fraction, 0 <= quantile_fraction <= 0.5, "between 0 and 0.5"),
            ("resample_probability", resample_probability, 0 <= resample_probability <= 1, "between 0 and 1"),
        ]
        for field, value, ok, expected in checks:
            if not ok:
                raise ValueError(f"{owner}({field}=...) must be {expected}, got {value!r}.")
        if not perturbation_factors:
            raise ValueError(f"{owner}(perturbation_factors=...) must not be empty.")
        if synch:
            raise ValueError(
                f"{owner}(synch=True) is not supported: synchronous PBT pauses trials until the whole "
                "population reaches each perturbation, and trainforge's tuner never pauses trials. "
                "Use synch=False."
            )
        self._time_attr = time_attr
        self._interval = perturbation_interval
        self._burn_in = burn_in_period
        self._mutations = mutations
        self._quantile_fraction = quantile_fraction
        self._resample_probability = resample_probability
        self._factors = tuple(perturbation_factors)
        self._custom_explore_fn = custom_explore_fn
        self._rng = random.Random(seed)
        self._members: dict[str, _Member] = {}
        self.exploit_history: list[dict] = []

    def on_trial_add(self, trial_id: str, config: dict) -> None:
        self._require_metric()
        if trial_id in self._members:
            return
        fill_missing(config, self._mutations, self._rng)
        self._members[trial_id] = _Member(config=copy.deepcopy(config))

    def on_trial_checkpoint(self, trial_id: str) -> None:
        member = self._member(trial_id)
        member.has_checkpoint = member.checkpoint_pending = True

    def on_trial_result(self, trial_id: str, result: dict) -> str | Exploit:
        member = self._member(trial_id)
        owner, metric = type(self).__name__, str(self._metric)
        t = number(result.get(self._time_attr), owner, self._time_attr)
        value = number(lookup(result, metric), owner, metric)
        if member.checkpoint_pending and t is not None:
            member.checkpoint_time, member.checkpoint_pending = t, False
        if member.done or t is None or value is None:
            return self.CONTINUE
        member.score = score(value, self._mode)
        member.last_perturbation_time = min(member.last_perturbation_time, t)
        if t < self._burn_in or t - member.last_perturbation_time < self._interval:
            return self.CONTINUE
        member.last_perturbation_time = t
        bottom, top = self._quantiles()
        sources = [other for other in top if other != trial_id and self._members[other].has_checkpoint]
        if trial_id not in bottom or not sources:
            return self.CONTINUE
        return self._exploit(trial_id, self._rng.choice(sources), t)

    def on_trial_complete(self, trial_id: str, result: dict | None) -> None:
        self._end(trial_id)

    def on_trial_error(self, trial_id: str) -> None:
        self._end(trial_id)

    def on_trial_remove(self, trial_id: str) -> None:
        self._end(trial_id)

    def get_state(self) -> dict:
        version, internal, gauss = self._rng.getstate()
        members = {}
        for trial_id, member in self._members.items():
            fields = asdict(member)
            fields["score"] = None if member.score is None else to_json_float(member.score)
            members[trial_id] = fields
        return {
            **self._base_state(),
            "members": members,
            "exploit_history": copy.deepcopy(self.exploit_history),
            "rng": [version, list(internal), gauss],
        }

    def set_state(self, state: dict) -> None:
        self._check_state(state)
        self._members = {}
        for trial_id, fields in state["members"].items():
            member = _Member(**fields)
            member.score = None if member.score is None else from_json_float(member.score)
            self._members[trial_id] = member
        self.exploit_history = copy.deepcopy(state["exploit_history"])
        version, internal, gauss = state["rng"]
        self._rng.setstate((version, tuple(internal), gauss))

    # -- internals ------------------------------------------------------------------------------
    def _member(self, trial_id: str) -> _Member:
        try:
            return self._members[trial_id]
        except KeyError:
            raise KeyError(
                f"{type(self).__name__}: trial {trial_id!r} is unknown; call on_trial_add(trial_id, config) "
                "before its first result."
            ) from None

    def _end(self, trial_id: str) -> None:
        if trial_id in self._members:
            self._members[trial_id].done = True

    def _quantiles(self) -> tuple[list[str], list[str]]:
        """(bottom, top) trial ids among the live trials with a score; Ray's sizes."""
        scores = {
            trial_id: m.score for trial_id, m in self._members.items() if not m.done and m.score is not None
        }
        ranked = sorted(scores, key=scores.__getitem__)  # stable: ties keep the order trials were added
        if len(ranked) <= 1:
            return [], []
        size = min(math.ceil(len(ranked) * self._quantile_fraction), len(ranked) // 2)
        if size == 0:
            return [], []
        return ranked[:size], ranked[-size:]

    def _exploit(self, trial_id: str, source_id: str, t: float) -> Exploit:
        member, source = self._members[trial_id], self._members[source_id]
        config, operations = explore(
            source.config, self._mutations, self._rng, self._resample_probability, self._factors
        )
        if self._custom_explore_fn is not None:
            config = self._custom_explore_fn(config)
            if not isinstance(config, dict):
                raise ValueError(
                    f"{type(self).__name__}: custom_explore_fn returned {config!r}; it must return the "
                    "config dict."
                )
        self.exploit_history.append(
            {
                "trial_id": trial_id,
                "source_trial_id": source_id,
                "time_attr": self._time_attr,
                "time": t,
                "source_checkpoint_time": source.checkpoint_time,
                "old_config": member.config,
                "source_config": copy.deepcopy(source.config),
                "new_config": copy.deepcopy(config),
                "operations": operations,
            }
        )
        member.config = config
        member.has_checkpoint = member.checkpoint_pending = False
        member.checkpoint_time = None
        return Exploit(source_trial_id=source_id, config=copy.deepcopy(config))
