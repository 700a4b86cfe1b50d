"""What a tune experiment tells a train server's Experiments pages (``trainforge.tune._experiment_info``):
its search space described, why each trial was stopped (the schedulers' ``explain()``, recorded in the
experiment's snapshot), and the experiment read back from its directory for ``trainforge experiments
import``, which the server takes (its schema) and shows as it ran: a pruned trial ends at its rung."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from trainforge import DataParallelTrainer, ScalingConfig, tune
from trainforge.tune import RunConfig, TuneConfig, Tuner
from trainforge.tune._experiment_info import DECISION_KEYS, describe_space, read_experiment
from trainforge.tune.schedulers import ASHAScheduler, FIFOScheduler, MedianStoppingRule

XS = [0.0, 0.95, 1.0, 0.1, 0.85, 0.2]  # each better than all before it but 1.0 (third): ASHA prunes it at rung 0


def objective(config):
    for step in range(4):
        tune.report({"loss": (config["x"] - 0.5) ** 2 + 1 / (step + 1), "step": step})


def _asha_run(tmp_path, name="local-asha"):
    return Tuner(objective, param_space={"x": tune.grid_search(XS), "lr": tune.loguniform(1e-4, 1e-1)},
                 tune_config=TuneConfig(metric="loss", mode="min", max_concurrent_trials=1, server=False,
                                        scheduler=ASHAScheduler(max_t=4, grace_period=1, reduction_factor=2)),
                 run_config=RunConfig(name=name, storage_path=str(tmp_path / "results"), verbose=0))  # fmt: skip


def test_the_decision_keys_are_the_servers_decision_fields():
    pytest.importorskip("fastapi")
    from trainforge.server.experiments.schemas import DecisionIn

    assert set(DECISION_KEYS) == set(DecisionIn.model_fields)


def test_the_search_space_is_described_by_the_keys_of_a_trial_jobs_config():
    space = {"lr": tune.loguniform(1e-4, 1e-1), "layers": tune.randint(1, 5), "act": tune.choice(["relu", "tanh"]),
             "opt": {"momentum": tune.uniform(0.5, 0.9), "name": "sgd"}, "seed": tune.grid_search([1, 2, 2]),
             "derived": tune.sample_from(lambda spec: 1)}  # fmt: skip
    described = describe_space(space, objective)
    assert described == {
        "lr": {"kind": "float", "low": 1e-4, "high": 1e-1, "log": True},
        "layers": {"kind": "int", "low": 1.0, "high": 4.0, "log": False},  # randint's upper is exclusive
        "act": {"kind": "categorical", "choices": ["relu", "tanh"]},
        "opt/momentum": {"kind": "float", "low": 0.5, "high": 0.9, "log": False},
        "seed": {"kind": "categorical", "choices": [1, 2]},
    }
    trainer = DataParallelTrainer(lambda c: None, scaling_config=ScalingConfig(num_workers=1))
    assert describe_space({"train_loop_config": {"lr": tune.uniform(0, 1)}}, trainer) == {
        "lr": {"kind": "float", "low": 0.0, "high": 1.0, "log": False}}


def test_asha_says_at_which_rung_it_stopped_a_trial_and_that_max_t_is_no_prune():
    pytest.importorskip("optuna")
    asha = ASHAScheduler(metric="loss", mode="min", max_t=8, grace_period=2, reduction_factor=2)
    for t in ("good", "bad"):
        asha.on_trial_add(t, {})
    for it in (1, 2, 3, 4):
        assert asha.on_trial_result("good", {"training_iteration": it, "loss": 1.0 / it}) == "CONTINUE"
    assert asha.on_trial_result("bad", {"training_iteration": 1, "loss": 5.0}) == "CONTINUE"
    assert asha.on_trial_result("bad", {"training_iteration": 2, "loss": 5.0}) == "STOP"
    why = asha.explain("bad")
    assert (why["kind"], why["rung"], why["rung_at"], why["at"], why["time_attr"]) == ("pruned", 0, 2.0, 2.0, "training_iteration")
    assert "rung 0" in why["text"]
    assert asha.on_trial_result("good", {"training_iteration": 8, "loss": 0.1}) == "STOP"
    assert asha.explain("good")["kind"] == "max_t"
    assert FIFOScheduler().explain("good") == {}
    median = MedianStoppingRule(metric="loss", mode="min", grace_period=0, min_samples_required=1)
    median.on_trial_result("a", {"time_total_s": 1, "loss": 0.1})
    assert median.on_trial_result("b", {"time_total_s": 1, "loss": 9.0}) == "STOP"
    assert median.explain("b")["kind"] == "pruned" and "median" in median.explain("b")["text"]


@pytest.mark.slow
def test_a_local_experiment_records_why_each_trial_ended_and_reads_back_as_an_import(tmp_path):
    pytest.importorskip("optuna")
    tuner = _asha_run(tmp_path)
    grid = tuner.fit()
    assert grid.num_errors == 0
    path = str(tmp_path / "results" / "local-asha")
    state = json.loads(open(os.path.join(path, "experiment_state.json")).read())
    assert state["info"]["scheduler"] == "ASHAScheduler" and state["info"]["space"]["lr"]["log"] is True
    decisions = {t["config"]["x"]: t["decisions"] for t in state["trials"]}
    (pruned,) = decisions[1.0]
    assert (pruned["kind"], pruned["iteration"], pruned["rung"], pruned["rule"]) == ("pruned", 1, 0, "ASHAScheduler")
    assert [d["kind"] for d in decisions[0.0]] == ["max_t"]  # used up its budget: completed, not pruned
    assert not [t for t in state["trials"] if t["config"]["x"] == 0.0][0]["last_result"].get("pruned")

    body = read_experiment(path)
    assert (body["name"], body["metric"], body["mode"], body["scheduler"]) == ("local-asha", "loss", "min", "ASHAScheduler")
    trial = next(t for t in body["trials"] if t["config"]["x"] == 1.0)
    assert trial["pruned"] and trial["decisions"][0]["iteration"] == 1
    assert [p[0] for p in trial["history"]["loss"]][:1] == [1]  # its run directory's reports, from the first
    fastapi = pytest.importorskip("fastapi")
    assert fastapi
    from trainforge.server.experiments.schemas import ExperimentImportIn

    ExperimentImportIn.model_validate(body)  # what the server takes


def test_the_cli_imports_a_local_experiment_into_the_server(tmp_path, train_server):
    pytest.importorskip("optuna")
    _asha_run(tmp_path, "to-import").fit()
    path = str(tmp_path / "results" / "to-import")
    run = [sys.executable, "-m", "trainforge", "experiments"]
    out = subprocess.run([*run, "import", path, "--state-dir", train_server.state_dir], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "imported experiment 1 (to-import): 6 trial(s)" in out.stdout and "/experiments/1" in out.stdout
    listed = subprocess.run([*run, "--state-dir", train_server.state_dir], capture_output=True, text=True, timeout=120)
    assert "to-import" in listed.stdout and "6 TERMINATED (1 pruned)" in listed.stdout  # 5 ran to their end
    client = train_server.client()
    trials = {t["config"]["x"]: t for t in client.request("GET", "/experiments/1/trials")["trials"]}
    assert trials[1.0]["state"] == "TERMINATED" and trials[1.0]["reason"]["kind"] == "pruned"
    assert trials[1.0]["iterations"] == 1
    curves = client.request("GET", "/experiments/1/curves")["trials"]
    assert curves[trials[1.0]["trial_id"]]["i"] == [1]  # its run went on past the rung; the trial did not
    missing = subprocess.run([*run, "import", str(tmp_path / "nothing"), "--state-dir", train_server.state_dir],
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    assert missing.returncode == 1 and "no tune experiment there" in missing.stderr
