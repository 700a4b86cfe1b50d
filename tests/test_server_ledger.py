"""The ResourceLedger (:mod:`trainforge.server.scheduling.ledger`) charges usage from the first second:
for any sequence of starts, stops, resizes and decisions at arbitrary times, each user's accrued usage
is the integral of their jobs' dominant shares over time (decayed by the half-life, or not at all),
worked out here numerically, within 1%, however many decisions ran in between. Time is an argument
of every method, so the tests drive it; no clock is read."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainforge.server.scheduling.accounting import Accounting
from trainforge.server.scheduling.ledger import ResourceLedger
from trainforge.server.scheduling.resources import dominant_share
from trainforge.server.scheduling.rule import JobRequest, decide

CAPACITY = {"CPU": 8.0, "GPU": 2.0}
USERS = ("ann", "bob", "cat")
grants = st.fixed_dictionaries({"CPU": st.sampled_from([0.5, 1.0, 2.0, 4.0])},
                               optional={"GPU": st.sampled_from([0.5, 1.0, 2.0])})  # fmt: skip
steps = st.lists(st.tuples(
    st.floats(0.0, 50.0, allow_nan=False),  # seconds since the step before
    st.sampled_from(["start", "stop", "resize", "decide"]),
    st.integers(1, 6),  # which job
    st.sampled_from(USERS),
    grants,
), max_size=40)  # fmt: skip


def _numeric_usage(segments: list[tuple[float, float, str, float]], end: float, half_life: float) -> dict[str, float]:
    """Each user's usage at ``end``: the integral of the shares ``segments`` (start, stop, user,
    share) held, each second's worth decayed by ``half_life`` up to ``end``, by the midpoint rule."""
    out: dict[str, float] = {}
    for t0, t1, user, share in segments:
        n = 64
        dt = (t1 - t0) / n
        total = 0.0
        for i in range(n):
            t = t0 + (i + 0.5) * dt
            total += share * dt * (1.0 if math.isinf(half_life) else 0.5 ** ((end - t) / half_life))
        out[user] = out.get(user, 0.0) + total
    return out


@settings(deadline=None)
@given(ops=steps, half_life=st.sampled_from([math.inf, 30.0, 200.0]), tail=st.floats(0.0, 100.0))
def test_each_users_usage_is_the_integral_of_their_dominant_share(ops, half_life, tail):
    ledger = ResourceLedger(dict(CAPACITY), Accounting(None, CAPACITY, half_life))
    holding: dict[int, tuple[str, float, float]] = {}  # job -> (user, share, since): the reference
    segments: list[tuple[float, float, str, float]] = []
    now = 1000.0
    for dt, action, job, user, grant in ops:
        now += dt
        if action == "start" and job not in ledger:
            ledger.hold(job, grant, now, user=user)
            holding[job] = (user, dominant_share(grant, CAPACITY), now)
        elif action == "stop" and job in ledger:
            ledger.release(job, now)
            owner, share, since = holding.pop(job)
            segments.append((since, now, owner, share))
        elif action == "resize" and job in ledger:
            ledger.resize(job, grant, now)
            owner, share, since = holding[job]
            segments.append((since, now, owner, share))
            holding[job] = (owner, dominant_share(grant, CAPACITY), now)
        elif action == "decide":  # a decision reads the ledger; it must change nothing charged
            queue = [JobRequest(99, 99, per_worker={"CPU": 1.0}, user=user)]
            decide(queue, ledger.running(now), CAPACITY)
            ledger.usage(now)
    end = now + tail
    segments += [(since, end, owner, share) for owner, share, since in holding.values()]
    expected = _numeric_usage(segments, end, half_life)
    usage = ledger.usage(end)
    for user in USERS:
        assert usage.get(user, 0.0) == pytest.approx(expected.get(user, 0.0), rel=0.01, abs=1e-9), user


def test_a_job_that_starts_and_ends_with_no_decision_between_is_charged_for_all_of_it():
    """The defect of issue 35: charged only from the decision after its start."""
    ledger = ResourceLedger(dict(CAPACITY), Accounting(None, CAPACITY, math.inf))
    ledger.hold(1, {"CPU": 1.0, "GPU": 1.0}, 100.0, user="bob")  # dominant share 1/2
    ledger.hold(2, {"CPU": 2.0}, 100.0, user="ann")  # 1/4
    assert ledger.usage(104.0) == {"bob": pytest.approx(2.0), "ann": pytest.approx(1.0)}
    ledger.release(1, 110.0)
    ledger.resize(2, {"CPU": 4.0}, 110.0)  # 1/2 from now on
    assert ledger.usage(120.0) == {"bob": pytest.approx(5.0), "ann": pytest.approx(2.5 + 5.0)}
    assert ledger.grants() == {2: {"CPU": 4.0}} and ledger.free() == {"CPU": 4.0, "GPU": 2.0}


def test_the_ledger_keeps_who_holds_what_and_the_gpus_by_id():
    ledger = ResourceLedger({"CPU": 4.0, "GPU": 2.0}, Accounting(None, CAPACITY, math.inf))
    ledger.hold(1, {"CPU": 1.0, "GPU": 2.0}, 0.0, user="ann", priority=1, preemptible=True)
    ledger.hold_gpus(1, ["0", "1"])
    ledger.hold(2, {"CPU": 1.0}, 5.0, user="bob", started_at=3.0)
    assert ledger.holdings() == {"ann": {"CPU": 1.0, "GPU": 2.0}, "bob": {"CPU": 1.0}}
    assert ledger.held_by("ann") == {"CPU": 1.0, "GPU": 2.0} and ledger.gpu_ids(1) == ["0", "1"]
    ledger.resize(1, {"CPU": 1.0, "GPU": 1.0}, 6.0, gpu_ids=["0"])
    assert ledger.gpu_owners() == {"0": 1}
    ledger.preempted(1, 7.0)
    running = {r.job_id: r for r in ledger.running(10.0)}
    assert running[1].stopping and running[1].since_preempted_s == 3.0 and running[1].run_s == 10.0
    assert running[2].run_s == 7.0 and not running[2].stopping and running[2].user == "bob"
    ledger.rename("bob", "bob (removed)")
    ledger.release(1, 10.0)
    assert ledger.owners() == {2: "bob (removed)"} and ledger.gpu_owners() == {}
    assert set(ledger.usage(10.0)) == {"ann", "bob (removed)"}
