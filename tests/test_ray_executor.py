"""The Ray executor on a one-node Ray instance: choosing it, failing fast on requests the cluster can
never hold, waiting for resources, Ray Data, stacks, cleanup, and never importing ray.train/tune/air.
(The behaviour shared with local workers is tested by the suites parametrised with ``executor``.)"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import pytest

import trainforge as train
from trainforge import DataParallelTrainer, FailureConfig, RunConfig, ScalingConfig, TrainingFailedError
from trainforge._internal.worker_group.executor import executor_kind

ray = pytest.importorskip("ray")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORBIDDEN = ("ray.train", "ray.tune", "ray.air")


def _rc(tmp_path, **failure):
    return RunConfig(storage_path=str(tmp_path), name="r", verbose=0, failure_config=FailureConfig(**failure))


# -- choosing the executor ------------------------------------------------------------------------
def test_executor_is_validated():
    with pytest.raises(ValueError, match=r"ScalingConfig.executor='rayy' is not valid: choose one of \('auto', 'local', 'ray'\)"):
        ScalingConfig(executor="rayy")


def test_auto_is_local_without_a_cluster_and_ray_with_ray_address(monkeypatch):
    from trainforge._internal import ray_utils

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray_utils, "ray_connected", lambda: False)  # as in a process without ray.init()
    assert executor_kind(ScalingConfig()) == "local"
    assert executor_kind(ScalingConfig(executor="ray")) == "ray"
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    assert executor_kind(ScalingConfig()) == "ray"
    assert executor_kind(ScalingConfig(executor="local")) == "local"


def test_auto_is_ray_when_connected(ray_single, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert executor_kind(ScalingConfig()) == "ray"
    assert executor_kind(ScalingConfig(executor="local")) == "local"


def test_library_never_imports_ray_train_tune_air():
    pattern = re.compile(r"^\s*(from|import)\s+ray\.(train|tune|air)\b|['\"]ray\.(train|tune|air)['\"]", re.M)
    offenders = []
    for root, _, files in os.walk(os.path.join(REPO, "trainforge")):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                with open(path) as f:
                    if pattern.search(f.read()):
                        offenders.append(os.path.relpath(path, REPO))
    assert offenders == []


_DRIVER = """
import sys
import tempfile
import trainforge as train
from trainforge import DataParallelTrainer, RunConfig, ScalingConfig

assert "ray" not in sys.modules  # import trainforge does not import ray
result = DataParallelTrainer(
    lambda: train.report({"ok": 1}),
    scaling_config=ScalingConfig(num_workers=2, executor=sys.argv[2]),
    run_config=RunConfig(storage_path=sys.argv[1], name="sub", verbose=0),
).fit()
assert result.metrics == {"ok": 1}, result.metrics
print("FORBIDDEN=" + ",".join(m for m in sys.modules if m.startswith(("ray.train", "ray.tune", "ray.air"))))
print("EXECUTOR=" + ("ray" if "ray" in sys.modules and sys.modules["ray"].is_initialized() else "local"))
"""


def _run_driver(tmp_path, executor: str, env: dict[str, str]) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", _DRIVER, str(tmp_path), executor],
        capture_output=True, text=True, timeout=240, env={**os.environ, **env}, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_ray_address_selects_ray_and_nothing_imports_ray_train(ray_single, tmp_path):
    """A fresh driver with $RAY_ADDRESS set (executor "auto") joins the cluster and runs its workers as
    actors; afterwards none of ray.train, ray.tune, ray.air is imported."""
    address = ray.get_runtime_context().gcs_address
    out = _run_driver(tmp_path, "auto", {"RAY_ADDRESS": address})
    assert "EXECUTOR=ray" in out and "FORBIDDEN=\n" in out


@pytest.mark.slow
def _dead_address() -> str:
    """127.0.0.1:PORT where nothing listens (a port the OS just handed out and took back)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize("address_file", ["none", "stale"])
def test_executor_ray_without_a_cluster_starts_ray(tmp_path, address_file):
    """No $RAY_ADDRESS: a local Ray instance starts, also when Ray's address file was left behind by a
    cluster that is gone (plain ``ray.init()`` would retry the dead address for minutes)."""
    ray_tmp = tempfile.mkdtemp(prefix="tfray", dir="/tmp")  # short: Ray's socket paths live under it
    try:
        if address_file == "stale":
            os.makedirs(os.path.join(ray_tmp, "ray"))
            with open(os.path.join(ray_tmp, "ray", "ray_current_cluster"), "w") as f:
                f.write(_dead_address())
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        env["RAY_TMPDIR"] = ray_tmp
        proc = subprocess.run(
            [sys.executable, "-c", _DRIVER, str(tmp_path), "ray"], capture_output=True, text=True, timeout=240,
            env=env, cwd=REPO,
        )  # fmt: skip
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "EXECUTOR=ray" in proc.stdout and "FORBIDDEN=\n" in proc.stdout
    assert "Started a local Ray instance" in proc.stderr


def test_stale_ray_address_is_one_nobody_listens_on(tmp_path, monkeypatch):
    from trainforge._internal.ray_utils import stale_ray_address

    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    assert stale_ray_address() is None  # no file
    (tmp_path / "ray").mkdir()
    dead = _dead_address()
    (tmp_path / "ray" / "ray_current_cluster").write_text(dead)
    assert stale_ray_address(probe_timeout_s=5) == dead
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        (tmp_path / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{server.getsockname()[1]}")
        assert stale_ray_address(probe_timeout_s=5) is None


# -- requests the cluster can never hold ----------------------------------------------------------
@pytest.mark.parametrize(
    "scaling, message",
    [
        (dict(num_workers=1, use_gpu=True, resources_per_worker={"GPU": 3}),
         r"1 worker\(s\) with \{'CPU': 1.0, 'GPU': 3.0\} each .* GPU=3, but the largest node has GPU=0"),
        (dict(num_workers=3, resources_per_worker={"CPU": 2}),
         r"3 workers need \{'CPU': 6.0\} in all, but the cluster has \{'CPU': 4.0\}"),
        (dict(num_workers=1, resources_per_worker={"TPU": 1}), r"TPU=1, but the largest node has TPU=0"),
        (dict(num_workers=2, placement_strategy="STRICT_SPREAD"),
         r"STRICT_SPREAD puts each of the 2 workers on a different node, but only 1 node\(s\) can hold one"),
        (dict(num_workers=(5, 8)), r"5 workers need \{'CPU': 5.0\} in all, but the cluster has \{'CPU': 4.0\}"),
    ],
    ids=["gpus", "cpus_in_all", "custom", "strict_spread", "elastic_min"],
)  # fmt: skip
def test_impossible_request_fails_fast(ray_single, tmp_path, scaling, message):
    trainer = DataParallelTrainer(
        lambda: None, scaling_config=ScalingConfig(executor="ray", **scaling), run_config=_rc(tmp_path)
    )
    start = time.monotonic()
    with pytest.raises(ValueError, match=message) as info:
        trainer.fit()
    assert time.monotonic() - start < 10  # not a wait for resources
    assert "can never hold" in str(info.value) and "Cluster nodes: 127.0.0.1" in str(info.value)


def test_request_that_fits_later_waits_with_a_message(ray_single, tmp_path, caplog):
    """3 of the 4 CPUs are held by someone else: the run logs that it waits; once they are freed
    (here: when that message appears) it gets its workers."""
    from ray.util.placement_group import placement_group, remove_placement_group

    blocker = placement_group([{"CPU": 3}])
    assert blocker.wait(30)

    class FreeOnWait(logging.Handler):
        def emit(self, record):
            if "waiting up to" in record.getMessage():
                remove_placement_group(blocker)

    handler = FreeOnWait()
    logging.getLogger("trainforge").addHandler(handler)
    try:
        with caplog.at_level("WARNING", logger="trainforge"):
            result = DataParallelTrainer(
                lambda: train.report({"ok": train.get_context().get_world_size()}),
                scaling_config=ScalingConfig(num_workers=2, executor="ray"),
                run_config=_rc(tmp_path),
            ).fit()
    finally:
        logging.getLogger("trainforge").removeHandler(handler)
    assert result.metrics == {"ok": 2}
    [msg] = [r.getMessage() for r in caplog.records if "waiting up to" in r.getMessage()]
    assert "2 worker(s) of {'CPU': 1.0} (PACK)" in msg and "available {'CPU': 1.0}" in msg


def test_request_that_never_gets_room_times_out(ray_single, tmp_path, monkeypatch):
    from ray.util.placement_group import placement_group, remove_placement_group

    monkeypatch.setenv("TRAINFORGE_RESOURCE_WAIT_S", "3")
    blocker = placement_group([{"CPU": 3}])
    assert blocker.wait(30)
    try:
        with pytest.raises(TrainingFailedError, match=r"Ray did not place 2 worker\(s\) of \{'CPU': 1.0\} \(PACK\) within 3s"):
            DataParallelTrainer(
                lambda: None, scaling_config=ScalingConfig(num_workers=2, executor="ray"), run_config=_rc(tmp_path)
            ).fit()
    finally:
        remove_placement_group(blocker)


# -- datasets -------------------------------------------------------------------------------------
def test_ray_dataset_is_split_with_streaming_split(ray_single, tmp_path):
    import ray.data

    def loop():
        shard = train.get_dataset_shard("train")
        ids = [int(x) for b in shard.iter_batches(batch_size=4) for x in b["id"]]
        torch_ids = [int(x) for b in shard.iter_torch_batches(batch_size=3) for x in b["id"]]
        val = train.get_dataset_shard("val")
        n_val = sum(len(b) for b in val.iter_batches(batch_size=5, batch_format="pandas"))
        train.report({"ids": ids, "torch_ids": torch_ids, "n_val": n_val})

    trainer = DataParallelTrainer(
        loop,
        datasets={"train": ray.data.range(20), "val": ray.data.from_items([{"x": i} for i in range(7)])},
        scaling_config=ScalingConfig(num_workers=2, executor="ray"),
        run_config=_rc(tmp_path),
    )
    [report] = list(trainer.fit_iter())
    ids = [m["ids"] for m in report.all_metrics]
    assert sorted(ids[0] + ids[1]) == list(range(20)) and len(ids[0]) == len(ids[1]) == 10  # each row once
    torch_ids = [m["torch_ids"] for m in report.all_metrics]
    assert sorted(torch_ids[0] + torch_ids[1]) == list(range(20))  # a second epoch, split again
    assert [m["n_val"] for m in report.all_metrics] == [7, 7]  # other names are given whole


def test_ray_dataset_needs_the_ray_executor(ray_single):
    import ray.data

    with pytest.raises(ValueError, match=r"datasets\['train'\] is a .* from ray.data, which needs the Ray executor"):
        DataParallelTrainer(
            lambda: None, datasets={"train": ray.data.range(4)}, scaling_config=ScalingConfig(executor="local")
        )


# -- placement and environment on one node --------------------------------------------------------
def test_workers_are_actors_of_one_placement_group_and_are_gone_after(ray_single, tmp_path):
    def loop():
        ctx = ray.get_runtime_context()
        pg = ray.util.get_current_placement_group()
        train.report({"actor": ctx.get_actor_id(), "pg": pg.id.hex() if pg else None, "pid": os.getpid(),
                      "local": (train.get_context().get_local_rank(), train.get_context().get_local_world_size()),
                      "env": [os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                                      "GROUP_RANK", "MASTER_ADDR", "OMP_NUM_THREADS")]})  # fmt: skip

    [report] = list(
        DataParallelTrainer(
            loop, scaling_config=ScalingConfig(num_workers=3, executor="ray"), run_config=_rc(tmp_path)
        ).fit_iter()
    )
    metrics = report.all_metrics
    assert all(m["actor"] for m in metrics) and len({m["actor"] for m in metrics}) == 3
    assert len({m["pg"] for m in metrics}) == 1 and metrics[0]["pg"] is not None
    assert [m["local"] for m in metrics] == [(0, 3), (1, 3), (2, 3)]
    assert [m["env"] for m in metrics] == [[str(r), str(r), "3", "3", "0", "127.0.0.1", "1"] for r in range(3)]
    from ray.util import placement_group_table

    states = {v["state"] for v in placement_group_table().values()}
    assert states <= {"REMOVED"}  # the run's placement group is gone
    from trainforge._testing.procs import pid_alive

    assert [m["pid"] for m in metrics if pid_alive(m["pid"])] == []


def test_hang_stacks_come_from_the_reader_thread(ray_single, tmp_path):
    """A Ray worker blocked in C (a lock) still answers the "stacks" command."""

    def loop():
        import threading

        if train.get_context().get_world_rank() == 0:
            lock = threading.Lock()
            lock.acquire()

            def blocked_on_a_lock_in_a_ray_actor():
                lock.acquire()

            blocked_on_a_lock_in_a_ray_actor()
        train.report({"ok": 1})

    with pytest.raises(TrainingFailedError) as info:
        DataParallelTrainer(
            loop, scaling_config=ScalingConfig(num_workers=2, executor="ray"), run_config=_rc(tmp_path, hang_timeout_s=2)
        ).fit()
    msg = str(info.value)
    assert "stacks (all threads) of hung rank 0" in msg and "blocked_on_a_lock_in_a_ray_actor" in msg
    assert "trainforge-reader" in msg or "_read_loop" in msg  # the thread that answered


# -- pure units -----------------------------------------------------------------------------------
def _node(ip, **resources):
    return {"NodeManagerAddress": ip, "Alive": True, "Resources": resources}


@pytest.mark.parametrize(
    "bundle, n, strategy, why",
    [
        ({"CPU": 1}, 4, "PACK", None),
        ({"CPU": 1}, 5, "SPREAD", r"5 workers need \{'CPU': 5\} in all, but the cluster has \{'CPU': 4.0\}"),
        ({"CPU": 3}, 2, "PACK", r"as whole bundles: 1"),  # 4 CPUs in all, but 3 + 1 on two nodes
        ({"CPU": 1}, 3, "STRICT_PACK", None),
        ({"CPU": 1}, 4, "STRICT_PACK", r"STRICT_PACK puts all 4 workers on one node, but the largest holds 3"),
        ({"CPU": 1}, 2, "STRICT_SPREAD", None),
        ({"CPU": 1}, 3, "STRICT_SPREAD", r"only 2 node\(s\) can hold one"),
        ({"CPU": 1, "GPU": 1}, 1, "PACK", r"GPU=1, but the largest node has GPU=0"),
        ({}, 1, "PACK", r"asks for no resources at all"),
    ],
)  # fmt: skip
def test_infeasibility_rules(bundle, n, strategy, why):
    from trainforge._internal.worker_group.ray_placement import infeasibility

    nodes = [_node("10.0.0.1", CPU=3.0), _node("10.0.0.2", CPU=1.0)]
    got = infeasibility(bundle, n, strategy, nodes)
    if why is None:
        assert got is None
    else:
        assert got is not None and re.search(why, got), got


def test_death_reason_keeps_the_cause_only():
    from trainforge._internal.worker_group.ray import death_reason

    class ActorDiedError(Exception):
        error_msg = (
            "The actor died unexpectedly before finishing this task.\n\tclass_name: _WorkerActor\n\tactor_id: ab12\n"
            "\tpid: 4242\n\tnamespace: x\n\tip: 10.0.0.2\nThe actor is dead because its worker process has died. "
            "Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error "
            "code 2. End of file. Some common causes include: (1) the process was killed by the OOM killer"
        )

    assert death_reason(ActorDiedError()) == (
        "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: "
        "Worker unexpectedly exits with a connection error code 2. End of file."
    )
