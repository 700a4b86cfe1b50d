"""The ``trainforge`` CLI's server commands, run as a user runs them (``python -m trainforge ...`` in
a subprocess) against a real train server (the ``train_server`` fixture: capacity 2 CPUs; the CLI
finds it through ``$TRAINFORGE_SERVER_DIR``).

Jobs are the small scripts ``tests/scripts/server_cli_*.py``. A job that must stay running waits
for a file the test creates (``server_cli_wait.py``); the tests wait on subprocesses and on the
output they print, never by sleeping.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from trainforge.server import Client

SCRIPTS = Path(__file__).parent / "scripts"
FIT = str(SCRIPTS / "server_cli_fit.py")
END = str(SCRIPTS / "server_cli_end.py")
WAIT = str(SCRIPTS / "server_cli_wait.py")
RAISES = str(SCRIPTS / "server_cli_raises.py")
TIMEOUT = 120


def _env(state_dir: str | os.PathLike | None) -> dict[str, str]:
    """This process's environment, finding the server only through ``state_dir`` (None: no
    ``$TRAINFORGE_SERVER_DIR``, for commands given ``--state-dir``)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRAINFORGE_ADDRESS", "TRAINFORGE_TOKEN", "TRAINFORGE_SERVER_DIR")}
    if state_dir is not None:
        env["TRAINFORGE_SERVER_DIR"] = str(state_dir)
    return env


def tf(state_dir, *args, cwd=None, timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
    """Run ``trainforge ARGS`` to its end."""
    return subprocess.run(
        [sys.executable, "-m", "trainforge", *map(str, args)], env=_env(state_dir), cwd=cwd,
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def ok(state_dir, *args, **kwargs) -> str:
    """Run ``trainforge ARGS``, which must succeed; its stdout."""
    r = tf(state_dir, *args, **kwargs)
    assert r.returncode == 0, f"trainforge {' '.join(map(str, args))}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout


def one_line_error(r: subprocess.CompletedProcess[str], code: int = 1) -> str:
    """The command failed with ``code`` and said why on stderr in one line, without a traceback."""
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


def job_id_of(submit_output: str) -> int:
    m = re.search(r"submitted job (\d+)", submit_output)
    assert m, submit_output
    return int(m.group(1))


def _default_sigint() -> None:
    # A shell starts background jobs with SIGINT ignored, and Python then raises no KeyboardInterrupt:
    # give the command the Ctrl-C of a terminal whatever this test process was started with.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Streamed:
    """A CLI command left running, its output (stdout and stderr together) read as it comes."""

    def __init__(self, state_dir, *args: object, cwd=None):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trainforge", *map(str, args)], env=_env(state_dir), cwd=cwd,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=_default_sigint,
        )  # fmt: skip
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._eof = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self._eof = True
            self._changed.notify_all()

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, text: str, timeout: float = TIMEOUT) -> None:
        """Block until a line of the output has ``text`` (fails if the command ends first)."""
        with self._changed:
            self._changed.wait_for(lambda: self._eof or any(text in line for line in self.lines), timeout)
        assert any(text in line for line in self.lines), f"no {text!r} in the output of {self.proc.args}:\n{self.output}"

    def finish(self, timeout: float = TIMEOUT) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(timeout)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


@pytest.fixture
def streamed():
    """Starts :class:`Streamed` commands; kills any still running when the test ends."""
    started: list[Streamed] = []

    def start(state_dir, *args: object, cwd=None) -> Streamed:
        s = Streamed(state_dir, *args, cwd=cwd)
        started.append(s)
        return s

    yield start
    for s in started:
        s.kill()


def queue_rows(text: str) -> list[tuple[str, int, int, str, str]]:
    """``trainforge queue``'s table as (position, job id, priority, name, reason) rows."""
    rows = []
    for line in text.splitlines()[1:]:
        m = re.match(r"^\s*(\S+)\s+(\d+)\s+(-?\d+)\s+(\S+)\s+(.*?)\s*$", line)
        assert m, line
        rows.append((m.group(1), int(m.group(2)), int(m.group(3)), m.group(4), m.group(5)))
    return rows


# -- submit, blocking ---------------------------------------------------------------------------------
def test_submit_streams_the_jobs_output_and_exits_with_its_outcome(train_server, tmp_path):
    d = train_server.state_dir
    # Options before the script are submit's; what follows the script is the script's argv.
    r = tf(d, "submit", "--workers", "1", FIT, "--foo")
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert re.search(r"^trainforge: submitted job 1 \(server_cli_fit.py\): RUNNING$", out, re.M), out
    assert "script argv ['--foo']" in out
    for step in range(3):  # trainforge's report lines, from the job's workers
        assert f"[report {step}] step={step}" in out
    assert "script done: step=2" in out
    assert out.splitlines()[-1] == "trainforge: job 1 (server_cli_fit.py): SUCCEEDED"
    assert out.index("script argv") < out.index("[report 0]") < out.index("script done") < out.index("SUCCEEDED")

    # A script that raises: the job FAILED, its traceback in the output, exit code 1.
    r = tf(d, "submit", END, "raise")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "RuntimeError: the script failed on purpose" in r.stdout
    assert r.stdout.splitlines()[-1] == ("trainforge: job 2 (server_cli_end.py): FAILED: "
                                         "RuntimeError: the script failed on purpose "
                                         f"(server_cli_end.py:{_line_of(END, 'raise RuntimeError')}, in <module>)")  # fmt: skip

    # sys.exit(3): the CLI exits 3.
    r = tf(d, "submit", "--config", "lr=0.01", "--config", "opt=adam", "--config", "warm=true", END, "3")
    assert r.returncode == 3, r.stdout + r.stderr
    assert json.loads(ok(d, "status", "3", "--json"))["config"] == {"lr": 0.01, "opt": "adam", "warm": True}
    assert r.stdout.splitlines()[-1] == "trainforge: job 3 (server_cli_end.py): FAILED: exit code 3"
    assert json.loads(ok(d, "status", "3", "--json"))["exit_code"] == 3

    # Options after the script are the script's: --workers and --no-wait here reach its argv (the CLI
    # still blocks, and the job asks for the default 1 worker).
    r = tf(d, "submit", END, "0", "--workers", "2", "--no-wait")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "(argv ['0', '--workers', '2', '--no-wait'])" in r.stdout
    assert r.stdout.splitlines()[-1] == "trainforge: job 4 (server_cli_end.py): SUCCEEDED"
    assert json.loads(ok(d, "status", "4", "--json"))["request"]["num_workers"] == 1


def test_submit_prints_the_output_while_the_job_runs(train_server, tmp_path, streamed):
    go = tmp_path / "go"
    submit = streamed(train_server.state_dir, "submit", WAIT, go)
    submit.wait_for(f"waiting for {go}")  # printed by the job, which now waits for us
    assert submit.proc.poll() is None
    go.touch()
    assert submit.finish() == 0, submit.output
    assert submit.output.splitlines()[-2:] == ["released", "trainforge: job 1 (server_cli_wait.py): SUCCEEDED"]


def test_submit_function_returning_a_trainer(train_server, tmp_path):
    d = train_server.state_dir
    # cwd is on the job's sys.path (the CLI sends it), so the module is found from there ...
    storage = tmp_path / "fn_runs"
    r = tf(d, "submit", "--workers", "2", "server_cli_trainer:make_trainer", storage, "3", cwd=SCRIPTS)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^trainforge: submitted job 1 \(server_cli_trainer:make_trainer\)", r.stdout, re.M), r.stdout
    assert "[report 2] step=2" in r.stdout
    assert r.stdout.splitlines()[-1] == "trainforge: job 1 (server_cli_trainer:make_trainer): SUCCEEDED"
    status = json.loads(ok(d, "status", "1", "--json"))
    assert status["kind"] == "function"
    assert status["run_path"] == str(storage / "cli_function")
    assert status["last_metrics"] == {"step": 2, "world_size": 2}
    assert status["reports"] == 3
    # ... or through --env PYTHONPATH from anywhere.
    r = tf(d, "submit", "--workers", "2", "--env", f"PYTHONPATH={SCRIPTS}", "--name", "by-env",
           "server_cli_trainer:make_trainer", tmp_path / "env_runs", "1", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines()[-1] == "trainforge: job 2 (by-env): SUCCEEDED"


def test_a_failed_script_job_lists_a_one_line_reason_with_the_scripts_file_and_line(train_server):
    # The script's fit() fails in its worker: the job lists show why in one line, naming the script's
    # file and line (not "<dynamic-code>", no internal frames); the traceback stays in its logs.
    d = train_server.state_dir
    r = tf(d, "submit", RAISES)
    assert r.returncode == 1, r.stdout + r.stderr
    job = job_id_of(r.stdout)
    reason = f"ValueError: bad lr -1 (server_cli_raises.py:{_line_of(RAISES, 'raise ValueError')}, in loop)"
    assert r.stdout.splitlines()[-1] == f"trainforge: job {job} (server_cli_raises.py): FAILED: {reason}"

    [row] = [line for line in ok(d, "jobs").splitlines()[1:] if line.split()[0] == str(job)]
    assert row.split()[1] == "FAILED" and row.endswith(f" {reason}"), row
    assert ok(d, "status", job).splitlines()[0] == f"job {job} (server_cli_raises.py): FAILED: {reason}"
    raw = json.loads(ok(d, "status", job, "--json"))
    assert raw["reason"] == reason
    assert raw["error"].splitlines()[0] == reason  # the whole error: the reason, then the tracebacks
    assert "Traceback" in raw["error"] and "<dynamic-code>" not in raw["error"]
    assert [j["reason"] for j in json.loads(ok(d, "jobs", "--json")) if j["id"] == job] == [reason]

    logs = ok(d, "logs", job)
    assert f'File "{RAISES}", line {_line_of(RAISES, "raise ValueError")}, in loop' in logs
    assert "Traceback (most recent call last)" in logs and "<dynamic-code>" not in logs


def _line_of(path: str, text: str) -> int:
    """The number of the first line of ``path`` that has ``text``."""
    return next(i for i, line in enumerate(Path(path).read_text().splitlines(), 1) if text in line)


# -- submit --no-wait, status, jobs, logs -------------------------------------------------------------
def test_no_wait_then_status_jobs_and_logs(train_server, tmp_path, streamed):
    d = train_server.state_dir
    go = tmp_path / "go"
    out = ok(d, "submit", "--no-wait", WAIT, go, "--lines", "5")
    job = job_id_of(out)
    assert f"trainforge: submitted job {job} (server_cli_wait.py): RUNNING" in out
    assert f"trainforge logs {job} -f" in out

    status = ok(d, "status", job)
    assert status.splitlines()[0] == f"job {job} (server_cli_wait.py): RUNNING"
    assert "request: 1 worker(s) x 1 CPU; priority 0" in status
    assert re.search(r"runner:  pid \d+ \(attempt 1\)", status), status
    raw = json.loads(ok(d, "status", job, "--json"))
    assert (raw["id"], raw["state"], raw["grant"], raw["workers"]) == (job, "RUNNING", {"CPU": 1.0}, 1)

    table = ok(d, "jobs")
    assert table.splitlines()[0].split()[:2] == ["ID", "STATE"]
    assert re.search(rf"^\s+{job}\s+RUNNING\s+0\s+1\s+\S+\s+admin\s+server_cli_wait.py", table, re.M), table
    assert [(j["id"], j["state"]) for j in json.loads(ok(d, "jobs", "--json"))] == [(job, "RUNNING")]

    follow = streamed(d, "logs", job, "-f")
    follow.wait_for(f"waiting for {go}")
    assert follow.proc.poll() is None  # following a running job
    go.touch()
    assert follow.finish() == 0, follow.output  # returns once the job has ended ...
    whole = follow.output
    expected = [f"waiting for {go}", *(f"line {i}" for i in range(5)), "released"]
    assert whole.splitlines()[0].startswith(f"trainforge job {job}: runner pid ")
    assert whole.splitlines()[1:] == expected  # ... with the whole output

    assert ok(d, "status", job).splitlines()[0] == f"job {job} (server_cli_wait.py): SUCCEEDED"
    assert ok(d, "logs", job) == whole
    assert ok(d, "logs", job, "--tail", "2") == "line 4\nreleased\n"
    assert ok(d, "logs", job, "-f") == whole  # an ended job: all of it, at once
    listed = json.loads(ok(d, "jobs", "--json"))
    assert [(j["id"], j["state"], j["exit_code"]) for j in listed] == [(job, "SUCCEEDED", 0)]
    assert [j["id"] for j in json.loads(ok(d, "jobs", "--json", "--state", "RUNNING"))] == []


# -- queue, priority, hold, release, resources --------------------------------------------------------
def test_queue_priority_hold_release_and_resources(train_server, tmp_path):
    d = train_server.state_dir
    go = tmp_path / "go"
    long = job_id_of(ok(d, "submit", "--no-wait", "--name", "long", WAIT, go))  # holds 1 of the 2 CPUs
    big = job_id_of(ok(d, "submit", "--no-wait", "--name", "big", "--workers", "2", WAIT, go))
    small = job_id_of(ok(d, "submit", "--no-wait", "--name", "small", WAIT, go))
    out = ok(d, "submit", "--no-wait", "--name", "urgent", "--workers", "2", WAIT, go)
    urgent = job_id_of(out)
    assert f"submitted job {urgent} (urgent): QUEUED, needs 2 CPU, 1 free" in out

    # big lacks a CPU; small would fit, but the CPU it needs is reserved for big, which came first.
    assert queue_rows(ok(d, "queue")) == [
        ("1", big, 0, "big", "needs 2 CPU, 1 free"),
        ("2", small, 0, "small", f"behind job {big}"),
        ("3", urgent, 0, "urgent", "needs 2 CPU, 1 free"),
    ]
    assert ok(d, "priority", urgent, 5).strip() == f"job {urgent} (urgent): QUEUED, needs 2 CPU, 1 free (position 1)"
    assert queue_rows(ok(d, "queue")) == [
        ("1", urgent, 5, "urgent", "needs 2 CPU, 1 free"),
        ("2", big, 0, "big", "needs 2 CPU, 1 free"),
        ("3", small, 0, "small", f"behind job {urgent}"),
    ]
    assert ok(d, "hold", urgent).strip() == f"job {urgent} (urgent): HELD, held"
    assert queue_rows(ok(d, "queue")) == [
        ("-", urgent, 5, "urgent", "held"),
        ("1", big, 0, "big", "needs 2 CPU, 1 free"),
        ("2", small, 0, "small", f"behind job {big}"),
    ]
    assert re.search(rf"^\s+{urgent}\s+HELD\s+5\s+2\s+\S+\s+admin\s+urgent\s+held$", ok(d, "jobs"), re.M)
    assert ok(d, "release", urgent).strip() == f"job {urgent} (urgent): QUEUED, needs 2 CPU, 1 free (position 1)"
    entries = json.loads(ok(d, "queue", "--json"))
    assert [(e["job_id"], e["pending"]["reason"], e["pending"]["position"]) for e in entries] == [
        (urgent, "resources", 1), (big, "resources", 2), (small, "reserved", 3)
    ]  # fmt: skip
    assert entries[2]["pending"]["behind"] == urgent
    assert Client(state_dir=d).queue(limit=2) == entries[:2]  # the first page of the queue only
    # Only a waiting job's priority and hold can change.
    msg = one_line_error(tf(d, "hold", long))
    assert f"job {long} is RUNNING" in msg and "(HTTP 409)" in msg

    res = ok(d, "resources")
    assert res.splitlines()[:3] == ["capacity: 2 CPU", "granted:  1 CPU", "free:     1 CPU"]
    assert f"  job {long}: 1 CPU" in res.splitlines()
    res_json = json.loads(ok(d, "resources", "--json"))
    assert (res_json["capacity"], res_json["granted"], res_json["free"]) == ({"CPU": 2.0}, {"CPU": 1.0}, {"CPU": 1.0})
    assert res_json["jobs"] == {str(long): {"grant": {"CPU": 1.0}, "gpu_ids": []}}

    go.touch()  # long ends; then urgent, big and small run one after the other (each takes 2 CPUs or is behind)
    ok(d, "logs", small, "-f")  # small starts last: when it has ended, all have
    jobs = {j["id"]: j for j in json.loads(ok(d, "jobs", "--json"))}
    assert {j: jobs[j]["state"] for j in jobs} == dict.fromkeys((long, big, small, urgent), "SUCCEEDED")
    assert sorted(jobs, key=lambda j: jobs[j]["started_at"]) == [long, urgent, big, small]
    assert queue_rows(ok(d, "queue")) == []
    assert json.loads(ok(d, "resources", "--json"))["free"] == {"CPU": 2.0}


# -- listings: whole names, what is left out, a reader that goes away --------------------------------
def test_jobs_shows_names_whole_says_how_many_more_and_stops_quietly_when_the_reader_goes(train_server):
    d = train_server.state_dir
    client = train_server.client()
    trials = [f"asha-demo/objective_ab01_{i:05d}" for i in range(4)]  # 30 characters: differ at the end
    long = "asha-demo/objective_ab01_00099_lr=0.0012345_momentum=0.9_weight_decay=0.0001"
    ids = [client.submit({"kind": "script", "path": END, "args": ["0"], "name": n, "hold": True}).id
           for n in (*trials, long)]  # held: nothing runs  # fmt: skip

    r = tf(d, "jobs", "--limit", "3")
    assert r.returncode == 0, r.stderr
    rows = r.stdout.splitlines()[1:]
    assert len(rows) == 3
    assert trials[3] in rows[1] and trials[2] in rows[2]  # whole, so each row says which trial
    cut = next(word for word in rows[0].split() if word.startswith("asha-demo/"))
    assert len(cut) == 48 and "..." in cut and cut.endswith("weight_decay=0.0001")  # the middle gives way
    assert r.stderr == "... 2 more jobs not shown: use --limit N or --all\n"  # on stderr: stdout stays a table

    r = tf(d, "jobs", "--all")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert [int(line.split()[0]) for line in r.stdout.splitlines()[1:]] == ids[::-1]
    listed = json.loads(ok(d, "jobs", "--limit", "4", "--json"))
    assert [j["name"] for j in listed] == [long, *trials[:0:-1]]
    assert trials[0] in ok(d, "queue")  # the queue shows names whole too
    msg = one_line_error(tf(d, "jobs", "--limit", "0"))
    assert msg == "trainforge jobs: --limit 0: give N >= 1 (or --all for every job)"

    # `trainforge jobs | head -1` once head has gone: quiet, the status of a process ended by SIGPIPE.
    read, write = os.pipe()
    os.close(read)
    try:
        r = subprocess.run([sys.executable, "-m", "trainforge", "jobs"], env=_env(d), stdout=write,
                           stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, timeout=TIMEOUT)  # fmt: skip
    finally:
        os.close(write)
    assert (r.returncode, r.stderr) == (141, "")


def test_logs_of_a_rank_without_a_log_says_which_ranks_have_one(train_server, tmp_path):
    d = train_server.state_dir
    script = tmp_path / "one_rank.py"
    script.write_text(
        "import trainforge\n"
        "from trainforge import DataParallelTrainer, RunConfig, ScalingConfig\n"
        "def loop(config):\n"
        "    print('hello from rank', trainforge.get_context().get_world_rank(), flush=True)\n"
        "    trainforge.report({'loss': 1.0})\n"
        "if __name__ == '__main__':\n"
        f"    run_config = RunConfig(name='one_rank', storage_path={str(tmp_path / 'runs')!r}, verbose=0)\n"
        "    DataParallelTrainer(loop, scaling_config=ScalingConfig(num_workers=1), run_config=run_config).fit()\n"
    )
    job = job_id_of(ok(d, "submit", script))
    assert "hello from rank 0" in ok(d, "logs", job, "--rank", "0")
    msg = one_line_error(tf(d, "logs", job, "--rank", "1"))
    assert msg == (f"trainforge: job {job} has no rank-1 log (ranks with logs: 0): try `trainforge logs {job} --rank 0`; "
                   f"`trainforge logs {job}` shows the job's output, every rank's lines in it")  # fmt: skip
    # A job that ran no fit(), and one that has not started: no rank logs, and why.
    ended = job_id_of(ok(d, "submit", END, "0"))
    msg = one_line_error(tf(d, "logs", ended, "--rank", "0"))
    assert f"job {ended} (SUCCEEDED) has no rank logs: it ran no fit()" in msg and f"`trainforge logs {ended}`" in msg
    held = job_id_of(ok(d, "submit", "--no-wait", "--hold", END, "0"))
    msg = one_line_error(tf(d, "logs", held, "--rank", "0"))
    assert f"job {held} (HELD) has no rank logs: no run of it has started yet" in msg


# -- stop ---------------------------------------------------------------------------------------------
def test_stop_a_running_job(train_server, tmp_path, streamed):
    d = train_server.state_dir
    # A blocking submit detaches on Ctrl-C (exit 130): the job goes on.
    first = streamed(d, "submit", WAIT, tmp_path / "never1", "--child")
    first.wait_for("waiting for")
    first.proc.send_signal(signal.SIGINT)
    assert first.finish() == 130, first.output
    assert "trainforge: detached from job 1; it keeps running" in first.output
    assert ok(d, "status", 1).startswith("job 1 (server_cli_wait.py): RUNNING")
    second = streamed(d, "submit", WAIT, tmp_path / "never2", "--child")
    second.wait_for("waiting for")
    assert len(train_server.job_processes(1)) >= 2  # its runner and the child the script started

    r = tf(d, "stop", 1)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == ["stopping job 1 ...", "job 1 (server_cli_wait.py): STOPPED"]
    assert train_server.job_processes(1) == []  # stop returned after every process of the job was gone
    assert len(train_server.job_processes(2)) >= 2
    assert ok(d, "logs", 1, "--tail", "1") == "trainforge job 1: stopped\n"  # it ended as on Ctrl-C

    # A blocking submit whose job is stopped exits 130.
    ok(d, "stop", 2)
    assert second.finish() == 130, second.output
    assert second.output.splitlines()[-1] == "trainforge: job 2 (server_cli_wait.py): STOPPED"
    assert train_server.job_processes() == []
    assert json.loads(ok(d, "status", 2, "--json"))["state"] == "STOPPED"

    # Stopping a job that has ended: one line, exit 1.
    r = tf(d, "stop", 1)
    msg = one_line_error(r)
    assert msg == "trainforge: job 1 already ended (STOPPED); nothing to stop (HTTP 409)"


# -- server status, start, stop -----------------------------------------------------------------------
def test_server_status_and_stop(train_server, tmp_path):
    d = train_server.state_dir
    out = ok(d, "server", "status")
    lines = out.splitlines()
    assert lines[0].startswith(f"train server at {train_server.url} (pid {train_server.proc.pid}, up ")
    assert lines[1:] == ["  jobs: 0 running, 0 stopping, 0 queued, 0 held", "  free: 2 CPU of 2 CPU"]
    info = json.loads(ok(d, "server", "status", "--json"))
    assert (info["url"], info["status"], info["pid"]) == (train_server.url, "ok", train_server.proc.pid)
    assert info["resources"]["capacity"] == {"CPU": 2.0}

    empty = tmp_path / "no-server"
    r = tf(None, "server", "status", "--state-dir", empty)
    assert r.returncode == 3, r.stdout + r.stderr
    assert r.stdout.strip() == f"no train server running (state directory {empty})"

    # The server is this process's child: reap it as it exits, as its parent would (`server stop`
    # waits until the process is gone, and an unreaped zombie is not).
    reaper = threading.Thread(target=train_server.proc.wait, daemon=True)
    reaper.start()
    out = ok(d, "server", "stop")
    assert out.splitlines()[0].startswith(f"stopping the train server at {train_server.url} (pid ")
    assert out.splitlines()[-1] == f"stopped the train server at {train_server.url}"
    reaper.join(TIMEOUT)
    assert train_server.proc.returncode == 0  # a clean stop ...
    assert not os.path.exists(os.path.join(d, "server.json"))  # ... that leaves no stale address behind
    assert not os.path.exists(os.path.join(d, "address"))
    r = tf(d, "server", "status")
    assert r.returncode == 3, r.stdout + r.stderr
    assert r.stdout.strip() == f"no train server running (state directory {d})"
    r = tf(d, "server", "stop")
    assert r.returncode == 0 and r.stdout.strip() == f"no train server running (state directory {d})"


def test_server_start_detached_then_status_and_stop(tmp_path):
    pytest.importorskip("fastapi")
    d = tmp_path / "detached"
    d.mkdir()
    d.chmod(0o755)  # made by hand: the start makes it the owner's alone, and says so
    pid = None
    try:
        out = ok(None, "server", "start", "--detach", "--state-dir", d, "--port", "0", "--capacity", "CPU=1")
        assert f"trainforge server: the state directory {d} was mode 0755: made it 0700" in out
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
        m = re.search(r"serving (http://127\.0\.0\.1:\d+)", out)
        assert m, out
        url = m.group(1)
        token = (d / "token").read_text().strip()
        # Its output is a pipe here (a log, a CI job's output): the dashboard's URL without the token.
        assert token not in out and "?token=" not in out, out
        assert f"  dashboard: {url}/ (`trainforge dashboard` prints its URL with the token that opens it)" in out
        assert ok(None, "dashboard", "--state-dir", d).strip() == f"{url}/?token={token}"  # asked for: it is told
        info = json.loads((d / "server.json").read_text())
        pid = info["pid"]
        assert info["url"] == url
        server = psutil.Process(pid)
        assert "trainforge.server" in " ".join(server.cmdline())

        status = ok(None, "server", "status", "--state-dir", d)
        assert status.startswith(f"train server at {url} (pid {pid}, ")
        assert "free: 1 CPU of 1 CPU" in status
        r = tf(None, "submit", "--state-dir", d, END, "0")  # the other commands take --state-dir too
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.splitlines()[-1] == "trainforge: job 1 (server_cli_end.py): SUCCEEDED"

        out = ok(None, "server", "stop", "--state-dir", d)
        assert out.splitlines()[-1] == f"stopped the train server at {url}"
        try:  # gone (or, until its new parent reaps it, a zombie)
            assert server.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            pass
        pid = None
        r = tf(None, "server", "status", "--state-dir", d)
        assert r.returncode == 3, r.stdout + r.stderr
        assert "no train server running" in r.stdout
    finally:
        if pid is not None:  # the test failed with the server up: do not leave it running
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass


def test_server_start_detached_from_a_terminal_prints_the_dashboards_url_with_its_token(tmp_path):
    """On the user's own terminal the URL that opens the dashboard may carry the token (as Jupyter's
    does): the same start as above, its output a pseudo-terminal."""
    pytest.importorskip("fastapi")
    import pty

    d = tmp_path / "tty"
    main, terminal = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "trainforge", "server", "start", "--detach", "--no-warm",
                                 "--state-dir", str(d), "--port", "0", "--capacity", "CPU=1"],
                                env=_env(None), stdin=subprocess.DEVNULL, stdout=terminal, stderr=subprocess.PIPE)  # fmt: skip
        os.close(terminal)
        terminal = -1
        chunks = []
        while select.select([main], [], [], TIMEOUT)[0]:  # until the command exits and the terminal closes
            try:
                chunk = os.read(main, 4096)
            except OSError:  # EIO on Linux once the last writer is gone
                break
            if not chunk:
                break
            chunks.append(chunk)
        _, err = proc.communicate(timeout=TIMEOUT)
        assert proc.returncode == 0, err
    finally:
        os.close(main)
        if terminal >= 0:
            os.close(terminal)
    try:
        out = b"".join(chunks).decode()
        token = (d / "token").read_text().strip()
        assert re.search(rf"  dashboard: http://127\.0\.0\.1:\d+/\?token={re.escape(token)}", out), out
    finally:
        assert ok(None, "server", "stop", "--state-dir", d).splitlines()[-1].startswith("stopped the train server at ")


def test_a_state_directory_is_made_its_owners_alone_and_another_users_is_refused(tmp_path):
    from trainforge.server._main import claim_state_dir

    fresh = tmp_path / "fresh" / "state"
    assert claim_state_dir(str(fresh)) is None  # created 0700: nothing to say
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o700
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o777)
    loose.chmod(0o775)
    assert claim_state_dir(str(loose)) == (f"trainforge server: the state directory {loose} was mode 0775: made it "
                                           "0700 (it holds the token and every job's files)")  # fmt: skip
    assert stat.S_IMODE(loose.stat().st_mode) == 0o700
    assert claim_state_dir(str(loose)) is None
    if os.geteuid() != 0:
        pytest.skip("giving a directory to another user needs root")
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 54321, 54321)
    with pytest.raises(PermissionError) as err:
        claim_state_dir(str(theirs))
    assert str(err.value).startswith(f"the state directory {theirs} belongs to uid 54321, not to ")
    assert "Start the server as that user, or pass a --state-dir of your own" in str(err.value)
    assert stat.S_IMODE(theirs.stat().st_mode) == 0o755  # left as it was
    for detach in ((), ("--detach",)):  # both starts refuse it in one line, before anything is written there
        msg = one_line_error(tf(None, "server", "start", *detach, "--no-warm", "--state-dir", theirs, "--port", "0"))
        assert msg.startswith(f"trainforge: the state directory {theirs} belongs to uid 54321, not to "), msg
    assert os.listdir(theirs) == []


# -- errors a user can cause --------------------------------------------------------------------------
def test_user_errors_are_one_line_without_traceback(train_server, tmp_path):
    d = train_server.state_dir
    for args in (("status", 999), ("logs", 999), ("hold", 999), ("release", 999), ("priority", 999, 1), ("retry", 999)):
        msg = one_line_error(tf(d, *args))
        assert msg == "trainforge: no job 999 (list them with `trainforge jobs`) (HTTP 404)", args
    r = tf(d, "stop", 999)
    assert "no job 999" in one_line_error(r)
    msg = one_line_error(tf(d, "logs", 999, "-f", timeout=30))  # a stream too: no reconnecting forever
    assert msg == "trainforge: no job 999 (list them with `trainforge jobs`) (HTTP 404)"

    missing = tmp_path / "missing.py"
    assert one_line_error(tf(d, "submit", missing)) == f"trainforge submit: no such script {str(missing)!r}"
    msg = one_line_error(tf(d, "submit", "--workers", "x", END, "0"))
    assert msg == "trainforge submit: --workers=x: give N or MIN-MAX (e.g. 2 or 2-4)"
    msg = one_line_error(tf(d, "submit", "--env", "NOVALUE", END, "0"))
    assert msg == "trainforge submit: --env 'NOVALUE': write KEY=VALUE"
    msg = one_line_error(tf(d, "submit", "not_a_target"))
    assert "'not_a_target' is neither a script (.py) nor pkg.module:function" in msg
    for flag, bad in (("--cpus", "-1"), ("--cpus", "nan"), ("--cpus", "inf"), ("--gpus", "-0.5")):
        msg = one_line_error(tf(d, "submit", f"{flag}={bad}", END, "0"))
        assert msg == (f"trainforge submit: {flag}={float(bad):g}: give a number >= 0 per worker (e.g. 0.5"
                       + ("; each worker counts at least 0.1 CPU)" if flag == "--cpus" else ")")), msg  # fmt: skip
    # Checked here, before any request, in the options' terms (not the API's field and an HTTP status).
    for args, said in ((("--workers", "0"), "--workers=0: give a number >= 1, or MIN-MAX"),
                       (("--workers", "3-2"), "--workers=3-2: give a number >= 1, or MIN-MAX with 1 <= MIN <= MAX"),
                       (("--max-retries", "-1"), "--max-retries=-1: give a number >= 0")):  # fmt: skip
        assert one_line_error(tf(d, "submit", *args, END, "0")).startswith(f"trainforge submit: {said}")
    # What only the server can check: its answer names the option, not the API's field.
    msg = one_line_error(tf(d, "submit", "--workers", "3", END, "0"))  # more than the server has
    assert msg.startswith("trainforge submit: --workers: ") and "3 CPU (capacity 2)" in msg, msg
    assert "HTTP 422" not in msg and "num_workers" not in msg, msg
    msg = one_line_error(tf(d, "submit", "--priority", "10000000", END, "0"))
    assert msg == "trainforge submit: --priority: Input should be less than or equal to 1000000", msg
    assert json.loads(ok(d, "jobs", "--json")) == []  # nothing was queued

    # No server where the CLI looks.
    nowhere = tmp_path / "nowhere"
    msg = one_line_error(tf(nowhere, "jobs"))
    assert msg.startswith(f"trainforge: no train server found (no address given, $TRAINFORGE_ADDRESS unset, no {nowhere}/address)")
    assert "no train server found" in one_line_error(tf(nowhere, "submit", END, "0"))
    r = tf(nowhere, "server", "status")
    assert r.returncode == 3 and r.stdout.strip() == f"no train server running (state directory {nowhere})"


def test_server_start_on_a_busy_port_says_what_to_do_in_one_line(tmp_path):
    pytest.importorskip("fastapi")
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        detached = one_line_error(tf(None, "server", "start", "--detach", "--no-warm", "--state-dir", tmp_path / "a",
                                     "--port", port, "--capacity", "CPU=1"))  # fmt: skip
        assert detached.startswith("trainforge: the train server exited at start (code 1): "
                                   f"cannot listen on 127.0.0.1:{port} (Address already in use): ")  # fmt: skip
        assert "pass --port (0 picks a free one)" in detached and f"(its output: {tmp_path / 'a'}/server.log)" in detached
        foreground = one_line_error(tf(None, "server", "start", "--no-warm", "--state-dir", tmp_path / "b",
                                       "--port", port, "--capacity", "CPU=1"))  # fmt: skip
        assert foreground.startswith(f"trainforge: cannot listen on 127.0.0.1:{port} (Address already in use)")
    assert not (tmp_path / "a" / "address").exists() and not (tmp_path / "b" / "address").exists()


def test_never_fitting_request_names_no_job(train_server):
    msg = one_line_error(tf(train_server.state_dir, "submit", "--workers", "3", END, "0"))
    assert "job 0" not in msg, msg


def test_second_detached_start_leaves_the_running_server_alone(tmp_path):
    pytest.importorskip("fastapi")
    d = tmp_path / "detached"
    ok(None, "server", "start", "--detach", "--state-dir", d, "--port", "0", "--capacity", "CPU=1")
    server = psutil.Process(json.loads((d / "server.json").read_text())["pid"])
    try:
        again = tf(None, "server", "start", "--detach", "--state-dir", d, "--port", "0")
        msg = one_line_error(again)
        assert again.stdout == "", again.stdout  # said nothing of starting before finding it runs
        assert f"a train server already runs with state directory {d} (pid {server.pid}, " in msg
        assert ok(None, "server", "status", "--state-dir", d).startswith("train server at http://127.0.0.1:")
        assert ok(None, "server", "stop", "--state-dir", d).splitlines()[-1].startswith("stopped the train server at ")
    finally:
        try:  # whatever the CLI did, the server does not outlive the test
            server.kill()
        except psutil.Error:
            pass


def test_flat_config_keeps_scalars_under_slash_joined_keys():
    from trainforge._internal.trainer_job import flat_config

    nested = {"lr": 0.1, "model": {"depth": 3, "act": "relu", "sizes": [1, 2]}, "nan": float("nan"),
              "warm": True, "none": None, "obj": object(), "long": "x" * 2000}  # fmt: skip
    assert flat_config(nested) == {"lr": 0.1, "model/depth": 3, "model/act": "relu", "warm": True, "none": None}
    assert len(flat_config({f"k{i}": i for i in range(1000)})) == 500
