"""One name for a job's worker count, Ray's ``num_workers``, from ``trainer.submit()`` to the grant its
runner reads: the API's ``JobSpecIn.num_workers``, the spec the server stores, the request the
scheduler charges, ``JobOut.request.num_workers``. Older clients send ``workers``, and older servers
stored ``min_workers``: both still mean it (a job queued before an upgrade runs after it)."""

from __future__ import annotations

import json
import sqlite3

import pytest

pytest.importorskip("fastapi")

from test_server_api import Api, P  # noqa: E402

from trainforge import DataParallelTrainer, ScalingConfig  # noqa: E402
from trainforge._internal.trainer_job import NUM_WORKERS, num_workers_of, trainer_job  # noqa: E402
from trainforge.server.scheduling.rule import JobRequest  # noqa: E402


def _loop(config):
    pass


def test_a_trainer_is_submitted_with_rays_name_for_its_workers():
    trainer = DataParallelTrainer(_loop, scaling_config=ScalingConfig(num_workers=3))
    spec = trainer_job(trainer, name="t", cannot_send="", fix="")
    assert spec[NUM_WORKERS] == 3 and "workers" not in spec and "min_workers" not in spec


@pytest.mark.parametrize("key", ["num_workers", "workers"])  # workers: what older clients send
def test_the_api_takes_num_workers_and_stores_and_charges_it(tmp_path, key):
    api = Api(str(tmp_path / "state"), {"CPU": 8.0})
    try:
        out = api.submit(**{key: 3, "per_worker": {"CPU": 1.0}})
        job = api.service.get(out["id"])
        assert job.spec[NUM_WORKERS] == 3 and "workers" not in job.spec and "min_workers" not in job.spec
        assert out["job"]["request"][NUM_WORKERS] == 3
        assert JobRequest.from_spec(job.spec, job.id).min_workers == 3
        assert api.starts.calls[-1][1:] == (3, {"CPU": 3.0})  # started with 3 workers' share
        too_many = api.post(f"{P}/jobs", json={"kind": "script", "path": "x.py", key: 3, "max_workers": 2})
        assert too_many.status_code == 422 and "less than num_workers=3" in too_many.text
    finally:
        api.close()


def test_a_job_an_older_server_queued_runs_with_its_workers_after_an_upgrade(tmp_path):
    state = str(tmp_path / "state")
    api = Api(state, {"CPU": 8.0})
    job_id = api.submit(num_workers=2, per_worker={"CPU": 1.0}, hold=True)["id"]
    api.close()
    conn = sqlite3.connect(f"{state}/state.db")  # as an older server stored the spec: min_workers
    spec = json.loads(conn.execute("SELECT spec FROM jobs WHERE id = ?", (job_id,)).fetchone()[0])
    spec["min_workers"] = spec.pop(NUM_WORKERS)
    conn.execute("UPDATE jobs SET spec = ? WHERE id = ?", (json.dumps(spec), job_id))
    conn.commit()
    conn.close()
    upgraded = Api(state, {"CPU": 8.0})
    try:
        assert upgraded.get(f"{P}/jobs/{job_id}").json()["request"][NUM_WORKERS] == 2
        assert upgraded.patch(f"{P}/jobs/{job_id}", json={"hold": False}).status_code == 200
        assert upgraded.starts.calls == [(job_id, 2, {"CPU": 2.0})]
    finally:
        upgraded.close()


def test_num_workers_of_reads_the_key_and_the_older_one():
    assert num_workers_of({"num_workers": 4}) == 4 and num_workers_of({"min_workers": 2}) == 2
    assert num_workers_of({"num_workers": 4, "min_workers": 2}) == 4 and num_workers_of({}) == 1
