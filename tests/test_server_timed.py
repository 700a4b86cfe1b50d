"""Issue 35's two scheduling defects, on a real JobService whose runners are fake processes (no
process runs: ``Popen`` stands in; a job's runner "ends" when the test sets its event, and ``_finish``
then runs on the waiter thread as for a real runner):

- **usage from the first second**: a job is charged from the moment it holds resources until it
  releases them, with no decision between its start and its end (the clock is the test's);
- **preemption by the clock**: with no other event, an urgent job preempts a preemptible one within
  its exemption (the scheduler's alarm, armed for the moment it ends, decides again); an idle server
  arms no alarm.

No test sleeps: each waits on an event or a state with a timeout."""

from __future__ import annotations

import os
import subprocess
import threading
import types

import pytest

from trainforge._testing.wait import wait_until
from trainforge.client._states import JobState
from trainforge.server.jobs import processes as _processes
from trainforge.server.jobs.service import JobService
from trainforge.server.scheduling.team_policy import TeamPolicy


class _FakeRunner:
    """Stands in for a runner's ``Popen``: no process; ``wait()`` returns once its job's event is set."""

    ends: dict[int, threading.Event] = {}

    def __init__(self, args: list[str], **kwargs: object):
        self.pid = os.getpid()
        self.job_id = int(os.path.basename(args[-1]))
        self.end = _FakeRunner.ends.setdefault(self.job_id, threading.Event())

    def wait(self, timeout: float | None = None) -> int:
        self.end.wait()
        return 0

    def poll(self) -> int | None:
        return None


class _Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def make_service(tmp_path, monkeypatch):
    fake = types.SimpleNamespace(Popen=_FakeRunner, DEVNULL=subprocess.DEVNULL, STDOUT=subprocess.STDOUT,
                                 PIPE=subprocess.PIPE)  # fmt: skip
    monkeypatch.setattr(_processes, "subprocess", fake)
    _FakeRunner.ends = {}
    services: list[JobService] = []

    def make(capacity: dict[str, float], **kwargs: object) -> JobService:
        service = JobService(str(tmp_path / f"state{len(services)}"), capacity, warm=False, **kwargs)  # type: ignore[arg-type]
        services.append(service)
        return service

    yield make
    for service in services:
        service._closing.set()  # the fake runners' waiters then end without recording anything
    for end in list(_FakeRunner.ends.values()):
        end.set()
    for service in services:
        service.close()


def _submit(service: JobService, owner: str, *, priority: int = 0, preemptible: bool = False, **per_worker: float) -> int:
    spec = {"kind": "script", "path": "train.py", "per_worker": per_worker or {"CPU": 1}}
    job, _ = service.submit(name=f"{owner}-job", spec=spec, owner=owner, priority=priority, preemptible=preemptible,
                            max_retries=0)  # its runner ending ends it (no outcome file: no retry)
    return job.id


def _end(service: JobService, job_id: int) -> None:
    """The job's runner ends; returns once the service has recorded it."""
    _FakeRunner.ends[job_id].set()
    wait_until(lambda: service.get(job_id).state not in (JobState.RUNNING, JobState.STOPPING), 30, f"job {job_id} to end")


def test_a_job_is_charged_from_its_start_to_its_end_with_no_decision_between(make_service):
    """On CPU=4,GPU=2, bob's 1-CPU + 1-GPU job (dominant share 1/2) and ann's 1-CPU job (1/4): each is
    charged from its first second, the most recently started included, and for all of a job that
    started and ended with nothing else happening."""
    clock = _Clock(1000.0)
    service = make_service({"CPU": 4.0, "GPU": 2.0}, clock=clock, team=TeamPolicy(half_life_s=float("inf")))
    ann = _submit(service, "ann", CPU=1)
    bob = _submit(service, "bob", CPU=1, GPU=1)  # the most recently started
    assert service.get(ann).state == service.get(bob).state == JobState.RUNNING
    clock.now = 1010.0
    assert service.ledger.usage(clock.now) == {"ann": pytest.approx(2.5), "bob": pytest.approx(5.0)}
    _end(service, bob)  # its end is the first event since it started
    clock.now = 1030.0
    assert service.ledger.usage(clock.now) == {"ann": pytest.approx(7.5), "bob": pytest.approx(5.0)}


def test_the_user_who_held_the_cpu_longer_waits_behind_the_other(make_service):
    """On CPU=1, ann's job holds the CPU 1 s, then bob's 2 s: the next decision between a job of each
    starts ann's (fair share from usage charged to the second)."""
    clock = _Clock(1000.0)
    service = make_service({"CPU": 1.0}, clock=clock, team=TeamPolicy(half_life_s=float("inf")))
    first = _submit(service, "ann")
    second = _submit(service, "bob")
    clock.now = 1001.0
    _end(service, first)  # bob's starts now
    assert service.get(second).state == JobState.RUNNING
    later_bob = _submit(service, "bob")
    later_ann = _submit(service, "ann")  # submitted after bob's
    clock.now = 1003.0
    _end(service, second)
    assert service.ledger.usage(clock.now) == {"ann": pytest.approx(1.0), "bob": pytest.approx(2.0)}
    assert service.get(later_ann).state == JobState.RUNNING and service.get(later_bob).state == JobState.QUEUED


def test_an_urgent_job_preempts_within_the_exemption_with_no_other_event(make_service):
    exempt = 0.5
    service = make_service({"CPU": 1.0}, team=TeamPolicy(preempt_exempt_s=exempt))
    stopped = threading.Event()
    service.scheduling.preemptor.stop_runner = lambda job_id: stopped.set()  # no process to stop
    low = _submit(service, "ann", preemptible=True)
    started = service.ledger.get(low).started_at
    assert service.scheduling.alarm.at is None  # nothing waits: no alarm
    urgent = _submit(service, "bob", priority=5)
    assert service.get(urgent).state == JobState.QUEUED and service.scheduling.alarm.at == pytest.approx(started + exempt)
    assert stopped.wait(30), "the low job was never preempted: the exemption ended with no event to decide on"
    job = service.get(low)
    assert job.state == JobState.STOPPING and job.preemptions == 1
    # Not before the exemption ended, and by the alarm armed for that moment (above): no other event
    # came. How soon after it is a figure, not an assertion (a loaded machine delays a thread): the
    # closing note of issue 35 measures it.
    assert job.preempted_at >= started + exempt - 1e-6
    assert service.scheduling.alarm.fired >= 1


def test_an_idle_server_and_one_with_nothing_to_preempt_arm_no_alarm(make_service):
    service = make_service({"CPU": 1.0}, team=TeamPolicy(preempt_exempt_s=60))
    low = _submit(service, "ann")  # not preemptible
    urgent = _submit(service, "bob", priority=5)
    assert service.get(low).state == JobState.RUNNING and service.get(urgent).state == JobState.QUEUED
    assert service.scheduling.alarm.at is None and service.scheduling.alarm.fired == 0
    quiet = make_service({"CPU": 1.0}, team=TeamPolicy(preempt_exempt_s=60, preemption=False))
    _submit(quiet, "ann", preemptible=True)
    _submit(quiet, "bob", priority=5)
    assert quiet.scheduling.alarm.at is None
