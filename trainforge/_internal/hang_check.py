"""Hung workers: the ranks of a group with no report and no output for longer than
``FailureConfig.hang_timeout_s``, as failure records (with their stacks) the controller handles
like any other failure."""

from __future__ import annotations

import time

from trainforge._internal.exceptions import WorkerFailure
from trainforge._internal.worker_group.api import WorkerGroup


def hung_workers(group: WorkerGroup, hang_timeout_s: float) -> list[WorkerFailure]:
    """One ``kind="hung"`` failure per rank of ``group`` silent for more than ``hang_timeout_s``."""
    now = time.monotonic()
    hung = [r for r, t in sorted(group.last_progress().items()) if now - t > hang_timeout_s]
    failures = []
    for rank in hung:
        meta = group.worker_metadata[rank]
        failures.append(
            WorkerFailure(
                rank=rank,
                pid=meta.pid,
                kind="hung",
                message=(
                    f"no report and no output for more than {hang_timeout_s:g}s "
                    "(FailureConfig.hang_timeout_s)"
                ),
                traceback=group.dump_stacks(rank),
                time=time.time(),
            )
        )
    return failures
