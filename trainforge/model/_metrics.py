"""An epoch's metrics: sample-weighted sums on each worker, combined by ONE ``all_reduce`` per epoch.

Each batch adds ``value * n`` and ``n`` (its samples) per metric. At the end of the epoch every
worker puts its sums, counts, last values, batch count and sample count into one float64 tensor,
sums it over the workers, and divides: the mean is then the mean over every sample of the epoch,
as one process going through all the data would compute it (an unweighted mean of batch means
would overweight short batches). As RaySGD reported them:

    <metric>        sample-weighted mean over all batches of all workers
    last_<metric>   the last batch's value, averaged over the workers
    batch_count     batches per worker (mean over the workers)
    num_samples     samples over all workers

Every worker must report the same metric names (they share the tensor's layout). A checkpoint taken
mid-epoch adds one all_reduce: it keeps the sums of every worker so far (``global_state``), which
rank 0 alone resumes, so the resumed epoch's means are those of an uninterrupted one.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from trainforge.model._config import BATCH_COUNT, NUM_SAMPLES


class EpochMetrics:
    """One worker's running sums for one epoch. CPU values are summed as Python floats (float64);
    GPU values stay on the device (no sync per batch) until the epoch's reduction."""

    def __init__(self) -> None:
        self.sums: dict[str, Any] = {}
        self.counts: dict[str, float] = {}
        self.last: dict[str, Any] = {}
        self.batches = 0
        self.samples = 0

    def add(self, metrics: dict[str, Any], n: int) -> None:
        for key, value in metrics.items():
            if isinstance(value, torch.Tensor):
                if value.numel() != 1:
                    raise ValueError(f"metric {key!r} has {value.numel()} values; report one number per batch (a mean)")
                value = value.detach()
                value = float(value) if value.device.type == "cpu" else value.reshape(()).double()
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                value = float(value)
            else:
                raise TypeError(f"metric {key!r}={value!r} is not a number: report numbers (or 1-element tensors)")
            self.sums[key] = self.sums.get(key, 0.0) + value * n
            self.counts[key] = self.counts.get(key, 0.0) + n
            self.last[key] = value
        self.batches += 1
        self.samples += n

    # -- a checkpoint taken mid-epoch keeps the sums, so the resumed epoch's mean is exact -----------
    def state(self) -> dict[str, Any]:
        return {
            "sums": {k: float(v) for k, v in self.sums.items()},
            "counts": dict(self.counts),
            "last": {k: float(v) for k, v in self.last.items()},
            "batches": self.batches,
            "samples": self.samples,
        }

    def global_state(self, device: torch.device | None = None) -> dict[str, Any]:
        """The sums so far over every worker (one all_reduce; for a mid-epoch checkpoint, which rank 0
        alone writes): resumed on rank 0, with the other ranks starting from zero, the epoch's
        reduction still counts every sample once. ``last`` values are this rank's."""
        keys = sorted(self.sums)
        values = [self.sums[k] for k in keys] + [self.counts[k] for k in keys] + [self.batches, self.samples]
        totals, _ = all_reduce_sum(values, len(keys), device)
        k = len(keys)
        return {
            "sums": dict(zip(keys, totals[:k], strict=True)),
            "counts": dict(zip(keys, totals[k:2 * k], strict=True)),
            "last": {key: float(self.last[key]) for key in keys},
            "batches": int(round(totals[2 * k])),
            "samples": int(round(totals[2 * k + 1])),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any] | None) -> EpochMetrics:
        out = cls()
        if state:
            out.sums, out.counts, out.last = dict(state["sums"]), dict(state["counts"]), dict(state["last"])
            out.batches, out.samples = int(state["batches"]), int(state["samples"])
        return out

    def local_summary(self) -> dict[str, Any]:
        """This worker's own means (``reduce_results=False``)."""
        out: dict[str, Any] = {BATCH_COUNT: self.batches, NUM_SAMPLES: self.samples}
        for key in self.sums:
            out[key] = float(self.sums[key]) / self.counts[key] if self.counts[key] else math.nan
            out["last_" + key] = float(self.last[key])
        return out

    def reduce(self, device: torch.device | None = None) -> dict[str, Any]:
        """The epoch's metrics over every worker (one all_reduce; none with one worker)."""
        keys = sorted(self.sums)
        values = [self.sums[k] for k in keys] + [self.counts[k] for k in keys] + [self.last[k] for k in keys]
        totals, world = all_reduce_sum(values + [self.batches, self.samples], len(keys), device)
        k = len(keys)
        out: dict[str, Any] = {BATCH_COUNT: _intish(totals[3 * k] / world), NUM_SAMPLES: int(round(totals[3 * k + 1]))}
        for i, key in enumerate(keys):
            out[key] = totals[i] / totals[k + i] if totals[k + i] else math.nan
        for i, key in enumerate(keys):
            out["last_" + key] = totals[2 * k + i] / world
        return out


def reduce_summary(stats: dict[str, Any], device: torch.device | None = None) -> dict[str, Any]:
    """Combine per-worker epoch summaries (a RaySGD ``train_epoch``/``validate`` override's return
    value) in one all_reduce: ``num_samples`` summed, ``batch_count`` and ``last_*`` averaged over the
    workers, every other number weighted by the worker's ``num_samples`` (1 when absent). Values that
    are not numbers stay this worker's (the report's are rank 0's)."""
    n = float(stats.get(NUM_SAMPLES, 1) or 0)
    numeric = sorted(k for k, v in stats.items() if _is_number(v) and k not in (NUM_SAMPLES,))
    values = [float(stats[k]) * (1.0 if _averaged(k) else n) for k in numeric]
    totals, world = all_reduce_sum(values + [n], len(numeric), device)
    total_n = totals[-1]
    out = {k: v for k, v in stats.items() if k not in numeric and k != NUM_SAMPLES}
    for i, key in enumerate(numeric):
        out[key] = totals[i] / world if _averaged(key) else (totals[i] / total_n if total_n else math.nan)
    if NUM_SAMPLES in stats:
        out[NUM_SAMPLES] = int(round(total_n))
    if BATCH_COUNT in out:
        out[BATCH_COUNT] = _intish(out[BATCH_COUNT])
    return out


def all_reduce_sum(values: list[Any], n_keys: int, device: torch.device | None) -> tuple[list[float], int]:
    """``values`` summed over the workers with one all_reduce, and the world size. The tensor also
    carries the number of metric names, so workers that reported different metrics fail loudly."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [float(v) for v in values], 1
    world = dist.get_world_size()
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    parts = [v.to(device, torch.float64).reshape(1) if isinstance(v, torch.Tensor) else None for v in values]
    if any(p is not None for p in parts):
        vec = torch.stack([p[0] if p is not None else torch.tensor(float(v), dtype=torch.float64, device=device)
                           for p, v in zip(parts, values, strict=True)] + [torch.tensor(float(n_keys), dtype=torch.float64, device=device)])  # fmt: skip
    else:
        vec = torch.tensor([float(v) for v in values] + [float(n_keys)], dtype=torch.float64, device=device)
    dist.all_reduce(vec)
    totals = vec.tolist()
    if totals[-1] != n_keys * world:
        raise RuntimeError(
            f"the workers reported different metrics this epoch ({n_keys} names here, {totals[-1] / world:g} on "
            "average): every worker's steps must return the same metric names."
        )
    return totals[:-1], world


def _is_number(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.numel() == 1
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _averaged(key: str) -> bool:
    """Keys averaged over workers rather than weighted by samples."""
    return key == BATCH_COUNT or key.startswith("last_")


def _intish(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value
