"""``ControllerHooks``: the driver-side functions the controller calls, supplied by the trainer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainforge._internal.checkpoint import Checkpoint
from trainforge._internal.exceptions import WorkerFailure
from trainforge._internal.worker_group.api import WorkerGroup, WorkerSpec


@dataclass
class ControllerHooks:
    """Driver-side functions the controller calls; supplied by the trainer."""

    make_worker_group: Callable[[], WorkerGroup]
    make_specs: Callable[[int, int], list[WorkerSpec]]  # (attempt, num_workers) -> specs
    make_payloads: Callable[[int, Checkpoint | None, list[WorkerSpec]], list[bytes]]
    worker_init_fn: Callable[[], Any] | None = None
    preload: tuple[str, ...] = ()
    callbacks: list[Any] = field(default_factory=list)
    # Called once a group is training, with its size and whether a later restart or resize is
    # possible (the local executor then pre-starts standby workers).
    after_start: Callable[[int, bool], None] | None = None
    # Called with each failed attempt's records (``attempt`` set), once its group is stopped.
    on_failure: Callable[[list[WorkerFailure]], None] | None = None
