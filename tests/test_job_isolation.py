"""Hostile jobs on a server a team shares (issue 34): a member's job tries to read the admin's token
and ``state.db``, list and write another user's job directory, swap another job's result, see the
server's processes, escape ``stop`` with ``setsid`` and a double fork, fork-bomb, allocate past its
memory request, and use its own credential for more than its owner may. Each is refused or
contained, and the server, the other job and its result are untouched.

Both mechanisms run where the host allows them: ``uid`` (the server as root: CI is root) and
``userns`` (bubblewrap; as root here, where the job's namespace maps to uid 0 but sees only its
view, has no capability, and lives in a PID namespace of its own). One server per mechanism serves
the module; the members' code lives in a directory every user may read.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

pytest.importorskip("fastapi")

from trainforge import DataParallelTrainer, RunConfig, ScalingConfig  # noqa: E402
from trainforge._internal.sandbox import Hierarchies, bwrap_problem, in_process_problem  # noqa: E402
from trainforge._testing.server import TrainServer  # noqa: E402
from trainforge._testing.wait import wait_until  # noqa: E402

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).parent / "scripts" / "hostile_job.py"
PIDS_MAX = 64
HOST = Hierarchies.discover()  # the cgroup hierarchies a server here would use


@dataclasses.dataclass
class Team:
    mode: str
    server: TrainServer
    tokens: dict[str, str]
    code: Path

    def client(self, user: str):  # type: ignore[no-untyped-def]
        from trainforge.server import Client

        return Client(self.server.url, token=self.tokens[user])

    def attack(self, user: str, *args: str, **spec: object):  # type: ignore[no-untyped-def]
        """``user`` submits hostile_job.py with ``args``; the job handle."""
        body = {"kind": "script", "path": str(self.code / SCRIPT.name), "args": list(args), "cwd": str(self.code),
                "per_worker": {"CPU": 1.0}, **spec}  # fmt: skip
        return self.client(user).submit(body)

    def results(self, job) -> list[dict]:  # type: ignore[no-untyped-def]
        text = job.client.request("GET", f"/jobs/{job.id}/logs")["text"]
        return [json.loads(line[len("RESULT "):]) for line in text.splitlines() if line.startswith("RESULT ")]


def _cli(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "trainforge", *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.fixture(scope="module", params=["uid", "userns"])
def team(request, tmp_path_factory):  # type: ignore[no-untyped-def]
    mode = request.param
    problem = in_process_problem() if mode == "uid" else bwrap_problem()
    if problem is not None:
        pytest.skip(f"job isolation {mode!r} is not available here: {problem}")
    base = tmp_path_factory.mktemp(f"team-{mode}")
    # What the members' jobs run: where every user may read it, as a shared checkout is (pytest's own
    # temporary directories are root's alone).
    code = Path(tempfile.mkdtemp(prefix="tf-team-code-", dir="/tmp"))
    code.chmod(0o755)
    shutil.copy(SCRIPT, code / SCRIPT.name)
    request.addfinalizer(lambda: shutil.rmtree(code, ignore_errors=True))
    server = TrainServer(str(base / "server"), capacity="CPU=4,memory=8G",
                         extra=["--job-isolation", mode, "--job-pids-max", str(PIDS_MAX)]).start()  # fmt: skip
    try:
        assert f"job isolation: {mode}:" in server.output, server.output
        tokens = {}
        for user in ("ann", "bob"):
            out = _cli("server", "users", "add", user, "--role", "member", "--state-dir", server.state_dir)
            tokens[user] = re.search(r"(tfu\.\S+)", out).group(1)  # type: ignore[union-attr]
        yield Team(mode, server, tokens, code)
    finally:
        left = server.cleanup()
    assert not left, f"job processes left behind: {left}"
    assert "Traceback" not in server.output, server.output


def _probe_loop(config):  # type: ignore[no-untyped-def]
    """Each rank reports who it runs as and whether it sees the server's token."""
    import os

    import trainforge

    trainforge.report({"uid": os.getuid(), "sees_token": os.path.exists(config["token"]), "answer": 42})


def test_a_members_job_reaches_neither_the_servers_files_nor_another_users_job(team, monkeypatch):
    state = team.server.state_dir
    monkeypatch.setenv("TRAINFORGE_ADDRESS", team.server.url)
    monkeypatch.setenv("TRAINFORGE_TOKEN", team.tokens["ann"])
    trainer = DataParallelTrainer(_probe_loop, train_loop_config={"token": os.path.join(state, "token")},
                                  scaling_config=ScalingConfig(num_workers=2), run_config=RunConfig(verbose=0))  # fmt: skip
    anns = trainer.submit()
    ann_result = anns.result(timeout=120)
    assert ann_result.error is None
    ranks = ann_result.metrics_dataframe  # rank 0's; every rank's below
    assert list(ranks["answer"]) == [42]
    all_ranks = anns.client.request("GET", f"/jobs/{anns.id}")["last_metrics"]
    assert all_ranks["sees_token"] is False
    ann_dir = os.path.join(state, "jobs", str(anns.id))
    with open(os.path.join(ann_dir, "result.pkl"), "rb") as f:
        before = f.read()

    bobs = team.attack("bob", "snoop", state, ann_dir)
    assert bobs.wait(120).state == "SUCCEEDED", bobs.client.request("GET", f"/jobs/{bobs.id}/logs")["text"]
    (seen,) = team.results(bobs)
    for what in ("token", "scrape_token", "state_db", "other_list", "other_result", "other_new_file"):
        assert seen[what].startswith("refused"), (what, seen)
    assert seen["jobs"] in ("refused: FileNotFoundError", f"got: ['{bobs.id}']"), seen  # its own directory only
    assert seen["server_seen"] is False and seen["processes"] <= 3, seen  # its own processes only
    assert seen["env_token_kind"] == "tfj.", seen  # its own credential, never the server's
    if team.mode == "uid":
        assert seen["uid"] >= 1879048192 and seen["uid"] != os.getuid(), seen
    with open(os.path.join(ann_dir, "result.pkl"), "rb") as f:
        assert f.read() == before
    assert not os.path.exists(os.path.join(ann_dir, "planted.py"))
    assert anns.result(timeout=30).metrics["answer"] == 42  # ann's result, whole, hers to unpickle
    from trainforge.server import ServerError

    with pytest.raises(ServerError, match="job.result"):  # and nobody else's client is handed it
        team.client("bob").job(anns.id).result(timeout=30)


@pytest.mark.skipif(HOST.track is None, reason="no cgroup hierarchy to track a job's processes in")
def test_setsid_and_a_double_fork_do_not_escape_stop_and_leave_no_zombie(team, tmp_path):
    gate = str(tmp_path / "gate-never")
    job = team.attack("bob", "escape", gate)
    wait_until(lambda: team.results(job), 60, "the job's escapee to start")

    def escapees() -> list[psutil.Process]:
        found = []
        for p in psutil.process_iter():
            try:
                if "escapee" in p.cmdline() and gate in p.cmdline():
                    found.append(p)
            except psutil.Error:
                continue
        return found

    (escapee,) = wait_until(escapees, 30, "the escapee")
    assert "TRAINFORGE_JOB_ID" not in escapee.environ()  # it dropped what a search by environment finds
    assert escapee.ppid() != job.status().raw["pid"]
    job.stop(grace_s=2)
    assert job.wait(60).state == "STOPPED"
    gone, alive = psutil.wait_procs([escapee], timeout=10)
    assert not alive, f"the escapee survived stop: {alive}"
    server = psutil.Process(team.server.proc.pid)  # type: ignore[union-attr]
    zombies = [c.pid for c in server.children() if c.status() == psutil.STATUS_ZOMBIE]
    assert not zombies, zombies


@pytest.mark.skipif(HOST.pids is None, reason=f"no pids controller here: {HOST.describe()}")
def test_a_fork_bomb_ends_at_the_jobs_pids_limit(team):
    job = team.attack("bob", "forkbomb")
    assert job.wait(120).state == "SUCCEEDED"
    (bomb,) = team.results(job)
    assert 0 < bomb["forked"] < PIDS_MAX and bomb["stopped_by"], bomb
    assert team.client("ann").request("GET", "/whoami")["name"] == "ann"  # the server serves on


@pytest.mark.skipif(HOST.memory is None, reason=f"no memory controller here: {HOST.describe()}")
def test_memory_past_the_jobs_request_is_the_jobs_problem_alone(team):
    job = team.attack("bob", "hog", "2048", per_worker={"CPU": 1.0, "memory": 256 * 2**20})
    status = job.wait(120)
    assert status.state == "FAILED" and not team.results(job), status.raw  # killed before it had it all
    assert team.client("ann").request("GET", "/whoami")["name"] == "ann"


def test_a_jobs_credential_is_its_owners_as_a_member_and_ends_with_the_job(team):
    from trainforge.server import Client, ServerError

    job = team.attack("bob", "credential")
    assert job.wait(120).state == "SUCCEEDED"
    (seen,) = team.results(job)
    assert seen["whoami"]["name"] == "bob" and seen["whoami"]["role"] == "member", seen
    assert seen["make_admin"] == 403 and seen["list_jobs"] == 200, seen
    with pytest.raises(ServerError, match="401|token"):
        Client(team.server.url, token=seen["token"]).request("GET", "/whoami")
    audit = team.server.client().request("GET", "/audit", params={"user": "bob"})
    assert any("job " + str(job.id) in (e.get("detail") or "") for e in audit), audit


def test_a_server_with_users_and_no_sandbox_refuses_to_run_unless_told_they_trust_each_other(tmp_path):
    """No way to sandbox here (bubblewrap asked for, and not on its PATH): a server with a member
    does not start, and one without refuses to add a member, saying what to do; with
    --no-job-isolation both go on, and say so."""
    state = str(tmp_path / "server")
    no_bwrap = {"PATH": str(tmp_path / "empty")}  # the server's python is named by its absolute path
    alone = TrainServer(state, extra=["--job-isolation", "userns"], env=no_bwrap).start()
    try:
        assert alone.url is not None, alone.output  # a single-user server needs no sandbox
        http = alone.http()
        r = http.post("/users", json={"name": "ann", "role": "member"})
        assert r.status_code == 409 and "--no-job-isolation" in r.json()["detail"], r.text
        assert "bubblewrap" in r.json()["detail"], r.text
        assert http.post("/users", json={"name": "root2", "role": "admin"}).status_code == 201  # admins are trusted
    finally:
        assert not alone.cleanup()
    _cli("server", "users", "add", "ann", "--role", "member", "--state-dir", state)
    refused = TrainServer(state, extra=["--job-isolation", "userns"], env=no_bwrap).start()
    try:
        assert refused.url is None and refused.proc is not None and refused.proc.wait(30) != 0
        assert "no way to keep their jobs apart" in refused.output and "--no-job-isolation" in refused.output
    finally:
        refused.cleanup()
    trusted = TrainServer(state, extra=["--no-job-isolation"]).start(require_url=True)
    try:
        assert "job isolation: off (--no-job-isolation)" in trusted.output
    finally:
        assert not trusted.cleanup()
