"""Scheduling policies as plug-ins (:mod:`trainforge.server.scheduling.policy`): the registry builds
them by name (a miss lists the names), and ``max_running:N``, written as docs/team-server.md says
("Writing a policy": one module, one hook), holds a user's job once they run N, with its own reason,
while another user's job starts; the quick path over a kept queue and the full walk still agree with
it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainforge.server.scheduling.decision import Pending
from trainforge.server.scheduling.policies import DEFAULT_POLICIES, REGISTRY, build, build_all
from trainforge.server.scheduling.policies.max_running import MaxRunning
from trainforge.server.scheduling.policies.preemption import Preemption
from trainforge.server.scheduling.policy import Policy, PolicySet
from trainforge.server.scheduling.rule import JobRequest, RunningJob, Team, decide, free_resources, order
from trainforge.server.scheduling.scan import Scan
from trainforge.server.scheduling.waiting import WaitingQueue

CAPACITY = {"CPU": 8.0}


def _job(job_id: int, user: str, cpus: float = 1.0, priority: int = 0) -> JobRequest:
    return JobRequest(job_id, seq=job_id, per_worker={"CPU": cpus}, user=user, priority=priority)


def test_the_registry_builds_policies_by_name_and_a_miss_lists_the_names():
    assert isinstance(build("max_running:2"), MaxRunning) and build("max_running:2").limit == 2
    assert [p.name for p in build_all(DEFAULT_POLICIES)] == list(DEFAULT_POLICIES)
    with pytest.raises(ValueError, match="fair_share, max_running, preemption, priority, quota"):
        build("max-running:2")
    for bad in ("max_running", "max_running:0", "max_running:two", "quota:3", "preemption:x"):
        with pytest.raises(ValueError, match=bad.split(":")[0]):
            build(bad)
    with pytest.raises(ValueError, match="at most once"):
        build_all(["quota", "quota"])
    assert set(REGISTRY) >= set(DEFAULT_POLICIES)


def test_max_running_holds_a_users_third_job_while_another_users_job_starts():
    policies = build_all([*DEFAULT_POLICIES, "max_running:2"])
    running = [RunningJob(1, {"CPU": 1.0}, user="ann"), RunningJob(2, {"CPU": 1.0}, user="ann")]
    queue = [_job(3, "ann"), _job(4, "bob"), _job(5, "bob"), _job(6, "bob")]
    decision = decide(queue, running, CAPACITY, Team(), policies)
    assert [s.job_id for s in decision.starts] == [4, 5]
    assert decision.reason(3) == Pending(3, 1, "max_running", limit={"jobs": 2.0},
                                         note="its user runs 2 jobs, at most 2")  # fmt: skip
    assert decision.reason(3).describe() == "its user runs 2 jobs, at most 2"
    assert decision.reason(6).reason == "max_running"  # bob's two that just started count
    # without the policy, every job starts
    assert len(decide(queue, running, CAPACITY, Team(), build_all(DEFAULT_POLICIES)).starts) == 4


class _Everyone(Policy):
    """A policy of one's own: only the hooks it needs (here none but describe)."""

    name = "everyone"

    def describe(self) -> str:
        return "changes nothing"


def test_a_policy_overrides_only_the_hooks_it_needs():
    policies = PolicySet([_Everyone(), MaxRunning(1), Preemption(5.0, 10.0)])
    assert [p.name for p in policies.admitters] == ["max_running"]
    assert [p.name for p in policies.preempters] == ["preemption"]
    assert [p.name for p in policies.orderers] == []
    assert policies.describe()[0] == {"name": "everyone", "description": "changes nothing"}


def test_preemption_says_when_a_job_leaves_its_exemption_or_cooldown():
    policy = Preemption(exempt_s=60.0, cooldown_s=600.0)
    urgent = _job(9, "bob", priority=5)
    young = RunningJob(1, {"CPU": 8.0}, priority=0, preemptible=True, run_s=20.0)
    assert policy.next_change(urgent, [young], 1000.0) == 1040.0
    cooled = RunningJob(2, {"CPU": 8.0}, preemptible=True, run_s=100.0, since_preempted_s=500.0)
    assert policy.next_change(urgent, [young, cooled], 1000.0) == 1040.0
    assert policy.next_change(urgent, [cooled], 1000.0) == 1100.0
    assert policy.next_change(None, [young], 1000.0) is None  # nothing waits: no wake-up
    assert policy.next_change(_job(9, "bob", priority=0), [young], 1000.0) is None  # not urgent enough
    old = RunningJob(3, {"CPU": 8.0}, preemptible=True, run_s=61.0)
    assert policy.next_change(urgent, [old], 1000.0) is None  # it may be preempted now: no later change


jobs = st.lists(st.tuples(st.sampled_from(["ann", "bob", "cat"]), st.sampled_from([0.5, 1.0, 3.0]),
                          st.integers(0, 1), st.booleans()), max_size=25)  # fmt: skip


@settings(deadline=None)
@given(specs=jobs, limit=st.integers(1, 3), held_running=st.integers(0, 3))
def test_max_running_never_lets_a_user_run_more_and_the_quick_path_agrees(specs, limit, held_running):
    queue = [JobRequest(i + 1, seq=i + 1, per_worker={"CPU": cpus}, user=user, priority=prio, held=held)
             for i, (user, cpus, prio, held) in enumerate(specs)]  # fmt: skip
    running = [RunningJob(100 + i, {"CPU": 1.0}, user="ann") for i in range(held_running)]
    policies = build_all(["priority", "fair_share", f"max_running:{limit}"])
    team = Team()
    decision = decide(WaitingQueue(queue), running, CAPACITY, team, policies)
    runs: dict[str, int] = {"ann": held_running}
    for start in decision.starts:
        user = next(j.user for j in queue if j.job_id == start.job_id)
        runs[user] = runs.get(user, 0) + 1
    for user, n in runs.items():
        assert n <= max(limit, held_running if user == "ann" else 0)
    full = Scan(order(queue, policies, team), free_resources(CAPACITY, [r.grant for r in running]), policies, team,
                {"ann": {"CPU": float(held_running)}} if held_running else {}, {"ann": held_running} if held_running else {})  # fmt: skip
    full.run(0, stop_when_saturated=False)
    assert sorted(s.job_id for s in decision.starts) == sorted(s.job_id for s in full.starts)
    assert decision.pending == full.pending


def test_max_running_is_one_line_of_configuration_and_get_queue_and_the_cli_show_its_reason(tmp_path, monkeypatch,
                                                                                              capsys):  # fmt: skip
    """Enabled by one line (``TeamPolicy.policies``), the server holds a user's second job with reason
    ``max_running``: GET /queue shows it, ``trainforge queue`` prints its text, GET /resources (and
    ``trainforge resources``) list the policies, and /metrics has what the policy exposes."""
    pytest.importorskip("fastapi")
    import argparse

    from test_server_api import Api, P

    from trainforge.server.cli import listing
    from trainforge.server.scheduling.team_policy import TeamPolicy

    api = Api(str(tmp_path / "state"), {"CPU": 4.0})
    try:
        api.service.scheduling.policy = TeamPolicy(policies=(*DEFAULT_POLICIES, "max_running:1"))  # the one line
        first, second = api.submit(per_worker={"CPU": 1}), api.submit(per_worker={"CPU": 1})
        assert api.get(f"{P}/jobs/{first['id']}").json()["state"] == "RUNNING"
        queue = api.get(f"{P}/queue").json()
        assert [(e["job_id"], e["pending"]["reason"]) for e in queue["entries"]] == [(second["id"], "max_running")]
        assert queue["entries"][0]["pending"]["text"] == "its user runs 1 jobs, at most 1"
        job = api.get(f"{P}/jobs/{second['id']}").json()
        assert job["state"] == "QUEUED" and job["pending"]["reason"] == "max_running"
        resources = api.get(f"{P}/resources").json()
        assert [p["name"] for p in resources["policies"]] == [*DEFAULT_POLICIES, "max_running"]

        class _Client:
            def queue(self) -> list:
                return queue["entries"]

            def resources(self) -> dict:
                return resources

        monkeypatch.setattr(listing, "client", lambda args: _Client())
        listing.queue_command(argparse.Namespace(json=False))
        listing.resources_command(argparse.Namespace(json=False))
        out = capsys.readouterr().out
        assert "its user runs 1 jobs, at most 1" in out and "max_running: a user runs at most 1 job(s) at once" in out
        metrics = api.get("/metrics").text
        assert "trainforge_policy_max_running_jobs 1.0" in metrics and 'trainforge_user_running_jobs{user="admin"} 1.0' in metrics
    finally:
        api.close()


running_jobs = st.lists(st.tuples(st.integers(0, 2), st.booleans(), st.floats(0, 100), st.none() | st.floats(0, 100),
                                  st.sampled_from([1.0, 2.0, 3.0])), min_size=1, max_size=6)  # fmt: skip


@settings(deadline=None)
@given(jobs_=running_jobs, need=st.sampled_from([1.0, 2.0, 4.0]), exempt=st.floats(0, 60), cooldown=st.floats(0, 120))
def test_following_next_change_preempts_at_the_first_moment_preemption_is_possible(jobs_, need, exempt, cooldown):
    """With no other event, the server decides again at each moment :meth:`Preemption.next_change`
    names (its alarm): an urgent job then preempts no later than the first moment, on a 0.5 s grid,
    at which a decision would preempt for it."""
    capacity = {"CPU": sum(j[4] for j in jobs_)}  # full: the urgent job lacks CPUs
    urgent = _job(99, "bob", cpus=need, priority=5)
    policies = PolicySet([build("priority"), Preemption(exempt, cooldown)])

    def running_at(t: float) -> list[RunningJob]:
        return [RunningJob(i, {"CPU": cpus}, priority=prio, preemptible=pre, run_s=run + t,
                           since_preempted_s=None if since is None else since + t)
                for i, (prio, pre, run, since, cpus) in enumerate(jobs_)]  # fmt: skip

    def preempts(t: float) -> bool:
        return bool(decide([urgent], running_at(t), capacity, Team(), policies).preempt)

    first = next((i * 0.5 for i in range(0, 400) if preempts(i * 0.5)), None)
    now: float | None = 0.0
    for _ in range(len(jobs_) * 2 + 2):  # each alarm lets at least one job out of its bounds
        assert now is not None
        if preempts(now):
            break
        at = policies.next_change(urgent, running_at(now), now)
        now = None if at is None else at + 0.01  # the alarm fires just after the moment, as the server's
        if now is None:
            break
    if first is None:
        return
    assert now is not None and preempts(now) and now <= first + 0.01
