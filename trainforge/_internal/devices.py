"""This machine's GPUs and how workers share them (``CUDA_VISIBLE_DEVICES`` per worker)."""

from __future__ import annotations

import math
import os
import shutil
import subprocess

from trainforge._internal import constants
from trainforge._internal.config import ScalingConfig


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


def local_gpu_groups(scaling: ScalingConfig, n: int) -> list[list[str]]:
    """GPU ids of each of ``n`` local workers (ValueError when this machine has too few)."""
    gpw = scaling.gpus_per_worker
    return assign_gpus(n, gpw, local_gpu_ids() if gpw > 0 else [])
