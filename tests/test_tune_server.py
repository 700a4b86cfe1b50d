"""Tune trials as jobs of a train server (``TuneConfig.server``): a real server (the ``train_server``
fixture: 2 CPUs, its own state directory, found through $TRAINFORGE_SERVER_DIR) runs every trial;
the tuner packs trials against the server's capacity, stops them through the server, and reads their
results from it. A server that is not there is an error only when named; otherwise trials run here.

No test sleeps to wait: the tuner returns once every job has ended; the fixtures fail a test that
leaves a process behind (a job's included)."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from trainforge import DataParallelTrainer, ScalingConfig, tune
from trainforge.server import Job, ServerNotFoundError
from trainforge.tune import RunConfig, TuneConfig, Tuner
from trainforge.tune._server import ServerRun, TrialLostError, connect

pytestmark = pytest.mark.slow


def _rc(tmp_path, name, **kw):
    return RunConfig(name=name, storage_path=str(tmp_path / "results"), verbose=0, **kw)


def _score(x, step):
    return -((x - 2) ** 2) + step


def quadratic(config):
    for step in range(3):
        tune.report({"score": _score(config["x"], step), "step": step})


def forever_or_fail(config):
    """Reports until stopped; with ``fail``, fails after its first report."""
    i = 0
    while True:
        i += 1
        tune.report({"i": i})
        if config["fail"]:
            raise RuntimeError("trial broke on purpose")
        time.sleep(0.01)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_every_trial_is_a_job_of_the_server_and_its_results_are_what_it_reported(train_server, tmp_path):
    tuner = Tuner(quadratic, param_space={"x": tune.grid_search([0, 1, 2, 3])},
                  tune_config=TuneConfig(metric="score", mode="max", server=train_server.url),
                  run_config=_rc(tmp_path, "served"))  # fmt: skip
    grid = tuner.fit()
    assert grid.num_errors == 0 and grid.num_terminated == 4
    best = grid.get_best_result()
    assert best.config["x"] == 2 and best.metrics["score"] == _score(2, 2)
    for r in grid:
        assert [h["score"] for h in r.metrics_history] == [_score(r.config["x"], s) for s in range(3)]
        assert r.metrics["training_iteration"] == 3

    client = train_server.client()
    jobs = {j.name: j for j in client.jobs()}
    trials = tuner.last_controller.trials
    assert set(jobs) == {f"served/{t.name}" for t in trials}  # <experiment>/<trial>: the dashboard's filter
    by_path = {r.path: r for r in grid}
    for t in trials:
        job = jobs[f"served/{t.name}"].raw
        assert job["state"] == "SUCCEEDED" and job["reports"] == 3
        assert job["config"] == {"x": t.config["x"]}  # what the compare page groups by
        assert job["request"]["per_worker"] == {"CPU": 1.0}
        assert job["last_metrics"]["score"] == by_path[job["run_path"]].metrics["score"]  # the run is the trial's
    spans = sorted((j.raw["started_at"], j.raw["ended_at"]) for j in jobs.values())
    assert max(sum(s <= start < e for s, e in spans) for start, _ in spans) <= 2  # packed against its 2 CPUs
    assert client.resources()["granted"] == {}
    # Trials that ran to their end (jobs SUCCEEDED): TERMINATED in the result grid, the API and the page.
    assert _states_in_every_view(train_server, tuner, grid) == {"TERMINATED"}


def _states_in_every_view(train_server, tuner, grid) -> set[str]:
    """Each trial's state as the result grid, ``GET /experiments/{id}/trials`` and the experiment's page
    show it, asserted equal; the states seen."""
    import httpx

    client = train_server.client()
    (experiment,) = client.request("GET", "/experiments")["experiments"]
    api = {t["trial_id"]: t["state"] for t in client.request("GET", f"/experiments/{experiment['id']}/trials")["trials"]}
    page = httpx.get(f"{train_server.url}/experiments/{experiment['id']}", timeout=60,
                     headers={"Authorization": f"Bearer {train_server.token}"})  # fmt: skip
    assert page.status_code == 200, page.text
    trials = tuner.last_controller.trials
    assert len(grid) == len(trials) == len(api)
    for result, trial in zip(grid, trials, strict=True):
        assert result.state == trial.status == api[trial.trial_id], (trial.name, result.state, api)
        assert f'<tr id="trial-{trial.trial_id}" data-state="{trial.status}">' in page.text
        assert f'<span class="tstate t-{trial.status}">{trial.status}</span>' in page.text
    return {str(r.state) for r in grid}


def test_stopped_trials_end_their_jobs_and_a_failing_trial_is_an_error(train_server, tmp_path):
    # TuneConfig() finds the server by itself ($TRAINFORGE_SERVER_DIR names its state directory).
    tuner = Tuner(forever_or_fail, param_space={"fail": tune.grid_search([False, True, False])},
                  run_config=_rc(tmp_path, "stopping", stop={"training_iteration": 3}))  # fmt: skip
    grid = tuner.fit()
    assert grid.num_errors == 1 and "trial broke on purpose" in str(grid.errors[0])
    stopped = [r for r in grid if r.error is None]
    assert len(stopped) == 2 and all(r.metrics["training_iteration"] == 3 for r in stopped)

    client = train_server.client()
    states = {j.name.rpartition("/")[2]: j.state for j in client.jobs()}
    # The stop criteria ended two: they ran to their end, so their jobs are SUCCEEDED (stopped by the tuner
    # with `complete`), not STOPPED as a job someone stopped (issue 36).
    expect = {t.name: "FAILED" if t.config["fail"] else "SUCCEEDED" for t in tuner.last_controller.trials}
    assert states == expect
    assert client.resources()["granted"] == {}  # every stopped job gave its CPU back
    # Those two are TERMINATED, as Ray shows them, in every view; the failed one is ERROR in every view.
    assert _states_in_every_view(train_server, tuner, grid) == {"TERMINATED", "ERROR"}
    assert sorted(r.state for r in grid) == ["ERROR", "TERMINATED", "TERMINATED"]
    assert train_server.job_processes() == []


def test_a_trial_whose_job_is_stopped_on_the_server_is_an_error(train_server, tmp_path):
    client = train_server.client()
    stopped: list = []

    def stop_the_first_run():
        for event, _, data in client.stream("/events", params={"after": 0}):
            if event == "run_start":
                stopped.append(client.job(data["job_id"]).stop())
                return

    stopper = threading.Thread(target=stop_the_first_run, daemon=True)
    stopper.start()
    grid = Tuner(forever_or_fail, param_space={"fail": False}, tune_config=TuneConfig(server=train_server.url),
                 run_config=_rc(tmp_path, "external")).fit()  # fmt: skip
    stopper.join(30)
    assert stopped and stopped[0].state == "STOPPED"
    assert grid.num_errors == 1 and "stopped on the train server" in str(grid.errors[0])


def test_server_false_runs_trials_here_even_with_an_address_set(train_server, tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFORGE_ADDRESS", train_server.url)
    grid = Tuner(quadratic, param_space={"x": 1}, tune_config=TuneConfig(server=False),
                 run_config=_rc(tmp_path, "here")).fit()  # fmt: skip
    assert grid.num_errors == 0 and grid[0].metrics["score"] == _score(1, 2)
    assert train_server.client().jobs() == []
    grid = Tuner(quadratic, param_space={"x": 1}, run_config=_rc(tmp_path, "there")).fit()  # the address: used
    assert grid.num_errors == 0 and [j.state for j in train_server.client().jobs()] == ["SUCCEEDED"]


@pytest.mark.parametrize("value", [True, 1, "", "127.0.0.1:8270", "ftp://host", "http://", "http://h:port"])
def test_a_bad_server_value_is_refused_naming_it(value):
    with pytest.raises(ValueError, match=r"TuneConfig\.server=.* is not valid: use None .* False .* URL"):
        TuneConfig(server=value)


def test_a_named_server_that_does_not_answer_is_an_error_and_none_found_runs_here(tmp_path, monkeypatch):
    dead = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(ServerNotFoundError, match=r"TuneConfig\.server=.*no train server answers.*server=False"):
        Tuner(quadratic, param_space={"x": 1}, tune_config=TuneConfig(server=dead),
              run_config=_rc(tmp_path, "named")).fit()  # fmt: skip
    assert not (tmp_path / "results" / "named").exists()  # refused before the experiment started
    monkeypatch.setenv("TRAINFORGE_ADDRESS", dead)
    with pytest.raises(ServerNotFoundError, match=r"\$TRAINFORGE_ADDRESS=.*unset it"):
        Tuner(quadratic, param_space={"x": 1}, run_config=_rc(tmp_path, "env")).fit()
    monkeypatch.delenv("TRAINFORGE_ADDRESS")
    state_dir = tmp_path / "server"  # a server that is gone left its address behind: trials run here
    state_dir.mkdir()
    (state_dir / "address").write_text(dead)
    monkeypatch.setenv("TRAINFORGE_SERVER_DIR", str(state_dir))
    grid = Tuner(quadratic, param_space={"x": 1}, run_config=_rc(tmp_path, "stale")).fit()
    assert grid.num_errors == 0 and grid[0].metrics["score"] == _score(1, 2)


def test_a_tuner_running_as_a_server_job_keeps_its_trials_in_the_job(monkeypatch):
    monkeypatch.setenv("TRAINFORGE_JOB_ID", "5")
    monkeypatch.setenv("TRAINFORGE_ADDRESS", f"http://127.0.0.1:{_free_port()}")  # inherited from the server
    assert connect(None) is None
    with pytest.raises(ServerNotFoundError):  # a server named in TuneConfig is still used
        connect(os.environ["TRAINFORGE_ADDRESS"])


class _LosingClient:
    """A server that takes the job, streams one report, then is gone for good."""

    address = "http://127.0.0.1:1"

    def submit(self, spec):
        self.spec = spec
        return Job(self, 7)

    def stream(self, path, **kw):
        yield "report", "1", {"index": 0, "metrics": {"i": 1}}
        raise ServerNotFoundError(f"lost the train server at {self.address}: connection refused")

    def request(self, *args, **kw):
        raise ServerNotFoundError(f"no train server answers at {self.address}")


def test_a_lost_server_is_the_trial_s_error_saying_what_to_do():
    trainer = DataParallelTrainer(lambda config: None, train_loop_config={"lr": 0.1, "net": {"depth": 3}},
                                  scaling_config=ScalingConfig(num_workers=2))  # fmt: skip
    client = _LosingClient()
    run = ServerRun(client, trainer, name="exp/trial_1")  # type: ignore[arg-type]
    assert client.spec["name"] == "exp/trial_1" and client.spec["num_workers"] == 2
    assert client.spec["config"] == {"lr": 0.1, "net/depth": 3}
    reports = iter(run)
    assert next(reports).metrics == {"i": 1}
    with pytest.raises(TrialLostError, match=r"lost the train server .* job 7 .*`trainforge stop 7`.*run the tuner again"):
        next(reports)
    run.stop()  # returns at once; the server being gone is only logged
