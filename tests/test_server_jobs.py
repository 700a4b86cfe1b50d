"""The train server with real processes: jobs queued by resources, results equal to fit(), stop,
server kill -9 and restart, runner kill -9 (lost, requeued), bursts of submissions.

Job loops that must wait for the test (to hold resources, or to be caught mid-run) wait for a gate
file the test creates; the test itself waits on events (a report arriving, a job ending) with
timeouts, never on a sleep."""

from __future__ import annotations

import json
import os
import signal
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import trainforge
from trainforge import Checkpoint, DataParallelTrainer, RunConfig, ScalingConfig
from trainforge._testing.wait import wait_until

pytestmark = pytest.mark.slow


def _loop(config):
    for step in range(config["steps"]):
        trainforge.report({"step": step, "loss": 1.0 / (step + 1), "rank": trainforge.get_context().get_world_rank()})


def _gated_loop(config):
    """Reports ``steps`` steps; before step ``gate_at[i]`` waits for file ``gates[i]``. With
    ``checkpoint``: a checkpoint per step, and a restarted run resumes after the latest one."""
    import tempfile

    start = 0
    ckpt = trainforge.get_checkpoint()
    if ckpt is not None:
        with open(os.path.join(ckpt.path, "step")) as f:
            start = int(f.read()) + 1
    for step in range(start, config["steps"]):
        for gate_at, gate in zip(config.get("gate_at", []), config.get("gates", []), strict=True):
            if step == gate_at:
                while not os.path.exists(gate):
                    time.sleep(0.02)
        checkpoint = None
        if config.get("checkpoint") and trainforge.get_context().get_world_rank() == 0:
            d = tempfile.mkdtemp()
            with open(os.path.join(d, "step"), "w") as f:
                f.write(str(step))
            checkpoint = Checkpoint.from_directory(d)
        trainforge.report({"step": step, "world": trainforge.get_context().get_world_size()}, checkpoint=checkpoint)


def _trainer(tmp_path, name, loop=_loop, workers=2, **config):
    config.setdefault("steps", 5)
    return DataParallelTrainer(
        loop, train_loop_config=config, scaling_config=ScalingConfig(num_workers=workers),
        run_config=RunConfig(name=name, storage_path=str(tmp_path / "runs"), verbose=0),
    )  # fmt: skip


def _first_report(job, timeout=120.0):
    """The job's first report (waits for it on the job's event stream)."""
    got: list = []
    reader = threading.Thread(target=lambda: got.append(next(iter(job.reports()), None)), daemon=True)
    reader.start()
    reader.join(timeout)
    assert got and got[0] is not None, f"no report from job {job.id} within {timeout} s: {job.status()}"
    return got[0]


def _events(job):
    return job.client.request("GET", f"/jobs/{job.id}/events")


def test_submitted_job_returns_the_result_fit_returns(train_server, tmp_path):
    local = _trainer(tmp_path, "local").fit()
    job = _trainer(tmp_path, "served").submit()
    reports = list(job.reports())
    result = job.result(timeout=120)
    assert [r.metrics for r in reports] == result.metrics_dataframe.to_dict("records")
    assert result.metrics == local.metrics
    assert result.metrics_dataframe.equals(local.metrics_dataframe)
    assert result.path == str(tmp_path / "runs" / "served")
    status = job.status()
    assert status.state == "SUCCEEDED" and status.exit_code == 0
    assert status.raw["reports"] == 5 and status.raw["last_metrics"]["step"] == 4


def test_blocking_submit_streams_output_and_callback_gets_the_result(train_server, tmp_path, capsys):
    trainer = _trainer(tmp_path, "blocking")
    trainer.run_config.verbose = 1
    delivered = threading.Event()
    results = []

    def callback(result):
        results.append(result)
        delivered.set()

    job = trainer.submit(wait=True, callback=callback)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"trainforge: submitted job {job.id} to ")
    assert any("[report 4] step=4" in line for line in lines), lines
    assert lines[-1] == f"trainforge: job {job.id} (blocking): SUCCEEDED"
    assert delivered.wait(60)
    assert results[0].metrics["step"] == 4


def test_three_jobs_on_a_capacity_for_two(train_server, tmp_path):
    gates = [str(tmp_path / f"gate{i}") for i in range(3)]
    jobs = [
        _trainer(tmp_path, f"j{i}", _gated_loop, workers=1, steps=2, gate_at=[1], gates=[gates[i]]).submit()
        for i in range(3)
    ]
    first, second = _first_report(jobs[0]), _first_report(jobs[1])
    assert first.metrics["step"] == 0 and second.metrics["step"] == 0  # both run at once
    waiting = jobs[2].status()
    assert waiting.state == "QUEUED"
    assert waiting.pending == "needs 1 CPU, 0 free" and waiting.position == 1
    open(gates[0], "w").close()  # job 0 ends: its CPU goes to job 2 at once
    assert jobs[0].wait(60).state == "SUCCEEDED"
    _first_report(jobs[2])
    ended = [e for e in _events(jobs[0]) if e["type"] == "ended"][0]
    starting = [e for e in _events(jobs[2]) if e["type"] == "starting"][0]
    assert starting["seq"] > ended["seq"]
    res = jobs[2].client.resources()
    assert res["free"]["CPU"] == 0 and set(res["jobs"]) == {str(jobs[1].id), str(jobs[2].id)}
    open(gates[1], "w").close()
    open(gates[2], "w").close()
    assert [j.wait(60).state for j in jobs] == ["SUCCEEDED"] * 3
    assert jobs[0].client.resources()["free"]["CPU"] == 2


def test_stop_ends_every_process_and_releases_the_grant(train_server, tmp_path):
    gate = str(tmp_path / "never")
    job = _trainer(tmp_path, "stopped", _gated_loop, steps=3, gate_at=[1], gates=[gate]).submit()
    _first_report(job)
    procs = train_server.job_processes(job.id)
    assert len(procs) >= 3, procs  # the runner and its two workers, found by the job's id
    queued = _trainer(tmp_path, "queued", workers=1).submit()
    assert queued.status().state == "QUEUED"
    assert queued.stop().state == "STOPPED"  # a queued job is cancelled at once
    status = job.stop(grace_s=5)
    assert status.state == "STOPPED" and status.failure_class == "stopped"
    assert train_server.job_processes(job.id) == []
    assert job.client.resources()["free"] == {"CPU": 2.0}
    from trainforge.server import JobConflictError

    with pytest.raises(JobConflictError, match="already ended"):
        job.stop()
    assert "stopped" in "".join(job.logs())


def test_server_kill9_reattaches_running_jobs_and_loses_nothing(train_server, tmp_path):
    gates = [str(tmp_path / "gate_a"), str(tmp_path / "gate_b")]
    job = _trainer(tmp_path, "survivor", _gated_loop, steps=20, gate_at=[5, 15], gates=gates).submit()
    _first_report(job)
    runner_pid = job.status().raw["pid"]
    events_file = os.path.join(train_server.state_dir, "jobs", str(job.id), "events.jsonl")
    train_server.kill9()
    # While the server is down the job goes on (its runner is in its own session) ...
    assert train_server.job_processes(job.id)
    open(gates[0], "w").close()
    wait_until(lambda: _count_reports(events_file) >= 15, 60, "the job to reach step 15 while the server is down")
    # ... and the restarted server reattaches it before serving, and replays what it did meanwhile.
    train_server.start()
    assert "1 running job(s) reattached" in train_server.output
    client = train_server.client()
    job = client.job(job.id)
    status = job.status()
    assert status.state == "RUNNING" and status.raw["pid"] == runner_pid
    wait_until(lambda: job.status().raw["reports"] >= 15, 60, "the replayed reports")
    open(gates[1], "w").close()
    result = job.result(timeout=120)
    assert list(result.metrics_dataframe["step"]) == list(range(20))
    assert [r.metrics["step"] for r in job.reports()] == list(range(20))
    types = [e["type"] for e in _events(job)]
    assert types.count("reattached") == 1 and types.count("run_start") == 1 and types.count("run_end") == 1
    assert job.status().raw["reports"] == 20


def _count_reports(path):
    try:
        with open(path) as f:
            return sum(1 for line in f if '"type": "report"' in line)
    except FileNotFoundError:
        return 0


def test_killed_runner_is_lost_then_requeued_and_resumes_from_its_checkpoint(train_server, tmp_path):
    gate = str(tmp_path / "gate")
    job = _trainer(tmp_path, "lost", _gated_loop, steps=6, gate_at=[3], gates=[gate], checkpoint=True).submit()
    wait_until(lambda: job.status().raw["reports"] >= 3, 60, "three reports")
    pid = job.status().raw["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: job.status().raw["attempt"] == 2 and job.status().raw["pid"] not in (None, pid), 60,
               "the requeued job's second runner")  # fmt: skip
    types = [e["type"] for e in _events(job)]
    assert "lost" in types and "requeued" in types
    lost = [e for e in _events(job) if e["type"] == "lost"][0]
    assert "killed by SIGKILL" in lost["payload"]["error"]
    open(gate, "w").close()
    result = job.result(timeout=120)
    assert job.status().state == "SUCCEEDED"
    # The second attempt continued the run from its latest checkpoint (step 2): steps 3.. once more.
    assert list(result.metrics_dataframe["step"]) == list(range(6))
    assert not train_server.job_processes(job.id)


def test_a_job_whose_cwd_does_not_exist_fails_as_a_user_error_naming_it_and_is_not_retried(train_server, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('never runs')\n")
    missing = str(tmp_path / "gone" / "workdir")
    job = train_server.client().submit({"kind": "script", "path": str(script), "cwd": missing, "max_retries": 3,
                                        "per_worker": {"CPU": 1}})  # fmt: skip
    status = job.wait(timeout=120)
    assert (status.state, status.failure_class) == ("FAILED", "user_error"), status.raw
    assert missing in status.error and "No such file or directory" in status.error and "cwd" in status.error
    assert status.raw["attempt"] == 1 and "lost" not in [e["type"] for e in _events(job)]  # an outcome: no retry
    assert "never runs" not in "".join(job.logs())


@pytest.mark.parametrize(
    ("files", "failure_class", "words"),
    [
        ({}, "infra", "spec.json"),
        ({"spec.json": "{not json", "grant.json": "{}"}, "infra", "submit the job again"),
        ({"spec.json": json.dumps({"kind": "script", "path": "a.py"})}, "infra", "grant.json"),
        ({"spec.json": json.dumps({"kind": "script", "path": "a.py", "cwd": "/nonexistent/dir"}), "grant.json": "{}"},
         "user_error", "'/nonexistent/dir': No such file or directory"),
        ({"spec.json": json.dumps({"kind": "script", "path": "a.py", "cwd": "CWD_IS_A_FILE"}), "grant.json": "{}"},
         "user_error", "Not a directory"),
    ],
    ids=["no-spec", "bad-spec", "no-grant", "no-cwd", "cwd-a-file"],
)
def test_a_runner_that_cannot_start_the_job_still_writes_its_outcome(tmp_path, files, failure_class, words):
    """Whatever fails before the job's code runs ends in exit.json (else the server calls the job lost
    and runs it again, to fail the same way)."""
    from trainforge.server.jobs.runner import main

    for name, text in files.items():
        (tmp_path / name).write_text(text.replace("CWD_IS_A_FILE", str(tmp_path / "spec.json")))
    assert main(str(tmp_path)) == 1
    outcome = json.loads((tmp_path / "exit.json").read_text())
    assert (outcome["status"], outcome["failure_class"]) == ("failed", failure_class)
    assert words in outcome["error"], outcome["error"]


def test_the_state_is_the_owners_alone_whatever_the_umask(tmp_path, monkeypatch):
    """With umask 0 and a state directory that exists as 0755 (made 0700 at the start), every file
    the server and its jobs write there is 0600 and every directory 0700: none is readable or
    writable by others."""
    from trainforge._testing.server import TrainServer

    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, 0o755)
    umask = os.umask(0)  # inherited by the server, its zygote, runners and workers
    try:
        server = TrainServer(str(state)).start()
    finally:
        os.umask(umask)
    try:
        monkeypatch.setenv("TRAINFORGE_SERVER_DIR", server.state_dir)
        job = _trainer(tmp_path, "private").submit()
        job.result(timeout=120)
        job_dir = state / "jobs" / str(job.id)
        assert {"spec.json", "grant.json", "trainer.pkl", "events.jsonl", "output.log", "exit.json",
                "result.pkl"} <= set(os.listdir(job_dir))  # fmt: skip
        shared = []
        for root, dirs, files in os.walk(state):
            for name in dirs + files:
                mode = os.lstat(os.path.join(root, name)).st_mode
                if not stat.S_ISLNK(mode) and stat.S_IMODE(mode) & 0o077:
                    shared.append((os.path.relpath(os.path.join(root, name), state), oct(stat.S_IMODE(mode))))
        assert shared == [], f"readable or writable by others: {shared}"
        assert stat.S_IMODE(os.stat(state).st_mode) == 0o700  # claimed at the start (it said so)
        assert f"the state directory {state} was mode 0755: made it 0700" in server.output
    finally:
        left = server.cleanup()
    assert not left, f"job processes left behind: {left}"


def test_a_requeued_job_without_a_checkpoint_charts_its_repeated_steps_apart(train_server, tmp_path):
    """Its runner killed before any checkpoint, the job's next attempt reports steps 0.. again: the
    series keeps the two attempts in segments of their own, each bucket in one of them."""
    gate = str(tmp_path / "gate")
    job = _trainer(tmp_path, "again", _gated_loop, workers=1, steps=5, gate_at=[3], gates=[gate]).submit()
    wait_until(lambda: job.status().raw["reports"] >= 3, 60, "three reports")
    pid = job.status().raw["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: job.status().raw["attempt"] == 2 and job.status().raw["pid"] not in (None, pid), 60,
               "the requeued job's second runner")  # fmt: skip
    open(gate, "w").close()
    assert job.wait(timeout=120).state == "SUCCEEDED"
    series = job.client.request("GET", f"/jobs/{job.id}/series", params={"points": 2})
    assert [(g["run"], g["start"], g["end"], g["attempt"]) for g in series["segments"]] == [
        ("again", 0, 2, 0), ("again", 3, 7, 0)]  # fmt: skip
    assert [g["job_attempt"] for g in series["segments"]] == [1, 2]
    step = series["series"]["step"]
    assert step["segment"] == [0, 1, 1] and step["i"] == [2, 5, 7] and step["min"] == [0, 0, 3]
    rows = job.client.request("GET", f"/jobs/{job.id}/metrics")["reports"]
    assert [r["index"] for r in rows] == [0, 1, 2, 0, 1, 2, 3, 4]
    assert not train_server.job_processes(job.id)


def test_a_burst_of_submissions_and_stops_never_hits_a_locked_database(train_server, tmp_path):
    script = tmp_path / "noop.py"
    script.write_text("print('never runs: held')\n")
    client = train_server.client()
    spec = {"kind": "script", "path": str(script), "hold": True, "per_worker": {"CPU": 1}}

    def submit_and_stop(i):
        job = client.submit({**spec, "name": f"burst{i}"})
        return job.stop().state

    with ThreadPoolExecutor(8) as pool:
        states = list(pool.map(submit_and_stop, range(1000)))
    assert states == ["STOPPED"] * 1000
    assert "database is locked" not in train_server.output
    assert len(client.jobs(["STOPPED"], limit=1000)) == 1000
    events = client.request("GET", "/jobs/1000/events")
    assert [e["type"] for e in events] == ["submitted", "stopped"]


def test_a_request_larger_than_the_capacity_is_refused_with_the_numbers(train_server, tmp_path):
    from trainforge.server import InvalidJobError

    with pytest.raises(InvalidJobError, match=r"3 CPU \(capacity 2\)"):
        _trainer(tmp_path, "too_big", workers=3).submit()


def test_an_unpicklable_trainer_is_refused_before_anything_is_sent(train_server, tmp_path):
    lock = threading.Lock()

    def loop(config):
        with lock:
            trainforge.report({"x": 1})

    trainer = DataParallelTrainer(loop, scaling_config=ScalingConfig(num_workers=1))
    with pytest.raises(TypeError, match="does not pickle"):
        trainer.submit()
    assert train_server.client().jobs() == []


def test_events_stream_resumes_with_last_event_id(train_server, tmp_path):
    client = train_server.client()
    job = _trainer(tmp_path, "events", workers=1).submit()
    job.wait(60)
    seen, payloads = [], []
    for event, ident, data in client.stream("/events", params={"after": 0}):
        seen.append((event, int(ident)))
        payloads.append(data)
        if event == "ended":
            break
    seqs = [s for _, s in seen]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    # Reconnecting with the id of the second event gives everything after it, nothing twice.
    again = []
    for event, ident, _ in client.stream("/events", last_id=str(seqs[1])):
        again.append(int(ident))
        if event == "ended":
            break
    assert again == seqs[2:]
    assert all(p["job_id"] == job.id for p in payloads) and json.dumps(payloads)


def test_an_elastic_job_starts_at_what_fits_and_grows_when_capacity_frees(train_server, tmp_path):
    blocker_gate, elastic_gate, resized_gate = (str(tmp_path / n) for n in ("blocker", "elastic", "resized"))
    blocker = _trainer(tmp_path, "blocker", _gated_loop, workers=1, steps=2, gate_at=[1], gates=[blocker_gate]).submit()
    _first_report(blocker)
    elastic = DataParallelTrainer(
        _gated_loop,
        train_loop_config={"steps": 5, "gate_at": [2, 3], "gates": [elastic_gate, resized_gate], "checkpoint": True},
        scaling_config=ScalingConfig(num_workers=(1, 2)),
        run_config=RunConfig(name="elastic", storage_path=str(tmp_path / "runs"), verbose=0),
    ).submit()  # fmt: skip
    assert _first_report(elastic).metrics["world"] == 1  # one CPU was free
    assert elastic.status().raw["grant"] == {"CPU": 1.0}
    open(blocker_gate, "w").close()
    assert blocker.wait(60).state == "SUCCEEDED"
    wait_until(lambda: elastic.status().raw["workers"] == 2, 60, "the elastic job's grant to grow")
    assert elastic.status().raw["grant"] == {"CPU": 2.0}
    open(elastic_gate, "w").close()  # step 2's checkpoint: the core sees the bigger grant and resizes
    wait_until(lambda: "restart" in [e["type"] for e in _events(elastic)], 60, "the resize")
    open(resized_gate, "w").close()
    result = elastic.result(timeout=120)
    worlds = list(result.metrics_dataframe["world"])
    assert worlds == [1, 1, 1, 2, 2], worlds
    assert "grow" in [e["type"] for e in _events(elastic)]


def test_an_elastic_job_lends_its_extra_workers_to_a_waiting_job_at_a_checkpoint(tmp_path, monkeypatch):
    from trainforge._testing.server import TrainServer

    server = TrainServer(str(tmp_path / "server"), capacity="CPU=3").start()
    try:
        monkeypatch.setenv("TRAINFORGE_SERVER_DIR", server.state_dir)
        asked, fixed_done = str(tmp_path / "asked"), str(tmp_path / "fixed_done")
        elastic = DataParallelTrainer(
            _gated_loop,
            train_loop_config={"steps": 6, "gate_at": [2, 4], "gates": [asked, fixed_done], "checkpoint": True},
            scaling_config=ScalingConfig(num_workers=(1, 3)),
            run_config=RunConfig(name="lender", storage_path=str(tmp_path / "runs"), verbose=0),
        ).submit()  # fmt: skip
        assert _first_report(elastic).metrics["world"] == 3  # all the capacity
        fixed = _trainer(tmp_path, "fixed", workers=2).submit()
        assert fixed.status().state == "QUEUED"
        wait_until(lambda: "shrink" in [e["type"] for e in _events(elastic)], 30, "the shrink request")
        open(asked, "w").close()  # a checkpoint after the request: the elastic job shrinks there
        assert fixed.wait(60).state == "SUCCEEDED"
        open(fixed_done, "w").close()
        result = elastic.result(timeout=60)
        assert list(result.metrics_dataframe["step"]) == list(range(6))  # nothing lost, nothing twice
        worlds = list(result.metrics_dataframe["world"])
        assert worlds[0] == 3 and 1 in worlds, worlds
        events = _events(elastic)
        shrink = [e for e in events if e["type"] == "shrink"]
        shrunk = [e for e in events if e["type"] == "shrunk"]
        assert [e["payload"] for e in shrink] == [{"workers": 1, "for_job": fixed.id}]
        assert shrunk and shrunk[0]["payload"]["workers"] == 1 and shrink[0]["seq"] < shrunk[0]["seq"]
        starting = [e for e in _events(fixed) if e["type"] == "starting"][0]
        assert starting["seq"] > shrunk[0]["seq"]  # the fixed job started once the elastic one had shrunk
    finally:
        left = server.cleanup()
    assert not left, f"job processes left behind: {left}"
    assert "Traceback" not in server.output, server.output


async def _async_loop(config):
    import asyncio

    for step in range(config["steps"]):
        await asyncio.sleep(0)
        trainforge.report({"step": step})


def _torch_loop(config):
    import torch

    from trainforge.torch import prepare_model

    torch.manual_seed(0)
    model = prepare_model(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.ones(8, 4), torch.zeros(8, 1)
    for step in range(config["steps"]):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        trainforge.report({"step": step, "loss": float(loss)})


@pytest.mark.parametrize("kind", ["async", "torch"])
def test_async_loops_and_torch_trainers_submit_like_any_trainer(train_server, tmp_path, kind):
    if kind == "torch":
        from trainforge.torch import TorchTrainer

        def make(name):
            return TorchTrainer(
                _torch_loop, train_loop_config={"steps": 3}, scaling_config=ScalingConfig(num_workers=2),
                run_config=RunConfig(name=name, storage_path=str(tmp_path / "runs"), verbose=0),
            )  # fmt: skip
    else:

        def make(name):
            return _trainer(tmp_path, name, _async_loop, steps=3)

    local = make("local").fit()
    served = make("served").submit().result(timeout=180)
    assert served.metrics_dataframe.equals(local.metrics_dataframe)


def test_ctrl_c_on_a_blocking_submit_only_detaches(train_server, tmp_path):
    import subprocess
    import sys

    gate = tmp_path / "gate"
    code = f"""
import faulthandler, signal, sys
# A shell's background job starts with SIGINT ignored (as CI may run us): take Ctrl-C as a terminal would.
signal.signal(signal.SIGINT, signal.default_int_handler)
faulthandler.register(signal.SIGUSR1)  # the test asks for the stacks if this hangs
sys.path.insert(0, {os.path.dirname(__file__)!r})
from test_server_jobs import _trainer, _gated_loop
import pathlib
job = _trainer(pathlib.Path({str(tmp_path)!r}), "detach", _gated_loop, workers=1, steps=2, gate_at=[1],
               gates=[{str(gate)!r}])
job.run_config.verbose = 1
job.submit(wait=True)
print("RETURNED", flush=True)
"""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:  # wait until the job is streaming its output
        lines.append(line)
        if "[report 0]" in line:
            break
    proc.send_signal(signal.SIGINT)
    try:
        rest, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)
        try:
            proc.wait(timeout=5)  # faulthandler writes the stacks and the process goes on
        except subprocess.TimeoutExpired:
            proc.kill()
        stacks, _ = proc.communicate(timeout=30)
        gate.touch()
        pytest.fail("the detached submit did not exit after Ctrl-C; its output and stacks:\n" + "".join(lines) + stacks)
    job_id = int(lines[0].split("submitted job ")[1].split()[0])
    assert f"detached from job {job_id}; it keeps running" in rest
    assert f"trainforge logs {job_id} -f" in rest and "RETURNED" in rest and proc.returncode == 0
    job = train_server.client().job(job_id)
    assert job.status().state == "RUNNING"
    gate.touch()
    assert job.wait(60).state == "SUCCEEDED"


def test_submit_starts_a_server_in_the_background_when_none_runs(tmp_path, monkeypatch, capsys):
    import psutil

    from trainforge.server._main import read_server_info

    state_dir = tmp_path / "auto"
    monkeypatch.setenv("TRAINFORGE_SERVER_DIR", str(state_dir))
    monkeypatch.delenv("TRAINFORGE_ADDRESS", raising=False)
    job = _trainer(tmp_path, "auto", workers=1).submit()
    info = read_server_info(str(state_dir))
    server = psutil.Process(info["pid"])
    try:
        out = capsys.readouterr().out
        assert f"no train server was running; started one at {info['url']}" in out
        assert job.result(timeout=120).metrics["step"] == 4
        assert oct(os.stat(state_dir / "token").st_mode & 0o777) == "0o600"
    finally:
        server.terminate()
        server.wait(30)
    assert not (state_dir / "address").exists()  # a clean stop removes it


def test_submit_starts_its_server_on_the_default_port_when_that_is_free(tmp_path, monkeypatch):
    """The server submit() starts is found where `trainforge server start` would put it (the default
    port) unless another program holds that port; then on any free one. (Which command starts it is
    checked here, not a real start on 8270: other tests may hold that port.)"""
    import socket

    from trainforge.server import _submission
    from trainforge.server._config import DEFAULT_PORT, ServerConfig
    from trainforge.server.cli.commands import add_commands

    monkeypatch.setenv("TRAINFORGE_SERVER_DIR", str(tmp_path / "nowhere"))  # no server there
    monkeypatch.delenv("TRAINFORGE_ADDRESS", raising=False)
    started: list[list[str]] = []

    class Stop(Exception):
        pass

    def start(state_dir=None, *, extra_args=None, timeout_s=60.0, announce=print):
        started.append(list(extra_args or []))
        raise Stop  # no real server: what it was asked for is the test

    monkeypatch.setattr(_submission, "start_background_server", start)
    trainer = _trainer(tmp_path, "default-port", workers=1)
    with socket.socket() as probe:  # a port that is free now, standing in for the default one
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    monkeypatch.setattr(_submission, "DEFAULT_PORT", free)
    with pytest.raises(Stop):
        trainer.submit()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", free))
        busy.listen()
        with pytest.raises(Stop):
            trainer.submit()
    assert started == [[], ["--port", "0"]]  # no --port: the server's own default, which is DEFAULT_PORT ...
    import argparse

    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers())
    assert parser.parse_args(["server", "start"]).port == DEFAULT_PORT == ServerConfig().port  # ... here too


def _process_loop(config):
    """Reports which process it is and its parent (and torch's thread count for a TorchTrainer),
    then waits for the gate file, if any."""
    import sys

    info = {"pid": os.getpid(), "ppid": os.getppid(), "rank": trainforge.get_context().get_world_rank()}
    if "torch" in sys.modules:
        info["threads"] = sys.modules["torch"].get_num_threads()
    trainforge.report(info)
    while config.get("gate") and not os.path.exists(config["gate"]):
        time.sleep(0.02)


def _warm_pool(client, timeout=60.0):
    wait_until(lambda: client.health()["warm_pool"]["ready"], timeout, "the warm pool")
    return client.health()["warm_pool"]


def test_a_warm_server_forks_jobs_from_its_zygote_and_stop_still_finds_every_process(train_server, tmp_path):
    from trainforge.server import Client

    pool = _warm_pool(Client())
    gate = str(tmp_path / "gate")
    job = _trainer(tmp_path, "forked", _process_loop, gate=gate).submit()
    report = _first_report(job)
    procs = {p.pid: p for p in train_server.job_processes(job.id)}  # found by the marks in /proc/PID/environ
    runner = [p for p in procs.values() if "trainforge.server.jobs.runner" in " ".join(p.cmdline())]
    assert len(runner) == 1 and runner[0].ppid() == pool["pid"]
    workers = [m["pid"] for m in report.all_metrics]
    assert set(workers) <= set(procs) and {m["ppid"] for m in report.all_metrics} == {pool["pid"]}
    status = job.stop(grace_s=5)
    assert status.state == "STOPPED"
    assert train_server.job_processes(job.id) == []
    with open(os.path.join(train_server.state_dir, "zygote.log")) as f:
        assert "ready" in f.read()
    open(gate, "w").close()


def test_torch_jobs_teach_the_warm_pool_torch_and_keep_their_thread_count(train_server, tmp_path):
    from trainforge.server import Client
    from trainforge.torch import TorchTrainer

    pool = _warm_pool(Client())

    def make(name):
        return TorchTrainer(
            _process_loop, scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name=name, storage_path=str(tmp_path / "runs"), verbose=0),
        )  # fmt: skip

    first = make("teaches").submit().result(timeout=180)
    assert first.error is None
    learned = os.path.join(train_server.state_dir, "warm_modules")
    wait_until(lambda: os.path.exists(learned) and "torch" in open(learned).read().split(), 60, "torch learned")
    job = make("warm").submit()
    report = _first_report(job)
    assert job.result(timeout=180).error is None
    # Forked from a zygote that imported torch with no $OMP_NUM_THREADS: each worker still runs the
    # 1 thread its 1 CPU allows, as a fresh worker would.
    assert [m["threads"] for m in report.all_metrics] == [1, 1]
    assert {m["ppid"] for m in report.all_metrics} == {pool["pid"]}


def test_a_server_started_no_warm_starts_fresh_processes(tmp_path, monkeypatch):
    from trainforge._testing.server import TrainServer

    server = TrainServer(str(tmp_path / "cold"), extra=("--no-warm",)).start()
    try:
        client = server.client()
        assert client.health()["warm_pool"] == {"enabled": False, "ready": False, "pid": None}
        monkeypatch.setenv("TRAINFORGE_SERVER_DIR", server.state_dir)
        job = _trainer(tmp_path, "cold", _process_loop).submit()
        report = _first_report(job)
        assert job.result(timeout=120).error is None
        runner_pids = {m["ppid"] for m in report.all_metrics}  # fresh workers are the runner's children
        assert len(runner_pids) == 1 and runner_pids != {server.proc.pid}
        assert server.zygotes() == []
    finally:
        left = server.cleanup()
    assert not left


def test_a_failed_trainer_jobs_reason_is_one_line_naming_the_users_file(train_server, tmp_path):
    # A trainer job whose loop (a function defined here, sent by value) raises: the API's reason is
    # one line naming this file and line; the error and the job's log keep the whole traceback.
    def loop(config):
        raise ValueError(f"bad lr {config['lr']}")

    line = loop.__code__.co_firstlineno + 1
    job = _trainer(tmp_path, "raises", loop, workers=1, lr=-1).submit()
    status = job.wait(timeout=120)
    reason = f"ValueError: bad lr -1 ({os.path.basename(__file__)}:{line}, in loop)"
    assert (status.state, status.reason, status.raw["reason"]) == ("FAILED", reason, reason), status.raw
    assert status.error.splitlines()[0] == reason and "<dynamic-code>" not in status.error
    assert f'File "{__file__}", line {line}, in loop' in status.error
    logs = "".join(job.logs())
    assert f'File "{__file__}", line {line}, in loop' in logs and "<dynamic-code>" not in logs
