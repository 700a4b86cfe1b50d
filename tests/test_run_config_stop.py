"""``RunConfig(stop=...)``, Ray 2.x's stop criteria, written as Ray code writes them: on train's
``RunConfig`` (``train.RunConfig(stop=...)``), honoured by a Tuner for every trial and by a trainer's
``fit()`` (in Ray Train 2.x ``fit()`` runs as one Tune trial), the accepted result being the last."""

from __future__ import annotations

import itertools

import pytest

import trainforge as train  # was: from ray import train
from trainforge import DataParallelTrainer, ScalingConfig, tune
from trainforge.tune import Stopper, Tuner

pytestmark = pytest.mark.slow


def forever(config=None):
    """Reports i = 1, 2, ... from every rank until stopped (a run that only the stop criteria end)."""
    for i in itertools.count(1):
        train.report({"i": i, "rank": train.get_context().get_world_rank()})


def _rc(tmp_path, **kw):
    return train.RunConfig(name="run", storage_path=str(tmp_path), verbose=0, **kw)


def _fit(tmp_path, stop, n=2):
    trainer = DataParallelTrainer(forever, scaling_config=ScalingConfig(num_workers=n), run_config=_rc(tmp_path, stop=stop))
    return trainer.fit()


def test_train_run_config_takes_stop_and_refuses_a_bad_one_naming_it():
    assert train.RunConfig(stop={"training_iteration": 5}).stop == {"training_iteration": 5}
    with pytest.raises(ValueError, match=r"RunConfig\(stop=\.\.\.\) must be a dict .* got 3 \(int\)"):
        train.RunConfig(stop=3)
    with pytest.raises(ValueError, match="'i' maps to 'x', which is not a number"):
        train.RunConfig(stop={"i": "x"})


def test_fit_ends_at_the_first_result_meeting_a_dict_criterion_which_is_the_last(tmp_path):
    result = _fit(tmp_path, {"training_iteration": 3})
    assert result.error is None and result.metrics == {"i": 3, "rank": 0}
    assert [row["i"] for row in result.metrics_history] == [1, 2, 3]
    assert [row["i"] for row in result.metrics_dataframe.to_dict("records")] == [1, 2, 3]


def test_fit_stops_on_a_function_of_the_result_and_a_metric_threshold(tmp_path):
    seen: list[tuple[str, int]] = []

    def stop(trial_id, result):
        seen.append((trial_id, result["training_iteration"]))
        return result["i"] >= 4

    result = _fit(tmp_path / "f", stop, n=1)
    assert result.metrics["i"] == 4 and seen == [("run", k) for k in (1, 2, 3, 4)]
    result = _fit(tmp_path / "d", {"i": 2})
    assert result.metrics["i"] == 2 and len(result.metrics_history) == 2


def test_fit_stops_when_a_stoppers_stop_all_says_so(tmp_path):
    class AfterTwo(Stopper):
        def __init__(self):
            self.calls = 0

        def __call__(self, trial_id, result):
            self.calls += 1
            return False

        def stop_all(self):
            return self.calls >= 2

    assert _fit(tmp_path, AfterTwo()).metrics["i"] == 2


def test_a_tuner_honours_train_run_config_stop_for_every_trial(tmp_path):
    # Ray 2.x Tune code: tune.Tuner(trainable, run_config=train.RunConfig(stop={"training_iteration": 5}))
    def trainable(config):
        for i in itertools.count(1):
            tune.report({"i": i * config["k"]})

    grid = Tuner(trainable, param_space={"k": tune.grid_search([1, 10])},
                 run_config=_rc(tmp_path, stop={"training_iteration": 5})).fit()  # fmt: skip
    assert grid.num_errors == 0 and grid.num_terminated == 2
    assert sorted(r.metrics["i"] for r in grid) == [5, 50]
    assert all(r.metrics["training_iteration"] == 5 for r in grid)
    grid = Tuner(trainable, param_space={"k": 1},
                 run_config=_rc(tmp_path / "f", stop=lambda trial_id, result: result["i"] >= 3)).fit()  # fmt: skip
    assert grid[0].metrics["i"] == 3
