"""Which of the machine's GPUs each running job holds. The server hands out whole devices: a job
granted a fraction of a GPU (0.5) gets one device to use (its ``CUDA_VISIBLE_DEVICES``), which
other jobs with fractions may share only through the scheduler's arithmetic, not by id."""

from __future__ import annotations

import math


class GpuOwners:
    """``owner``: GPU id -> the job holding it (kept by the
    :class:`~trainforge.server.scheduling.ledger.ResourceLedger`, which frees some of a shrunk job's
    when it resizes). ``capacity_gpus``: how many of this machine's GPUs the server may hand out."""

    def __init__(self, capacity_gpus: float):
        self.owner: dict[str, int] = {}
        self._count = int(capacity_gpus)

    def machine(self) -> list[str]:
        """The GPUs the server hands out: the first of this machine's (``CUDA_VISIBLE_DEVICES`` or
        nvidia-smi), as many as its capacity says."""
        from trainforge._internal.devices import local_gpu_ids

        return local_gpu_ids()[: self._count]

    def take(self, job_id: int, grant: dict[str, float]) -> tuple[list[str], bool]:
        """Free GPUs for a job with ``grant`` (held from now on), and whether it should be told its
        devices (it asked for some, or this machine has some to share out: then ``CUDA_VISIBLE_DEVICES``
        is set, empty for a job without a GPU grant)."""
        want = math.ceil(grant.get("GPU", 0.0) - 1e-9)  # a fractional grant (0.5) needs one GPU to use
        ids = [g for g in self.machine() if g not in self.owner][:want] if want else []
        self.hold(job_id, ids)
        return ids, bool(want) or bool(self.machine())

    def hold(self, job_id: int, ids: list[str]) -> None:
        for gpu in ids:
            self.owner[gpu] = job_id

    def release(self, job_id: int) -> None:
        for gpu in [g for g, j in self.owner.items() if j == job_id]:
            del self.owner[gpu]

    def by_job(self) -> dict[int, list[str]]:
        """Job id -> the GPUs it holds, in order."""
        out: dict[int, list[str]] = {}
        for gpu, job_id in self.owner.items():
            out.setdefault(job_id, []).append(gpu)
        return {j: sorted(ids) for j, ids in out.items()}
