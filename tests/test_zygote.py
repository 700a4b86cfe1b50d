"""The warm fork server (trainforge/_internal/zygote/): a real zygote process, real forked children.

What a child must look like is what ``python -m module`` would have been: its exit code, its output on
the fds it was given, its environment (and the identifying variables visible in /proc/PID/environ,
which is how the train server finds a job's processes), its command line, its own session. And the
zygote's lifetime: it serves no one once the server's pipe closes but stays for its children.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from trainforge._internal import zygote

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the zygote is Linux-only")

CHILD_MODULE = textwrap.dedent(
    """
    import os, sys, time

    def hello(code):
        print("out", os.getpid(), os.environ.get("TRAINFORGE_JOB_ID"), os.getcwd(), sys.argv, flush=True)
        print("err line", file=sys.stderr, flush=True)
        return int(code)

    def sleep(seconds):
        print("sleeping", flush=True)
        time.sleep(float(seconds))

    def fail():
        raise RuntimeError("boom in the child")

    def exit_with(code):
        sys.exit(int(code))

    def has_module(name):
        print("has", name, name in sys.modules, flush=True)  # what the zygote had imported when it forked us
    """
)

ENV_JOB = "TRAINFORGE_JOB_ID"
ENV_SERVER = "TRAINFORGE_SERVER_ID"


class Zygote:
    def __init__(self, tmp_path, learn: bool = False, env: dict[str, str] | None = None):
        self.dir = tmp_path
        (tmp_path / "zchild.py").write_text(CHILD_MODULE)
        self.path = zygote.socket_path(str(tmp_path))
        self.log = str(tmp_path / "zygote.log")
        self.learn_file = str(tmp_path / "learned") if learn else None
        base = dict(os.environ if env is None else env)
        base["PYTHONPATH"] = os.pathsep.join([str(tmp_path), base.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        self.proc, ready_fd = zygote.launch(self.path, log_path=self.log, learn_file=self.learn_file,
                                            preload=("trainforge",), env=base)  # fmt: skip
        try:
            ready, _, _ = select.select([ready_fd], [], [], 60)
            self.ready_line = os.read(ready_fd, 100) if ready else b""
        finally:
            os.close(ready_fd)

    def spawn(self, target: str, *args, env: dict[str, str] | None = None, out=None, **kw) -> zygote.ZygoteChild:
        out_path = self.dir / "child.out"
        fd = os.open(out if out is not None else out_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            request = zygote.SpawnRequest(
                target=f"zchild:{target}", args=list(args), env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                cwd=str(self.dir), fds={1: 0, 2: 0}, mark=(ENV_JOB, ENV_SERVER), **kw,
            )  # fmt: skip
            return zygote.spawn(self.path, request, [fd])
        finally:
            os.close(fd)

    def output(self) -> str:
        return (self.dir / "child.out").read_text()

    def close(self) -> int:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        return self.proc.wait(timeout=30)


@pytest.fixture
def zyg(tmp_path):
    z = Zygote(tmp_path)
    yield z
    z.close()


def test_a_forked_child_runs_its_target_with_its_own_environment_cwd_and_output(zyg):
    assert zyg.ready_line.startswith(b"ready")
    child = zyg.spawn("hello", 7, env={ENV_JOB: "42", ENV_SERVER: "srv1"})
    assert child.wait(timeout=30) == 7
    assert child.returncode == 7 and child.poll() == 7
    out = zyg.output()
    assert f"out {child.pid} 42 {zyg.dir} ['zchild', '7']" in out
    assert "err line" in out  # fd 2 went where it was told too


def test_the_job_marks_show_in_proc_environ_and_the_command_line_names_the_module(zyg):
    child = zyg.spawn("sleep", 60, env={ENV_JOB: "123456", ENV_SERVER: "abcdef012345"})
    try:
        p = psutil.Process(child.pid)
        env = p.environ()  # /proc/PID/environ: the exec-time block, rewritten in place by the child
        assert env[ENV_JOB] == "123456" and env[ENV_SERVER] == "abcdef012345"
        assert zygote.MARK_VAR not in env
        assert p.cmdline()[1:] == ["-m", "zchild", "60"]
        assert p.ppid() == zyg.proc.pid
        assert os.getsid(child.pid) == child.pid  # its own session (new_session=True)
    finally:
        child.kill()
    assert child.wait(timeout=10) == -signal.SIGKILL


def test_exit_codes_match_popen_for_exceptions_sys_exit_and_signals(zyg):
    assert zyg.spawn("fail").wait(timeout=30) == 1
    assert "RuntimeError: boom in the child" in zyg.output()
    assert zyg.spawn("exit_with", 5).wait(timeout=30) == 5
    child = zyg.spawn("sleep", 60)
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(timeout=0.05)
    assert child.poll() is None
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=10) == -signal.SIGTERM


def test_a_child_watching_a_process_dies_with_it(zyg):
    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        child = zyg.spawn("sleep", 60, watch_pid=parent.pid)
        assert child.poll() is None
    finally:
        parent.kill()
        parent.wait()
    assert child.wait(timeout=10) == -signal.SIGKILL


def test_once_the_server_pipe_closes_it_serves_no_one_but_stays_for_its_children(zyg):
    child = zyg.spawn("sleep", 60)
    zyg.proc.stdin.close()
    deadline = time.monotonic() + 10
    while os.path.exists(zyg.path) and time.monotonic() < deadline:  # the socket goes first
        time.sleep(0.01)
    with pytest.raises(zygote.ZygoteUnavailable):
        zyg.spawn("hello", 0)
    assert zyg.proc.poll() is None  # still there: its child runs
    child.kill()
    assert child.wait(timeout=10) == -signal.SIGKILL  # the exit status still came through it
    assert zyg.proc.wait(timeout=10) == 0


def test_it_learns_the_modules_its_children_preload_when_idle(tmp_path):
    module = "xml.dom.minidom"  # light, and imported by nothing the zygote preloads
    z = Zygote(tmp_path, learn=True)
    try:
        assert z.spawn("has_module", module).wait(timeout=30) == 0
        assert z.spawn("hello", 0, preload=(module,)).wait(timeout=30) == 0
        deadline = time.monotonic() + 30
        while not (os.path.exists(z.learn_file) and open(z.learn_file).read()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert open(z.learn_file).read().split() == [module]
        assert z.spawn("has_module", module).wait(timeout=30) == 0
    finally:
        z.close()
    z2 = Zygote(tmp_path, learn=True)  # the next zygote (a restarted server's) starts with it
    try:
        assert z2.spawn("has_module", module).wait(timeout=30) == 0
    finally:
        z2.close()
    assert z.output().splitlines()[0] == f"has {module} False"
    assert [line for line in z.output().splitlines() if line.startswith("has")][1:] == [f"has {module} True"] * 2


def test_a_zygote_that_cannot_mark_its_children_refuses_to_serve(tmp_path):
    env = dict(os.environ)  # started without launch(), so without the placeholder it overwrites
    bare = subprocess.run(
        [sys.executable, "-m", "trainforge._internal.zygote", str(tmp_path / "z2.sock")],
        env={k: v for k, v in env.items() if k != zygote.MARK_VAR}, capture_output=True, text=True, timeout=60,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert bare.returncode == 3
    assert "cannot mark" in bare.stderr
    assert not os.path.exists(tmp_path / "z2.sock")


def _ppid_loop(config):
    import os

    import trainforge as train

    train.report({"ppid": os.getppid(), "pid": os.getpid(), "rank": train.get_context().get_world_rank()})


def _fit(tmp_path, name: str):
    import trainforge as train

    trainer = train.DataParallelTrainer(
        _ppid_loop, scaling_config=train.ScalingConfig(num_workers=2, executor="local"),
        run_config=train.RunConfig(storage_path=str(tmp_path / "runs"), name=name, verbose=0),
    )  # fmt: skip
    run = trainer.fit_iter()
    reports = list(run)
    assert run.result.error is None
    return reports[0].all_metrics  # every rank's first report


def test_a_run_with_a_zygote_forks_its_workers_from_it(zyg, tmp_path, monkeypatch):
    monkeypatch.setenv(zygote.ENV_ZYGOTE, zyg.path)
    ranks = _fit(tmp_path, "forked")
    assert [r["rank"] for r in ranks] == [0, 1]
    assert {r["ppid"] for r in ranks} == {zyg.proc.pid}


def test_a_run_whose_zygote_is_gone_starts_fresh_workers(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(zygote.ENV_ZYGOTE, str(tmp_path / "no-such.sock"))
    with caplog.at_level("WARNING", logger="trainforge"):
        ranks = _fit(tmp_path, "fresh")
    assert {r["ppid"] for r in ranks} == {os.getpid()}
    assert "starting this run's workers as fresh processes" in caplog.text


def test_a_child_gets_the_sys_path_its_own_pythonpath_gives(zyg, tmp_path):
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "onlyhere.py").write_text("import sys\ndef main():\n    print('found', sys.path.index(__file__.rsplit('/', 1)[0]))\n")
    out = tmp_path / "pp.out"
    fd = os.open(out, os.O_WRONLY | os.O_CREAT)
    try:
        request = zygote.SpawnRequest(
            target="onlyhere:main", args=[], env={**os.environ, "PYTHONPATH": str(other)}, cwd=str(tmp_path),
            fds={1: 0, 2: 0},
        )  # fmt: skip
        assert zygote.spawn(zyg.path, request, [fd]).wait(timeout=30) == 0
    finally:
        os.close(fd)
    assert out.read_text().strip() == "found 1"  # right after sys.path[0], as a fresh interpreter puts it


def test_a_process_whose_environment_changes_how_python_starts_is_refused(zyg):
    with pytest.raises(zygote.ZygoteUnavailable, match="PYTHONHASHSEED"):
        zyg.spawn("hello", 0, env={"PYTHONHASHSEED": "123"})
    assert zyg.spawn("hello", 0).wait(timeout=30) == 0  # and it still serves
