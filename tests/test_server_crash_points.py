"""The train server killed at every named crash point (``trainforge/server/_crash.py``: the server
``os._exit``s there, as a ``kill -9`` would leave it) while a client submits, a job starts, is stopped,
ends, or is reattached; then restarted on the same state directory. After each: the jobs the client
was told about are exactly the jobs the server has, each ran exactly once, none is stuck, and nothing
of a submission that never committed is left in ``jobs/``. Every job is submitted with
``max_retries=0``: a crash of the server spends none of a job's retries (at ``start:granted`` its
runner never started: the job goes back to the queue as it was, and runs once, attempt 1).

The client is the real one (``Client.submit`` retries a dropped submission with its idempotency key
until the restarted server answers; it finds the new address in the state directory)."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

from trainforge.server import Client, ServerNotFoundError
from trainforge.server._crash import CRASH_EXIT_CODE, CRASH_POINTS

pytestmark = pytest.mark.slow
pytest.importorskip("fastapi")

from trainforge._testing.server import TrainServer  # noqa: E402

JOB = os.path.join(os.path.dirname(__file__), "scripts", "crash_walk_job.py")
CRASH_ENV = "TRAINFORGE_CRASH_AT"


class Walk:
    """One scenario's servers (each started on the same state directory), its client and its job files."""

    def __init__(self, tmp_path: Any):
        self.state_dir = str(tmp_path / "server")
        self.marker = str(tmp_path / "ran.log")
        self.gate = str(tmp_path / "gate")
        self.servers: list[TrainServer] = []
        self.told: set[int] = set()  # the jobs a client was told about

    def start(self, crash_at: str | None = None) -> TrainServer:
        server = TrainServer(self.state_dir, env={CRASH_ENV: crash_at} if crash_at else {})
        self.servers.append(server)
        return server.start()

    def crashed(self, server: TrainServer) -> None:
        assert server.proc is not None
        assert server.proc.wait(timeout=60) == CRASH_EXIT_CODE, server.output

    def client(self) -> Client:
        return Client(state_dir=self.state_dir)  # found through the address file, as the CLI does

    def spec(self, *, gated: bool) -> dict[str, Any]:
        return {"kind": "script", "path": JOB, "args": [self.marker, self.gate if gated else "-"], "name": "walk",
                "max_retries": 0}

    def submit_in_thread(self, spec: dict[str, Any]) -> tuple[threading.Thread, list[Any]]:
        got: list[Any] = []

        def go() -> None:
            try:
                job = self.client().submit(spec, wait_s=90)
                self.told.add(job.id)
                got.append(job)
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                got.append(exc)

        thread = threading.Thread(target=go, daemon=True)
        thread.start()
        return thread, got

    def runs(self) -> list[int]:
        if not os.path.exists(self.marker):
            return []
        with open(self.marker) as f:
            return [int(line) for line in f.read().split()]

    def check(self, server: TrainServer, end_state: str) -> None:
        """Every job the client was told about is on the server, ended in ``end_state``, ran once;
        the server has no other job and ``jobs/`` holds nothing else."""
        client = server.client()
        for job_id in self.told:
            status = client.job(job_id).wait(timeout=90)
            assert status.state == end_state, (status, server.output)
            assert client.request("GET", f"/jobs/{job_id}")["attempt"] == 1, server.output  # no retry spent
        assert {j.id for j in client.jobs(limit=100)} == self.told, server.output
        assert sorted(self.runs()) == sorted(self.told), f"ran {self.runs()}, told {self.told}"
        assert sorted(os.listdir(os.path.join(self.state_dir, "jobs"))) == sorted(str(j) for j in self.told)

    def cleanup(self) -> list[Any]:
        left = []
        for server in reversed(self.servers):
            left += server.cleanup()
        return left


@pytest.fixture
def walk(tmp_path):
    w = Walk(tmp_path)
    yield w
    left = w.cleanup()
    assert not left, f"processes left behind: {left}"


def test_the_walk_covers_every_crash_point():
    walked = {p for group in (SUBMIT, START, STOP) for p in group} | {"finish:read", "reattach:recorded"}
    assert walked == set(CRASH_POINTS)


SUBMIT = ("submit:staged", "submit:inserted", "submit:placed", "submit:committed")
START = ("start:granted", "start:spawned")
STOP = ("stop:stopping", "stop:signalled")


@pytest.mark.parametrize("point", SUBMIT + START)
def test_a_submission_cut_by_a_crash_is_queued_once_and_runs_once(walk, point):
    """The crash cuts the submit request (before its reply: a submission starts its job at once when
    resources are free, so the start points are reached inside it too); the client sends it again
    with the same key to the restarted server."""
    first = walk.start(crash_at=point)
    thread, got = walk.submit_in_thread(walk.spec(gated=False))
    walk.crashed(first)
    second = walk.start()
    thread.join(120)
    assert got and not isinstance(got[0], BaseException), got
    assert got[0].created == (point in SUBMIT[:3]), point  # committed before the crash: the earlier try's job
    walk.check(second, "SUCCEEDED")


@pytest.mark.parametrize("point", STOP)
def test_a_stop_cut_by_a_crash_is_finished_by_the_restarted_server(walk, point):
    first = walk.start(crash_at=point)
    job = walk.client().submit(walk.spec(gated=True))
    walk.told.add(job.id)
    reached = threading.Event()
    threading.Thread(target=lambda: (next(iter(job.client.stream(f"/jobs/{job.id}/logs/stream"))), reached.set()),
                     daemon=True).start()  # fmt: skip
    assert reached.wait(60), first.output  # the job's runner is up (it printed its first line)
    with pytest.raises(ServerNotFoundError):
        job.stop()  # cut by the crash
    walk.crashed(first)
    second = walk.start()
    walk.check(second, "STOPPED")  # not left STOPPING, nor reattached and run on to its end


def test_a_crash_while_recording_an_end_loses_no_outcome(walk):
    first = walk.start(crash_at="finish:read")
    job = walk.client().submit(walk.spec(gated=False))
    walk.told.add(job.id)
    walk.crashed(first)  # the job ended; the server died reading its outcome
    second = walk.start()
    walk.check(second, "SUCCEEDED")


def test_a_crash_while_reattaching_then_a_restart_reattaches(walk):
    first = walk.start()
    job = walk.client().submit(walk.spec(gated=True))
    walk.told.add(job.id)
    assert job.submitted is not None and job.submitted.state == "RUNNING"
    first.kill9()
    second = walk.start(crash_at="reattach:recorded")
    walk.crashed(second)
    third = walk.start()
    with open(walk.gate, "w"):
        pass  # the job may end now
    walk.check(third, "SUCCEEDED")
