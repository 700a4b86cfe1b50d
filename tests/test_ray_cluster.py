"""The Ray executor on a real multi-node Ray cluster on this machine (``ray.cluster_utils.Cluster``,
every node on 127.0.0.1): placement across nodes, node/local ranks, devices, cross-node DDP, storage
reachability, and losing a node mid-training.

Nodes: the head (2 CPUs, 2 pretend GPUs, {"head", "loss": 1}), node2 (2 CPUs, {"node2"}), and for
the node-loss tests a spare node ({"loss": 1}) that the test removes.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

import pytest

import trainforge as train
from trainforge import (
    Checkpoint,
    DataParallelTrainer,
    FailureConfig,
    RunConfig,
    ScalingConfig,
    TrainingFailedError,
)
from trainforge.backend import Backend, BackendConfig

ray = pytest.importorskip("ray")

HEAD = {"num_cpus": 2, "num_gpus": 2, "resources": {"head": 100, "loss": 1}}
NODE2 = {"num_cpus": 2, "resources": {"node2": 100}}
SPARE = {"num_cpus": 1, "resources": {"loss": 1, "spare": 1}}


@pytest.fixture(scope="module")
def cluster(ray_harness):
    cluster = ray_harness.start_cluster(HEAD, [NODE2])
    yield cluster
    ray_harness.stop()


@pytest.fixture
def add_spare(cluster):
    """Adds the spare node when called; removes it after the test if it is still there."""
    added = []

    def add():
        node = cluster.add_node(node_ip_address="127.0.0.1", object_store_memory=100 * 2**20, **SPARE)
        cluster.wait_for_nodes()
        added.append(node)
        return node

    yield add
    for node in added:
        if node in cluster.worker_nodes:
            cluster.remove_node(node)


@pytest.fixture
def spare_node(add_spare):
    return add_spare()


def _rc(tmp_path, callbacks=None, **failure):
    return RunConfig(storage_path=str(tmp_path), name="c", verbose=0, failure_config=FailureConfig(**failure),
                     callbacks=callbacks)  # fmt: skip


_METADATA: list = []


class _RecordPlacement(Backend):
    def on_start(self, worker_group, backend_config):
        _METADATA[:] = worker_group.worker_metadata


@dataclass
class _RecordConfig(BackendConfig):
    @property
    def backend_cls(self):
        return _RecordPlacement


def _where():
    ctx = train.get_context()
    train.report(
        {
            "node": ray.get_runtime_context().get_node_id(),
            "node_rank": ctx.get_node_rank(),
            "local": (ctx.get_local_rank(), ctx.get_local_world_size()),
            "env": {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR")},
            "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "pid": os.getpid(),
        }
    )


def _placement(scaling: ScalingConfig, tmp_path) -> list[dict]:
    [report] = list(
        DataParallelTrainer(_where, backend_config=_RecordConfig(), scaling_config=scaling, run_config=_rc(tmp_path))
        .fit_iter()
    )
    return report.all_metrics


def test_spread_uses_both_nodes_with_node_and_local_ranks(cluster, tmp_path):
    metrics = _placement(ScalingConfig(num_workers=4, placement_strategy="SPREAD", executor="ray"), tmp_path)
    nodes = [m["node"] for m in metrics]
    assert set(nodes) == {cluster.head_node.node_id, next(iter(cluster.worker_nodes)).node_id}
    # Node rank: the order in which nodes first appear among the ranks; rank 0's node is node 0.
    order = list(dict.fromkeys(nodes))
    assert [m["node_rank"] for m in metrics] == [order.index(n) for n in nodes]
    assert {m["node_rank"] for m in metrics} == {0, 1}
    for node in order:  # local ranks count the ranks of each node, in rank order
        on_node = [m for m in metrics if m["node"] == node]
        assert [m["local"] for m in on_node] == [(i, len(on_node)) for i in range(len(on_node))]
    for rank, m in enumerate(metrics):
        assert m["env"] == {
            "RANK": str(rank), "LOCAL_RANK": str(m["local"][0]), "LOCAL_WORLD_SIZE": str(m["local"][1]),
            "GROUP_RANK": str(m["node_rank"]), "MASTER_ADDR": "127.0.0.1",
        }  # fmt: skip
    # The driver knows where each worker runs (what the torch backend uses for MASTER_ADDR).
    assert [(md.rank, md.node_rank, md.local_rank, md.pid, md.node_ip) for md in _METADATA] == [
        (r, m["node_rank"], m["local"][0], m["pid"], "127.0.0.1") for r, m in enumerate(metrics)
    ]
    assert all(md.hostname for md in _METADATA)


def test_custom_resource_pins_workers_to_a_node(cluster, tmp_path):
    scaling = ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1, "node2": 1}, executor="ray")
    metrics = _placement(scaling, tmp_path)
    node2 = next(iter(cluster.worker_nodes)).node_id
    assert [m["node"] for m in metrics] == [node2, node2]
    assert [(m["node_rank"], m["local"]) for m in metrics] == [(0, (0, 2)), (0, (1, 2))]


@pytest.mark.parametrize(
    "resources, expected", [(None, [["0"], ["1"]]), ({"GPU": 0.5}, [["0"], ["0"]])], ids=["whole", "half"]
)
def test_gpus_are_the_ones_ray_assigned(cluster, tmp_path, resources, expected):
    """The head node pretends to have 2 GPUs: each worker's CUDA_VISIBLE_DEVICES is Ray's assignment."""
    scaling = ScalingConfig(num_workers=2, use_gpu=True, resources_per_worker=resources, executor="ray")
    metrics = _placement(scaling, tmp_path)
    assert [m["node"] for m in metrics] == [cluster.head_node.node_id] * 2
    cvds = [m["cvd"] for m in metrics]
    if resources is None:
        assert sorted(cvds) == ["0", "1"]  # one GPU each, different ones
    else:
        assert cvds == ["0", "0"]  # two workers share GPU 0
    assert sorted([md.gpu_ids for md in _METADATA]) == sorted(expected)


def test_ddp_across_nodes(cluster, tmp_path):
    from trainforge.torch import TorchTrainer, prepare_model

    def loop():
        import torch
        import torch.distributed as dist

        model = prepare_model(torch.nn.Linear(2, 1))
        total = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(total)
        train.report({"sum": total.item(), "ddp": isinstance(model, torch.nn.parallel.DistributedDataParallel),
                      "node": ray.get_runtime_context().get_node_id()})  # fmt: skip

    [report] = list(
        TorchTrainer(
            loop,
            scaling_config=ScalingConfig(num_workers=2, placement_strategy="STRICT_SPREAD", executor="ray"),
            run_config=_rc(tmp_path),
        ).fit_iter()
    )
    assert [m["sum"] for m in report.all_metrics] == [3.0, 3.0]
    assert all(m["ddp"] for m in report.all_metrics)
    assert len({m["node"] for m in report.all_metrics}) == 2


def test_strict_spread_beyond_the_node_count_fails_fast(cluster, tmp_path):
    trainer = DataParallelTrainer(
        lambda: None,
        scaling_config=ScalingConfig(num_workers=3, placement_strategy="STRICT_SPREAD", executor="ray"),
        run_config=_rc(tmp_path),
    )
    with pytest.raises(ValueError, match=r"STRICT_SPREAD puts each of the 3 workers on a different node, but only 2"):
        trainer.fit()


def test_local_storage_path_across_machines_is_refused(cluster, tmp_path, monkeypatch):
    """The nodes here share this machine; pretend the driver runs elsewhere."""
    import trainforge._internal.worker_group.ray as ray_group

    monkeypatch.setattr(ray_group.socket, "gethostname", lambda: "the-driver-machine")
    trainer = DataParallelTrainer(
        lambda: None, scaling_config=ScalingConfig(num_workers=2, executor="ray"), run_config=_rc(tmp_path)
    )
    with pytest.raises(ValueError, match=r"storage_path is a local path, but the Ray workers run on other machines"):
        trainer.fit()


def _save(value) -> Checkpoint:
    d = tempfile.mkdtemp()
    with open(os.path.join(d, "value"), "w") as f:
        f.write(str(value))
    return Checkpoint.from_directory(d)


def _loss_loop():
    """Attempt 0: a checkpoint, then wait (the test removes the spare node). Later: resume."""
    import time

    ctx = train.get_context()
    if ctx.get_attempt() == 0:
        train.report({"attempt": 0, "world": ctx.get_world_size()}, checkpoint=_save(41))
        while True:
            time.sleep(0.05)
    with train.get_checkpoint().as_directory() as d:
        resumed = int(open(os.path.join(d, "value")).read())
    train.report({"attempt": ctx.get_attempt(), "world": ctx.get_world_size(), "resumed": resumed})


@pytest.mark.slow
def test_node_loss_elastic_run_recovers_on_what_remains(cluster, spare_node, tmp_path):
    class Restarts(train.Callback):
        def __init__(self):
            self.restarts = []

        def on_restart(self, attempt, reason):
            self.restarts.append((attempt, reason))

    callback = Restarts()
    # One worker per node that has the "loss" resource: the head and the spare node.
    trainer = DataParallelTrainer(
        _loss_loop,
        scaling_config=ScalingConfig(num_workers=(1, 2), resources_per_worker={"CPU": 1, "loss": 1}, executor="ray"),
        run_config=_rc(tmp_path, callbacks=[callback], max_failures=1),
    )
    run = trainer.fit_iter()
    first = next(run)
    assert [m["world"] for m in first.all_metrics] == [2, 2]
    lost = spare_node.node_id
    cluster.remove_node(spare_node)
    rest = list(run)
    assert run.result.error is None
    assert [m for r in rest for m in r.all_metrics] == [{"attempt": 1, "world": 1, "resumed": 41}]
    [(attempt, reason)] = callback.restarts
    assert attempt == 1 and f"the Ray actor died on node 127.0.0.1 (id {lost[:12]})" in reason


@pytest.mark.slow
def test_node_loss_without_restarts_fails_naming_the_node(cluster, spare_node, tmp_path):
    trainer = DataParallelTrainer(
        _loss_loop,
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1, "loss": 1}, executor="ray"),
        run_config=_rc(tmp_path, max_failures=0),
    )
    run = trainer.fit_iter()
    next(run)
    lost = spare_node.node_id
    cluster.remove_node(spare_node)
    list(run)
    error = run.result.error
    assert isinstance(error, TrainingFailedError)
    msg = str(error)
    assert f"the Ray actor died on node 127.0.0.1 (id {lost[:12]})" in msg
    [failure] = error.failures[0]
    assert failure.kind == "died" and lost[:12] in failure.node


def _grow_loop():
    """Attempt 0 (1 worker): a checkpoint; once the cluster has room for 2, another one, at which the
    group grows. Attempt 1 (2 workers): resume."""
    import time

    ctx = train.get_context()
    if ctx.get_attempt() == 0:
        train.report({"attempt": 0, "world": ctx.get_world_size()}, checkpoint=_save(1))
        while ray.cluster_resources().get("loss", 0) < 2:
            time.sleep(0.05)
        train.report({"attempt": 0, "world": ctx.get_world_size()}, checkpoint=_save(2))
        while True:
            time.sleep(0.05)
    with train.get_checkpoint().as_directory() as d:
        resumed = int(open(os.path.join(d, "value")).read())
    train.report({"attempt": ctx.get_attempt(), "world": ctx.get_world_size(), "resumed": resumed})


@pytest.mark.slow
def test_elastic_run_grows_when_a_node_joins(cluster, add_spare, tmp_path):
    trainer = DataParallelTrainer(
        _grow_loop,
        scaling_config=ScalingConfig(num_workers=(1, 2), resources_per_worker={"CPU": 1, "loss": 1}, executor="ray"),
        run_config=_rc(tmp_path),
    )
    run = trainer.fit_iter()
    first = next(run)
    assert [m["world"] for m in first.all_metrics] == [1]
    add_spare()
    rest = list(run)
    assert run.result.error is None
    assert [(r.attempt, len(r.all_metrics)) for r in rest] == [(0, 1), (1, 2)]
    assert rest[-1].all_metrics == [{"attempt": 1, "world": 2, "resumed": 2}] * 2
