"""Shared fixtures. Every test runs with its own storage path and fails if it leaks child processes.

``executor`` runs a test once per executor ("local" processes, "ray" actors): the shared behaviour
suite. The Ray side uses one Ray instance (4 CPUs, no dashboard, every process bound to 127.0.0.1),
started before the test's process snapshot. Tests that use Ray run after all the others (so that no
other test sees a Ray connection, which makes ``executor="auto"`` choose Ray), and the multi-node
tests (test_ray_cluster.py, a ``ray.cluster_utils.Cluster``) run last.
"""

from __future__ import annotations

import os

import psutil
import pytest

# Ray turns a 127.0.0.1 node address into the machine's reachable IP unless clusters are "disabled";
# with this, every Ray process of the tests binds to 127.0.0.1 only.
# (read when ray is imported, so set before any test imports it).
RAY_TEST_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
RAY_CPUS = 4
os.environ.update(RAY_TEST_ENV)


class RayHarness:
    """The Ray cluster of the test session: "single" (one node) or a multi-node Cluster."""

    def __init__(self) -> None:
        self.mode: str | None = None
        self.cluster = None

    def single(self) -> None:
        if self.mode == "single":
            return
        self.stop()
        import ray

        ray.init(
            address="local",  # a new instance, whatever a leftover ray_current_cluster file names
            num_cpus=RAY_CPUS,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            object_store_memory=200 * 2**20,
            log_to_driver=True,
        )
        self.mode = "single"

    def start_cluster(self, head: dict, workers: list[dict]):
        from ray.cluster_utils import Cluster

        self.stop()
        base = {"node_ip_address": "127.0.0.1", "object_store_memory": 100 * 2**20}
        self.cluster = Cluster(initialize_head=True, head_node_args={**base, **head})
        for args in workers:
            self.cluster.add_node(**{**base, **args})
        self.cluster.wait_for_nodes()
        self.cluster.connect()
        self.mode = "cluster"
        return self.cluster

    def stop(self) -> None:
        if self.mode is None:
            return
        import ray

        ray.shutdown()
        if self.cluster is not None:
            self.cluster.shutdown()
            self.cluster = None
        self.mode = None


def _uses_ray(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    if callspec is not None and callspec.params.get("executor") == "ray":
        return True
    return bool({"ray_single", "ray_harness", "cluster"} & set(getattr(item, "fixturenames", ())))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    cluster = [i for i in items if "cluster" in getattr(i, "fixturenames", ())]
    ray_tests = [i for i in items if _uses_ray(i) and i not in cluster]
    others = [i for i in items if not _uses_ray(i)]
    items[:] = others + ray_tests + cluster


@pytest.fixture(scope="session")
def ray_harness():
    harness = RayHarness()
    yield harness
    harness.stop()


@pytest.fixture(scope="module")
def ray_single(ray_harness):
    """A one-node Ray instance (module scope: set up before any test's process snapshot)."""
    pytest.importorskip("ray")
    ray_harness.single()
    return ray_harness


@pytest.fixture(params=["local", "ray"])
def executor(request):
    """The executor a shared-suite test runs on: pass it as ScalingConfig(executor=executor)."""
    if request.param == "ray":
        request.getfixturevalue("ray_single")
    return request.param


@pytest.fixture(autouse=True)
def _isolated_storage(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFORGE_STORAGE_PATH", str(tmp_path / "results"))
    monkeypatch.setenv("TRAINFORGE_SHUTDOWN_GRACE_S", "3")
    yield


# Ray's daemons and agents, and the cluster-wide helper actors Ray Data starts once and keeps.
_RAY_SYSTEM_NAMES = ("ray::IDLE", "raylet", "gcs_server", "ray::DashboardAgent", "ray::RuntimeEnvAgent",
                     "ray::_StatsActor", "ray::_AutoscalingCoordinatorActor", "ray::_Autoscali", "ray::_StatsActo")
_RAY_SYSTEM_SCRIPTS = ("ray/_private/workers/default_worker.py", "ray/dashboard/", "ray/_private/log_monitor.py",
                       "ray/autoscaler/", "ray_process_reaper")  # fmt: skip


def _ray_system_process(p: psutil.Process) -> bool:
    """A process of Ray's own that may come and go between tests: an idle pooled worker (or one
    starting up), a node's daemon or agent. Actors (named ``ray::ClassName...``) are not."""
    try:
        name, cmd = p.name(), " ".join(p.cmdline())
    except psutil.Error:
        return True
    if name in _RAY_SYSTEM_NAMES or cmd.startswith(_RAY_SYSTEM_NAMES):
        return True
    return any(script in cmd for script in _RAY_SYSTEM_SCRIPTS)


def _describe(p: psutil.Process) -> tuple:
    try:
        return (p.pid, p.name(), p.cmdline())
    except psutil.Error:
        return (p.pid, "gone")


@pytest.fixture(autouse=True)
def _no_leftover_processes():
    """Fail any test that leaves a child process (a worker, or a worker's child, or a Ray actor) behind."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    leftover = [
        p for p in psutil.Process().children(recursive=True) if p.pid not in before and not _ray_system_process(p)
    ]
    if not leftover:
        return
    gone, alive = psutil.wait_procs(leftover, timeout=5)
    for p in alive:
        p.kill()
    assert not alive, f"test left processes behind: {[_describe(p) for p in alive]}"


os.environ.setdefault("PYTHONFAULTHANDLER", "1")


@pytest.fixture
def train_server(tmp_path, monkeypatch):
    """A real train server (capacity 2 CPUs) on 127.0.0.1, which ``trainer.submit()`` and ``Client()``
    find through $TRAINFORGE_SERVER_DIR; fails the test if a job process outlives it (the server
    keeps jobs running when it stops, so every test must have ended or stopped them)."""
    pytest.importorskip("fastapi")
    from serverutil import ServerProc

    server = ServerProc(str(tmp_path / "server")).start()
    monkeypatch.setenv("TRAINFORGE_SERVER_DIR", server.state_dir)
    yield server
    left = server.cleanup()
    assert not left, f"job processes left behind: {left}"
    assert "Traceback" not in server.output, server.output  # no request ever failed inside the server
