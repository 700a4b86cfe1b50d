"""What the local machine offers to workers, and how many workers of a ScalingConfig fit in it.

Used for elastic sizing (``ScalingConfig(num_workers=(min, max))``). The local machine offers its
CPU count and visible GPUs, unless ``$TRAINFORGE_LOCAL_RESOURCES`` says otherwise: a JSON object
(``{"CPU": 8, "GPU": 2}``) or ``@/path/file.json``, a file re-read at every sizing decision, so a
scheduler (or a test) can shrink and grow what trainforge may use while a run is going.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any

from trainforge._internal import constants
from trainforge._internal.config import ScalingConfig


def local_available() -> dict[str, float]:
    override = os.environ.get(constants.ENV_LOCAL_RESOURCES)
    if override:
        text = override
        if override.startswith("@"):
            with open(override[1:]) as f:
                text = f.read()
        try:
            value: Any = json.loads(text)
        except ValueError as exc:
            raise ValueError(
                f"${constants.ENV_LOCAL_RESOURCES}={override!r} is not valid: give a JSON object such as "
                '\'{"CPU": 8, "GPU": 2}\' or @/path/to/such.json'
            ) from exc
        if not isinstance(value, dict):
            raise ValueError(f"${constants.ENV_LOCAL_RESOURCES} must hold a JSON object, got {value!r}")
        return {str(k): float(v) for k, v in value.items()}
    from trainforge._internal.devices import local_gpu_ids

    return {"CPU": float(os.cpu_count() or 1), "GPU": float(len(local_gpu_ids()))}


MIN_CPU_PER_WORKER = 0.1
"""What every worker is charged in CPUs at least, whatever it asks for (0 CPUs included), as a small
Kubernetes CPU request: a worker is a process, so nothing runs for free. The train server's
scheduler counts it against capacity, quotas and fair-share usage
(:meth:`trainforge.server.scheduling.rule.JobRequest.from_spec`), and elastic sizing on this machine (or
within a train server's grant) against what is available; what a job *asks* for is kept as asked."""


def per_worker(scaling: ScalingConfig) -> dict[str, float]:
    """What each worker asks for (kinds asked for in amounts above zero)."""
    need = {k: float(v) for k, v in (scaling.resources_per_worker or {}).items()}
    need["CPU"] = scaling.cpus_per_worker
    need["GPU"] = scaling.gpus_per_worker
    return {k: v for k, v in need.items() if v > 0}


def charge(asked: Mapping[str, float]) -> dict[str, float]:
    """What a worker asking for ``asked`` is charged: the same, with at least
    :data:`MIN_CPU_PER_WORKER` CPUs."""
    out = {str(k): float(v) for k, v in asked.items()}
    out["CPU"] = max(out.get("CPU", 0.0), MIN_CPU_PER_WORKER)
    return out


def workers_that_fit(scaling: ScalingConfig, available: dict[str, float], *, charged: bool = True) -> int:
    """How many workers (at most max_workers) the available resources can hold, each counting what it
    is charged (:func:`charge`; ``charged=False``: only what it asks for, as on a Ray cluster, whose
    own placement counts the workers' bundles)."""
    fit = scaling.max_workers
    need = charge(per_worker(scaling)) if charged else per_worker(scaling)
    for name, amount in need.items():
        fit = min(fit, int(math.floor(available.get(name, 0.0) / amount + 1e-9)))
    return max(fit, 0)
