"""A stand-in for nvidia-ml-py's ``pynvml`` at the NVML boundary of ``trainforge.server.jobs.usage``, for
tests on machines without a GPU: put this directory first on the server's ``PYTHONPATH``.

Two devices. A "GPU process" is any process whose environment names a trainforge job
(``TRAINFORGE_JOB_ID``) and whose command line runs a worker (``worker_main``): device 0 lists each
with ``FAKE_NVML_MIB`` (100) MiB, device 1 lists those of even pid with half that. Utilisation:
device 0 30 %, device 1 70 %. ``FAKE_NVML_FAIL=1``: ``nvmlInit`` fails as without a driver.
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import psutil

UTIL = (30, 70)


class NVMLError(Exception):
    pass


def nvmlInit() -> None:
    if os.environ.get("FAKE_NVML_FAIL") == "1":
        raise NVMLError("Driver Not Loaded")


def nvmlShutdown() -> None:
    pass


def nvmlDeviceGetCount() -> int:
    return len(UTIL)


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    return index


def nvmlDeviceGetUtilizationRates(handle: int) -> Any:
    return SimpleNamespace(gpu=UTIL[handle], memory=0)


def _gpu_pids() -> list[int]:
    pids = []
    for p in psutil.process_iter():
        try:
            if "TRAINFORGE_JOB_ID" in p.environ() and "worker_main" in " ".join(p.cmdline()):
                pids.append(p.pid)
        except (psutil.Error, OSError):
            continue
    return pids


def nvmlDeviceGetComputeRunningProcesses(handle: int) -> list[Any]:
    mib = int(os.environ.get("FAKE_NVML_MIB", "100")) * 2**20
    if handle == 0:
        return [SimpleNamespace(pid=pid, usedGpuMemory=mib) for pid in _gpu_pids()]
    return [SimpleNamespace(pid=pid, usedGpuMemory=mib // 2) for pid in _gpu_pids() if pid % 2 == 0]
