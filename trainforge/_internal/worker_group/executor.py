"""Executors: where a run's workers live. ``ScalingConfig.executor`` picks one.

    "local"  worker processes on this machine (worker_group/local.py)
    "ray"    Ray actors in one placement group on a Ray cluster (worker_group/ray.py)
    "auto"   Ray when this process is already connected to a Ray cluster (``ray.init()`` was called)
             or ``$RAY_ADDRESS`` is set; local processes otherwise

An executor makes the run's worker groups (one per attempt) and their specs, offers the resource
view elastic sizing reads, and holds what outlives one attempt (a process pool, a Ray connection).
"""

from __future__ import annotations

import os
from typing import Any

from trainforge._internal.config import ScalingConfig
from trainforge._internal.worker_group.api import Executor

__all__ = ["Executor", "executor_kind", "make_executor"]


def executor_kind(scaling: ScalingConfig) -> str:
    """"local" or "ray", by the rule above. Never imports ray (nor starts it)."""
    from trainforge._internal import ray_utils

    if scaling.executor != "auto":
        return scaling.executor
    if ray_utils.ray_connected() or os.environ.get(ray_utils.ENV_RAY_ADDRESS):
        return "ray"
    return "local"


def make_executor(
    scaling: ScalingConfig,
    preload: tuple[str, ...],
    log_dir: str | None,
    log_to_driver: bool,
    storage: Any,
    may_restart: bool = False,
) -> Executor:
    """The executor for a run (connecting to Ray, or starting a local Ray instance, if it is "ray")."""
    if executor_kind(scaling) == "ray":
        from trainforge._internal.worker_group.ray import RayExecutor

        return RayExecutor(scaling, preload, log_dir, log_to_driver, storage)
    from trainforge._internal.worker_group.local import LocalExecutor

    return LocalExecutor(scaling, preload, log_dir, log_to_driver, may_restart)
