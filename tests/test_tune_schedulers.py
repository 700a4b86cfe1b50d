"""trainforge.tune's trial schedulers and stoppers: pure units, property tests against small reference
implementations of the rules they claim (api-tune.md), and state save/restore."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import pickle
import random
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples

from trainforge.tune import schedulers
from trainforge.tune import stopper as stopper_module
from trainforge.tune._stopper import (
    CombinedStopper,
    ExperimentPlateauStopper,
    FunctionStopper,
    MaximumIterationStopper,
    NoopStopper,
    Stopper,
    TimeoutStopper,
    TrialPlateauStopper,
    make_stopper,
)
from trainforge.tune.schedulers import (
    ASHAScheduler,
    AsyncHyperBandScheduler,
    Exploit,
    FIFOScheduler,
    HyperBandScheduler,
    MedianStoppingRule,
    PopulationBasedTraining,
    TrialScheduler,
)
from trainforge.tune.schedulers._explore import explore

CONTINUE, STOP = TrialScheduler.CONTINUE, TrialScheduler.STOP
PROPERTY = settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def json_roundtrip(state: dict) -> dict:
    return json.loads(json.dumps(state, allow_nan=False))  # strict JSON: no NaN/inf numbers


def result(
    t: float, value: float | None, *, time_attr: str = "training_iteration", metric: str = "m"
) -> dict:
    out: dict = {time_attr: t}
    if value is not None:
        out[metric] = value
    return out


# -- public names ---------------------------------------------------------------------------------


def test_public_names_are_pinned():
    assert sorted(schedulers.__all__) == [
        "ASHAScheduler",
        "AsyncHyperBandScheduler",
        "Exploit",
        "FIFOScheduler",
        "HyperBandScheduler",
        "MedianStoppingRule",
        "PopulationBasedTraining",
        "TrialScheduler",
    ]
    assert sorted(stopper_module.__all__) == [
        "CombinedStopper",
        "ExperimentPlateauStopper",
        "FunctionStopper",
        "MaximumIterationStopper",
        "NoopStopper",
        "Stopper",
        "TimeoutStopper",
        "TrialPlateauStopper",
    ]
    assert AsyncHyperBandScheduler is ASHAScheduler
    assert (TrialScheduler.CONTINUE, TrialScheduler.PAUSE, TrialScheduler.STOP) == (
        "CONTINUE",
        "PAUSE",
        "STOP",
    )


# -- the base interface ---------------------------------------------------------------------------


def make_pbt(**kwargs) -> PopulationBasedTraining:
    defaults: dict = dict(
        time_attr="training_iteration",
        perturbation_interval=2,
        hyperparam_mutations={"lr": [0.1, 0.2, 0.3, 0.4]},
        resample_probability=0.0,
        seed=0,
    )
    return PopulationBasedTraining(**{**defaults, **kwargs})


NEEDS_METRIC = {
    "ASHAScheduler": lambda **kw: ASHAScheduler(**kw),
    "HyperBandScheduler": lambda **kw: HyperBandScheduler(**kw),
    "MedianStoppingRule": lambda **kw: MedianStoppingRule(**kw),
    "PopulationBasedTraining": lambda **kw: make_pbt(**kw),
}


@pytest.mark.parametrize("name", sorted(NEEDS_METRIC))
def test_set_search_properties_fills_metric_and_mode_from_tune_config(name):
    scheduler = NEEDS_METRIC[name]()
    assert scheduler.set_search_properties("m", "max") is True
    assert (scheduler.metric, scheduler.mode) == ("m", "max")
    half = NEEDS_METRIC[name](metric="m")
    assert half.set_search_properties(None, "min") is True
    assert (half.metric, half.mode) == ("m", "min")


@pytest.mark.parametrize("name", sorted(NEEDS_METRIC))
def test_a_scheduler_left_without_metric_or_mode_says_where_to_set_them(name):
    with pytest.raises(ValueError, match=rf"{name} needs a metric and a mode.*`metric`/`mode`.*TuneConfig"):
        NEEDS_METRIC[name]().set_search_properties(None, None)
    with pytest.raises(ValueError, match="mode=None"):
        NEEDS_METRIC[name](metric="m").set_search_properties(None, None)
    with pytest.raises(ValueError, match=name):  # used without set_search_properties at all
        scheduler = NEEDS_METRIC[name]()
        scheduler.on_trial_add("a", {})
        scheduler.on_trial_result("a", result(1, 1.0))


def test_conflicting_metric_or_mode_is_reported_and_the_scheduler_keeps_its_own():
    scheduler = ASHAScheduler(metric="loss", mode="min")
    assert scheduler.set_search_properties("accuracy", "max") is False
    assert (scheduler.metric, scheduler.mode) == ("loss", "min")
    assert ASHAScheduler(metric="loss", mode="min").set_search_properties("loss", "min") is True
    assert ASHAScheduler(metric="loss", mode="min").set_search_properties(None, None) is True


def test_mode_must_be_min_or_max():
    with pytest.raises(ValueError, match="'maximize'"):
        ASHAScheduler(metric="m", mode="maximize")
    with pytest.raises(ValueError, match="TuneConfig.*'up'"):
        MedianStoppingRule(metric="m").set_search_properties(None, "up")


def test_fifo_needs_nothing_and_always_continues():
    fifo = FIFOScheduler()
    assert fifo.set_search_properties(None, None) is True
    fifo.on_trial_add("a", {})
    assert [fifo.on_trial_result("a", result(t, -t)) for t in range(1, 50)] == [CONTINUE] * 49
    assert fifo.get_state() == {}


def test_exploit_is_a_frozen_value():
    exploit = Exploit(source_trial_id="b", config={"lr": 0.1})
    assert exploit == Exploit("b", {"lr": 0.1})
    with pytest.raises(dataclasses.FrozenInstanceError):
        exploit.source_trial_id = "c"  # type: ignore[misc]


def test_optuna_schedulers_name_the_extra_when_optuna_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)  # `import optuna` now raises ImportError
    for cls in (ASHAScheduler, HyperBandScheduler):
        with pytest.raises(ImportError, match=r'pip install "trainforge\[tune\]"'):
            cls(metric="m", mode="min")
    MedianStoppingRule(metric="m", mode="min")  # pure Python: no Optuna needed
    make_pbt(metric="m", mode="min")


def test_set_state_refuses_another_schedulers_state():
    median = MedianStoppingRule(metric="m", mode="min")
    with pytest.raises(ValueError, match="ASHAScheduler.set_state.*'MedianStoppingRule'"):
        ASHAScheduler(metric="m", mode="min").set_state(median.get_state())


def test_non_numeric_metric_is_an_error_naming_it():
    asha = ASHAScheduler(metric="m", mode="min")
    asha.on_trial_add("a", {})
    with pytest.raises(ValueError, match=r"result\['m'\] = 'high' is not a number"):
        asha.on_trial_result("a", {"training_iteration": 1, "m": "high"})


# -- ASHA -----------------------------------------------------------------------------------------


def asha(**kwargs) -> ASHAScheduler:
    scheduler = ASHAScheduler(**{"metric": "m", "mode": "min", **kwargs})
    scheduler.set_search_properties(None, None)
    return scheduler


def test_asha_keeps_the_top_fraction_of_a_rung():
    scheduler = asha(max_t=100, grace_period=1, reduction_factor=4)
    # Eight trials each better than all before it: each is the best so far, so each continues.
    for i, value in enumerate([8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0]):
        scheduler.on_trial_add(f"t{i}", {})
        assert scheduler.on_trial_result(f"t{i}", result(1, value)) == CONTINUE
    # The 9th value recorded: top 1/4 of 9 -> the best 9 // 4 = 2 continue; 2.5 is third.
    scheduler.on_trial_add("third", {})
    assert scheduler.on_trial_result("third", result(1, 2.5)) == STOP
    scheduler.on_trial_add("second", {})
    assert scheduler.on_trial_result("second", result(1, 1.5)) == CONTINUE
    # Ties continue: 1.0 has nobody strictly better.
    scheduler.on_trial_add("tie", {})
    assert scheduler.on_trial_result("tie", result(1, 1.0)) == CONTINUE
    # Between rungs (1 and 4) nothing is decided, however bad the value.
    assert [scheduler.on_trial_result("tie", result(t, 1e9)) for t in (2, 3)] == [CONTINUE, CONTINUE]


def test_asha_never_stops_before_grace_period_and_always_stops_at_max_t():
    scheduler = asha(max_t=10, grace_period=3, reduction_factor=2)
    for trial in ("good", "bad"):
        scheduler.on_trial_add(trial, {})
    assert scheduler.on_trial_result("good", result(1, 0.0)) == CONTINUE
    assert [scheduler.on_trial_result("bad", result(t, 100.0)) for t in (1, 2)] == [CONTINUE, CONTINUE]
    assert [scheduler.on_trial_result("good", result(t, 0.0)) for t in range(2, 10)] == [CONTINUE] * 8
    assert scheduler.on_trial_result("bad", result(3, 100.0)) == STOP  # the first rung
    assert scheduler.on_trial_result("good", result(10, 0.0)) == STOP  # max_t: finished
    assert scheduler.on_trial_result("good", result(11, 0.0)) == STOP  # a decision is final
    assert scheduler.on_trial_result("bad", result(4, -1.0)) == STOP


def test_asha_nan_is_stopped_at_a_rung_and_inf_ranks_normally():
    scheduler = asha(max_t=100, grace_period=2, reduction_factor=2)
    for trial in ("nan", "first", "inf", "-inf"):
        scheduler.on_trial_add(trial, {})
    assert scheduler.on_trial_result("nan", result(1, math.nan)) == CONTINUE  # before the grace period
    assert scheduler.on_trial_result("nan", result(2, math.nan)) == STOP  # even as the first at the rung
    assert scheduler.on_trial_result("first", result(2, 5.0)) == CONTINUE  # NaN was not recorded
    assert scheduler.on_trial_result("inf", result(2, math.inf)) == STOP
    assert scheduler.on_trial_result("-inf", result(2, -math.inf)) == CONTINUE
    json_roundtrip(scheduler.get_state())  # NaN/inf are encoded, not emitted as invalid JSON


def test_asha_ignores_results_without_time_or_metric():
    scheduler = asha(max_t=5, grace_period=1, reduction_factor=2)
    scheduler.on_trial_add("a", {})
    assert scheduler.on_trial_result("a", {"training_iteration": 5}) == CONTINUE
    assert scheduler.on_trial_result("a", {"m": 1.0}) == CONTINUE
    assert scheduler.on_trial_result("a", {"training_iteration": 5, "m": 1.0}) == STOP


def test_asha_reads_a_nested_metric_by_path():
    scheduler = asha(metric="val/loss", max_t=100, grace_period=1, reduction_factor=2)
    for trial in "ab":
        scheduler.on_trial_add(trial, {})
    assert scheduler.on_trial_result("a", {"training_iteration": 1, "val": {"loss": 1.0}}) == CONTINUE
    assert scheduler.on_trial_result("b", {"training_iteration": 1, "val": {"loss": 2.0}}) == STOP


def test_asha_with_a_float_time_attr_counts_rungs_in_grace_period_units():
    scheduler = asha(time_attr="time_total_s", max_t=4.0, grace_period=0.5, reduction_factor=2)
    for trial in "abc":
        scheduler.on_trial_add(trial, {})

    def report(trial: str, t: float, value: float) -> str:
        return scheduler.on_trial_result(trial, result(t, value, time_attr="time_total_s"))

    assert report("a", 0.3, 1.0) == CONTINUE  # before the grace period
    assert report("a", 0.6, 1.0) == CONTINUE  # rung 0.5: first there
    assert report("b", 0.7, 2.0) == STOP  # rung 0.5: worse than a
    assert report("c", 2.2, 0.5) == CONTINUE  # crosses rungs 0.5, 1 and 2 at once: recorded at each
    assert report("a", 1.1, 1.0) == STOP  # rung 1: c recorded 0.5 there
    assert report("c", 4.0, 0.5) == STOP  # max_t
    # Float noise at a rung boundary: 0.1 * 3 is 0.30000000000000004, 0.3 / 0.1 is 2.9999999999999996.
    noisy = asha(time_attr="time_total_s", max_t=10.0, grace_period=0.1, reduction_factor=3)
    for trial in "xy":
        noisy.on_trial_add(trial, {})
    assert noisy.on_trial_result("x", result(0.1, 1.0, time_attr="time_total_s")) == CONTINUE
    assert noisy.on_trial_result("y", result(0.1, 0.0, time_attr="time_total_s")) == CONTINUE
    assert noisy.on_trial_result("x", result(0.3, 1.0, time_attr="time_total_s")) == CONTINUE  # rung 0.3
    assert noisy.on_trial_result("y", result(0.3, 9.0, time_attr="time_total_s")) == STOP


def test_asha_brackets_start_their_rungs_later():
    def run(brackets: int) -> list[str]:
        scheduler = asha(max_t=16, grace_period=1, reduction_factor=2, brackets=brackets)
        for trial in "abc":
            scheduler.on_trial_add(trial, {})
        return [
            scheduler.on_trial_result(trial, result(1, value))
            for trial, value in zip("abc", (1.0, 2.0, 9.0), strict=True)
        ]

    assert run(1) == [CONTINUE, STOP, STOP]
    # Two brackets, weights e^0 and e^-1: a and b go to bracket 0, c to bracket 1, whose first rung is 2.
    assert run(2) == [CONTINUE, STOP, CONTINUE]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_t": 0}, "max_t"),
        ({"max_t": 10, "grace_period": 11}, "grace_period"),
        ({"grace_period": 0}, "grace_period"),
        ({"reduction_factor": 1}, "reduction_factor"),
        ({"reduction_factor": 2.5}, "reduction_factor"),
        ({"brackets": 0}, "brackets"),
    ],
)
def test_asha_validates_its_arguments(kwargs, field):
    with pytest.raises(ValueError, match=rf"ASHAScheduler\({field}="):
        ASHAScheduler(**kwargs)


class ReferenceASHA:
    """api-tune.md's sentence, "at rungs grace·rf^k < max_t, stop trials below the top 1/rf recorded
    there", read as documented on ASHAScheduler: the n values recorded at a rung include the trial's
    own; it continues iff fewer than max(1, n // rf) of them are strictly better (NaN: stopped, not
    recorded). Alongside, Ray's own rule at the same rung (percentile of the values recorded before)."""

    def __init__(self, max_t: float, grace: float, rf: int, mode: str):
        self.max_t, self.rf, self.sign = max_t, rf, 1.0 if mode == "max" else -1.0
        self.rungs: list[float] = []
        while grace * rf ** len(self.rungs) < max_t:
            self.rungs.append(grace * rf ** len(self.rungs))
        self.recorded: dict[float, list[tuple[str, float]]] = {r: [] for r in self.rungs}
        self.passed: dict[str, set[float]] = {}
        self.stopped_at: dict[str, float] = {}

    def decide(self, trial: str, t: float, value: float) -> tuple[str, bool]:
        """(the sentence's decision, whether Ray's rule stops at a rung crossed by this result)."""
        if t >= self.max_t:
            return STOP, False
        v = self.sign * value
        ray_stops = False
        for rung in self.rungs:
            if t < rung or rung in self.passed.setdefault(trial, set()):
                continue
            self.passed[trial].add(rung)
            before = [x for _, x in self.recorded[rung]]
            if before and not all(math.isnan(x) for x in before):
                ray_stops = ray_stops or v < np.nanpercentile(before, (1 - 1 / self.rf) * 100)
            if math.isnan(v):
                self.stopped_at[trial] = rung
                return STOP, ray_stops
            self.recorded[rung].append((trial, v))
            n = len(self.recorded[rung])
            if sum(x > v for _, x in self.recorded[rung]) >= max(1, n // self.rf):
                self.stopped_at[trial] = rung
                return STOP, ray_stops
        return CONTINUE, ray_stops


def interleave(lengths: list[int], order: list[int]) -> list[int]:
    """Trial indices, one per report: ``order`` first (skipping trials with no reports left), then
    round robin until every trial has made all its reports."""
    left = list(lengths)
    out = []
    for i in order:
        if left[i]:
            left[i] -= 1
            out.append(i)
    while any(left):
        for i, n in enumerate(left):
            if n:
                left[i] -= 1
                out.append(i)
    return out


@st.composite
def learning_curves(draw, *, max_len: int):
    n = draw(st.integers(1, 10))
    value = st.one_of(st.sampled_from([0.0, 1.0, 2.0]), st.floats(-10, 10, allow_nan=False))
    if draw(st.booleans()):
        value = st.one_of(value, st.just(math.nan))
    curves = [draw(st.lists(value, min_size=1, max_size=max_len)) for _ in range(n)]
    order = draw(st.lists(st.integers(0, n - 1), max_size=150))
    return curves, interleave([len(c) for c in curves], order)


@PROPERTY
@given(
    rf=st.integers(2, 4),
    grace=st.integers(1, 3),
    extra=st.integers(0, 28),
    mode=st.sampled_from(["min", "max"]),
    data=st.data(),
)
def test_asha_matches_the_contract_sentence_and_is_never_more_lenient_than_ray(rf, grace, extra, mode, data):
    max_t = grace + extra
    curves, schedule = data.draw(learning_curves(max_len=max_t + 2))
    scheduler = asha(mode=mode, max_t=max_t, grace_period=grace, reduction_factor=rf)
    reference = ReferenceASHA(max_t, grace, rf, mode)
    reported = [0] * len(curves)
    stopped: set[str] = set()
    for i in schedule:
        trial = f"t{i}"
        if trial in stopped:
            continue
        if reported[i] == 0:
            scheduler.on_trial_add(trial, {})
        t, value = reported[i] + 1, curves[i][reported[i]]
        reported[i] = t
        decision = scheduler.on_trial_result(trial, result(t, value))
        expected, ray_stops = reference.decide(trial, t, value)
        assert decision == expected, (trial, t, value)
        assert not ray_stops or decision == STOP  # Ray's rule stops it -> so does ours
        if decision == STOP:
            assert t >= grace  # never before the grace period
            assert t >= max_t or t in reference.rungs  # only at a rung, or when finished
            stopped.add(trial)
        else:
            assert t < max_t  # everything stops at max_t
            if t == len(curves[i]):
                scheduler.on_trial_complete(trial, result(t, value))
    for rung, values in reference.recorded.items():  # the best of each rung was never stopped there
        if values:
            best = max(v for _, v in values)
            assert all(reference.stopped_at.get(trial) != rung for trial, v in values if v == best)


@PROPERTY
@given(
    rf=st.integers(2, 3),
    grace=st.sampled_from([0.25, 0.5, 1.0]),
    max_t=st.sampled_from([1.0, 2.5, 4.0, 8.0]),
    steps=st.lists(
        st.lists(st.sampled_from([0.125, 0.25, 0.5, 1.5]), min_size=1, max_size=20), min_size=1, max_size=6
    ),
    values=st.lists(st.floats(-5, 5), min_size=20, max_size=20),
    order=st.lists(st.integers(0, 5), max_size=60),
)
def test_asha_with_float_times_matches_the_contract_sentence(rf, grace, max_t, steps, values, order):
    scheduler = asha(
        time_attr="time_total_s", max_t=max_t, grace_period=min(grace, max_t), reduction_factor=rf
    )
    reference = ReferenceASHA(max_t, min(grace, max_t), rf, "min")
    times = [list(np.cumsum(s)) for s in steps]
    reported = [0] * len(steps)
    stopped: set[int] = set()
    for i in interleave([len(s) for s in steps], [i for i in order if i < len(steps)]):
        if i in stopped:
            continue
        if reported[i] == 0:
            scheduler.on_trial_add(f"t{i}", {})
        t, value = float(times[i][reported[i]]), values[reported[i]] + i
        reported[i] += 1
        decision = scheduler.on_trial_result(f"t{i}", result(t, value, time_attr="time_total_s"))
        assert decision == reference.decide(f"t{i}", t, value)[0]
        if decision == STOP:
            stopped.add(i)


# -- HyperBand ------------------------------------------------------------------------------------


def test_hyperband_stops_only_at_rungs_keeps_the_best_and_finishes_at_max_t():
    scheduler = HyperBandScheduler(metric="m", mode="min", max_t=27, reduction_factor=3)
    trials = [f"t{i}" for i in range(40)]
    for trial in trials:
        scheduler.on_trial_add(trial, {})
    stopped_at: dict[str, int] = {}
    for t in range(1, 28):
        for i, trial in enumerate(trials):
            if trial not in stopped_at and scheduler.on_trial_result(trial, result(t, float(i))) == STOP:
                stopped_at[trial] = t
    assert len(stopped_at) == len(trials)  # everyone stops: early, or at max_t
    assert stopped_at["t0"] == 27  # the best trial is never pruned
    early = {trial: t for trial, t in stopped_at.items() if t < 27}
    assert len(early) > len(trials) // 2  # halving does prune
    assert set(early.values()) <= {1, 3, 9}  # only at rungs 3^k


def test_hyperband_validates_max_t_and_reduction_factor():
    with pytest.raises(ValueError, match=r"HyperBandScheduler\(max_t=.*2.5"):
        HyperBandScheduler(max_t=2.5)
    with pytest.raises(ValueError, match=r"HyperBandScheduler\(reduction_factor="):
        HyperBandScheduler(reduction_factor=1)


# -- the median stopping rule ---------------------------------------------------------------------


def median_rule(**kwargs) -> MedianStoppingRule:
    defaults: dict = dict(
        time_attr="training_iteration", metric="m", mode="max", grace_period=2, min_samples_required=2
    )
    return MedianStoppingRule(**{**defaults, **kwargs})


def test_median_rule_stops_a_trial_whose_best_is_below_the_median_of_running_means():
    rule = median_rule()
    for t in range(1, 5):
        assert rule.on_trial_result("a", result(t, 1.0)) == CONTINUE  # too few others
        assert rule.on_trial_result("b", result(t, 3.0)) == CONTINUE
    # At t=2 the others' running means over [2, 2] are 1 and 3: median 2.
    assert rule.on_trial_result("tie", result(1, 2.0)) == CONTINUE  # before the grace period
    assert rule.on_trial_result("tie", result(2, 2.0)) == CONTINUE  # not strictly worse
    assert rule.on_trial_result("worse", result(1, 9.0)) == CONTINUE
    assert rule.on_trial_result("worse", result(2, 1.5)) == CONTINUE  # its best (9, before grace) counts
    # Now the others at t=2 are a, b, tie and worse: means 1, 3, 2 and 1.5, median 1.75.
    assert rule.on_trial_result("above", result(2, 1.8)) == CONTINUE
    assert rule.on_trial_result("low", result(2, 1.7)) == STOP
    assert rule.on_trial_result("low", result(3, 99.0)) == STOP  # a decision is final


def test_median_rule_needs_min_samples_of_trials_that_got_as_far():
    rule = median_rule(min_samples_required=3)
    for trial, value in (("a", 5.0), ("b", 5.0)):
        for t in range(1, 4):
            rule.on_trial_result(trial, result(t, value))
    rule.on_trial_result("short", result(1, 5.0))  # never reaches t=2: not a sample there
    assert rule.on_trial_result("low", result(2, 0.0)) == CONTINUE
    rule.on_trial_result("c", result(2, 5.0))
    assert rule.on_trial_result("low2", result(2, 0.0)) == STOP


def test_median_rule_treats_nan_as_worst_and_skips_trials_without_a_window():
    rule = median_rule(time_attr="time_total_s", grace_period=10.0, min_samples_required=3)

    def report(trial: str, t: float, value: float) -> str:
        return rule.on_trial_result(trial, result(t, value, time_attr="time_total_s"))

    for trial in ("a", "b"):
        for t in (10.0, 20.0):
            report(trial, t, 1.0)
    report("late", 5.0, 1.0)
    report("late", 30.0, 1.0)  # got past t=15 but has no result in [10, 15]: no running mean there
    assert report("nan", 15.0, math.nan) == CONTINUE  # so only 2 samples (Ray: a NaN mean, and STOP)
    report("c", 10.0, 1.0)
    report("c", 20.0, 1.0)
    assert report("nan2", 15.0, math.nan) == STOP  # NaN is the worst value
    json_roundtrip(rule.get_state())


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"grace_period": -1}, "grace_period"), ({"min_samples_required": 0}, "min_samples_required")],
)
def test_median_rule_validates_its_arguments(kwargs, field):
    with pytest.raises(ValueError, match=rf"MedianStoppingRule\({field}="):
        MedianStoppingRule(**kwargs)


class RayMedianRule:
    """Ray's MedianStoppingRule.on_trial_result (hard stop), line by line."""

    def __init__(self, grace: float, min_samples: int, mode: str):
        self.grace, self.min_samples = grace, min_samples
        self.compare = max if mode == "max" else min
        self.results: dict[str, list[tuple[float, float]]] = {}
        self.stopped: set[str] = set()

    def on_result(self, trial: str, t: float, value: float) -> str:
        if trial in self.stopped:
            return STOP
        self.results.setdefault(trial, []).append((t, value))
        if t < self.grace:
            return CONTINUE
        others = [o for o in self.results if self.results[o][-1][0] >= t and o != trial]
        if len(others) < self.min_samples:
            return CONTINUE
        means = []
        for other in others:
            scoped = [v for time, v in self.results[other] if self.grace <= time <= t]
            means.append(sum(scoped) / len(scoped))
        median = float(np.median(means))
        best = self.compare(v for _, v in self.results[trial])
        if self.compare(median, best) != best:
            self.stopped.add(trial)
            return STOP
        return CONTINUE


@PROPERTY
@given(
    grace=st.integers(0, 4),
    min_samples=st.integers(1, 4),
    mode=st.sampled_from(["min", "max"]),
    curves=st.lists(st.lists(st.integers(-3, 3).map(float), min_size=1, max_size=12), min_size=1, max_size=8),
    order=st.lists(st.integers(0, 7), max_size=80),
)
def test_median_rule_decides_as_ray_does(grace, min_samples, mode, curves, order):
    rule = median_rule(grace_period=grace, min_samples_required=min_samples, mode=mode)
    ray = RayMedianRule(grace, min_samples, mode)
    reported = [0] * len(curves)
    decisions = []
    for i in interleave([len(c) for c in curves], [i for i in order if i < len(curves)]):
        t, value = reported[i] + 1, curves[i][reported[i]]
        reported[i] = t
        decision = rule.on_trial_result(f"t{i}", result(t, value))
        assert decision == ray.on_result(f"t{i}", t, value), (i, t, value)
        decisions.append(decision)
        if decision == STOP:
            assert t >= grace


# -- PBT ------------------------------------------------------------------------------------------


class Box:
    """A third-party search domain: anything with ``.sample(rng)``; bounds but no ``quantize``."""

    def __init__(self, lower: float, upper: float):
        self.lower, self.upper = lower, upper

    def sample(self, rng: random.Random) -> float:
        return rng.uniform(self.lower, self.upper)


def population(
    pbt: PopulationBasedTraining, scores: dict[str, float], lrs: dict[str, float], t: int = 1
) -> None:
    for trial in scores:
        pbt.on_trial_add(trial, {"lr": lrs[trial], "id": trial})
    for trial, score in scores.items():
        assert pbt.on_trial_result(trial, result(t, score)) == CONTINUE


def test_pbt_bottom_trial_exploits_a_top_trial_that_has_a_checkpoint():
    pbt = make_pbt(metric="m", mode="max", quantile_fraction=0.25)
    population(pbt, {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}, {"a": 0.1, "b": 0.2, "c": 0.3, "d": 0.2})
    assert pbt.on_trial_result("a", result(2, 1.0)) == CONTINUE  # d, the top, has no checkpoint
    pbt.on_trial_checkpoint("c")  # c has one, but is not in the top quarter
    pbt.on_trial_result("c", result(2, 3.0))
    assert pbt.on_trial_result("a", result(4, 1.0)) == CONTINUE
    pbt.on_trial_checkpoint("d")
    assert pbt.on_trial_result("d", result(2, 4.0)) == CONTINUE  # the top trial itself stays
    decision = pbt.on_trial_result("a", result(6, 1.0))
    assert isinstance(decision, Exploit) and decision.source_trial_id == "d"
    assert decision.config["lr"] in (0.1, 0.3)  # a neighbour of d's 0.2 (no resampling here)
    assert decision.config["id"] == "d"  # the rest of the config is the source's
    [entry] = pbt.exploit_history
    assert entry["trial_id"] == "a" and entry["source_trial_id"] == "d" and entry["time"] == 6
    assert entry["old_config"] == {"lr": 0.1, "id": "a"} and entry["new_config"] == decision.config
    assert entry["source_checkpoint_time"] == 2
    assert entry["operations"]["lr"] in ("shift left", "shift right")
    json_roundtrip(pbt.get_state())


def test_pbt_waits_for_perturbation_interval_and_burn_in():
    pbt = make_pbt(metric="m", mode="min", perturbation_interval=3, burn_in_period=5, quantile_fraction=0.5)
    pbt.on_trial_add("good", {"lr": 0.1})
    pbt.on_trial_add("bad", {"lr": 0.4})
    pbt.on_trial_checkpoint("good")
    pbt.on_trial_result("good", result(1, 0.0))
    assert [pbt.on_trial_result("bad", result(t, 5.0)) for t in range(1, 5)] == [CONTINUE] * 4  # burn-in
    assert isinstance(pbt.on_trial_result("bad", result(5, 5.0)), Exploit)
    assert [pbt.on_trial_result("bad", result(t, 5.0)) for t in (6, 7)] == [CONTINUE] * 2  # interval
    assert isinstance(pbt.on_trial_result("bad", result(8, 5.0)), Exploit)


def test_pbt_measures_the_interval_again_when_time_goes_back():
    pbt = make_pbt(metric="m", mode="max", perturbation_interval=4, quantile_fraction=0.5)
    population(pbt, {"a": 1.0, "b": 2.0}, {"a": 0.1, "b": 0.2})
    pbt.on_trial_checkpoint("b")
    pbt.on_trial_result("b", result(2, 2.0))
    assert isinstance(pbt.on_trial_result("a", result(8, 1.0)), Exploit)
    # The tuner restored b's checkpoint counters: a's time is 2 again; the next perturbation is at 6.
    pbt.on_trial_checkpoint("b")
    pbt.on_trial_result("b", result(3, 2.0))
    assert [pbt.on_trial_result("a", result(t, 1.0)) for t in (2, 3, 4, 5)] == [CONTINUE] * 4
    assert isinstance(pbt.on_trial_result("a", result(6, 1.0)), Exploit)


def test_pbt_never_exploits_itself_or_a_finished_trial():
    pbt = make_pbt(metric="m", mode="max", quantile_fraction=0.5)
    pbt.on_trial_add("alone", {"lr": 0.1})
    pbt.on_trial_checkpoint("alone")
    assert [pbt.on_trial_result("alone", result(t, 1.0)) for t in range(1, 9)] == [CONTINUE] * 8
    pbt.on_trial_add("top", {"lr": 0.2})
    pbt.on_trial_checkpoint("top")
    pbt.on_trial_result("top", result(1, 9.0))
    pbt.on_trial_complete("top", result(1, 9.0))
    assert pbt.on_trial_result("alone", result(10, 1.0)) == CONTINUE  # top finished: not a source
    assert pbt.exploit_history == []


def test_pbt_samples_missing_mutated_keys_into_the_config_in_place():
    pbt = make_pbt(
        metric="m", mode="max", hyperparam_mutations={"lr": [0.1, 0.2], "opt": {"wd": Box(0.0, 1.0)}}, seed=3
    )
    config: dict = {"lr": 0.2, "fixed": 7}
    pbt.on_trial_add("a", config)
    assert config["lr"] == 0.2 and config["fixed"] == 7  # present values are kept
    assert 0.0 <= config["opt"]["wd"] <= 1.0


def test_pbt_explores_nested_mutations_then_applies_custom_explore_fn():
    seen = []

    def custom(config: dict) -> dict:
        seen.append(config["opt"]["lr"])
        return {**config, "custom": True}

    pbt = make_pbt(
        metric="m",
        mode="max",
        quantile_fraction=0.5,
        hyperparam_mutations={"opt": {"lr": [1, 2, 3]}},
        custom_explore_fn=custom,
    )
    pbt.on_trial_add("a", {"opt": {"lr": 1, "beta": 0.9}})
    pbt.on_trial_add("b", {"opt": {"lr": 2, "beta": 0.5}})
    pbt.on_trial_checkpoint("b")
    pbt.on_trial_result("b", result(1, 5.0))
    decision = pbt.on_trial_result("a", result(2, 0.0))
    assert isinstance(decision, Exploit)
    assert decision.config["custom"] is True and decision.config["opt"]["beta"] == 0.5
    assert decision.config["opt"]["lr"] in (1, 3) and seen == [decision.config["opt"]["lr"]]
    assert pbt.exploit_history[0]["operations"]["opt"]["lr"] in ("shift left", "shift right")


def test_pbt_custom_explore_fn_must_return_a_config():
    pbt = make_pbt(metric="m", mode="max", quantile_fraction=0.5, custom_explore_fn=lambda config: None)
    pbt.on_trial_add("a", {"lr": 0.1})
    pbt.on_trial_add("b", {"lr": 0.2})
    pbt.on_trial_checkpoint("b")
    pbt.on_trial_result("b", result(1, 5.0))
    with pytest.raises(ValueError, match="custom_explore_fn returned None"):
        pbt.on_trial_result("a", result(2, 0.0))


def test_pbt_needs_on_trial_add_before_results():
    pbt = make_pbt(metric="m", mode="max")
    with pytest.raises(KeyError, match="on_trial_add"):
        pbt.on_trial_result("ghost", result(1, 1.0))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"quantile_fraction": 0.6}, r"quantile_fraction=\.\.\.\) must be between 0 and 0.5, got 0.6"),
        ({"perturbation_interval": 0}, r"perturbation_interval=\.\.\.\) must be > 0"),
        ({"hyperparam_mutations": {}}, "hyperparam_mutations"),
        ({"hyperparam_mutations": {"lr": 5}}, "'lr' maps to 5"),
        ({"hyperparam_mutations": {"opt": {"lr": []}}}, "'opt/lr' is empty"),
        ({"resample_probability": 2}, "resample_probability"),
        ({"synch": True}, r"synch=True\) is not supported"),
    ],
)
def test_pbt_validates_its_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_pbt(**kwargs)


def test_pbt_accepts_custom_explore_fn_without_mutations():
    pbt = PopulationBasedTraining(hyperparam_mutations=None, custom_explore_fn=lambda config: config)
    assert pbt.set_search_properties("m", "max")


def test_pbt_refuses_sample_from_as_in_ray():
    from trainforge.tune._sample import sample_from

    with pytest.raises(ValueError, match="sample_from"):
        make_pbt(hyperparam_mutations={"lr": sample_from(lambda spec: 0.1)})


LRS = [0.001, 0.01, 0.1, 1.0]


@PROPERTY
@given(
    seed=st.integers(0, 2**32 - 1),
    resample_probability=st.sampled_from([0.0, 0.25, 1.0]),
    start=st.integers(0, 3),
    batch=st.integers(1, 512),
    momentum=st.floats(0.0, 1.0),
)
def test_explore_keeps_values_in_their_lists_and_domains(seed, resample_probability, start, batch, momentum):
    from trainforge.tune import _sample

    mutations = {
        "lr": LRS,
        "batch": _sample.qrandint(1, 512, 8),
        "layers": _sample.randint(1, 5),
        "act": _sample.choice(["relu", "tanh", "gelu"]),
        "momentum": _sample.uniform(0.0, 1.0),
        "box": Box(0.5, 2.0),
        "fn": lambda: 42.0,
        "nested": {"wd": _sample.loguniform(1e-5, 1e-1)},
    }
    config = {
        "lr": LRS[start],
        "batch": batch,
        "layers": 1 + start,
        "act": "tanh",
        "momentum": momentum,
        "box": 1.9,
        "fn": 10.0,
        "nested": {"wd": 1e-3},
        "other": "kept",
    }
    rng = random.Random(seed)
    new, operations = explore(config, mutations, rng, resample_probability, (1.2, 0.8))
    assert new["other"] == "kept" and config["lr"] == LRS[start]  # the input is not modified
    for key in ("batch", "layers", "act", "momentum"):
        assert mutations[key].is_valid(new[key]), (key, new[key])
    assert mutations["nested"]["wd"].is_valid(new["nested"]["wd"])
    assert new["lr"] in LRS and 0.5 <= new["box"] <= 2.0
    if resample_probability == 0.0:  # no resampling: a neighbour, or a product by a factor
        assert abs(LRS.index(new["lr"]) - start) == 1 or (operations["lr"].endswith("(noop)"))
        assert ["relu", "tanh", "gelu"].index(new["act"]) in (0, 2)
        assert new["fn"] in (12.0, 8.0)
        assert new["layers"] == max(1, min(4, int((1 + start) * float(operations["layers"][2:]))))
    if resample_probability == 1.0:
        assert new["fn"] == 42.0 and all(op == "resample" for k, op in operations.items() if k != "nested")


@PROPERTY
@given(
    n=st.integers(2, 8),
    interval=st.integers(1, 4),
    burn_in=st.integers(0, 6),
    quantile=st.sampled_from([0.0, 0.2, 0.25, 0.5]),
    seed=st.integers(0, 2**32 - 1),
    reports=st.integers(1, 120),
)
def test_pbt_decisions_follow_the_rules(n, interval, burn_in, quantile, seed, reports):
    """An independent account of who is due, who is bottom/top and who has a checkpoint."""
    rng = random.Random(seed)
    pbt = PopulationBasedTraining(
        time_attr="training_iteration",
        metric="m",
        mode="max",
        perturbation_interval=interval,
        burn_in_period=burn_in,
        quantile_fraction=quantile,
        hyperparam_mutations={"lr": LRS, "wd": Box(0.0, 1.0)},
        resample_probability=0.3,
        seed=seed,
    )
    trials = [f"t{i}" for i in range(n)]
    configs = {trial: {"lr": rng.choice(LRS), "wd": rng.random(), "name": trial} for trial in trials}
    for trial in trials:
        pbt.on_trial_add(trial, dict(configs[trial]))
    time = dict.fromkeys(trials, 0)
    last_perturbation = dict.fromkeys(trials, 0)
    scores: dict[str, float] = {}
    checkpointed: set[str] = set()
    done: set[str] = set()
    exploits = 0
    for _ in range(reports):
        live = [trial for trial in trials if trial not in done]
        if not live:
            break
        trial = rng.choice(live)
        time[trial] += 1
        if rng.random() < 0.3:
            pbt.on_trial_checkpoint(trial)
            checkpointed.add(trial)
        scores[trial] = rng.gauss(0, 1)
        decision = pbt.on_trial_result(trial, result(time[trial], scores[trial]))

        due = time[trial] >= burn_in and time[trial] - last_perturbation[trial] >= interval
        if due:
            last_perturbation[trial] = time[trial]
        ranked = sorted((x for x in trials if x not in done and x in scores), key=scores.__getitem__)
        size = min(math.ceil(len(ranked) * quantile), len(ranked) // 2) if len(ranked) > 1 else 0
        bottom, top = ranked[:size], ranked[len(ranked) - size :]
        sources = [x for x in top if x in checkpointed and x != trial]
        if due and trial in bottom and sources:
            assert isinstance(decision, Exploit)
            assert decision.source_trial_id in sources and decision.source_trial_id != trial
            source_config = configs[decision.source_trial_id]
            assert decision.config["name"] == source_config["name"]
            assert decision.config["lr"] in LRS and 0.0 <= decision.config["wd"] <= 1.0
            configs[trial] = decision.config
            checkpointed.discard(trial)
            exploits += 1
        else:
            assert decision == CONTINUE
        if rng.random() < 0.03:
            done.add(trial)
            pbt.on_trial_complete(trial, None)
    assert len(pbt.exploit_history) == exploits


# -- state save/restore ---------------------------------------------------------------------------


def event_stream(seed: int, n_events: int) -> list[tuple]:
    """A tuner's calls for a random asynchronous experiment (decisions are not acted on: a scheduler
    answers the same for a trial it already stopped)."""
    rng = random.Random(seed)
    events: list[tuple] = []
    time: dict[str, int] = {}
    done: set[str] = set()
    for _ in range(n_events):
        live = [trial for trial in time if trial not in done]
        if not live or rng.random() < 0.15:
            trial = f"t{len(time)}"
            time[trial] = 0
            events.append(("add", trial, {"lr": rng.choice(LRS)}))
            continue
        trial = rng.choice(live)
        time[trial] += 1
        if rng.random() < 0.3:
            events.append(("checkpoint", trial))
        value = math.nan if rng.random() < 0.03 else rng.gauss(time[trial] * 0.1, 1)
        events.append(("result", trial, {"training_iteration": time[trial], "m": value}))
        roll = rng.random()
        if roll < 0.04:
            events.append(("complete", trial))
            done.add(trial)
        elif roll < 0.05:
            events.append(("error", trial))
            done.add(trial)
    return events


def drive(scheduler: TrialScheduler, events: list[tuple]) -> list:
    decisions = []
    for event in events:
        kind, trial = event[0], event[1]
        if kind == "add":
            scheduler.on_trial_add(trial, dict(event[2]))
        elif kind == "checkpoint":
            scheduler.on_trial_checkpoint(trial)
        elif kind == "result":
            decisions.append((trial, scheduler.on_trial_result(trial, event[2])))
        elif kind == "complete":
            scheduler.on_trial_complete(trial, None)
        else:
            scheduler.on_trial_error(trial)
    return decisions


STATEFUL = {
    "ASHAScheduler": lambda: ASHAScheduler(max_t=20, grace_period=1, reduction_factor=2),
    "ASHAScheduler-brackets": lambda: ASHAScheduler(max_t=30, grace_period=1, reduction_factor=3, brackets=3),
    "HyperBandScheduler": lambda: HyperBandScheduler(max_t=27, reduction_factor=3),
    "MedianStoppingRule": lambda: MedianStoppingRule(time_attr="training_iteration", grace_period=2),
    "PopulationBasedTraining": lambda: PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=2,
        quantile_fraction=0.5,
        hyperparam_mutations={"lr": LRS, "wd": Box(0.0, 1.0)},
        seed=None,  # the random state must travel with the state
    ),
}


@pytest.mark.parametrize("name", sorted(STATEFUL))
@settings(max_examples=examples(25), deadline=None)
@given(seed=st.integers(0, 2**32 - 1), split=st.floats(0.0, 1.0))
def test_a_restored_scheduler_decides_as_an_uninterrupted_one(name, seed, split):
    events = event_stream(seed, 250)
    cut = int(len(events) * split)
    running = STATEFUL[name]()
    running.set_search_properties("m", "max")
    drive(running, events[:cut])
    state = json_roundtrip(running.get_state())
    restored = STATEFUL[name]()
    restored.set_search_properties("m", "max")
    restored.set_state(state)
    assert restored.get_state() == state
    assert drive(restored, events[cut:]) == drive(running, events[cut:])
    assert restored.get_state() == running.get_state()
    if isinstance(restored, PopulationBasedTraining):
        assert isinstance(running, PopulationBasedTraining)
        assert restored.exploit_history == running.exploit_history


def test_the_restore_streams_exercise_every_decision():
    kinds = {}
    for name, factory in STATEFUL.items():
        scheduler = factory()
        scheduler.set_search_properties("m", "max")
        kinds[name] = {
            type(d).__name__ if isinstance(d, Exploit) else d
            for _, d in drive(scheduler, event_stream(1, 250))
        }
    assert all(STOP in kinds[name] for name in STATEFUL if "Population" not in name)
    assert kinds["PopulationBasedTraining"] == {CONTINUE, "Exploit"}


# -- stoppers -------------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Counting(Stopper):
    def __init__(self, answer: bool) -> None:
        self.answer, self.calls = answer, 0

    def __call__(self, trial_id: str, result: dict) -> bool:
        self.calls += 1
        return self.answer

    def stop_all(self) -> bool:
        return self.answer


def test_stopper_is_abstract():
    with pytest.raises(TypeError):
        Stopper()  # type: ignore[abstract]

    class OnlyCall(Stopper):
        def __call__(self, trial_id, result):
            return False

    with pytest.raises(TypeError):
        OnlyCall()  # type: ignore[abstract]


def test_maximum_iteration_stopper_counts_each_trials_results():
    stop = MaximumIterationStopper(max_iter=3)
    assert [stop("a", {}) for _ in range(3)] == [False, False, True]
    assert stop("b", {}) is False and stop.stop_all() is False
    with pytest.raises(ValueError, match="max_iter"):
        MaximumIterationStopper(0)


def test_timeout_stopper_counts_from_the_first_stop_all_call():
    clock = FakeClock()
    stop = TimeoutStopper(10, clock=clock)
    clock.now += 100  # before the first call: setup time does not count
    assert stop.stop_all() is False
    clock.now += 9.5
    assert stop.stop_all() is False and stop("a", {}) is False
    clock.now += 0.5
    assert stop.stop_all() is True


def test_timeout_stopper_accepts_timedelta_and_keeps_its_budget_across_pickling():
    clock = FakeClock()
    stop = TimeoutStopper(datetime.timedelta(minutes=1), clock=clock)
    stop.stop_all()
    clock.now += 50
    assert stop.stop_all() is False
    restored = pickle.loads(pickle.dumps(stop))
    restored._clock = clock  # the pickled FakeClock is a copy; share the test's one
    clock.now += 3600  # the tuner was down for an hour: not counted
    assert restored.stop_all() is False
    clock.now += 10
    assert restored.stop_all() is True
    with pytest.raises(ValueError, match="timeout"):
        TimeoutStopper("10s")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="negative"):
        TimeoutStopper(-1)


def test_trial_plateau_stopper():
    stop = TrialPlateauStopper(metric="m", std=0.01, num_results=3, grace_period=4)
    values = [5.0, 1.0, 1.0, 1.0, 1.001, 2.0]
    assert [stop("a", {"m": v}) for v in values] == [False, False, False, True, True, False]
    assert stop("b", {"m": 1.0}) is False  # per trial
    nan = TrialPlateauStopper(metric="m", num_results=2, grace_period=0)
    assert [nan("a", {"m": v}) for v in (math.nan, 1.0, 1.0)] == [False, False, True]
    assert [nan("b", {}) for _ in range(3)] == [False, False, False]  # a missing metric never plateaus


def test_trial_plateau_stopper_threshold_needs_the_mode():
    with pytest.raises(ValueError, match="metric_threshold"):
        TrialPlateauStopper(metric="m", metric_threshold=0.5)
    stop = TrialPlateauStopper(metric="m", num_results=2, grace_period=2, metric_threshold=0.5, mode="min")
    assert [stop("a", {"m": v}) for v in (0.7, 0.7, 0.4, 0.4)] == [False, False, False, True]
    zero = TrialPlateauStopper(metric="m", num_results=2, grace_period=2, metric_threshold=0.0, mode="max")
    assert [zero("a", {"m": v}) for v in (-1.0, -1.0)] == [False, False]  # a 0 threshold is a threshold


def test_experiment_plateau_stopper():
    stop = ExperimentPlateauStopper(metric="m", std=0.001, top=3, mode="min", patience=2)
    assert [stop(t, {"m": v}) for t, v in (("a", 1.0), ("b", 1.0), ("c", 5.0))] == [False, False, False]
    assert stop("d", {"m": 1.0}) is False  # top 3 = [1, 1, 1]: a plateau for 1 result, patience 2
    assert stop("e", {"m": math.nan}) is False  # ignored
    assert stop("e", {"m": 3.0}) is True and stop.stop_all() is True  # still [1, 1, 1]: 2 results
    eager = ExperimentPlateauStopper(metric="m", std=0.001, top=2, mode="max", patience=0)
    assert [eager(t, {"m": v}) for t, v in (("a", 1.0), ("b", 0.5), ("c", 0.5), ("d", 1.0))] == [
        False,
        False,
        False,
        True,
    ]
    with pytest.raises(ValueError, match="top"):
        ExperimentPlateauStopper(metric="m", top=1)
    with pytest.raises(ValueError, match="mode"):
        ExperimentPlateauStopper(metric="m", mode="best")


def test_combined_stopper_asks_every_stopper():
    first, second = Counting(True), Counting(False)
    combined = CombinedStopper(first, second)
    assert combined("a", {}) is True and combined.stop_all() is True
    assert second.calls == 1  # still told about the result
    assert CombinedStopper(Counting(False), NoopStopper())("a", {}) is False


def test_make_stopper_from_a_dict():
    stop = make_stopper({"training_iteration": 3, "val/acc": 0.9})
    assert isinstance(stop, Stopper)
    assert stop("a", {"training_iteration": 2, "val": {"acc": 0.5}}) is False
    assert stop("a", {"training_iteration": 3, "val": {"acc": 0.5}}) is True
    assert stop("a", {"training_iteration": 1, "val/acc": 0.95}) is True
    with pytest.raises(ValueError, match="'val/acc'.*did not report"):
        stop("a", {"training_iteration": 1})
    assert make_stopper({}) is None


def test_make_stopper_from_a_function_a_stopper_or_none():
    stop = make_stopper(lambda trial_id, result: trial_id == "b" and result["x"] > 1)
    assert isinstance(stop, FunctionStopper)
    assert (stop("a", {"x": 5}), stop("b", {"x": 5}), stop("b", {"x": 0}), stop.stop_all()) == (
        False,
        True,
        False,
        False,
    )
    counting = Counting(False)
    assert make_stopper(counting) is counting
    assert make_stopper(None) is None


class Impostor:
    def __call__(self, trial_id, result):
        return False

    def stop_all(self):
        return False


@pytest.mark.parametrize(
    ("stop", "match"),
    [
        (42, "got 42"),
        ("loss", "got 'loss'"),
        ({"loss": "low"}, "'loss' maps to 'low'"),
        ({"loss": True}, "'loss' maps to True"),
        ({1: 2}, "the key 1"),
        (Impostor(), "not a trainforge.tune.Stopper"),
        (NoopStopper, r"the class NoopStopper: pass an instance, NoopStopper\(...\)"),
    ],
)
def test_make_stopper_refuses_anything_else_naming_it(stop, match):
    with pytest.raises(ValueError, match=match):
        make_stopper(stop)
