"""The live console view of a run on a terminal: workers and their state, each rank's latest report,
reporting rate, checkpoints and restarts; plain lines when output is not a terminal."""

from __future__ import annotations

import io
import os
import pty
import re
import select
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

import trainforge
from trainforge._internal.live_view import ENV_PLAIN, LiveView, live_view_available
from trainforge._internal.worker_group.api import WorkerMetadata

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _plain(text: str) -> str:
    """What the terminal shows, colours and cursor moves taken out."""
    return _ANSI.sub("", text).replace("\r", "")


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")


def _report(index, metrics, checkpoint=None, attempt=0):
    return SimpleNamespace(index=index, metrics=metrics[0], all_metrics=metrics, attempt=attempt,
                           checkpoint=SimpleNamespace(path=f"/r/{checkpoint}") if checkpoint else None)  # fmt: skip


def test_the_panel_shows_workers_reports_checkpoints_restarts_and_the_end():
    out = FakeTerminal()
    view = LiveView(1, "demo", out=out)
    view.on_run_start("/results/demo", 2)
    view.on_workers_start([WorkerMetadata(rank=r, local_rank=r, node_rank=0, pid=4000 + r, hostname="h",
                                          node_ip="127.0.0.1") for r in (0, 1)])  # fmt: skip
    view.on_report(_report(0, [{"loss": 0.5}, {"loss": 0.75}]))
    view.on_report(_report(1, [{"loss": 0.25}, {"loss": 0.375}], checkpoint="checkpoint_000000"))
    view.on_restart(1, "rank 1 died (SIGKILL)")
    view.on_workers_start([WorkerMetadata(rank=r, local_rank=r, node_rank=0, pid=5000 + r, hostname="h",
                                          node_ip="127.0.0.1") for r in (0, 1)])  # fmt: skip
    view.on_report(_report(2, [{"loss": 0.125}, {"loss": 0.1875}], attempt=1))
    view.on_run_end(SimpleNamespace(error=None, checkpoint=SimpleNamespace(path="/r/checkpoint_000000")))
    text = _plain(out.getvalue())
    final = text[text.rindex("trainforge demo"):]  # the last frame drawn
    assert "finished" in final and "5000" in final and "5001" in final and "4000" not in final
    assert "loss=0.125" in final and "loss=0.1875" in final  # each rank's own latest metrics
    assert "reports 3" in final and "checkpoints 1 (latest checkpoint_000000)" in final
    assert "restarts 1" in final and "last restart: rank 1 died (SIGKILL)" in final
    assert "results: /results/demo" in final
    assert "finished in" in text and "latest checkpoint: /r/checkpoint_000000" in text  # closing lines
    assert "[report" not in text  # no per-report lines under the panel


def test_the_view_is_used_only_on_a_terminal_with_rich(monkeypatch):
    assert live_view_available(FakeTerminal())
    assert not live_view_available(io.StringIO())
    monkeypatch.setenv(ENV_PLAIN, "1")
    assert not live_view_available(FakeTerminal())


def _run_on_a_terminal(tmp_path, env_extra):
    """tests/scripts/live_view_run.py with its stdout and stderr on a pseudo-terminal; all it wrote."""
    master, slave = pty.openpty()
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(trainforge.__file__)), "COLUMNS": "160",
           **env_extra}  # fmt: skip
    proc = subprocess.Popen([sys.executable, os.path.join(SCRIPTS, "live_view_run.py"), str(tmp_path)],
                            stdout=slave, stderr=slave, stdin=subprocess.DEVNULL, env=env)  # fmt: skip
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the terminal's last writer is gone
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(master)
    assert proc.wait(timeout=30) == 0
    return _plain(b"".join(chunks).decode(errors="replace"))


@pytest.mark.slow
def test_a_fit_on_a_terminal_draws_the_panel_and_plain_mode_prints_lines(tmp_path):
    text = _run_on_a_terminal(tmp_path / "a", {})
    assert "PIDS-DONE" in text and "trainforge live" in text
    final = text[text.rindex("trainforge live"):]
    assert "finished" in final and "checkpoints 1" in final and "loss=0.25" in final and "step=3" in final
    assert "[report" not in text
    plain = _run_on_a_terminal(tmp_path / "b", {ENV_PLAIN: "1"})
    assert "[report 3] step=3" in plain and "trainforge live" not in plain


class _JobWithLateReports:
    """A followed job whose reports reach the client only after its output stream has ended (the
    two are separate streams of the server): the panel's end must still count all of them."""

    def __init__(self, n: int):
        import threading

        self.id, self.n, self.asked = 7, n, threading.Event()
        self.submitted, self.output_ended = None, False

    def status(self):
        from trainforge.client import JobStatus

        if self.output_ended:  # follow() asks once the output has ended; the reports are still coming
            self.asked.set()
        return JobStatus.from_json({"id": 7, "name": "late", "state": "SUCCEEDED", "run_path": "/r/late",
                                    "priority": 0, "request": {"workers": 2}})  # fmt: skip

    def logs(self, follow=False):
        yield "hello from the runner\n"
        self.output_ended = True

    def reports(self):
        assert self.asked.wait(30)
        for step in range(self.n):
            yield _report(step, [{"step": step}, {"step": step}])


def test_a_followed_jobs_last_panel_waits_for_reports_still_on_their_way():
    from trainforge.server._job_view import follow

    out = FakeTerminal()
    status = follow(_JobWithLateReports(40), out)
    assert status is not None and status.state == "SUCCEEDED"
    text = _plain(out.getvalue())
    final = text[text.rindex("trainforge job 7 (late)"):]
    assert "finished" in final and "reports 40" in final and "step=39" in final


@pytest.mark.slow
def test_a_followed_server_job_on_a_terminal_gets_the_same_panel(train_server, tmp_path):
    """trainer.submit(wait=True) / `trainforge submit` on a terminal: the panel, fed by the job's state
    and reports; the runner's per-report lines are not repeated under it, its other output is."""
    from trainforge import DataParallelTrainer, RunConfig, ScalingConfig
    from trainforge.server._job_view import follow

    def loop():
        for step in range(5):
            trainforge.report({"step": step, "rank": trainforge.get_context().get_world_rank()})

    trainer = DataParallelTrainer(loop, scaling_config=ScalingConfig(num_workers=2),
                                  run_config=RunConfig(name="followed", storage_path=str(tmp_path), verbose=1))  # fmt: skip
    job = trainer.submit()
    out = FakeTerminal()
    status = follow(job, out)
    assert status is not None and status.state == "SUCCEEDED"
    text = _plain(out.getvalue())
    final = text[text.rindex(f"trainforge job {job.id} (followed)"):]
    assert "finished" in final and "reports 5" in final and "step=4 rank=1" in final
    assert "[report " not in text and "finished in" in text  # the runner's own closing line
    assert text.rstrip().endswith(status.describe())
