"""Executors: where a run's workers live. ``ScalingConfig.executor`` picks one.

    "local"  worker processes on this machine (worker_group/local.py)
    "ray"    Ray actors in one placement group on a Ray cluster (worker_group/ray.py)
    "auto"   Ray when this process is already connected to a Ray cluster (``ray.init()`` was called)
             or ``$RAY_ADDRESS`` is set; local processes otherwise

An executor makes the run's worker groups (one per attempt) and their specs, offers the resource
view elastic sizing reads, and holds what outlives one attempt (a process pool, a Ray connection).
"""

from __future__ import annotations

import abc
import os
from typing import Any

from trainforge._internal.config import ScalingConfig
from trainforge._internal.worker_group.api import WorkerGroup, WorkerSpec


class Executor(abc.ABC):
    name: str

    @abc.abstractmethod
    def make_group(self) -> WorkerGroup:
        """A new worker group for the next attempt."""

    @abc.abstractmethod
    def make_specs(self, attempt: int, n: int) -> list[WorkerSpec]:
        """Ranks and environment of ``n`` workers (a Ray group completes the per-node fields once
        it knows where its workers run)."""

    @abc.abstractmethod
    def available(self) -> dict[str, float]:
        """Resources the run may use now (elastic sizing), counting those its running group holds."""

    def after_start(self, n: int, may_restart: bool) -> None:
        """Called once a group is training; ``may_restart``: a restart or resize may follow."""
        return None

    def split_ray_dataset(self, name: str, dataset: Any, n: int, split: bool) -> list[Any]:
        """One shard per rank of a ``ray.data.Dataset`` (split across the ranks, or whole for each)."""
        raise ValueError(
            f"datasets[{name!r}] is a ray.data.Dataset, which needs the Ray executor, but this run uses the "
            f"{self.name!r} executor: "
            "pass ScalingConfig(executor='ray'), or convert the dataset first (e.g. ds.to_pandas())."
        )

    def close(self) -> None:
        """Release everything at the end of the run."""
        return None


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
) -> Executor:
    """The executor for a run (connecting to Ray, or starting a local Ray instance, if it is "ray")."""
    if executor_kind(scaling) == "ray":
        from trainforge._internal.worker_group.ray import RayExecutor

        return RayExecutor(scaling, preload, log_dir, log_to_driver, storage)
    from trainforge._internal.worker_group.local import LocalExecutor

    return LocalExecutor(scaling, preload, log_dir, log_to_driver)
