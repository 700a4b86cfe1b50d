"""The rules of a server a team shares, inside the pure scheduler (``decide(..., team=Team(...))``):
quotas are never exceeded and never hold back another user; gangs stay whole; fair share orders equal
priorities so that usage converges to the configured shares under a steady load; nobody starves;
preemption happens only for a higher priority, after the exempt time and the cooldown, never before
elastic jobs lend, and never with a victim the waiting job could do without."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples

from trainforge.server.scheduling.accounting import Accounting
from trainforge.server.scheduling.policies import from_team
from trainforge.server.scheduling.resources import dominant_share
from trainforge.server.scheduling.rule import (
    JobRequest,
    RunningJob,
    Team,
    WaitingQueue,
    check_fits,
    decide,
    free_resources,
)
from trainforge.server.scheduling.rule import order as order_jobs
from trainforge.server.scheduling.scan import Scan

USERS = ("ann", "bob", "cat")


def _order(queue, team, capacity):
    """The queue in the order a decision takes it, with the policies ``team`` stands for."""
    return order_jobs(queue, from_team(team), team)


KINDS = ("CPU", "GPU")
CAPACITY = {"CPU": 8.0, "GPU": 2.0}


def _fits(request, free) -> bool:
    return all(v <= free.get(k, 0.0) + 1e-9 for k, v in request.items())


@st.composite
def queues(draw, n_max: int = 12, quotas: dict | None = None) -> list[JobRequest]:
    out = []
    for i in range(draw(st.integers(0, n_max))):
        kinds = draw(st.sets(st.sampled_from(KINDS), min_size=1))
        lo = draw(st.integers(1, 2))
        job = JobRequest(
            job_id=100 + i, seq=i, per_worker={k: float(draw(st.integers(1, 2))) for k in sorted(kinds)},
            min_workers=lo, max_workers=draw(st.one_of(st.none(), st.integers(lo, lo + 2))),
            priority=draw(st.integers(0, 2)), held=draw(st.integers(0, 9)) == 0, user=draw(st.sampled_from(USERS)),
        )  # fmt: skip
        try:
            check_fits(job, CAPACITY, (quotas or {}).get(job.user))
        except ValueError:
            continue  # refused at submission
        out.append(job)
    return out


@st.composite
def teams(draw) -> Team:
    quotas = {u: {"CPU": float(draw(st.integers(2, 8)))} for u in USERS if draw(st.booleans())}
    usage = {u: float(draw(st.integers(0, 100))) for u in USERS if draw(st.booleans())}
    shares = {u: float(draw(st.integers(1, 4))) for u in USERS if draw(st.booleans())}
    return Team(usage=usage, shares=shares, quotas=quotas)


def _held(running: list[RunningJob], user: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in running:
        if r.user == user:
            for k, v in r.grant.items():
                out[k] = out.get(k, 0.0) + v
    return out


@settings(max_examples=examples(300), deadline=None)
@given(data=st.data(), team=teams())
def test_never_above_a_quota_never_above_capacity_and_gangs_are_whole(data, team):
    queue = data.draw(queues(quotas=dict(team.quotas)))
    running = [RunningJob(1, {"CPU": 1.0}, user=data.draw(st.sampled_from(USERS)))]
    decision = decide(queue, running, CAPACITY, team)
    by_id = {j.job_id: j for j in queue}
    total = free_resources(CAPACITY, [r.grant for r in running] + [s.grant for s in decision.starts])
    assert all(v >= -1e-9 for v in total.values()), decision
    for user, quota in team.quotas.items():
        held = _held(running, user)
        before = dict(held)
        for s in decision.starts:
            if by_id[s.job_id].user == user:
                for k, v in s.grant.items():
                    held[k] = held.get(k, 0.0) + v
        for k, limit in quota.items():
            assert held.get(k, 0.0) <= max(limit, before.get(k, 0.0)) + 1e-9, (user, held, quota, decision)
    for s in decision.starts:
        job = by_id[s.job_id]
        assert job.min_workers <= s.workers <= job.upper_workers and s.grant == job.request(s.workers)
        assert not job.held
    assert sorted([s.job_id for s in decision.starts] + [p.job_id for p in decision.pending]) == sorted(by_id)
    for p in decision.pending:
        if p.reason == "quota":
            assert p.describe().startswith("over its user's quota") and p.limit


def test_a_quota_holds_its_users_third_job_while_another_users_job_starts():
    team = Team(quotas={"ann": {"CPU": 2.0}})
    queue = [JobRequest(i, seq=i, per_worker={"CPU": 1.0}, user="ann") for i in (1, 2, 3)]
    queue.append(JobRequest(4, seq=4, per_worker={"CPU": 1.0}, user="bob"))
    decision = decide(queue, [], {"CPU": 8.0}, team)
    assert sorted(s.job_id for s in decision.starts) == [1, 2, 4]
    (third,) = decision.pending
    assert (third.job_id, third.reason, third.need, third.free, third.limit) == (3, "quota", {"CPU": 1.0}, {"CPU": 0.0},
                                                                                 {"CPU": 2.0})  # fmt: skip
    assert third.describe() == "over its user's quota: needs 1 CPU, 0 of 2 left"
    with pytest.raises(ValueError, match=r"quota 2\).*users set"):
        check_fits(JobRequest(0, seq=0, per_worker={"CPU": 3.0}, user="ann"), {"CPU": 8.0}, {"CPU": 2.0})


def test_a_user_with_one_job_is_not_stuck_behind_another_users_hundred():
    queue = [JobRequest(i, seq=i, per_worker={"CPU": 1.0}, user="ann") for i in range(1, 101)]
    queue.append(JobRequest(101, seq=101, per_worker={"CPU": 1.0}, user="bob"))
    order = [j.job_id for j in _order(queue, Team(), {"CPU": 1.0})]
    assert order.index(101) == 1  # nobody used anything: they take turns (ann's first came first)
    order = [j.job_id for j in _order(queue, Team(usage={"ann": 3.0, "bob": 1.0}), {"CPU": 1.0})]
    assert order.index(101) == 0  # ann used more: bob's job first
    order = [j.job_id for j in _order(queue, Team(usage={"ann": 1.0, "bob": 3.0}), {"CPU": 1.0})]
    assert order.index(101) == 100  # bob used more: his job waits for ann's, as fair share says
    # Priority comes first: a higher-priority job of the busiest user goes ahead of everyone.
    urgent = JobRequest(102, seq=102, per_worker={"CPU": 1.0}, user="ann", priority=1)
    assert _order([*queue, urgent], Team(usage={"ann": 100.0}), {"CPU": 1.0})[0].job_id == 102


def test_the_fair_share_factor_is_slurms():
    team = Team(usage={"ann": 3.0, "bob": 1.0}, shares={"ann": 1.0, "bob": 1.0})
    f = team.factors(["ann", "bob", "cat"])
    # U: 0.75, 0.25, 0; S: 1/3 each: F = 2^(-U/S)
    assert f["ann"] == pytest.approx(2 ** -(0.75 * 3)) and f["bob"] == pytest.approx(2 ** -(0.25 * 3)) and f["cat"] == 1.0
    assert Team(usage={"ann": 1.0, "bob": 1.0}).factors(["ann", "bob"]) == {"ann": 0.5, "bob": 0.5}  # at share


def _simulate(shares: dict[str, float], sizes: dict[str, float], backlog: dict[str, int], steps: int,
              capacity: float = 4.0, seed: int = 0) -> dict[str, float]:  # fmt: skip
    """A steady load: each user keeps ``backlog[u]`` jobs of ``sizes[u]`` CPUs queued (refilled as
    they start); every job runs 2 to 4 steps; a decision at every step. The users' usage."""
    rng = random.Random(seed)
    cap = {"CPU": capacity}
    acct = Accounting(None, cap, half_life_s=math.inf)
    seq = iter(range(1, 10**9))
    queue: list[JobRequest] = []
    running: dict[int, tuple[str, dict[str, float], int]] = {}
    for t in range(steps):
        for job_id in [j for j, (_, _, end) in running.items() if end <= t]:
            del running[job_id]
        for user, n in backlog.items():
            while sum(1 for j in queue if j.user == user) < n:
                i = next(seq)
                queue.append(JobRequest(i, seq=i, per_worker={"CPU": sizes[user]}, user=user))
        acct.sync({j: (u, g) for j, (u, g, _) in running.items()}, float(t))
        team = Team(usage=acct.usage(float(t)), shares=shares)
        decision = decide(queue, [RunningJob(j, g, user=u) for j, (u, g, _) in running.items()], cap, team)
        started = {s.job_id: s for s in decision.starts}
        for job in [j for j in queue if j.job_id in started]:
            running[job.job_id] = (job.user, started[job.job_id].grant, t + rng.randint(2, 4))
        queue = [j for j in queue if j.job_id not in started]
    return acct.usage(float(steps))


@settings(max_examples=examples(20), deadline=None)
@given(shares=st.fixed_dictionaries({u: st.integers(1, 3) for u in USERS}),
       backlog=st.fixed_dictionaries({u: st.integers(4, 40) for u in USERS}), seed=st.integers(0, 1000))  # fmt: skip
def test_usage_shares_converge_to_the_configured_shares_under_a_steady_load(shares, backlog, seed):
    """Three users with unequal backlogs (4 to 40 jobs queued at all times: each could fill the
    server alone) and shares: after a while each user's share of the usage is their configured share
    (within 5 points)."""
    usage = _simulate({u: float(s) for u, s in shares.items()}, {u: 1.0 for u in USERS}, backlog, steps=300, seed=seed)
    total_usage, total_share = sum(usage.values()), sum(shares.values())
    for u in USERS:
        assert usage[u] / total_usage == pytest.approx(shares[u] / total_share, abs=0.05), (usage, shares)


def test_fair_share_counts_the_dominant_share_of_bigger_jobs():
    """Ann's jobs ask 2 CPUs, bob's 1: with equal shares they still get equal usage (in CPU-seconds
    here, the only kind), not equal numbers of jobs."""
    usage = _simulate({"ann": 1.0, "bob": 1.0}, {"ann": 2.0, "bob": 1.0}, {"ann": 10, "bob": 10}, steps=300)
    assert usage["ann"] / (usage["ann"] + usage["bob"]) == pytest.approx(0.5, abs=0.05)


@settings(max_examples=examples(200), deadline=None)
@given(data=st.data(), team=teams(), ends=st.randoms(use_true_random=False))
def test_no_job_waits_forever_with_fair_share_and_quotas(data, team, ends):
    queue = [j for j in data.draw(queues(quotas=dict(team.quotas))) if not j.held]
    running: dict[int, RunningJob] = {}
    users = {j.job_id: j.user for j in queue}
    for _ in range(len(queue) + 1):
        decision = decide(queue, list(running.values()), CAPACITY, team)
        for s in decision.starts:
            running[s.job_id] = RunningJob(s.job_id, s.grant, user=users[s.job_id])
        queue = [j for j in queue if j.job_id not in running]
        if not queue:
            break
        assert running, f"nothing runs, yet jobs wait: {decision.pending}"
        running.pop(ends.choice(sorted(running)))
    assert queue == []


@settings(max_examples=examples(200), deadline=None)
@given(data=st.data(), team=teams(), seed=st.integers(0, 2**32 - 1))
def test_the_answer_does_not_depend_on_the_order_jobs_are_given_in(data, team, seed):
    queue = data.draw(queues(quotas=dict(team.quotas)))
    shuffled = list(queue)
    random.Random(seed).shuffle(shuffled)
    assert decide(queue, [], CAPACITY, team) == decide(shuffled, [], CAPACITY, team)


@settings(max_examples=examples(200), deadline=None)
@given(data=st.data(), team=teams())
def test_stopping_the_scan_early_changes_nothing_with_quotas_and_fair_share(data, team):
    queue = data.draw(queues(n_max=20, quotas=dict(team.quotas)))
    running = [RunningJob(1, {"CPU": 2.0}, user="ann")]
    full = Scan(_order(queue, team, CAPACITY), free_resources(CAPACITY, [{"CPU": 2.0}]), from_team(team), team,
                {"ann": {"CPU": 2.0}} if team.quotas else {}, {"ann": 1} if team.quotas else {})  # fmt: skip
    full.run(0, stop_when_saturated=False)
    decision = decide(queue, running, CAPACITY, team)
    assert decision.blocked == full.blocked
    assert sorted(decision.starts, key=lambda s: s.job_id) == sorted(full.starts, key=lambda s: s.job_id)
    assert decision.pending == full.pending


@settings(max_examples=examples(200), deadline=None)
@given(data=st.data(), team=teams(), seed=st.integers(0, 2**32 - 1))
def test_a_waiting_queue_pages_and_single_reasons_agree_with_the_whole_list(data, team, seed):
    """The server's WaitingQueue (kept up to date, never sorted again) decides as the list of its jobs,
    and a page of the reasons, or one job's, is exactly the whole list's, with quotas and fair share."""
    queue = data.draw(queues(n_max=20, quotas=dict(team.quotas)))
    running = [RunningJob(1, {"CPU": 2.0}, user="ann")]
    jobs = list(queue)
    random.Random(seed).shuffle(jobs)
    waiting = WaitingQueue()
    for job in jobs:
        waiting.put(dataclasses.replace(job, priority=job.priority + 1))
        waiting.put(job)
    expected = decide(queue, running, CAPACITY, team)
    assert decide(waiting, running, CAPACITY, team) == expected
    full = Scan(_order(queue, team, CAPACITY), free_resources(CAPACITY, [{"CPU": 2.0}]), from_team(team), team,
                {"ann": {"CPU": 2.0}} if team.quotas else {}, {"ann": 1} if team.quotas else {})  # fmt: skip
    full.run(0, stop_when_saturated=False)  # the whole queue walked, no lazy part
    whole = full.pending
    offset, limit = data.draw(st.integers(0, len(whole))), data.draw(st.integers(1, 6))
    decision = decide(waiting, running, CAPACITY, team)
    assert decision.page(offset, limit) == whole[offset : offset + limit]
    by_id = {p.job_id: p for p in whole}
    assert [decision.reason(j.job_id) for j in jobs] == [by_id.get(j.job_id) for j in jobs]


# -- preemption ---------------------------------------------------------------------------------------
@st.composite
def running_jobs(draw) -> list[RunningJob]:
    out, free = [], dict(CAPACITY)
    for i in range(draw(st.integers(0, 6))):
        grant = {"CPU": float(draw(st.integers(1, 3)))}
        if draw(st.booleans()):
            grant["GPU"] = 1.0
        if not _fits(grant, free):
            continue
        for k, v in grant.items():
            free[k] -= v
        out.append(RunningJob(
            job_id=1 + i, grant=grant, user=draw(st.sampled_from(USERS)), priority=draw(st.integers(0, 3)),
            preemptible=draw(st.booleans()), run_s=float(draw(st.integers(0, 120))),
            since_preempted_s=draw(st.one_of(st.none(), st.integers(0, 900).map(float))),
            stopping=draw(st.integers(0, 5)) == 0,
            lendable={"CPU": 1.0} if grant["CPU"] > 1 and draw(st.integers(0, 4)) == 0 else {},
        ))  # fmt: skip
    return out


@settings(max_examples=examples(500), deadline=None)
@given(running=running_jobs(), data=st.data(), exempt=st.sampled_from([0.0, 60.0]),
       cooldown=st.sampled_from([0.0, 600.0]))  # fmt: skip
def test_preemption_is_bounded_and_takes_no_more_victims_than_needed(running, data, exempt, cooldown):
    queue = data.draw(queues(n_max=4))
    team = Team(exempt_s=exempt, cooldown_s=cooldown)
    decision = decide(queue, running, CAPACITY, team)
    if not decision.preempt:
        return
    assert decision.blocked is not None
    waiting = next(j for j in queue if j.job_id == decision.blocked)
    by_id = {r.job_id: r for r in running}
    victims = [by_id[v] for v in decision.preempt]
    for v in victims:  # only preemptible jobs, only for a higher priority, after exempt time and cooldown
        assert v.preemptible and not v.stopping and v.priority < waiting.priority
        assert v.run_s >= exempt and (v.since_preempted_s is None or v.since_preempted_s >= cooldown)
    free = free_resources(CAPACITY, [r.grant for r in running] + [s.grant for s in decision.starts])
    coming = dict(free)
    for r in running:
        if r.stopping:
            for k, x in r.grant.items():
                coming[k] += x
    need = waiting.min_request
    assert not _fits(need, coming)  # it could not start from what is free and what stopping jobs give back
    lent = dict(coming)
    for r in running:
        if not r.stopping:
            for k, x in r.lendable.items():
                lent[k] += x
    assert not _fits(need, lent)  # elastic jobs could not lend it enough: they shrink first

    def pool(chosen):
        p = dict(coming)
        for v in chosen:
            for k, x in v.grant.items():
                p[k] += x
        return p

    assert _fits(need, pool(victims))  # the victims are enough
    for v in victims:  # and each is needed
        assert not _fits(need, pool([w for w in victims if w is not v])), (v, victims)


def test_preemption_picks_the_lowest_priority_then_the_newest_and_respects_the_bounds():
    urgent = JobRequest(10, seq=10, per_worker={"CPU": 4.0}, priority=5, user="ann")
    old = RunningJob(1, {"CPU": 4.0}, user="bob", priority=1, preemptible=True, run_s=500.0)
    new = RunningJob(2, {"CPU": 4.0}, user="cat", priority=1, preemptible=True, run_s=100.0)
    lower = RunningJob(3, {"CPU": 4.0}, user="cat", priority=0, preemptible=True, run_s=70.0)
    cap, two = {"CPU": 12.0}, {"CPU": 8.0}  # full with three of them; with two
    team = Team(exempt_s=60.0, cooldown_s=600.0)
    assert decide([urgent], [old, new, lower], cap, team).preempt == [3]  # lowest priority first
    assert decide([urgent], [old, new], two, team).preempt == [2]  # then the newest
    young = RunningJob(2, {"CPU": 4.0}, user="cat", priority=1, preemptible=True, run_s=10.0)
    assert decide([urgent], [old, young], two, team).preempt == [1]  # 10 s < exempt: not it
    cooled = RunningJob(1, {"CPU": 4.0}, user="bob", priority=1, preemptible=True, run_s=500.0, since_preempted_s=60.0)
    assert decide([urgent], [cooled, young], two, team).preempt == []  # preempted a minute ago; the other too young
    equal = JobRequest(10, seq=10, per_worker={"CPU": 4.0}, priority=1, user="ann")
    assert decide([equal], [old, new], two, team).preempt == []  # never for an equal priority (nor fair share)
    assert decide([urgent], [old, new], two, Team(preemption=False)).preempt == []
    assert decide([urgent], [old, new], cap).preempt == []  # no team: no preemption
    stopping = RunningJob(2, {"CPU": 4.0}, user="cat", priority=1, preemptible=True, run_s=100.0, stopping=True)
    assert decide([urgent], [old, stopping], two, team).preempt == []  # what a stopping job gives back: wait for it
    elastic = RunningJob(4, {"CPU": 8.0}, user="bob", priority=9, lendable={"CPU": 4.0})
    assert decide([urgent], [elastic, new], cap, team).preempt == []  # an elastic job lends first


def test_the_last_pass_drops_a_victim_that_is_not_needed():
    """Lowest priority first takes the 1-CPU job, then the 4-CPU one, which alone is enough: the
    1-CPU job is dropped."""
    urgent = JobRequest(10, seq=10, per_worker={"CPU": 4.0}, priority=5)
    small = RunningJob(1, {"CPU": 1.0}, priority=0, preemptible=True)
    big = RunningJob(2, {"CPU": 4.0}, priority=1, preemptible=True)
    decision = decide([urgent], [small, big], {"CPU": 5.0}, Team())
    assert decision.preempt == [2]


def test_accounting_decays_usage_by_its_half_life_and_counts_running_jobs():
    acct = Accounting(None, {"CPU": 4.0, "GPU": 2.0}, half_life_s=100.0)
    acct.sync({1: ("ann", {"CPU": 1.0, "GPU": 1.0})}, 0.0)  # dominant share: 1 of 2 GPUs = 0.5
    assert acct.usage(10.0)["ann"] == pytest.approx(0.5 * 100 / math.log(2) * (1 - 0.5 ** 0.1))
    acct.sync({}, 100.0)  # it ended: charged
    charged = acct.usage(100.0)["ann"]
    assert acct.usage(200.0)["ann"] == pytest.approx(charged / 2)  # halves every half-life
    assert dominant_share({"CPU": 1.0, "GPU": 1.0}, {"CPU": 4.0, "GPU": 2.0}) == 0.5
    with pytest.raises(ValueError, match="half_life_s"):
        Accounting(None, {}, half_life_s=0)


@pytest.mark.parametrize("kwargs, field", [
    (dict(usage={"a": -1.0}), "usage"), (dict(shares={"a": 0.0}), "shares"),
    (dict(quotas={"a": {"CPU": math.nan}}), "quotas"), (dict(exempt_s=-1.0), "exempt_s"),
])  # fmt: skip
def test_bad_team_inputs_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        Team(**kwargs)
