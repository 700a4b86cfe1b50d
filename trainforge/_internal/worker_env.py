"""Build every local worker's ranks and environment in one place (torchrun's variable names)."""

from __future__ import annotations

import math
import os
import shutil
import subprocess

from trainforge._internal import constants
from trainforge._internal.config import ScalingConfig
from trainforge._internal.worker_group.api import WorkerSpec


def local_gpu_ids() -> list[str]:
    """GPUs this process may use: ``CUDA_VISIBLE_DEVICES`` if set, else those nvidia-smi lists."""
    visible = os.environ.get(constants.ENV_CUDA_VISIBLE_DEVICES)
    if visible is not None:
        return [g.strip() for g in visible.split(",") if g.strip() and g.strip() != "-1"]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = [line for line in out.splitlines() if line.startswith("GPU ")]
    return [str(i) for i in range(len(gpus))]


def assign_gpus(num_workers: int, gpus_per_worker: float, available: list[str]) -> list[list[str]]:
    """GPU ids per worker. Fractions pack workers onto a GPU (0.5 -> two workers per GPU).
    Raise ValueError naming what was asked and what this machine has when it does not fit."""
    if gpus_per_worker <= 0:
        return [[] for _ in range(num_workers)]
    if gpus_per_worker < 1:
        per_gpu = int(math.floor(1 / gpus_per_worker + 1e-9))
        needed = math.ceil(num_workers / per_gpu)
        groups = [[available[i // per_gpu]] for i in range(num_workers)] if needed <= len(available) else None
    else:
        n = int(gpus_per_worker)
        needed = n * num_workers
        groups = [available[i * n:(i + 1) * n] for i in range(num_workers)] if needed <= len(available) else None
    if groups is None:
        raise ValueError(
            f"ScalingConfig asks for {num_workers} worker(s) with {gpus_per_worker:g} GPU each ({needed} GPU(s) in "
            f"all), but this machine has {len(available)} visible GPU(s) ({','.join(available) or 'none'}). "
            "Use fewer workers, a fractional resources_per_worker={'GPU': 0.5}, or use_gpu=False."
        )
    return groups


def local_worker_specs(
    scaling: ScalingConfig, attempt: int, n: int, gpu_groups: list[list[str]]
) -> list[WorkerSpec]:
    threads = str(max(1, int(scaling.cpus_per_worker)))
    specs = []
    for rank in range(n):
        env = {
            constants.ENV_RANK: str(rank),
            constants.ENV_LOCAL_RANK: str(rank),
            constants.ENV_WORLD_SIZE: str(n),
            constants.ENV_LOCAL_WORLD_SIZE: str(n),
            constants.ENV_NODE_RANK: "0",
            constants.ENV_MASTER_ADDR: "127.0.0.1",
            constants.ENV_RESTART_COUNT: str(attempt),
        }
        # Like Ray Train and torchrun: one intra-op thread per reserved CPU unless the user chose.
        if "OMP_NUM_THREADS" not in os.environ:
            env["OMP_NUM_THREADS"] = threads
        if scaling.gpus_per_worker > 0:
            env[constants.ENV_CUDA_VISIBLE_DEVICES] = ",".join(gpu_groups[rank])
        specs.append(WorkerSpec(rank, rank, n, 0, n, env, list(gpu_groups[rank])))
    return specs


def spawn_env(scaling: ScalingConfig) -> dict[str, str]:
    """Environment every local worker process starts with (before it has a rank): what must be set
    before torch is imported. Like Ray Train and torchrun, one intra-op thread per reserved CPU
    unless the user chose."""
    if "OMP_NUM_THREADS" in os.environ:
        return {}
    return {"OMP_NUM_THREADS": str(max(1, int(scaling.cpus_per_worker)))}
