"""What each running job actually uses: CPU, memory and, with an NVIDIA GPU, GPU memory and
utilisation, per process, sampled every second.

A job's processes are found as ``stop`` finds them (their environment names the job; the sampler
is given the finder, ``_processes.find_job_processes``), in one scan of the machine's processes every few seconds; between
scans the known processes are sampled with psutil (``cpu_percent`` since the previous sample, RSS).
GPU numbers come from NVML (``nvidia-ml-py``, in the ``[server]`` extra) per process id, so a GPU
shared by two jobs is split by what each job's processes hold; without a GPU or NVML the reading
says why (``gpu``: ``"no GPU: ..."``). A short history (the last ``HISTORY`` samples) of each job's
totals feeds the dashboard's usage chart.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

INTERVAL_S = 1.0
RESCAN_S = 5.0
HISTORY = 600  # samples per job (10 minutes at 1 Hz)


class _Gpus:
    """NVML, if there is a GPU to ask: per-process memory and per-device utilisation."""

    def __init__(self) -> None:
        self.problem: str | None = None
        self._nvml: Any = None
        self._handles: list[Any] = []
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self._nvml = pynvml
            if not self._handles:
                self.problem = "no GPU: NVML sees no device"
        except ImportError:
            self.problem = "no GPU readings: nvidia-ml-py is not installed (pip install 'trainforge[server]')"
        except Exception as exc:  # NVMLError: no driver, no device
            self.problem = f"no GPU: {exc}"

    def sample(self) -> dict[int, dict[str, float]]:
        """pid -> {"gpu_memory": bytes, "gpu_util": % of its device}, over every device."""
        out: dict[int, dict[str, float]] = {}
        if self._nvml is None:
            return out
        nv = self._nvml
        for handle in self._handles:
            try:
                util = float(nv.nvmlDeviceGetUtilizationRates(handle).gpu)
                procs = nv.nvmlDeviceGetComputeRunningProcesses(handle)
            except Exception:  # a device that went away, or a driver hiccup: skip it this time
                continue
            for p in procs:
                entry = out.setdefault(int(p.pid), {"gpu_memory": 0.0, "gpu_util": 0.0})
                entry["gpu_memory"] += float(p.usedGpuMemory or 0)
                entry["gpu_util"] = max(entry["gpu_util"], util)
        return out


class UsageSampler:
    """Samples the jobs that ``active_jobs()`` names, whose processes ``find_processes(job_ids)``
    finds (job id -> its live processes). Where ``cgroup_of(job_id)`` gives the job's cgroup, its
    totals are the cgroup's (CPU time and memory of everything in it, processes that came and went
    between samples included: ``source`` says ``cgroup``); else the sum over its processes."""

    def __init__(self, active_jobs: Callable[[], list[int]],
                 find_processes: Callable[[list[int]], dict[int, list[psutil.Process]]],
                 cgroup_of: Callable[[int], Any] = lambda job_id: None):  # fmt: skip
        self._active_jobs = active_jobs
        self._find_processes = find_processes
        self._cgroup_of = cgroup_of
        self._cpu_seen: dict[int, tuple[float, float]] = {}  # job -> (monotonic time, its cgroup's CPU seconds)
        self._lock = threading.Lock()
        self._procs: dict[int, dict[int, tuple[psutil.Process, str]]] = {}  # job -> pid -> (process, role)
        self._latest: dict[int, dict[str, Any]] = {}
        self._history: dict[int, collections.deque[tuple[float, float, float, float]]] = {}
        self._scanned = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.gpus: _Gpus | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, daemon=True, name="tf-usage")
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        self.gpus = _Gpus()
        while not self._stop.wait(INTERVAL_S):
            try:
                self.sample()
            except Exception:  # a sampling error must not end the sampling
                pass

    def _scan(self, active: set[int]) -> None:
        found: dict[int, dict[int, tuple[psutil.Process, str]]] = {}
        for job_id, procs in self._find_processes(sorted(active)).items():
            known = self._procs.get(job_id, {})
            found[job_id] = {}
            for proc in procs:
                if proc.pid in known:  # the same object: cpu_percent() measures since its last call
                    found[job_id][proc.pid] = known[proc.pid]
                    continue
                try:
                    cmd = " ".join(proc.cmdline())
                except (psutil.Error, OSError):
                    continue
                role = "runner" if "server.jobs.runner" in cmd else "worker" if "worker_main" in cmd else "other"
                found[job_id][proc.pid] = (proc, role)
        self._procs = found
        self._scanned = time.monotonic()

    def sample(self) -> None:
        active = set(self._active_jobs())
        if not active and not self._procs:
            return  # nothing runs: no scan of the machine's processes
        now = time.monotonic()
        if active != set(self._procs) or now - self._scanned > RESCAN_S or any(not p for p in self._procs.values()):
            self._scan(active)
        gpu = self.gpus.sample() if self.gpus is not None else {}
        t = time.time()
        latest: dict[int, dict[str, Any]] = {}
        for job_id, procs in self._procs.items():
            rows = []
            for pid, (proc, role) in list(procs.items()):
                try:
                    with proc.oneshot():
                        row = {
                            "pid": pid,
                            "role": role,
                            "cpu_percent": proc.cpu_percent(None),
                            "rss": float(proc.memory_info().rss),
                            "threads": proc.num_threads(),
                        }
                except (psutil.Error, OSError):
                    procs.pop(pid, None)
                    continue
                row.update(gpu.get(pid, {}))
                rows.append(row)
            total = {
                "cpu_percent": sum(r["cpu_percent"] for r in rows),
                "rss": sum(r["rss"] for r in rows),
                "gpu_memory": sum(r.get("gpu_memory", 0.0) for r in rows),
                "gpu_util": max([r.get("gpu_util", 0.0) for r in rows] or [0.0]),
                "processes": len(rows),
                "source": "processes",
            }
            self._from_cgroup(job_id, total, now)
            latest[job_id] = {"t": t, "processes": sorted(rows, key=lambda r: (r["role"] != "runner", r["pid"])),
                              "total": total}  # fmt: skip
            history = self._history.setdefault(job_id, collections.deque(maxlen=HISTORY))
            history.append((t, total["cpu_percent"], total["rss"], total["gpu_memory"]))
        with self._lock:
            self._latest = latest
            for job_id in [j for j in self._history if j not in active]:
                self._history.pop(job_id, None)
            for job_id in [j for j in self._cpu_seen if j not in active]:
                self._cpu_seen.pop(job_id, None)

    def _from_cgroup(self, job_id: int, total: dict[str, Any], now: float) -> None:
        """The job's totals from its cgroup, where it has one: CPU as the share of a core its CPU
        time grew by since the last sample, memory (``memory``, bytes charged to it) as is."""
        group = self._cgroup_of(job_id)
        usage = group.usage() if group is not None else {}
        if "cpu_s" in usage:
            seen = self._cpu_seen.get(job_id)
            self._cpu_seen[job_id] = (now, usage["cpu_s"])
            if seen is not None and now > seen[0]:
                total["cpu_percent"] = max(0.0, 100.0 * (usage["cpu_s"] - seen[1]) / (now - seen[0]))
            total["source"] = "cgroup"
        if "memory" in usage:
            total["memory"] = usage["memory"]
            total["source"] = "cgroup"

    def usage(self, job_id: int) -> dict[str, Any]:
        """The latest sample of a job (empty while it does not run) and its recent totals."""
        with self._lock:
            latest = self._latest.get(job_id)
            history = list(self._history.get(job_id, ()))
        problem = self.gpus.problem if self.gpus is not None else "not sampled yet"
        return {
            "gpu": problem or "ok",
            "interval_s": INTERVAL_S,
            "t": latest["t"] if latest else None,
            "processes": latest["processes"] if latest else [],
            "total": latest["total"] if latest else None,
            "history": [{"t": t, "cpu_percent": c, "rss": r, "gpu_memory": g} for t, c, r, g in history],
        }

    def totals(self) -> dict[int, dict[str, float]]:
        with self._lock:
            return {j: dict(v["total"]) for j, v in self._latest.items()}
