"""Fakes for driving the controller without worker processes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from trainforge._internal.backend import Backend, BackendConfig
from trainforge._internal.exceptions import WorkerFailure
from trainforge._internal.worker_group.api import (
    DoneEvent,
    Event,
    FailureEvent,
    ReportEvent,
    WorkerGroup,
    WorkerMetadata,
    WorkerSpec,
)


def report(rank: int, index: int, metrics: dict[str, Any] | None = None, ckpt: bool = False) -> ReportEvent:
    return ReportEvent(
        rank=rank,
        index=index,
        metrics=metrics or {"rank": rank, "i": index},
        has_checkpoint=ckpt,
        time=time.time(),
    )


def done(rank: int, count: int) -> DoneEvent:
    return DoneEvent(rank=rank, report_count=count)


def failure(
    rank: int,
    message: str = "boom",
    exc_type: str = "RuntimeError",
    t: float | None = None,
    pid: int | None = None,
) -> FailureEvent:
    return FailureEvent(
        WorkerFailure(
            rank=rank,
            pid=pid if pid is not None else 1000 + rank,
            kind="exception",
            exc_type=exc_type,
            message=message,
            time=t if t is not None else time.time(),
        )
    )


def specs(n: int) -> list[WorkerSpec]:
    return [WorkerSpec(rank=r, local_rank=r, local_world_size=n, node_rank=0, world_size=n) for r in range(n)]


class FakeWorkerGroup(WorkerGroup):
    """``poll()`` returns the next batch of ``script`` (a list of event lists, or callables returning
    one, run at poll time), then ``[]``. Every lifecycle call is recorded in ``calls``."""

    def __init__(
        self,
        script: list[list[Event] | Callable[[], list[Event]]] | None = None,
        start_error: BaseException | None = None,
    ):
        self.script = list(script or [])
        self.start_error = start_error
        self.calls: list[tuple] = []
        self.specs: list[WorkerSpec] = []
        self.payloads: list[bytes] | None = None
        self.progress: dict[int, float] = {}  # what last_progress() returns

    def start(self, specs: list[WorkerSpec], preload: tuple[str, ...] = ()) -> None:
        self.calls.append(("start", len(specs)))
        self.specs = specs
        if self.start_error is not None:
            raise self.start_error

    def execute(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        self.calls.append(("execute", fn))
        return [fn(*args, **kwargs) for _ in self.specs]

    def execute_single(self, rank: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self.calls.append(("execute_single", rank, fn))
        return fn(*args, **kwargs)

    def start_training(self, payloads: list[bytes]) -> None:
        self.calls.append(("start_training", len(payloads)))
        self.payloads = payloads

    def poll(self, timeout: float) -> list[Event]:
        if not self.script:
            time.sleep(min(timeout, 0.001))
            return []
        batch = self.script.pop(0)
        return list(batch() if callable(batch) else batch)

    def last_progress(self) -> dict[int, float]:
        return dict(self.progress)

    def dump_stacks(self, rank: int, timeout: float = 3.0) -> str:
        self.calls.append(("dump_stacks", rank))
        return f"Thread 0x1 (most recent call first):\n  File 'loop.py', line 1 in stuck_rank_{rank}\n"

    def shutdown(self, graceful: bool = True) -> None:
        self.calls.append(("shutdown", graceful))

    @property
    def shutdowns(self) -> list[bool]:
        return [c[1] for c in self.calls if c[0] == "shutdown"]

    @property
    def num_workers(self) -> int:
        return len(self.specs)

    @property
    def worker_metadata(self) -> list[WorkerMetadata]:
        return [
            WorkerMetadata(s.rank, s.local_rank, s.node_rank, 1000 + s.rank, "localhost", "127.0.0.1")
            for s in self.specs
        ]


class RecordingBackend(Backend):
    """Records every hook in ``log`` with the group it got (and in a fake group's ``calls``)."""

    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []

    def _record(self, hook: str, worker_group: Any) -> None:
        self.log.append((hook, worker_group))
        if isinstance(worker_group, FakeWorkerGroup):  # also in the group's call order
            worker_group.calls.append((hook,))

    def on_start(self, worker_group: Any, backend_config: BackendConfig) -> None:
        self._record("on_start", worker_group)

    def on_training_start(self, worker_group: Any, backend_config: BackendConfig) -> None:
        self._record("on_training_start", worker_group)

    def on_shutdown(self, worker_group: Any, backend_config: BackendConfig) -> None:
        self._record("on_shutdown", worker_group)

    @property
    def hooks(self) -> list[str]:
        return [name for name, _ in self.log]


class RecordingCallback:
    def __init__(self) -> None:
        self.reports: list[Any] = []
        self.restarts: list[tuple[int, str]] = []

    def on_report(self, report: Any) -> None:
        self.reports.append(report)

    def on_restart(self, attempt: int, reason: str) -> None:
        self.restarts.append((attempt, reason))
