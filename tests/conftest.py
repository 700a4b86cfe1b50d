"""Shared fixtures. Every test runs with its own storage path and fails if it leaks child processes.

``executor`` runs a test once per executor ("local" processes, "ray" actors): the shared behaviour
suite. The Ray side uses one Ray instance (4 CPUs, no dashboard, every process bound to 127.0.0.1),
started before the test's process snapshot. Tests that use Ray run after all the others (so that no
other test sees a Ray connection, which makes ``executor="auto"`` choose Ray), then the multi-node
tests (test_ray_cluster.py, a ``ray.cluster_utils.Cluster``).

``chromium`` (session) and ``page`` drive Debian's headless Chromium through Playwright
(trainforge/_testing/browser.py).
Tests that use them run last of all: Playwright's sync API leaves an asyncio loop running in the main
thread from the browser's start to the session's end, and ``asyncio.run()`` refuses to run then.

Lanes (scripts/test.sh): the collection hook marks the tests that use Ray or the browser ``ray`` /
``browser`` and both ``serial``: they keep that order in a lane of their own (``pytest -m serial``,
one process), while the rest run on parallel xdist workers (``pytest -n N -m "not serial"``).
``quick`` marks the unit tests of the edit loop (``scripts/test.sh --quick``): not ``slow``, not
serial, and not in a module of real multi-process runs (``SLOW_MODULES``).

Hypothesis: the profile ``$HYPOTHESIS_PROFILE`` names is loaded here (tests/hypothesis_profiles.py):
``quick`` (a few examples a property; ``scripts/test.sh --quick`` sets it) or ``thorough`` (each
property's full count; the default, and the full suite's lanes).

Processes: every test fails if it leaves a child process behind (``_no_leftover_processes``, per
process, so per xdist worker). The run tags its environment (``$TRAINFORGE_TEST_RUN``, inherited by
all it starts); at the end the controller kills and names any tagged process still alive.
"""

from __future__ import annotations

import os
import sys

import hypothesis_profiles
import pytest

from trainforge._testing import procs

hypothesis_profiles.load()

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


def _uses_browser(item: pytest.Item) -> bool:
    return "chromium" in getattr(item, "fixturenames", ())  # ``page`` uses it too


# Out of the quick layer (``scripts/test.sh --quick``, <= 3 min), like the tests marked ``slow``: tests
# that start real processes (a trainer's workers, a server, a driver script, an S3 server) or take
# seconds. A test is out if it uses one of SLOW_FIXTURES, is in one of SLOW_MODULES (their tests are
# mostly such runs) or is named in SLOW_TESTS. A new module of real runs goes in SLOW_MODULES (or marks
# its tests ``slow``); `pytest -m quick --durations=20` shows what the quick layer spends its time on.
SLOW_FIXTURES = frozenset({"executor", "train_server", "bucket", "moto_endpoint"})
SLOW_MODULES = frozenset({"test_console", "test_failures", "test_gpu_readiness", "test_local_e2e", "test_ray_executor",
                          "test_recovery", "test_server_cli", "test_sinks", "test_storage_faults"})  # fmt: skip
SLOW_TESTS = frozenset({
    "test_stateful_sequences_follow_the_schema",  # test_server_api: 100 scenarios, ~40 s
    "test_register_a_trained_model_and_load_it_in_one_call",  # test_registry: real fits and CLI runs
    "test_models_uri_is_a_checkpoint_for_trainers_and_tuners",
    "test_cli_register_list_alias_delete_push_pull",
    "test_concurrent_registers_and_alias_moves_on_local_disk",
})  # fmt: skip


def _quick(item: pytest.Item) -> bool:
    return (
        item.get_closest_marker("slow") is None
        and item.module.__name__ not in SLOW_MODULES
        and getattr(item, "originalname", item.name) not in SLOW_TESTS
        and not SLOW_FIXTURES & set(getattr(item, "fixturenames", ()))
    )


@pytest.hookimpl(tryfirst=True)  # before -m deselects by the markers it adds
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        serial = False
        if _uses_ray(item):
            item.add_marker(pytest.mark.ray)
            serial = True
        if _uses_browser(item):
            item.add_marker(pytest.mark.browser)
            serial = True
        if serial:
            item.add_marker(pytest.mark.serial)
        elif _quick(item):
            item.add_marker(pytest.mark.quick)
    browser = [i for i in items if _uses_browser(i)]
    cluster = [i for i in items if "cluster" in getattr(i, "fixturenames", ()) and i not in browser]
    ray_tests = [i for i in items if _uses_ray(i) and i not in cluster and i not in browser]
    others = [i for i in items if not _uses_ray(i) and i not in browser]
    items[:] = others + ray_tests + cluster + browser


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


@pytest.fixture(scope="module")
def moto_endpoint():
    """moto's S3 server on 127.0.0.1 (an ephemeral port), one per test module."""
    import logging

    moto_server = pytest.importorskip("moto.server")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def bucket(moto_endpoint, monkeypatch, tmp_path) -> str:
    """A fresh bucket; the environment points boto (and so s3fs, in the driver and the workers) at moto."""
    import uuid

    s3fs = pytest.importorskip("s3fs")
    boto3 = pytest.importorskip("boto3")
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no_aws_config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no_aws_credentials"))
    monkeypatch.setenv("TRAINFORGE_STORAGE_RETRY_DELAY_S", "0.01")
    s3fs.S3FileSystem.clear_instance_cache()  # instances made for another server or environment
    name = f"tf-{uuid.uuid4().hex[:12]}"
    boto3.client("s3").create_bucket(Bucket=name)
    yield name
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture(autouse=True)
def _isolated_storage(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFORGE_STORAGE_PATH", str(tmp_path / "results"))
    monkeypatch.setenv("TRAINFORGE_SHUTDOWN_GRACE_S", "3")
    # The model registry and its local cache of pulled versions: never the user's ~/trainforge/registry.
    monkeypatch.setenv("TRAINFORGE_REGISTRY", str(tmp_path / "registry"))
    monkeypatch.setenv("TRAINFORGE_REGISTRY_CACHE", str(tmp_path / "registry-cache"))
    # No test finds a train server of this machine's user by accident (a tuner would send its trials
    # there): tests that want one start it (the train_server fixture sets these again).
    monkeypatch.setenv("TRAINFORGE_SERVER_DIR", str(tmp_path / "no-server"))
    monkeypatch.delenv("TRAINFORGE_ADDRESS", raising=False)
    yield


@pytest.fixture(scope="session")
def _session_process_roots() -> set[int]:
    """Pids of the process trees that session fixtures keep for the whole run (the ``chromium``
    fixture's Playwright driver); ``_no_leftover_processes`` ignores them and all their descendants."""
    return set()


@pytest.fixture(autouse=True)
def _no_leftover_processes(_session_process_roots):
    """Fail any test that leaves a child process (a worker, or a worker's child, or a Ray actor) behind.

    The session browser's processes are not a test's: pytest sets session fixtures up before this
    snapshot, but Chromium starts renderers as pages open and reaps them (or keeps a spare) when it
    likes, so no snapshot tells them apart; the tree under a session root (its Playwright driver) does.
    Per process: under xdist each worker checks its own tests.
    """
    before = procs.child_pids()
    yield
    alive = procs.leftover_children(before, _session_process_roots)
    assert not alive, f"test left processes behind: {alive}"


def pytest_configure(config: pytest.Config) -> None:
    procs.tag_run(os.environ.get("PYTEST_XDIST_WORKER"))


def pytest_unconfigure(config: pytest.Config) -> None:
    """The controller (or a run without xdist), once its workers are gone: any process of this run
    still alive outlived its test unseen (an orphan, not a child when its test ended): named, killed."""
    if os.environ.get("PYTEST_XDIST_WORKER") is not None:
        return
    tag = os.environ[procs.RUN_ENV]
    left = procs.tagged_processes(tag)
    if left:
        alive = procs.wait_until_gone([p.pid for p in left], timeout=5)
        named = [procs.describe(p, 200) for p in left if p.pid in alive]
        procs.kill_procs(p for p in left if p.pid in alive)
        if named:
            print(f"\nprocesses of this test run outlived it (killed now): {named}", file=sys.stderr)


os.environ.setdefault("PYTHONFAULTHANDLER", "1")


@pytest.fixture
def train_server(tmp_path, monkeypatch):
    """A real train server (capacity 2 CPUs) on 127.0.0.1, which ``trainer.submit()`` and ``Client()``
    find through $TRAINFORGE_SERVER_DIR; fails the test if a job process outlives it (the server
    keeps jobs running when it stops, so every test must have ended or stopped them)."""
    pytest.importorskip("fastapi")
    from trainforge._testing.server import TrainServer

    server = TrainServer(str(tmp_path / "server")).start()
    monkeypatch.setenv("TRAINFORGE_SERVER_DIR", server.state_dir)
    yield server
    left = server.cleanup()
    assert not left, f"job processes left behind: {left}"
    assert "Traceback" not in server.output, server.output  # no request ever failed inside the server


@pytest.fixture(scope="session")
def chromium(_session_process_roots):
    """Debian's headless Chromium, driven by Playwright's sync API, for the whole session: a
    ``playwright.sync_api.Browser`` (see trainforge/_testing/browser.py). Errors with the fix, never skips, when Playwright
    or /usr/bin/chromium is missing. From its start on, the main thread has a running asyncio loop
    (Playwright's) and ``asyncio.run()`` fails: tests that use it run after all others, and must not
    call ``asyncio.run()`` themselves (drive the server in a subprocess, e.g. ``train_server``)."""
    from trainforge._testing.browser import BrowserSession

    session = BrowserSession.start()
    _session_process_roots.add(session.driver_pid)
    yield session.browser
    _session_process_roots.discard(session.driver_pid)
    session.stop()


@pytest.fixture
def page_errors():
    """The ``page`` fixture's record of the page's errors: ``page_errors.allow("status of 401")`` lets a
    test expect one (see trainforge._testing.browser.PageErrors)."""
    from trainforge._testing.browser import PageErrors

    return PageErrors()


@pytest.fixture
def page(chromium, page_errors):
    """A fresh page (its own context) in the session's Chromium; fails the test at teardown if the page
    logged a ``console.error`` (a failed load included), threw an uncaught exception or crashed, listing
    them, unless the test allowed them with ``page_errors.allow(regex)``."""
    from trainforge._testing.browser import open_page

    with open_page(chromium, page_errors) as page:
        yield page
