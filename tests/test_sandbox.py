"""The job sandbox's parts, one by one (issue 34): a plan's order and JSON, its bubblewrap command
line, the cgroup hierarchies of a host read from fake mount tables (hybrid, v2 only, v1 only), the
zygote's job-channel requests (JSON, checked field by field), reading and writing a job's files never
through what the job planted, the events reader's line bound, job credentials, who a job's token
signs in as, what a user namespace lends, and (as root) a process entering a plan for real.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from trainforge._internal import job_events, state_files
from trainforge._internal.sandbox import Bind, Hierarchies, Plan, bwrap_command
from trainforge._internal.zygote.protocol import SpawnRequest

ROOT = os.geteuid() == 0


# -- the plan -------------------------------------------------------------------------------------
def test_a_plan_refuses_root_relative_paths_and_half_an_identity():
    with pytest.raises(ValueError, match="root"):
        Plan(binds=(), uid=0, gid=0)
    with pytest.raises(ValueError, match="absolute"):
        Plan(binds=(Bind("relative/path"),))
    with pytest.raises(ValueError, match="both or neither"):
        Plan(binds=(), uid=1000)


def test_a_plans_mounts_come_parents_first_and_a_mask_after_the_binds_it_hides_part_of():
    plan = Plan(binds=(Bind("/srv/state/jobs/7", True), Bind("/usr"), Bind("/home/ann/project", True)),
                masks=("/srv/state", "/home/ann/project/secret.txt"))  # fmt: skip
    order = [(kind, path) for kind, path, _ in plan.ops()]
    assert order.index(("mask", "/srv/state")) < order.index(("bind", "/srv/state/jobs/7"))
    assert order.index(("bind", "/home/ann/project")) < order.index(("mask", "/home/ann/project/secret.txt"))
    code_in_tmp = [(k, p) for k, p, _ in Plan(binds=(Bind("/tmp/code"),)).ops()]
    assert code_in_tmp.index(("tmpfs", "/tmp")) < code_in_tmp.index(("bind", "/tmp/code"))  # not hidden by it
    assert order.index(("dev", "/dev")) < order.index(("tmpfs", "/dev/shm"))
    same_depth = Plan(binds=(Bind("/srv/x"),), masks=("/srv/x",)).ops()
    assert [k for k, p, _ in same_depth if p == "/srv/x"] == ["bind", "mask"]  # the mask wins


def test_a_plan_goes_through_json_whole():
    plan = Plan(binds=(Bind("/usr"), Bind("/data", True)), masks=("/srv",), uid=2000, gid=2000, groups=(2000, 27),
                cgroups=("/sys/fs/cgroup/x",), root="/srv/root", env={"A": "1"})  # fmt: skip
    assert Plan.from_json(plan.to_json()) == plan


def test_the_bubblewrap_command_holds_the_view_and_joins_the_cgroups_before_it(tmp_path):
    data, secret = tmp_path / "data", tmp_path / "token"
    data.mkdir()
    secret.write_text("x")
    plan = Plan(binds=(Bind("/usr"), Bind(str(data), True)), masks=(str(tmp_path), str(secret)),
                cgroups=("/cg/a", "/cg/b"))  # fmt: skip
    argv = bwrap_command(plan, ["python", "-m", "x"], chdir=str(data))
    assert argv[:2] == ["/bin/sh", "-c"] and argv[4:6] == ["/cg/a", "/cg/b"]
    bw = argv[6:]
    for flag in ("--unshare-user", "--unshare-pid", "--new-session", "--proc", "--dev"):
        assert flag in bw
    assert bw[bw.index("--cap-drop") + 1] == "ALL"
    assert ["--ro-bind", "/usr", "/usr"] == bw[bw.index("/usr") - 1 : bw.index("/usr") + 2]
    assert bw[bw.index("--tmpfs", bw.index(str(tmp_path)) - 1) + 1] == str(tmp_path)  # the mask: empty
    assert ["--bind", str(data), str(data)] == bw[bw.index(str(data)) - 1 : bw.index(str(data)) + 2]
    assert bw.index(str(tmp_path)) < bw.index(str(data))  # masked first, its writable part bound again after
    assert bw[-4:] == ["--", "python", "-m", "x"]
    # sh moves itself into both cgroups, then becomes bubblewrap
    script = argv[2]
    assert '"$1/cgroup.procs"' in script and '"$2/cgroup.procs"' in script and 'exec "$@"' in script


# -- cgroup hierarchies -----------------------------------------------------------------------------
def _host(tmp_path, mounts: list[str], own: list[str]) -> Hierarchies:
    info, mine = tmp_path / "mountinfo", tmp_path / "cgroup"
    info.write_text("".join(f"{i} 1 0:{i} / {line}\n" for i, line in enumerate(mounts, 30)))
    mine.write_text("".join(f"{line}\n" for line in own))
    return Hierarchies.discover(str(info), str(mine))


def test_a_hybrid_host_tracks_by_v2_and_limits_by_v1(tmp_path):
    root = tmp_path / "fs"
    for d in ("unified", "memory", "pids", "freezer", "cpuacct"):
        (root / d).mkdir(parents=True)
    mounts = [f"{root}/unified rw - cgroup2 cgroup2 rw", f"{root}/memory rw - cgroup cgroup rw,memory",
              f"{root}/pids rw - cgroup cgroup rw,pids", f"{root}/freezer rw - cgroup cgroup rw,freezer",
              f"{root}/cpuacct rw - cgroup cgroup rw,cpuacct"]  # fmt: skip
    own = ["0::/", "5:memory:/svc", "4:pids:/", "3:freezer:/", "2:cpuacct:/"]
    host = _host(tmp_path, mounts, own)
    assert host.track is not None and host.track.version == 2
    assert host.memory is not None and host.memory.version == 1 and host.memory.own == "/svc"
    assert host.pids is not None and host.pids.mount == f"{root}/pids"
    group = host.group("tf-abc/job-3")
    assert f"{root}/memory/svc/tf-abc/job-3" in group.directories
    assert len(group.directories) == 3  # v2 (tracking, CPU time), v1 memory, v1 pids


def test_a_v1_only_host_kills_through_the_freezer(tmp_path):
    root = tmp_path / "fs"
    for d in ("memory", "freezer"):
        (root / d).mkdir(parents=True)
    host = _host(tmp_path, [f"{root}/memory rw - cgroup cgroup rw,memory", f"{root}/freezer rw - cgroup cgroup rw,freezer"],
                 ["2:memory:/", "1:freezer:/"])  # fmt: skip
    assert host.track is not None and "freezer" in host.track.controllers
    assert host.pids is None and any("pids" in p for p in host.problems)
    assert "memory v1(memory)" in host.describe()


def test_no_cgroup_mount_is_no_cgroup(tmp_path):
    host = _host(tmp_path, ["/ rw - ext4 /dev/vda rw"], ["0::/"])
    assert not host.usable and host.group("x").directories == ()


# -- the zygote's job channel ---------------------------------------------------------------------
def test_a_channel_request_is_json_checked_field_by_field_and_takes_the_channels_plan():
    request = SpawnRequest(target="pkg.mod:main", args=["a", 1], env={"K": "v"}, cwd="/w", fds={1: 0, 2: 1},
                           mark=("K",), watch_pid=12, preload=("torch",), sandbox="MINE", channel=True)  # fmt: skip
    data = json.loads(request.to_json())
    assert "sandbox" not in data and "channel" not in data  # what a job sends names no plan
    back = SpawnRequest.from_json(request.to_json(), sandbox="THE CHANNEL'S")
    assert back.sandbox == "THE CHANNEL'S" and back.fds == {1: 0, 2: 1} and back.channel is False
    forged = json.dumps({**data, "sandbox": "{}", "channel": True}).encode()
    assert SpawnRequest.from_json(forged, sandbox="THE CHANNEL'S").sandbox == "THE CHANNEL'S"
    for bad in ({**data, "target": "os.system('x')"}, {**data, "env": {"K": 1}}, {**data, "fds": {"x": 0}},
                {**data, "args": [None]}, {**data, "watch_pid": "12"}, {**data, "cwd": 3}, ["not", "a", "dict"]):  # fmt: skip
        with pytest.raises(ValueError):
            SpawnRequest.from_json(json.dumps(bad).encode(), sandbox="P")


# -- a job's files, as the server reads and writes them ----------------------------------------------
def test_the_server_never_reads_or_appends_through_a_link_a_job_planted(tmp_path):
    secret = tmp_path / "token"
    secret.write_text("the admin's token")
    job = tmp_path / "job"
    job.mkdir()
    (job / "output.log").symlink_to(secret)
    with pytest.raises(FileNotFoundError):  # as good as no file, for every reader
        state_files.open_regular(str(job / "output.log"))
    with pytest.raises(OSError):
        state_files.open_append(str(job / "output.log"))
    os.mkfifo(job / "events.jsonl")
    with pytest.raises(FileNotFoundError):  # never blocks on a FIFO
        state_files.open_regular(str(job / "events.jsonl"))
    assert job_events.read_events(str(job / "events.jsonl"))[1] == 0
    state_files.write_atomic(str(job / "output.log"), "new")  # replaces the link itself
    assert secret.read_text() == "the admin's token" and not (job / "output.log").is_symlink()
    before = os.stat(os.devnull).st_mode
    with state_files.open_append(os.devnull):  # a device is taken as it is: its mode untouched (it was
        pass  # chmod-ed to 0600, root's alone, when a pool's zygote logged there as root)
    assert os.stat(os.devnull).st_mode == before


def test_a_line_longer_than_the_bound_is_skipped_not_held(tmp_path, monkeypatch):
    monkeypatch.setattr(job_events, "MAX_LINE", 1000)
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"x" * 5000 + b"\n" + json.dumps({"type": "report", "n": 1}).encode() + b"\n")
    offset, seen = 0, []
    for _ in range(10):
        events, offset = job_events.read_events(str(path), offset)
        seen += list(events)
    assert seen == [{"type": "report", "n": 1}] and offset == path.stat().st_size


# -- credentials -------------------------------------------------------------------------------------
def test_a_jobs_credential_signs_in_as_its_owner_at_most_a_member_until_it_is_revoked(tmp_path):
    from trainforge.server.store.database import JobStore
    from trainforge.server.team.job_tokens import JobTokens
    from trainforge.server.team.users import UserBook, authenticator

    store = JobStore(str(tmp_path / "state.db"))
    users = UserBook(store)
    users.add("ann", "member")
    users.add("boss", "admin")
    tokens = JobTokens(store)
    ann_job, boss_job, admin_job = tokens.issue(7, "ann"), tokens.issue(8, "boss"), tokens.issue(9, "admin")
    auth = authenticator(users, "a" * 32, jobs=tokens.verify)
    who = auth(ann_job)
    assert (who.name, who.role, who.job_id) == ("ann", "member", 7)
    assert auth(boss_job).role == "member" and auth(admin_job).role == "member"  # a job never manages users
    assert auth(ann_job[:-2] + "xx") is None and auth("tfj.7.short") is None
    assert JobTokens(store).verify(ann_job) == (7, "ann")  # kept across a restart (only its hash)
    assert "tfj" not in "".join(str(tuple(r)) for r in store.query("SELECT * FROM job_tokens"))
    tokens.revoke(7)
    assert auth(ann_job) is None and JobTokens(store).verify(ann_job) is None
    users.remove("boss")
    assert auth(boss_job) is None  # its owner is no longer a user
    store.close()


def test_in_a_user_namespace_only_what_every_user_may_read_is_lent():
    import shutil
    import tempfile
    from pathlib import Path

    from trainforge.server.jobs.sandboxes import _open_to_all

    base = Path(tempfile.mkdtemp(dir="/tmp"))  # pytest's own temporary directories are searchable by root only
    try:
        shared, private = base / "shared", base / "private"
        for d in (shared, private):
            d.mkdir()
        base.chmod(0o755)
        shared.chmod(0o755)
        private.chmod(0o700)
        assert _open_to_all(str(shared), write=False) and not _open_to_all(str(shared), write=True)
        assert not _open_to_all(str(private), write=False)
        base.chmod(0o700)  # a parent others cannot search hides everything below it
        assert not _open_to_all(str(shared), write=False)
    finally:
        shutil.rmtree(base)


# -- for real: a process enters a plan ----------------------------------------------------------------
PROBE = """
import json, os, sys
from trainforge._internal.sandbox import enter_from_environment
enter_from_environment()
def can(path):
    try:
        open(path).read()
        return True
    except OSError:
        return False
print(json.dumps({"uid": os.getuid(), "secret": can(sys.argv[1]), "mine": can(sys.argv[2]), "env": os.environ.get("JOB_ONLY"),
                  "procs": len([p for p in os.listdir("/proc") if p.isdigit()]), "no_new_privs": open("/proc/self/status").read().split("NoNewPrivs:")[1].split()[0]}))
"""


@pytest.mark.skipif(not ROOT, reason="entering a sandbox in-process needs root")
def test_a_process_that_enters_a_plan_sees_only_its_view_as_another_uid(tmp_path):
    from trainforge.server.jobs.sandboxes import SYSTEM_DIRS, python_paths, server_start_env

    state = tmp_path / "state"
    job = state / "jobs" / "1"
    job.mkdir(parents=True)
    (state / "token").write_text("secret")
    (job / "mine.txt").write_text("ok")
    uid = 1879048192 + 999_998
    for path in (job, job / "mine.txt"):
        os.chown(path, uid, uid)
    root = tmp_path / "root"
    root.mkdir()
    binds = [Bind(p) for p in (*SYSTEM_DIRS, *python_paths()) if os.path.lexists(p)] + [Bind(str(job), True)]
    plan = Plan(binds=tuple(binds), masks=(str(state),), uid=uid, gid=uid, groups=(uid,), root=str(root),
                env={**server_start_env(), "JOB_ONLY": "yes"})  # fmt: skip
    proc = subprocess.run([sys.executable, "-P", "-s", "-c", PROBE, str(state / "token"), str(job / "mine.txt")],
                          env={**server_start_env(), "TRAINFORGE_SANDBOX_PLAN": plan.to_json()}, cwd="/",
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen == {"uid": uid, "secret": False, "mine": True, "env": "yes", "procs": 1, "no_new_privs": "1"}


@pytest.mark.skipif(not ROOT, reason="giving a directory to another uid needs root")
def test_what_the_server_writes_in_a_sandboxed_jobs_directory_is_the_jobs_to_read(tmp_path):
    """An elastic job's grant is rewritten while it runs: the new file is its uid's too."""
    from trainforge.server.jobs.files import JobFiles
    from trainforge.server.scheduling.rule import JobRequest

    files = JobFiles(str(tmp_path / "jobs"))
    os.makedirs(files.dir(4))
    os.chown(files.dir(4), 1879048192 + 5, 1879048192 + 5)
    files.write_grant(4, JobRequest.from_spec({"per_worker": {"CPU": 1.0}, "min_workers": 1, "max_workers": 3}, 4), 2)
    st = os.stat(os.path.join(files.dir(4), "grant.json"))
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (1879048192 + 5, 0o600)
    os.makedirs(files.dir(5))  # the server's own (an unsandboxed job's): stays the server's
    files.write_grant(5, JobRequest.from_spec({"per_worker": {"CPU": 1.0}}, 5), 1)
    assert os.stat(os.path.join(files.dir(5), "grant.json")).st_uid == os.geteuid()


@pytest.mark.skipif(not ROOT or not Hierarchies.discover().usable, reason="making cgroups needs root and a cgroup fs")
def test_a_restarted_server_removes_the_cgroups_its_ended_jobs_left(tmp_path):
    """A server that stopped while a sandboxed job ran leaves its cgroup when the job then ends
    without it; the next start removes every cgroup of a job that no longer runs (what is left in
    one is killed first) and keeps a running job's."""
    from trainforge.server.isolation.config import IsolationConfig
    from trainforge.server.isolation.mechanism import Isolation
    from trainforge.server.jobs.sandboxes import JobSandboxes
    from trainforge.server.store.database import JobStore
    from trainforge.server.team.users import UserBook

    store = JobStore(str(tmp_path / "state.db"))
    running, _ = store.add_job(name="running", kind="script", spec={"path": "/x.py"})
    store.update(running.id, None, None, state="RUNNING")
    isolation = Isolation("uid", "test", IsolationConfig(), Hierarchies.discover())
    sandboxes = JobSandboxes(str(tmp_path), isolation, UserBook(store), server_id=f"t{os.getpid()}")
    left, alive = sandboxes.cgroup(99), sandboxes.cgroup(running.id)
    assert left is not None and alive is not None
    left.create()
    alive.create()
    try:
        assert sandboxes.sweep_cgroups() == 1
        assert not left.exists() and alive.exists()
    finally:
        alive.kill()
        alive.remove()
        left.remove()
        store.close()
