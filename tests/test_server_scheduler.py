"""The train server's scheduling rule (a pure function): capacity is never exceeded, gangs are all or
nothing, the answer is deterministic, the reservation rule holds, and no job waits forever."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples

from trainforge.server.scheduling.decision import Pending
from trainforge.server.scheduling.rule import JobRequest, check_fits, decide, free_resources

KINDS = ("CPU", "GPU", "memory")
CAPACITY = {"CPU": 8.0, "GPU": 2.0, "memory": 16.0}


@st.composite
def jobs(draw, n_max: int = 12) -> list[JobRequest]:
    n = draw(st.integers(0, n_max))
    out = []
    for i in range(n):
        kinds = draw(st.sets(st.sampled_from(KINDS), min_size=1))
        per_worker = {k: float(draw(st.integers(1, 4))) for k in sorted(kinds)}
        driver = {"CPU": float(draw(st.integers(0, 1)))}
        lo = draw(st.integers(1, 3))
        hi = draw(st.one_of(st.none(), st.integers(lo, lo + 2)))
        job = JobRequest(
            job_id=100 + i, seq=i, per_worker=per_worker, driver=driver, min_workers=lo, max_workers=hi,
            priority=draw(st.integers(0, 2)), held=draw(st.booleans()) and draw(st.booleans()),
        )  # fmt: skip
        try:
            check_fits(job, CAPACITY)
        except ValueError:
            continue  # refused at submission
        out.append(job)
    return out


def _total(grants) -> dict[str, float]:
    return {k: sum(g.get(k, 0.0) for g in grants) for k in KINDS}


@settings(max_examples=examples(300), deadline=None)
@given(queue=jobs(), running_share=st.integers(0, 4))
def test_never_grants_more_than_capacity_and_gangs_are_whole(queue, running_share):
    running = [{"CPU": float(running_share), "GPU": float(running_share % 3 == 1)}]
    decision = decide(queue, running, CAPACITY)
    used = _total(running + [s.grant for s in decision.starts])
    assert all(used[k] <= CAPACITY[k] + 1e-9 for k in KINDS), (used, decision)
    by_id = {j.job_id: j for j in queue}
    for s in decision.starts:
        job = by_id[s.job_id]
        assert job.min_workers <= s.workers <= job.upper_workers  # all of the gang, never part of it
        assert s.grant == job.request(s.workers)
        assert not job.held
    # every job is either started or pending, exactly once
    ids = [s.job_id for s in decision.starts] + [p.job_id for p in decision.pending]
    assert sorted(ids) == sorted(by_id)


@settings(max_examples=examples(200), deadline=None)
@given(queue=jobs(), seed=st.integers(0, 2**32 - 1))
def test_the_answer_does_not_depend_on_the_order_jobs_are_given_in(queue, seed):
    shuffled = list(queue)
    random.Random(seed).shuffle(shuffled)
    assert decide(queue, [], CAPACITY) == decide(shuffled, [], CAPACITY)


@settings(max_examples=examples(300), deadline=None)
@given(queue=jobs(), running_cpu=st.integers(0, 6))
def test_a_started_job_needs_no_kind_an_earlier_waiting_job_lacks(queue, running_cpu):
    decision = decide(queue, [{"CPU": float(running_cpu)}], CAPACITY)
    order = sorted(queue, key=lambda j: (-j.priority, j.seq))
    started = {s.job_id for s in decision.starts}
    pending = {p.job_id: p for p in decision.pending}
    lacked: set[str] = set()
    for job in order:
        if job.job_id in started:
            assert not (set(job.request(job.min_workers)) & lacked), (job, lacked)
        elif pending[job.job_id].reason == "resources":
            lacked |= set(pending[job.job_id].need)
    # the first job that is not held starts whenever it fits in what is free
    first = next((j for j in order if not j.held), None)
    free = free_resources(CAPACITY, [{"CPU": float(running_cpu)}])
    if first is not None and all(v <= free.get(k, 0.0) for k, v in first.request(first.min_workers).items()):
        assert first.job_id in started


@settings(max_examples=examples(200), deadline=None)
@given(queue=jobs(), ends=st.randoms(use_true_random=False))
def test_no_job_waits_forever(queue, ends):
    """Jobs end one at a time (in any order): every job that is not held starts within as many
    decisions as there are jobs, plus one."""
    waiting = [j for j in queue if not j.held]
    running: dict[int, dict[str, float]] = {}
    for _ in range(len(waiting) + 1):
        decision = decide(waiting, list(running.values()), CAPACITY)
        for s in decision.starts:
            running[s.job_id] = s.grant
        waiting = [j for j in waiting if j.job_id not in running]
        if not waiting:
            break
        assert running, "nothing runs, yet a job that fits the capacity waits"
        running.pop(ends.choice(sorted(running)))
    assert waiting == []


@settings(max_examples=examples(200), deadline=None)
@given(queue=jobs())
def test_every_waiting_job_has_a_reason_and_a_place(queue):
    decision = decide(queue, [{"CPU": 4.0}], CAPACITY)
    positions = [p.position for p in decision.pending if p.reason != "held"]
    assert positions == list(range(1, len(positions) + 1))
    pending_ids = {p.job_id for p in decision.pending}
    for p in decision.pending:
        assert p.describe()
        if p.reason == "held":
            assert p.position is None
        if p.reason == "reserved":
            assert p.behind in pending_ids and p.behind != p.job_id


def test_a_cpu_job_passes_a_job_waiting_for_gpus_but_not_one_waiting_for_cpus():
    gpu_job = JobRequest(1, seq=0, per_worker={"GPU": 2, "CPU": 1}, min_workers=1)
    cpu_small = JobRequest(2, seq=1, per_worker={"CPU": 1}, min_workers=1)
    running = [{"GPU": 1, "CPU": 1}]
    decision = decide([gpu_job, cpu_small], running, {"CPU": 4, "GPU": 2})
    assert [s.job_id for s in decision.starts] == [2]
    assert decision.pending == [Pending(1, 1, "resources", need={"GPU": 2.0}, free={"GPU": 1.0})]
    assert decision.pending[0].describe() == "needs 2 GPU, 1 free"

    cpu_big = JobRequest(3, seq=0, per_worker={"CPU": 2}, min_workers=2)
    decision = decide([cpu_big, cpu_small], [{"CPU": 1}], {"CPU": 4})
    assert decision.starts == []
    assert [(p.job_id, p.describe()) for p in decision.pending] == [
        (3, "needs 4 CPU, 3 free"),
        (2, "behind job 3"),
    ]


def test_priority_then_submission_order_and_held_jobs_wait():
    a = JobRequest(1, seq=0, per_worker={"CPU": 2})
    b = JobRequest(2, seq=1, per_worker={"CPU": 2}, priority=5)
    c = JobRequest(3, seq=2, per_worker={"CPU": 2}, held=True)
    decision = decide([a, b, c], [], {"CPU": 2})
    assert [s.job_id for s in decision.starts] == [2]
    assert [(p.job_id, p.describe(), p.position) for p in decision.pending] == [
        (1, "needs 2 CPU, 0 free", 1),
        (3, "held", None),
    ]


def test_an_elastic_job_starts_with_what_fits_up_to_its_maximum():
    job = JobRequest(1, seq=0, per_worker={"CPU": 1}, driver={"CPU": 1}, min_workers=2, max_workers=8)
    (start,) = decide([job], [], {"CPU": 5}).starts
    assert (start.workers, start.grant) == (4, {"CPU": 5.0})
    (start,) = decide([job], [], {"CPU": 100}).starts
    assert start.workers == 8


def test_blocked_is_the_first_job_lacking_resources_found_without_the_others_reasons():
    big = JobRequest(1, seq=0, per_worker={"CPU": 4})  # takes everything: the scan stops after it
    held = JobRequest(2, seq=1, per_worker={"CPU": 1}, held=True)
    rest = [JobRequest(3 + i, seq=2 + i, per_worker={"CPU": 1}) for i in range(1000)]
    decision = decide([big, held, *rest], [], {"CPU": 4})
    assert [s.job_id for s in decision.starts] == [1]
    assert decision.blocked == 3 and decision._all is None  # the 1000 reasons are not worked out yet
    assert decision.pending[1] == Pending(3, 1, "resources", need={"CPU": 1.0}, free={"CPU": 0.0})
    assert decide([big], [], {"CPU": 4}).blocked is None


def test_a_request_beyond_capacity_is_refused_with_the_numbers():
    job = JobRequest(7, seq=0, per_worker={"GPU": 1, "CPU": 1}, min_workers=3)
    with pytest.raises(ValueError, match=r"job 7 asks for 3 GPU \(capacity 2\).*--capacity"):
        check_fits(job, {"CPU": 8, "GPU": 2})
    check_fits(job, {"CPU": 8, "GPU": 3})


@pytest.mark.parametrize(
    "kwargs, field",
    [(dict(min_workers=0), "min_workers"), (dict(min_workers=2, max_workers=1), "max_workers"),
     (dict(per_worker={"CPU": -1}), r"per_worker\['CPU'\]"), (dict(driver={"GPU": float("nan")}), "driver")],
)  # fmt: skip
def test_bad_requests_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        JobRequest(**{"job_id": 1, "seq": 0, "per_worker": {"CPU": 1}, **kwargs})


@settings(max_examples=examples(300), deadline=None)
@given(queue=jobs(n_max=20), running_share=st.integers(0, 4), zero=st.booleans())
def test_stopping_the_scan_early_changes_nothing(queue, running_share, zero):
    """decide() stops walking the queue once nothing more can start and works out the remaining
    reasons lazily; the answer must be exactly that of walking the whole queue."""
    from trainforge.server.scheduling.rule import order
    from trainforge.server.scheduling.scan import Scan

    if zero:  # a job asking for nothing can start even when everything is reserved
        queue = [*queue, JobRequest(job_id=999, seq=999, per_worker={}, min_workers=1)]
    running = [{"CPU": 2.0 * running_share, "GPU": float(running_share % 3)}]
    ordered = order(queue)
    full = Scan(ordered, free_resources(CAPACITY, running))
    full.run(0, stop_when_saturated=False)
    decision = decide(queue, running, CAPACITY)
    # read before the lazy reasons are worked out: the first job lacking resources, found either way
    assert decision.blocked == full.blocked == next((p.job_id for p in full.pending if p.reason == "resources"), None)
    assert sorted(decision.starts, key=lambda s: s.job_id) == sorted(full.starts, key=lambda s: s.job_id)
    assert decision.pending == full.pending


def _churned(queue: list[JobRequest], rng: random.Random):
    """A WaitingQueue that saw ``queue``'s jobs come in shuffled, some of them changed (priority, hold)
    and put back, and extra jobs come and go: it must end up holding exactly ``queue``."""
    from trainforge.server.scheduling.rule import WaitingQueue

    waiting = WaitingQueue()
    jobs = list(queue)
    rng.shuffle(jobs)
    for job in jobs:
        if rng.random() < 0.3:
            waiting.put(dataclasses.replace(job, priority=job.priority + 1, held=not job.held))
        waiting.put(job)
        if rng.random() < 0.2:
            waiting.put(JobRequest(job_id=5000 + job.job_id, seq=job.seq, per_worker={"CPU": 1.0}))
    for job in jobs:
        waiting.discard(5000 + job.job_id)
    assert len(waiting) == len(queue) and all(j.job_id in waiting for j in queue)
    return waiting


@settings(max_examples=examples(300), deadline=None)
@given(queue=jobs(n_max=20), running_share=st.integers(0, 4), zero=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_a_waiting_queue_kept_up_to_date_decides_as_the_list_of_its_jobs(queue, running_share, zero, seed):
    if zero:
        queue = [*queue, JobRequest(job_id=999, seq=999, per_worker={}, min_workers=1)]
    running = [{"CPU": 2.0 * running_share, "GPU": float(running_share % 3)}]
    waiting = _churned(queue, random.Random(seed))
    assert [j.job_id for j in waiting.ordered] == [j.job_id for j in sorted(queue, key=lambda j: (-j.priority, j.seq))]
    expected, decision = decide(queue, running, CAPACITY), decide(waiting, running, CAPACITY)
    assert (decision.blocked, decision.reserved) == (expected.blocked, expected.reserved)
    assert decision == expected


@settings(max_examples=examples(200), deadline=None)
@given(queue=jobs(n_max=30), running_share=st.integers(0, 4), zero=st.booleans(), data=st.data())
def test_a_page_or_one_reason_is_that_of_the_whole_list(queue, running_share, zero, data):
    """GET /queue shows a page, and a job's reply its own reason, without working out every reason:
    each must be exactly what the whole list says."""
    if zero:
        queue = [*queue, JobRequest(job_id=999, seq=data.draw(st.integers(0, 30)), per_worker={}, min_workers=1)]
    from trainforge.server.scheduling.rule import order
    from trainforge.server.scheduling.scan import Scan

    running = [{"CPU": 2.0 * running_share, "GPU": float(running_share % 3)}]
    full = Scan(order(queue), free_resources(CAPACITY, running))  # the whole queue walked, no lazy part
    full.run(0, stop_when_saturated=False)
    whole = full.pending
    assert decide(queue, running, CAPACITY).pending == whole
    offset, limit = data.draw(st.integers(0, len(whole) + 2)), data.draw(st.integers(1, 8))
    decision = decide(queue, running, CAPACITY)
    assert decision.waiting == len(whole)
    assert decision.page(offset, limit) == whole[offset : offset + limit]
    by_id = {p.job_id: p for p in whole}
    decision = decide(queue, running, CAPACITY)
    for job in data.draw(st.permutations(queue)):
        assert decision.reason(job.job_id) == by_id.get(job.job_id)
    assert decision.page(offset, limit) == whole[offset : offset + limit]
