"""The train server lends elastic jobs' extra workers and takes them back (``JobService._shrink`` and
``_resized``), driven without runner processes: the service is built directly, its runners are fake
processes that never end on their own, and the jobs' events are written to their events files with
the callback the core uses, then read by one pass of the tailer."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import types

import pytest

from trainforge._internal.controller import resize_reason
from trainforge._internal.job_events import JobEventsCallback
from trainforge.server.jobs import processes as _processes
from trainforge.server.jobs.runner import EVENTS_FILE, GRANT_FILE
from trainforge.server.jobs.service import JobService


class _FakeRunner:
    """Stands in for a runner's ``Popen``: no process; ``wait()`` returns once the test ends."""

    release = threading.Event()
    started: list[list[str]] = []

    def __init__(self, args: list[str], **kwargs: object):
        self.args = args
        self.pid = os.getpid()
        _FakeRunner.started.append(args)

    def wait(self, timeout: float | None = None) -> int:
        _FakeRunner.release.wait()
        return 0

    def poll(self) -> int | None:
        return None


@pytest.fixture
def make_service(tmp_path, monkeypatch):
    fake = types.SimpleNamespace(Popen=_FakeRunner, DEVNULL=subprocess.DEVNULL, STDOUT=subprocess.STDOUT,
                                 PIPE=subprocess.PIPE)  # fmt: skip
    monkeypatch.setattr(_processes, "subprocess", fake)
    _FakeRunner.release = threading.Event()
    services: list[JobService] = []

    def make(cpus: float) -> JobService:
        service = JobService(str(tmp_path / f"state{len(services)}"), {"CPU": float(cpus)})
        services.append(service)
        return service

    yield make
    for service in services:
        service._closing.set()  # the fake runners' waiters then end without recording anything
    _FakeRunner.release.set()
    for service in services:
        service.close()


def _submit(service: JobService, name: str, lo: int, hi: int | None = None, *, priority: int = 0) -> int:
    spec = {"kind": "script", "path": "train.py", "per_worker": {"CPU": 1}, "min_workers": lo, "max_workers": hi}
    job, _ = service.submit(name=name, spec=spec, priority=priority)
    return job.id


def _grant_file(service: JobService, job_id: int) -> dict[str, float]:
    with open(os.path.join(service.job_dir(job_id), GRANT_FILE)) as f:
        return json.load(f)


def _events(service: JobService, job_id: int, *types_: str) -> list[dict]:
    return [e.payload for e in service.store.events_after(0, job_id) if e.type in types_]


def _report(service: JobService, job_id: int, world: int) -> None:
    line = {"type": "report", "index": 0, "attempt": 0, "metrics": {"x": 1}, "all_metrics": [{"x": 1}] * world,
            "checkpoint": None, "t": 0.0}  # fmt: skip
    with open(os.path.join(service.job_dir(job_id), EVENTS_FILE), "a") as f:
        f.write(json.dumps(line) + "\n")


def _resize(service: JobService, job_id: int, workers: int, attempt: int = 1) -> None:
    """What the core writes when it resizes the job's group at a checkpoint."""
    JobEventsCallback(os.path.join(service.job_dir(job_id), EVENTS_FILE)).on_resize(attempt, workers, resize_reason(workers))


def _state(service: JobService, job_id: int) -> str:
    return service.get(job_id).state


def test_resize_restarts_carry_their_worker_count_in_the_job_events(tmp_path):
    path = str(tmp_path / "events.jsonl")
    callback = JobEventsCallback(path)
    callback.on_resize(1, 3, resize_reason(3))
    callback.on_restart(2, "rank 0 (pid 12): RuntimeError: boom")
    with open(path) as f:
        first, second = (json.loads(line) for line in f)
    assert first["workers"] == 3 and first["reason"] == "resize to 3 workers"
    assert "workers" not in second


def test_a_blocked_job_shrinks_the_lowest_priority_then_newest_lenders_just_enough(make_service):
    service = make_service(8)
    low = _submit(service, "low", 1, 3, priority=-1)  # older, but lowest priority: asked first
    old = _submit(service, "old", 1, 3)
    new = _submit(service, "new", 1, 2)
    assert [service.get(j).workers for j in (low, old, new)] == [3, 3, 2]
    waiting = _submit(service, "fixed", 3)
    assert _state(service, waiting) == "QUEUED"
    # low gives 2 (down to its minimum), new gives 1, old none: 3 CPUs, no more
    assert _grant_file(service, low) == {"CPU": 1.0} and _grant_file(service, new) == {"CPU": 1.0}
    assert _grant_file(service, old) == {"CPU": 3.0} and _events(service, old, "shrink") == []
    assert _events(service, low, "shrink") == [{"workers": 1, "for_job": waiting}]
    assert _events(service, new, "shrink") == [{"workers": 1, "for_job": waiting}]
    # Until the jobs resize, their resources are theirs, and nobody is asked twice.
    assert service.grants()[low]["grant"] == {"CPU": 3.0} and service.free() == {"CPU": 0.0}
    service._schedule()
    assert len(_events(service, low, "shrink")) == 1
    _report(service, low, 3)
    service._tail_once()
    assert service.grants()[low]["grant"] == {"CPU": 3.0}

    _resize(service, low, 1)  # low's next checkpoint: it restarts with 1 worker
    service._tail_once()
    assert service.grants()[low]["grant"] == {"CPU": 1.0} and service.get(low).workers == 1
    assert _events(service, low, "shrunk") == [{"workers": 1, "grant": {"CPU": 1.0}}]
    assert _state(service, waiting) == "QUEUED"  # 2 free, needs 3: new has not shrunk yet
    _resize(service, new, 1)
    service._tail_once()
    assert _state(service, waiting) == "RUNNING" and service.free() == {"CPU": 0.0}
    restart = _events(service, new, "restart")[0]
    assert restart["workers"] == 1 and restart["reason"] == "resize to 1 workers"


def test_no_shrink_when_all_the_extras_cannot_cover_what_the_job_lacks_nor_below_a_minimum(make_service):
    service = make_service(6)
    fixed = _submit(service, "fixed", 2)
    elastic = _submit(service, "elastic", 2, 4)
    assert service.get(elastic).workers == 4 and service.get(fixed).workers == 2
    big = _submit(service, "big", 3)  # lacks 3; the elastic job can lend only 2 (its minimum is 2)
    assert _state(service, big) == "QUEUED"
    assert _grant_file(service, elastic) == {"CPU": 4.0} and _events(service, elastic, "shrink") == []
    small = _submit(service, "small", 2)  # behind big: only the first blocked job is lent to
    assert _events(service, elastic, "shrink") == []
    service.stop(big)
    assert _events(service, elastic, "shrink") == [{"workers": 2, "for_job": small}]  # down to its minimum
    _resize(service, elastic, 2)
    service._tail_once()
    assert _state(service, small) == "RUNNING" and service.get(elastic).workers == 2


def test_a_shrinking_job_does_not_grow_until_it_has_shrunk(make_service):
    service = make_service(4)
    elastic = _submit(service, "elastic", 1, 5)
    waiting = _submit(service, "waiting", 2)
    assert _events(service, elastic, "shrink") == [{"workers": 2, "for_job": waiting}]
    service.stop(waiting)  # the job it shrinks for goes away, and capacity grows
    service.capacity["CPU"] = 5.0
    service._schedule()
    assert _grant_file(service, elastic) == {"CPU": 2.0} and _events(service, elastic, "grow") == []
    _resize(service, elastic, 2)
    service._tail_once()
    assert _events(service, elastic, "shrunk") == [{"workers": 2, "grant": {"CPU": 2.0}}]
    # shrunk, with no job waiting: it grows into what is free again
    assert service.get(elastic).workers == 5 and _grant_file(service, elastic) == {"CPU": 5.0}


def test_a_grow_not_yet_applied_is_taken_back_without_waiting_for_a_resize(make_service):
    service = make_service(2)
    elastic = _submit(service, "elastic", 1, 4)
    _report(service, elastic, 2)
    service._tail_once()
    service.capacity["CPU"] = 4.0
    service._schedule()
    assert service.get(elastic).workers == 4  # granted; the group still runs 2 until its next checkpoint
    waiting = _submit(service, "waiting", 2)
    assert _events(service, elastic, "shrink") == [{"workers": 2, "for_job": waiting}]
    service._tail_once()  # it already runs within 2 workers: no resize will come, none is needed
    assert _state(service, waiting) == "RUNNING"
    assert service.get(elastic).workers == 2 and _events(service, elastic, "shrunk") == [
        {"workers": 2, "grant": {"CPU": 2.0}}
    ]


def test_a_shrink_asked_for_before_a_server_restart_is_still_seen(make_service):
    service = make_service(3)
    elastic = _submit(service, "elastic", 1, 3)
    waiting = _submit(service, "waiting", 2)
    assert _events(service, elastic, "shrink") == [{"workers": 1, "for_job": waiting}]
    service.elastic.shrinking.clear()  # as after a restart: only the grant file remembers the request
    _resize(service, elastic, 1)
    service._tail_once()
    assert service.get(elastic).workers == 1 and _state(service, waiting) == "RUNNING"
