"""The train server started against a Ray cluster (``RAY_ADDRESS``): its capacity is the cluster's,
a driver connected to the cluster finds it without being told its address (the server publishes its
URL and state directory in the cluster's KV; the token is read from ``<state_dir>/token``, so on the
server's machine as its user), and a job's workers are Ray actors of that cluster, all gone after
the job. Stopping the server only disconnects it: the test's own Ray instance goes on.

Ray: the test session's one-node instance (conftest ``ray_single``, 4 CPUs, 127.0.0.1), connected in
this process; the server joins it as another driver, and each job's runner as a third."""

from __future__ import annotations

import json
import os

import pytest

import trainforge
from trainforge import DataParallelTrainer, RunConfig, ScalingConfig
from trainforge.client import discover

ray = pytest.importorskip("ray")
pytest.importorskip("fastapi")


def _loop(config):
    import ray as ray_in_worker

    ctx = ray_in_worker.get_runtime_context()
    trainforge.report({"rank": trainforge.get_context().get_world_rank(), "pid": os.getpid(),
                       "ray": ray_in_worker.is_initialized(), "actor": ctx.get_actor_id(), "job": ctx.get_job_id()})  # fmt: skip


@pytest.fixture
def ray_server(ray_single, tmp_path, monkeypatch):
    """A server started with ``RAY_ADDRESS`` = the test's cluster and no ``--capacity``; this process
    has none of the variables that name a server. (``HOME`` stays: Ray keeps its cluster's auth
    token in ``~/.ray/auth_token``.)"""
    from trainforge._testing.server import TrainServer

    for var in ("TRAINFORGE_ADDRESS", "TRAINFORGE_SERVER_DIR", "TRAINFORGE_TOKEN", "RAY_ADDRESS"):
        monkeypatch.delenv(var, raising=False)
    server = TrainServer(str(tmp_path / "server"), capacity=None,
                        env={"RAY_ADDRESS": ray.get_runtime_context().gcs_address}).start()  # fmt: skip
    assert server.url is not None, server.output
    yield server
    left = server.cleanup()
    assert not left, f"job processes left behind: {left}"


def _published() -> dict | None:
    from ray.experimental import internal_kv

    from trainforge._internal.constants import RAY_KV_KEY, RAY_KV_NAMESPACE

    value = internal_kv._internal_kv_get(RAY_KV_KEY, namespace=RAY_KV_NAMESPACE)
    return json.loads(value) if value else None


def test_server_on_a_ray_cluster_runs_jobs_as_actors_and_is_found_through_it(ray_server, tmp_path, monkeypatch):
    # Capacity: the cluster's resources (node-address ones aside), no reserve taken off.
    cluster = {k: float(v) for k, v in ray.cluster_resources().items() if not k.startswith("node:")}
    assert cluster["CPU"] == 4.0
    with ray_server.client() as by_url:
        assert by_url.resources()["capacity"] == cluster

    # Found through the cluster's KV: no address, no $TRAINFORGE_ADDRESS / $TRAINFORGE_SERVER_DIR.
    assert _published() == {"url": ray_server.url, "state_dir": ray_server.state_dir, "pid": ray_server.proc.pid}
    with open(os.path.join(ray_server.state_dir, "token")) as f:
        assert discover() == (ray_server.url, f.read().strip())  # the token of the published state directory
    with trainforge.server.Client() as client:
        assert client.address == ray_server.url
        assert client.health()
    # A state directory named explicitly comes first (then the cluster's server is not looked up).
    other = tmp_path / "other"
    other.mkdir()
    (other / "address").write_text("http://127.0.0.1:1")
    (other / "token").write_text("other-token")
    monkeypatch.setenv("TRAINFORGE_SERVER_DIR", str(other))
    assert discover() == ("http://127.0.0.1:1", "other-token")
    monkeypatch.delenv("TRAINFORGE_SERVER_DIR")
    trainer = DataParallelTrainer(
        _loop, scaling_config=ScalingConfig(num_workers=2),  # executor "auto": Ray, by the job's RAY_ADDRESS
        run_config=RunConfig(name="on-ray", storage_path=str(tmp_path / "runs"), verbose=0),
    )  # fmt: skip
    job = trainer.submit()  # no address: found through Ray as above
    assert job.client.address == ray_server.url
    result = job.result(timeout=90)
    assert job.status().state == "SUCCEEDED"
    [report] = list(job.reports())
    assert report.metrics == result.metrics
    metrics = report.all_metrics
    assert [m["rank"] for m in metrics] == [0, 1]
    assert all(m["ray"] for m in metrics)
    actors = [m["actor"] for m in metrics]
    assert all(actors) and len(set(actors)) == 2  # two Ray actors
    [ray_job] = {m["job"] for m in metrics}
    assert ray_job != ray.get_runtime_context().get_job_id()  # the job's runner is a Ray driver of its own

    # Nothing of the job is left on the cluster: its actors are dead, its placement group removed.
    from ray._private import state  # the GCS's actor table (ray.util.state needs the dashboard)
    from ray.util import placement_group_table

    from trainforge._testing.procs import pid_alive

    assert {state.actors(actor_id=a)["State"] for a in actors} == {"DEAD"}
    assert {v["state"] for v in placement_group_table().values()} <= {"REMOVED"}
    assert [m["pid"] for m in metrics if pid_alive(m["pid"])] == []

    # Stopping the server withdraws its entry and only disconnects it: this driver's Ray goes on.
    ray_server.stop()  # SIGTERM (its exit code is Ray's driver SIGTERM handler's: sys.exit(15))
    assert "the Ray cluster's: 4 CPU" in ray_server.output and "trainforge server: stopped" in ray_server.output
    assert _published() is None
    assert ray.is_initialized()
    assert ray.get(ray.remote(lambda: 42).remote()) == 42
    assert ray.cluster_resources()["CPU"] == 4.0
