"""The worker group interface: a few lifecycle verbs. Local processes and Ray actors differ only here.

Everything above (controller, checkpoint bookkeeping, backends) talks to a ``WorkerGroup``, so unit
tests drive the controller with a fake group.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainforge._internal.exceptions import WorkerFailure


@dataclass
class WorkerSpec:
    """What one worker needs to start: its ranks and environment."""

    rank: int
    local_rank: int
    local_world_size: int
    node_rank: int
    world_size: int
    env: dict[str, str] = field(default_factory=dict)
    gpu_ids: list[str] = field(default_factory=list)


@dataclass
class WorkerMetadata:
    rank: int
    local_rank: int
    node_rank: int
    pid: int
    hostname: str
    node_ip: str
    gpu_ids: list[str] = field(default_factory=list)


# Events a running group reports through poll().
@dataclass
class ReportEvent:
    rank: int
    index: int
    metrics: dict[str, Any]
    has_checkpoint: bool
    time: float


@dataclass
class DoneEvent:
    rank: int
    report_count: int


@dataclass
class FailureEvent:
    failure: WorkerFailure


Event = ReportEvent | DoneEvent | FailureEvent


class WorkerGroup(abc.ABC):
    """A set of worker processes. Lifecycle: start -> execute* -> start_training -> poll* -> shutdown."""

    @abc.abstractmethod
    def start(self, specs: list[WorkerSpec], preload: tuple[str, ...] = ()) -> None:
        """Start one worker per spec and wait until every one is ready; raise WorkerStartError if not."""

    @abc.abstractmethod
    def execute(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        """Run ``fn(*args, **kwargs)`` on every worker; return the results in rank order.
        Raise ``WorkerGroupError`` naming the rank(s) if it raised or a worker died."""

    @abc.abstractmethod
    def execute_single(self, rank: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn`` on one worker and return its result."""

    @abc.abstractmethod
    def start_training(self, payloads: list[bytes]) -> None:
        """Start the train loop on every worker (payload i is for rank i); returns at once."""

    @abc.abstractmethod
    def poll(self, timeout: float) -> list[Event]:
        """Wait up to ``timeout`` seconds for events (reports, completions, failures) and return them."""

    @abc.abstractmethod
    def last_progress(self) -> dict[int, float]:
        """For each worker whose train loop is still running: ``time.monotonic()`` of its last sign
        of progress (a report or a line of output; the training start at first)."""

    @abc.abstractmethod
    def dump_stacks(self, rank: int, timeout: float = 3.0) -> str:
        """The Python stack of every thread of a worker, taken now (even if it is blocked in C code)."""

    def request_stop(self) -> None:  # noqa: B027 - optional: a group without it is stopped by shutdown()
        """Ask every worker's train loop to end at its next ``report()`` (it then sends its "done");
        returns at once."""

    @abc.abstractmethod
    def shutdown(self, graceful: bool = True) -> None:
        """Stop every worker (SIGTERM, bounded wait, SIGKILL). Idempotent; leaves no process behind."""

    @property
    @abc.abstractmethod
    def num_workers(self) -> int: ...

    @property
    @abc.abstractmethod
    def worker_metadata(self) -> list[WorkerMetadata]: ...

    def __len__(self) -> int:
        return self.num_workers


class Executor(abc.ABC):
    """Where a run's workers live (worker_group/executor.py picks one): makes its worker groups (one
    per attempt) and their specs, and offers the resource view elastic sizing reads."""

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
