"""The Experiments API in-process (``trainforge.server.experiments.book``): the runner-less server of
test_server_api.py (``Api``: no job process starts; a "running" job runs until stopped), with trial jobs
tagged as Tune tags them and their events files written here as a trial's run writes them.

What is checked: trial jobs become an experiment with each trial's numbers; a stop decision ends a
trial's reports where it was taken (its numbers, its curve and its job's chart); states and reasons;
importance ranks the parameter the metric depends on (both evaluators) and is kept until a trial
ends; imports; the live stream; the errors (404, 409, 422).
"""

from __future__ import annotations

import json
import os
import random
import threading

import pytest

pytest.importorskip("fastapi")

from test_server_api import Api, P, read_sse  # noqa: E402

from trainforge.client import JobState, TrialState, trial_state  # noqa: E402
from trainforge.server.jobs.runner import EVENTS_FILE  # noqa: E402

SPACE = {"x": {"kind": "float", "low": 0.0, "high": 1.0}, "lr": {"kind": "float", "low": 1e-4, "high": 1e-1, "log": True}}
TAG = {"path": "/runs/asha", "name": "asha", "metric": "loss", "mode": "min", "searcher": "BasicVariantGenerator",
       "scheduler": "ASHAScheduler", "space": SPACE}  # fmt: skip


@pytest.fixture
def api(tmp_path):
    made = Api(str(tmp_path / "state"), {"CPU": 64.0})
    yield made
    made.close()


def _trial(api: Api, trial_id: str, config: dict, losses: list[float], *, tag: dict | None = None) -> int:
    """A trial job of the experiment ``tag`` that reported ``losses`` (its events file, as a run writes it)."""
    job = api.submit(name=f"asha/objective_{trial_id}", config=config, experiment={**(tag or TAG), "trial_id": trial_id})
    _report(api, job["id"], losses)
    return int(job["id"])


def _report(api: Api, job_id: int, losses: list[float], start: int = 0) -> None:
    path = os.path.join(api.service.job_dir(job_id), EVENTS_FILE)
    with open(path, "a") as f:
        for i, loss in enumerate(losses, start):
            f.write(json.dumps({"type": "report", "index": i, "t": 1000.0 + i, "metrics": {"loss": loss, "step": i}}) + "\n")
    api.service.store.update(job_id, events_offset=os.path.getsize(path))  # as the server's tailer does


def _decide(api: Api, job_id: int, **decision) -> dict:
    r = api.post(f"{P}/jobs/{job_id}/decisions", json=decision)
    assert r.status_code == 201, r.text
    return r.json()


def _trials(api: Api, experiment: int = 1) -> dict[str, dict]:
    r = api.get(f"{P}/experiments/{experiment}/trials")
    assert r.status_code == 200, r.text
    return {t["trial_id"]: t for t in r.json()["trials"]}


def test_trial_jobs_make_one_experiment_with_each_trials_numbers(api):
    a = _trial(api, "a", {"x": 0.1, "lr": 0.01, "seed": 1}, [1.0, 0.8, 0.6])
    b = _trial(api, "b", {"x": 0.9, "lr": 0.001, "seed": 1}, [1.2, 0.3, 0.5])
    api.submit(name="not-a-trial", hold=True)
    (listed,) = api.get(f"{P}/experiments").json()["experiments"]
    assert (listed["name"], listed["source"], listed["metric"], listed["mode"]) == ("asha", "server", "loss", "min")
    assert listed["trials"] == 2 and listed["counts"] == {"RUNNING": 2} and listed["live"]
    assert listed["best"]["trial_id"] == "b" and listed["best"]["value"] == 0.5 and listed["best"]["job"] == b
    body = api.get(f"{P}/experiments/1/trials").json()
    assert body["params"] == ["x", "lr", "seed"]  # the search space's first
    t = {x["trial_id"]: x for x in body["trials"]}
    assert (t["a"]["iterations"], t["a"]["last"], t["a"]["best"], t["a"]["best_at"]) == (3, 0.6, 0.6, 3)
    assert (t["b"]["last"], t["b"]["best"], t["b"]["best_at"], t["b"]["job"]) == (0.5, 0.3, 2, b)
    assert t["a"]["name"] == "objective_a" and t["a"]["config"] == {"x": 0.1, "lr": 0.01, "seed": 1}
    _report(api, a, [0.1], start=3)  # a report more: the next read counts it in
    assert _trials(api)["a"]["iterations"] == 4 and _trials(api)["a"]["last"] == 0.1
    for job in (a, b):
        api.post(f"{P}/jobs/{job}/stop")
    ended = api.get(f"{P}/experiments/1").json()
    assert ended["counts"] == {"ERROR": 2} and not ended["live"] and ended["ended_at"] is not None
    assert _trials(api)["a"]["reason"]["kind"] == "stopped"  # stopped on the server, not by the tuner: failed for Tune
    history = api.get(f"{P}/experiments/1/history").json()["points"]
    assert [p["n"] for p in history] == [1, 2] and history[-1]["best"] == 0.1


def test_a_stop_decision_ends_the_trial_and_its_job_chart_where_it_was_taken(api):
    """The job ran on after the tuner's decision at iteration 2 (5 reports): the trial's numbers, its
    curve and the job's own chart end at iteration 2, and its job's events say why."""
    job = _trial(api, "p", {"x": 0.5, "lr": 0.01}, [1.0, 0.9, 0.1, 0.05, 0.01])
    assert _trials(api)["p"]["iterations"] == 5  # counted before the decision came
    out = _decide(api, job, kind="pruned", iteration=2, rule="ASHAScheduler", rung=1, rung_at=2.0, value=0.9)
    assert out["detail"]["text"] == "ASHAScheduler stopped it at rung 1 (training_iteration 2)"
    trial = _trials(api)["p"]
    assert (trial["iterations"], trial["last"], trial["best"], trial["state"]) == (2, 0.9, 0.9, "RUNNING")
    api.post(f"{P}/jobs/{job}/stop")
    trial = _trials(api)["p"]
    assert trial["state"] == "TERMINATED" and trial["reason"]["kind"] == "pruned"  # as Ray Tune shows it
    assert trial["reason"]["rung"] == 1 and trial["reason"]["iteration"] == 2
    summary = api.get(f"{P}/experiments/1").json()
    assert summary["counts"] == {"TERMINATED": 1} and summary["pruned"] == 1
    curve = api.get(f"{P}/experiments/1/curves").json()
    assert curve["metric"] == "loss" and sorted(curve["metrics"]) == ["loss", "step"]
    assert curve["trials"]["p"]["i"] == [1, 2] and curve["trials"]["p"]["v"] == [1.0, 0.9] and curve["trials"]["p"]["cut"] == 2
    assert curve["trials"]["p"]["state"] == "TERMINATED" and curve["trials"]["p"]["pruned"]
    series = api.get(f"{P}/jobs/{job}/series").json()  # the compare page and the job page tell the same story
    assert series["series"]["loss"]["i"] == [0, 1]
    events = [e for e in api.get(f"{P}/jobs/{job}/events").json() if e["type"] == "tune_decision"]
    assert events[0]["payload"]["kind"] == "pruned" and events[0]["payload"]["trial_id"] == "p"
    (decision,) = api.get(f"{P}/experiments/1/decisions").json()
    assert (decision["trial_id"], decision["kind"], decision["iteration"], decision["job_id"]) == ("p", "pruned", 2, job)


def test_an_exploited_trial_goes_on_in_a_new_job_and_its_curve_joins_both(api):
    """PBT: the tuner exploits at iteration 2 (its first job ran on to 3 reports), and the trial goes on
    in a new job with a new config; its iterations count on from 2."""
    first = _trial(api, "pbt", {"lr": 0.1}, [1.0, 0.8, 0.7])
    _decide(api, first, kind="exploit", iteration=2, source_trial="other", rule="PopulationBasedTraining")
    api.post(f"{P}/jobs/{first}/stop")
    waiting = _trials(api)["pbt"]
    assert waiting["state"] == "PENDING" and "exploited trial other" in waiting["reason"]["text"]
    second = _trial(api, "pbt", {"lr": 0.05}, [0.6, 0.5])
    t = _trials(api)["pbt"]
    assert (t["jobs"], t["job"], t["config"], t["iterations"], t["last"], t["best"]) == ([first, second], second,
                                                                                       {"lr": 0.05}, 4, 0.5, 0.5)  # fmt: skip
    assert t["state"] == "RUNNING" and t["reason"] is None
    curve = api.get(f"{P}/experiments/1/curves").json()["trials"]["pbt"]
    assert curve["i"] == [1, 2, 3, 4] and curve["v"] == [1.0, 0.8, 0.6, 0.5]
    assert api.get(f"{P}/jobs/{first}/series").json()["series"]["loss"]["i"] == [0, 1]  # the earlier job, cut too


def test_a_trial_the_tuners_ctrl_c_left_is_pending_as_in_its_snapshot_and_the_experiment_is_not_live(api):
    """Ctrl-C: the tuner saves the trial PENDING (Tuner.restore continues it); the server says the same,
    and, as nothing here will run it, the experiment has ended."""
    job = _trial(api, "cut", {"x": 0.5}, [1.0, 0.9])
    _decide(api, job, kind="interrupted", iteration=2)
    api.post(f"{P}/jobs/{job}/stop")
    trial = _trials(api)["cut"]
    assert (trial["state"], trial["reason"]["kind"]) == ("PENDING", "interrupted")
    summary = api.get(f"{P}/experiments/1").json()
    assert summary["counts"] == {"PENDING": 1} and not summary["live"] and summary["ended_at"] is not None


@pytest.mark.parametrize(("job_state", "kind", "expected"), [
    (JobState.QUEUED, None, "PENDING"), (JobState.RUNNING, "pruned", "RUNNING"), (JobState.SUCCEEDED, None, "TERMINATED"),
    (JobState.STOPPED, "pruned", "TERMINATED"), (JobState.STOPPED, "max_t", "TERMINATED"),
    (JobState.STOPPED, "stopper", "TERMINATED"), (JobState.STOPPED, "exploit", "PENDING"), (JobState.STOPPED, None, "ERROR"),
    (JobState.FAILED, None, "ERROR"), (JobState.SUCCEEDED, "error", "ERROR"), (JobState.STOPPED, "interrupted", "PENDING"),
    (JobState.LOST, None, "PENDING"),
])  # fmt: skip
def test_a_trials_state_comes_from_its_job_and_the_tuners_decision(job_state, kind, expected):
    assert trial_state(job_state, kind) == TrialState(expected)


def test_decisions_need_a_trial_job_and_a_valid_body(api):
    plain = api.submit(name="plain", hold=True)["id"]
    r = api.post(f"{P}/jobs/{plain}/decisions", json={"kind": "pruned", "iteration": 1})
    assert r.status_code == 409 and "not a trial" in r.json()["detail"]
    assert api.post(f"{P}/jobs/999/decisions", json={"kind": "pruned"}).status_code == 404
    job = _trial(api, "t", {"x": 0.5}, [1.0])
    r = api.post(f"{P}/jobs/{job}/decisions", json={"kind": "paused", "iteration": 1})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "kind"]
    r = api.post(f"{P}/jobs/{job}/decisions", json={"kind": "pruned", "surprise": 1})
    assert r.status_code == 422
    assert api.get(f"{P}/experiments/7").status_code == 404
    assert api.get(f"{P}/experiments/7/stream").status_code == 404
    assert api.get(f"{P}/experiments/1/importance?evaluator=random_forest").status_code == 422


@pytest.mark.slow  # Optuna's and scikit-learn's imports, and 16 trials' worth of requests
def test_importance_ranks_the_parameter_the_metric_depends_on_and_is_kept_until_a_trial_ends(api):
    rng = random.Random(0)
    for i in range(16):
        x, dummy = i / 15, rng.random()
        job = _trial(api, f"t{i:02d}", {"x": x, "dummy": dummy, "const": 3}, [2.0, (x - 0.3) ** 2])
        _decide(api, job, kind="max_t", iteration=2)  # ASHA: its budget used up (a completed trial)
        api.post(f"{P}/jobs/{job}/stop")
    results = {}
    for evaluator in ("ped_anova", "fanova"):
        r = api.get(f"{P}/experiments/1/importance", params={"evaluator": evaluator})
        assert r.status_code == 200, r.text
        imp = r.json()
        assert imp["evaluator"] == evaluator and imp["trials"] == 16 and not imp["cached"]
        assert list(imp["importances"]) == ["x", "dummy"], imp  # most important first
        assert imp["importances"]["x"] > imp["importances"]["dummy"]
        assert all(type(v) is float for v in imp["importances"].values())
        assert imp["skipped"] == {"const": "the same value in every trial"}
        results[evaluator] = imp
    again = api.get(f"{P}/experiments/1/importance").json()  # ped_anova, the default
    assert again["cached"] and again["importances"] == results["ped_anova"]["importances"]
    job = _trial(api, "t16", {"x": 0.3, "dummy": 0.5, "const": 3}, [0.0])
    assert api.get(f"{P}/experiments/1/importance").json()["cached"]  # a running trial changes nothing
    _decide(api, job, kind="max_t", iteration=1)
    api.post(f"{P}/jobs/{job}/stop")
    fresh = api.get(f"{P}/experiments/1/importance").json()
    assert not fresh["cached"] and fresh["trials"] == 17


@pytest.mark.slow  # Optuna's and scikit-learn's imports
def test_importance_of_five_trials_warns_shows_how_little_it_knows_and_leaves_constants_out(api):
    """Issue 36: 5 completed trials of an objective that never reads ``lr`` (nor the constant
    ``batch_size`` and ``seed``). The answer warns that 5 trials rank by chance, names the constants
    (and ranks none of them), and its bootstrap intervals leave ``lr`` room to matter a lot."""
    xs, lrs = [0.1, 0.9, 0.5, 0.3, 0.7], [0.01, 0.002, 0.05, 0.001, 0.03]
    for i, (x, lr) in enumerate(zip(xs, lrs, strict=True)):
        job = _trial(api, f"t{i}", {"x": x, "lr": lr, "batch_size": 64, "seed": 0}, [1.0, (x - 0.3) ** 2])
        _decide(api, job, kind="max_t", iteration=2)
        api.post(f"{P}/jobs/{job}/stop")
    for evaluator in ("ped_anova", "fanova"):
        imp = api.get(f"{P}/experiments/1/importance", params={"evaluator": evaluator}).json()
        assert imp["trials"] == 5 and set(imp["importances"]) == {"x", "lr"}, imp
        assert imp["warning"].startswith("only 5 completed trial(s): with fewer than 20, importance ranks"), imp
        assert imp["constant"] == ["batch_size", "seed"]
        assert "constant: batch_size, seed (left out: a parameter that never changed explains nothing)" in imp["notes"]
        assert imp["resamples"] == 10 and set(imp["intervals"]) == {"x", "lr"}
        assert all(0.0 <= lo <= hi <= 1.0 for lo, hi in imp["intervals"].values())
        lo, hi = imp["intervals"]["lr"]  # 5 trials cannot rule out the parameter nobody reads
        assert hi >= 0.3 and hi - lo >= 0.2, imp
        assert 0.0 <= imp["stability"] <= 1.0


def test_importance_of_twenty_trials_has_no_warning_nor_resamples():
    pytest.importorskip("optuna")
    from trainforge.server.experiments.importance import SMALL_SAMPLE, compute

    rows = [{"config": {"x": i / 19, "lr": (7 * i % 20) / 20, "seed": 1}, "value": (i / 19 - 0.3) ** 2}
            for i in range(SMALL_SAMPLE)]  # fmt: skip
    imp = compute(rows, {}, "min", "ped_anova")
    assert list(imp["importances"])[0] == "x" and imp["constant"] == ["seed"]
    assert imp["warning"] is None and imp["stability"] is None and imp["intervals"] == {} and imp["resamples"] == 0
    small = compute(rows[:SMALL_SAMPLE - 1], {}, "min", "ped_anova")
    assert small["warning"] is not None and small["resamples"] == 10
    assert compute(rows[:SMALL_SAMPLE - 1], {}, "min", "ped_anova")["intervals"] == small["intervals"]  # seed 0


def test_importance_with_too_few_trials_says_so(api):
    _trial(api, "only", {"x": 0.1}, [1.0])
    imp = api.get(f"{P}/experiments/1/importance").json()
    assert imp["importances"] == {} and imp["trials"] == 0 and "at least 3" in imp["notes"][0]


def _imported(path: str = "/runs/local", **extra) -> dict:
    trials = [
        {"trial_id": "a", "name": "objective_a", "config": {"x": 0.1}, "status": "TERMINATED",
         "metrics": {"loss": 0.2, "training_iteration": 4}, "history": {"loss": [[1, None, 1.0], [2, None, 0.5], [3, None, 0.3], [4, None, 0.2]]},
         "decisions": [{"kind": "max_t", "iteration": 4, "rule": "ASHAScheduler"}], "checkpoint": "/runs/local/a/checkpoint_000003"},
        {"trial_id": "b", "name": "objective_b", "config": {"x": 1.0}, "status": "TERMINATED", "pruned": True,
         "metrics": {"loss": 1.5, "training_iteration": 1}, "history": {"loss": [[1, None, 1.5], [2, None, 1.4], [3, None, 1.3]]}},
        {"trial_id": "c", "name": "objective_c", "config": {"x": 0.5}, "status": "ERROR", "error": "Traceback...\nValueError: boom"},
        {"trial_id": "d", "name": "objective_d", "config": {"x": 0.7}, "status": "RUNNING"},
    ]  # fmt: skip
    return {"path": path, "name": "local", "metric": "loss", "mode": "min", "scheduler": "ASHAScheduler",
            "trials": trials, **extra}  # fmt: skip


def test_an_imported_experiment_is_a_snapshot_replaced_by_a_new_import(api):
    r = api.post(f"{P}/experiments/import", json=_imported())
    assert r.status_code == 201, r.text
    e = r.json()
    assert (e["source"], e["trials"], e["live"]) == ("import", 4, False)
    assert e["counts"] == {"TERMINATED": 2, "ERROR": 1, "PENDING": 1} and e["pruned"] == 1  # d: Tuner.restore's
    assert e["best"] == {"trial_id": "a", "value": 0.2, "job": None, "checkpoint": "/runs/local/a/checkpoint_000003",
                         "config": {"x": 0.1}}  # fmt: skip
    t = _trials(api, e["id"])
    assert t["b"]["state"] == "TERMINATED" and t["b"]["reason"]["kind"] == "pruned" and t["b"]["iterations"] == 1
    assert t["a"]["state"] == "TERMINATED" and t["a"]["reason"]["kind"] == "max_t"
    assert t["d"]["state"] == "PENDING" and t["d"]["reason"]["kind"] == "interrupted" and t["b"]["last"] == 1.5
    assert t["c"]["reason"]["text"] == "error: ValueError: boom"
    curves = api.get(f"{P}/experiments/{e['id']}/curves").json()["trials"]
    assert curves["b"]["i"] == [1] and curves["b"]["cut"] == 1  # its run went on; the trial ended at its rung
    assert curves["a"]["i"] == [1, 2, 3, 4]
    body = _imported()
    body["trials"] = body["trials"][:1]
    again = api.post(f"{P}/experiments/import", json=body).json()
    assert again["id"] == e["id"] and again["trials"] == 1
    assert [d["trial_id"] for d in api.get(f"{P}/experiments/{e['id']}/decisions").json()] == ["a"]


def test_an_import_naming_a_trial_twice_is_422_naming_it(api):
    """Found by the schema fuzzer: two trials with one id were a 500 (the table's unique key)."""
    body = _imported()
    body["trials"].append(dict(body["trials"][2]))
    r = api.post(f"{P}/experiments/import", json=body)
    assert r.status_code == 422 and "trial_id 'c' is given twice" in r.text
    assert api.get(f"{P}/experiments").json()["experiments"] == []  # nothing imported


def test_importing_over_an_experiment_whose_trials_ran_here_is_409(api):
    _trial(api, "a", {"x": 0.1}, [1.0])
    r = api.post(f"{P}/experiments/import", json=_imported(path=TAG["path"]))
    assert r.status_code == 409 and "/experiments/1" in r.json()["detail"]


def test_the_stream_sends_changed_trials_and_ends_once_none_runs(api):
    job = _trial(api, "live", {"x": 0.5}, [])
    rev = api.get(f"{P}/experiments/1/trials").json()["rev"]
    seen: list[tuple[str, dict]] = []

    def on_event(event: dict[str, str]) -> None:
        data = json.loads(event["data"])
        seen.append((event["event"], data))
        if event["event"] == "trial" and data["iterations"] == 0 and len(seen) == 1:
            _report(api, job, [0.7])  # a report arrives: the stream sends the trial again
        elif event["event"] == "trial" and data["iterations"] == 1 and data["state"] == "RUNNING":
            api.service.stop(job)  # and once its job ends, nothing runs: the stream ends

    reply = read_sse(api.app, f"{P}/experiments/1/stream", query={"after": rev - 1}, on_event=on_event)
    assert reply.complete and reply.status == 200
    kinds = [k for k, _ in seen]
    assert kinds[-1] == "idle" and "experiment" in kinds
    trials = [d for k, d in seen if k == "trial"]
    assert [t["iterations"] for t in trials][:2] == [0, 1] and trials[-1]["state"] == "ERROR"
    ids = [int(e["id"]) for e in reply.events]
    assert ids == sorted(ids)


def test_curves_take_a_metric_and_thin_long_trials(api):
    _trial(api, "long", {"x": 0.5}, [1 / (i + 1) for i in range(500)])
    curves = api.get(f"{P}/experiments/1/curves", params={"metric": "step", "points": 10}).json()
    c = curves["trials"]["long"]
    assert curves["metric"] == "step" and len(c["i"]) == 10 and c["i"][0] == 1 and c["i"][-1] == 500 and c["v"][-1] == 499
    assert c["t"][0] == 0.0 and c["t"][-1] == 499.0  # seconds since the trial's first report
    assert api.get(f"{P}/experiments/1/curves", params={"points": 1}).status_code == 422
    assert api.get(f"{P}/experiments/1/curves", params={"metric": "nope"}).json()["trials"]["long"]["v"] == [None] * 200


def test_the_pages_render_a_trial_table_and_say_what_is_missing(api):
    _trial(api, "a", {"x": 0.1, "lr": 0.01}, [1.0, 0.5])
    page = api.get("/experiments/1")
    assert page.status_code == 200 and 'id="trial-a"' in page.text and "/static/experiments.js" in page.text
    assert "Experiments" in api.get("/experiments").text and 'id="experiment-1"' in api.get("/experiments/rows").text
    assert "No experiment 5" in api.get("/experiments/5").text


def test_trials_a_server_before_tunes_names_stored_are_read_in_them(tmp_path):
    """A state directory of an older server keeps its trials' states in the older words: migration 7
    renames them as trial_state would derive them (a stopped trial: PENDING when the tuner was
    interrupted, else ERROR)."""
    import sqlite3

    from trainforge.server.store.database import JobStore
    from trainforge.server.store.migrations import MIGRATIONS

    path = str(tmp_path / "state.db")
    conn = sqlite3.connect(path)  # the schema an older server left: migrations 1-6
    for n in range(1, 7):
        conn.executescript(MIGRATIONS[n])
    old = {"q": ("queued", None), "r": ("running", None), "c": ("completed", "max_t"), "p": ("pruned", "pruned"),
           "e": ("errored", "error"), "i": ("stopped", "interrupted"), "s": ("stopped", "stopped")}  # fmt: skip
    for trial_id, (state, kind) in old.items():
        conn.execute("INSERT INTO trials(experiment_id, trial_id, name, config, state, reason) VALUES (1, ?, ?, '{}', ?, ?)",
                     (trial_id, trial_id, state, json.dumps({"kind": kind}) if kind else None))  # fmt: skip
    conn.execute("PRAGMA user_version=6")
    conn.commit()
    conn.close()
    JobStore(path).close()  # migrates it from 6 on
    conn = sqlite3.connect(path)
    states = dict(conn.execute("SELECT trial_id, state FROM trials").fetchall())
    conn.close()
    assert states == {"q": "PENDING", "r": "RUNNING", "c": "TERMINATED", "p": "TERMINATED", "e": "ERROR", "i": "PENDING",
                      "s": "ERROR"}  # fmt: skip
    assert {k: trial_state({"queued": None, "running": JobState.RUNNING}.get(v[0], JobState.STOPPED), v[1]).value
            for k, v in old.items() if k not in ("e",)} == {k: v for k, v in states.items() if k != "e"}  # the one rule's
def test_reading_an_experiment_writes_nothing_its_trials_are_written_as_their_jobs_change(api, monkeypatch):
    """Every GET of the Experiments API only reads; the trial took its report in when the job's events
    were read in (the tailer's write), and its end when its job ended."""
    job = _trial(api, "a", {"x": 0.1, "lr": 0.01}, [1.0, 0.8])
    store = api.service.store
    writes: list[object] = []
    commit = store._transaction

    def counted(work):
        if threading.current_thread().name != "tf-audit":  # the audit of an earlier POST, flushed behind it
            writes.append(work)
        return commit(work)

    monkeypatch.setattr(store, "_transaction", counted)
    reads = ("", "/1", "/1/trials", "/1/decisions", "/1/history", "/1/curves")
    for path in reads:
        assert api.get(f"{P}/experiments{path}").status_code == 200, path
    assert writes == [] and _trials(api)["a"]["iterations"] == 2
    _report(api, job, [0.5], start=2)
    assert len(writes) == 2  # the job's events offset, then its trial's numbers: where the report arose
    writes.clear()
    assert (_trials(api)["a"]["iterations"], _trials(api)["a"]["last"]) == (3, 0.5)
    api.post(f"{P}/jobs/{job}/stop")
    writes.clear()
    assert _trials(api)["a"]["ended_at"] is not None and writes == []
    for path in reads:
        assert api.get(f"{P}/experiments{path}").status_code == 200, path
    assert writes == []


def test_trial_jobs_a_stopped_server_had_not_taken_in_are_taken_in_when_it_starts(tmp_path):
    """A trial job committed while no experiments followed the store (a server stopped between a job's
    commit and its trial's) is taken in, with its reports, when the server starts again."""
    from trainforge.server.store.database import JobStore

    state = str(tmp_path / "state")
    first = Api(state, {"CPU": 8.0})
    _trial(first, "a", {"x": 0.1}, [1.0])
    first.close()
    store = JobStore(os.path.join(state, "state.db"))
    job, _ = store.add_job(name="asha/objective_b", kind="script",
                           spec={"kind": "script", "path": "train.py", "config": {"x": 0.7},
                                 "experiment": {**TAG, "trial_id": "b"}})  # fmt: skip
    path = os.path.join(first.service.job_dir(job.id), EVENTS_FILE)
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:  # it reported twice, and the tailer read that in
        for i, loss in enumerate([0.4, 0.3]):
            f.write(json.dumps({"type": "report", "index": i, "t": 1000.0 + i, "metrics": {"loss": loss}}) + "\n")
    store.update(job.id, events_offset=os.path.getsize(path))
    store.close()
    again = Api(state, {"CPU": 8.0})
    try:
        trials = _trials(again)
        assert sorted(trials) == ["a", "b"] and trials["b"]["config"] == {"x": 0.7}
        assert (trials["b"]["iterations"], trials["b"]["best"], trials["b"]["job"]) == (2, 0.3, job.id)
        assert trials["a"]["iterations"] == 1
    finally:
        again.close()


def test_a_pruned_trials_figures_stop_at_the_decision_in_every_view(api):
    """Issue 36: a pruned trial showed its job's last report (epoch 2) in the job's row, `trainforge
    status` and Compare, but its numbers at the decision (iteration 1) on the experiment page. One rule:
    the job's figures are its trial's at the decision, whether its later reports were read in before
    the decision came or after (the job runs on until the stop reaches it)."""
    job = api.submit(name="asha/objective_p", config={"x": 0.5}, experiment={**TAG, "trial_id": "p"})["id"]
    path = os.path.join(api.service.job_dir(job), EVENTS_FILE)

    def report(i: int, loss: float) -> None:
        with open(path, "a") as f:
            f.write(json.dumps({"type": "report", "index": i, "t": 1000.0 + i, "metrics": {"loss": loss, "step": i}}) + "\n")
        api.service.tailer.ingest(job)  # the server's tailer reads it in

    report(0, 0.72)
    report(1, 0.83)  # read in before the tuner's decision at iteration 1 arrives
    assert api.get(f"{P}/jobs/{job}").json()["last_metrics"]["loss"] == 0.83
    _decide(api, job, kind="pruned", iteration=1)
    report(2, 0.91)  # the job ran on until the stop reached it
    figures = api.get(f"{P}/jobs/{job}").json()["last_metrics"]
    listed = next(j for j in api.get(f"{P}/jobs").json()["jobs"] if j["id"] == job)["last_metrics"]
    trial = _trials(api)["p"]
    assert figures == listed == {"loss": 0.72, "step": 0}
    assert (trial["last"], trial["iterations"]) == (0.72, 1)
    assert api.get(f"{P}/jobs/{job}").json()["reports"] == 3  # the job did report three times
