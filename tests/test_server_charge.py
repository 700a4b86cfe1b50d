"""Charging what is held: every worker counts at least ``MIN_CPU_PER_WORKER`` (0.1) CPUs, whatever it
asks for, against the server's capacity, a user's quota and fair-share usage, and in the elastic
sizing of a job within its grant (``trainforge/_internal/resources.py``, the scheduler's rule 0). A
job's spec keeps what was asked for; its grant is what it is charged.

In-process, runner-less (the ``Api`` of test_server_api.py, ``TeamApi`` of test_server_access.py)."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest

from trainforge import ScalingConfig
from trainforge._internal.resources import MIN_CPU_PER_WORKER, charge, workers_that_fit
from trainforge.server.jobs.service import request_of
from trainforge.server.scheduling.rule import JobRequest

pytest.importorskip("fastapi")

from test_server_access import TeamApi  # noqa: E402
from test_server_api import Api, P  # noqa: E402

ZERO = {"per_worker": {}, "workers": 8}  # 8 workers asking for nothing: charged 0.8 CPU


@pytest.fixture
def make_api(tmp_path):
    """``make_api(capacity)``: a runner-less server (``team=True``: with the users of ``TeamApi``)."""
    made: list[Api] = []

    def make(capacity: dict[str, float] | None = None, *, team: bool = False) -> Any:
        api = (TeamApi if team else Api)(str(tmp_path / f"state{len(made)}"), capacity or {"CPU": 4.0})
        made.append(api)
        return api

    yield make
    for api in made:
        api.close()


def test_every_worker_is_charged_at_least_the_minimum_cpu_and_keeps_what_else_it_asks_for():
    assert MIN_CPU_PER_WORKER == 0.1
    assert charge({}) == {"CPU": 0.1}
    assert charge({"CPU": 0.0, "GPU": 1.0}) == {"CPU": 0.1, "GPU": 1.0}
    assert charge({"CPU": 2.0, "memory": 4e9}) == {"CPU": 2.0, "memory": 4e9}  # above the minimum: as asked
    job = JobRequest.from_spec({"per_worker": {}, "min_workers": 8})
    assert job.per_worker == {"CPU": 0.1} and job.request(8) == pytest.approx({"CPU": 0.8})
    assert JobRequest.from_spec({"per_worker": {"GPU": 1}}).min_request == {"CPU": 0.1, "GPU": 1.0}


def test_elastic_sizing_on_this_machine_counts_the_charge_so_a_grant_bounds_zero_cpu_workers():
    """The server's grant file says what a job's workers may use ({"CPU": 0.8} for 8 zero-CPU
    workers): the core's sizing must read it as 8 workers, not as room for any number."""
    scaling = ScalingConfig(num_workers=(1, 100), resources_per_worker={"CPU": 0})
    for n in (1, 3, 7, 8, 10):
        assert workers_that_fit(scaling, {"CPU": n * MIN_CPU_PER_WORKER}) == n
    assert workers_that_fit(scaling, {"CPU": 0.05}) == 0
    assert workers_that_fit(scaling, {"CPU": 0.8}, charged=False) == 100  # a Ray cluster's own placement counts
    two = ScalingConfig(num_workers=(1, 100), resources_per_worker={"CPU": 2})
    assert workers_that_fit(two, {"CPU": 8}) == 4  # above the minimum: what it asks for


def test_zero_cpu_workers_count_against_the_servers_capacity(make_api):
    api = make_api({"CPU": 2.0})
    ids = [api.submit(**ZERO)["id"] for _ in range(4)]
    assert [c[0] for c in api.starts.calls] == ids[:2]  # 0.8 + 0.8 of 2 CPUs; a third would need 2.4
    assert all(grant == pytest.approx({"CPU": 0.8}) for _, _, grant in api.starts.calls)
    queue = [(e["job_id"], e["pending"]["reason"], e["pending"]["text"]) for e in api.get(f"{P}/queue").json()["entries"]]
    assert queue == [(j, "resources", "needs 0.8 CPU, 0.4 free") for j in ids[2:]]
    assert api.get(f"{P}/resources").json()["free"] == pytest.approx({"CPU": 0.4})
    job = api.get(f"{P}/jobs/{ids[0]}").json()
    assert job["request"]["per_worker"] == {} and job["grant"] == pytest.approx({"CPU": 0.8})  # asked vs charged
    with open(os.path.join(api.service.job_dir(ids[0]), "spec.json")) as f:
        assert json.load(f)["per_worker"] == {}  # the stored spec keeps what was asked for

    r = api.post(f"{P}/jobs", json={"kind": "script", "path": "train.py", "per_worker": {}, "workers": 30})
    assert r.status_code == 422, r.text  # 3 CPU, more than the server has even when idle
    assert "3 CPU (capacity 2)" in r.text and "(each worker counts at least 0.1 CPU)" in r.text
    api.post(f"{P}/jobs/{ids[0]}/stop")
    assert [c[0] for c in api.starts.calls] == ids[:3]


def test_an_elastic_job_of_zero_cpu_workers_grows_only_as_far_as_its_charge_allows(make_api):
    """The scheduler sizes it by the charge, and the core, reading the grant it is written, agrees."""
    api = make_api({"CPU": 1.0})
    job = api.submit(per_worker={}, workers=2, max_workers=100)["id"]
    ((started, workers, grant),) = api.starts.calls
    assert (started, workers) == (job, 10) and grant == pytest.approx({"CPU": 1.0})
    api.service.files.write_grant(job, request_of(api.service.get(job)), workers)  # as the real start does
    with open(os.path.join(api.service.job_dir(job), "grant.json")) as f:
        written = json.load(f)
    assert written == pytest.approx({"CPU": 1.0})
    scaling = ScalingConfig(num_workers=(2, 100), resources_per_worker={"CPU": 0})
    assert workers_that_fit(scaling, written) == 10  # what the grant file lets the job's core start


@pytest.mark.parametrize("amount", [-1, "NaN", "Infinity", "-Infinity", "1e400"])
def test_a_bad_amount_per_worker_is_still_422(make_api, amount):
    api = make_api()
    body = '{"kind": "script", "path": "a.py", "per_worker": {"CPU": AMOUNT}}'.replace("AMOUNT", str(amount))
    r = api.post(f"{P}/jobs", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    assert "per_worker" in r.text and "CPU" in r.text
    assert api.service.store.count() == 0


def test_zero_cpu_workers_count_against_their_users_quota_holdings_and_usage(make_api):
    api = make_api({"CPU": 4.0}, team=True)
    r = api.as_("admin", "PATCH", f"{P}/users/bob", json={"quota": {"CPU": 1}})
    assert r.status_code == 200, r.text
    ids = [api.submit_as("member", **ZERO)["id"] for _ in range(3)]  # "member" is bob
    assert [c[0] for c in api.starts.calls] == ids[:1]  # 0.8 of bob's 1 CPU: the next would take him to 1.6
    for job_id in ids[1:]:
        pending = api.as_("member", "GET", f"{P}/jobs/{job_id}").json()["pending"]
        assert (pending["reason"], pending["text"]) == ("quota", "over its user's quota: needs 0.8 CPU, 0.2 of 1 left")
    assert api.as_("member", "GET", f"{P}/whoami").json()["holds"] == pytest.approx({"CPU": 0.8})
    # The server has room (3.2 CPUs free): another user's zero-CPU job is not held back by bob's quota.
    ann = api.submit_as("owner", **ZERO)["id"]
    assert [c[0] for c in api.starts.calls] == [ids[0], ann]
    # Fair share charges what they hold: the dominant share of 0.8 of 4 CPUs, 0.2 a second each.
    now = time.time()
    usage = api.service.ledger.usage(now + 1000.0)
    assert usage["bob"] == pytest.approx(usage["ann"], rel=0.01) and usage["bob"] == pytest.approx(200.0, rel=0.01)
    r = api.as_("member", "POST", f"{P}/jobs", json={"kind": "script", "path": "t.py", "per_worker": {}, "workers": 11})
    assert r.status_code == 422, r.text  # 1.1 CPU: more than bob's quota even with nothing else running
    assert "1.1 CPU (quota 1)" in r.text and "(each worker counts at least 0.1 CPU)" in r.text
