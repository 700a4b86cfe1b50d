"""Build every worker's ranks and environment in one place (torchrun's variable names)."""

from __future__ import annotations

import os

from trainforge._internal import constants
from trainforge._internal.config import ScalingConfig
from trainforge._internal.worker_group.api import WorkerSpec


def node_layout(nodes: list[str]) -> list[tuple[int, int, int]]:
    """``(node_rank, local_rank, local_world_size)`` of each rank, given the node each rank runs on.
    Node ranks number the nodes in the order of their first rank (rank 0's node is node 0)."""
    node_rank: dict[str, int] = {}
    size: dict[str, int] = {}
    local: list[int] = []
    for node in nodes:
        node_rank.setdefault(node, len(node_rank))
        local.append(size.get(node, 0))
        size[node] = size.get(node, 0) + 1
    return [(node_rank[node], local[r], size[node]) for r, node in enumerate(nodes)]


def worker_env(spec: WorkerSpec, attempt: int, master_addr: str, scaling: ScalingConfig) -> dict[str, str]:
    """The environment of one worker, from its spec."""
    env = {
        constants.ENV_RANK: str(spec.rank),
        constants.ENV_LOCAL_RANK: str(spec.local_rank),
        constants.ENV_WORLD_SIZE: str(spec.world_size),
        constants.ENV_LOCAL_WORLD_SIZE: str(spec.local_world_size),
        constants.ENV_NODE_RANK: str(spec.node_rank),
        constants.ENV_MASTER_ADDR: master_addr,
        constants.ENV_RESTART_COUNT: str(attempt),
    }
    # Like Ray Train and torchrun: one intra-op thread per reserved CPU unless the user chose.
    if "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = str(max(1, int(scaling.cpus_per_worker)))
    # Its GPUs only; none for a worker without a GPU share (as Ray hides them from such an actor), so
    # use_gpu=False trains on the CPU, and picks gloo, on a GPU machine too.
    env[constants.ENV_CUDA_VISIBLE_DEVICES] = ",".join(spec.gpu_ids) if scaling.gpus_per_worker > 0 else ""
    return env


def place_specs(
    specs: list[WorkerSpec], nodes: list[str], attempt: int, master_addr: str, scaling: ScalingConfig,
    gpu_groups: list[list[str]] | None = None,
) -> None:  # fmt: skip
    """Fill in the per-node fields (node rank, local rank and world size, devices) and the
    environment of ``specs`` once it is known which node each rank runs on."""
    for spec, (node_rank, local_rank, local_size) in zip(specs, node_layout(nodes), strict=True):
        spec.node_rank, spec.local_rank, spec.local_world_size = node_rank, local_rank, local_size
        if gpu_groups is not None:
            spec.gpu_ids = list(gpu_groups[spec.rank])
        spec.env = worker_env(spec, attempt, master_addr, scaling)


def local_worker_specs(
    scaling: ScalingConfig, attempt: int, n: int, gpu_groups: list[list[str]]
) -> list[WorkerSpec]:
    specs = [WorkerSpec(rank, rank, n, 0, n) for rank in range(n)]
    place_specs(specs, ["localhost"] * n, attempt, "127.0.0.1", scaling, gpu_groups)
    return specs


def spawn_env(scaling: ScalingConfig) -> dict[str, str]:
    """Environment every local worker process starts with (before it has a rank): what must be set
    before torch is imported. Like Ray Train and torchrun, one intra-op thread per reserved CPU
    unless the user chose."""
    if "OMP_NUM_THREADS" in os.environ:
        return {}
    return {"OMP_NUM_THREADS": str(max(1, int(scaling.cpus_per_worker)))}
