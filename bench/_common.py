"""Helpers shared by the benchmarks in this folder (measuring, running variants in fresh processes, tables).

Nothing here imports torch or trainforge at module level: a variant subprocess pays only for what it uses.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(BENCH_DIR)
# For every benchmark that starts Ray: every Ray process binds to 127.0.0.1 (Ray otherwise turns
# 127.0.0.1 into the machine's address); no token auth between the benchmark's own processes on the
# loopback interface.
RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}


# --------------------------------------------------------------------------------------------------
# Measuring.
# --------------------------------------------------------------------------------------------------
def proc_start_wall() -> float:
    """Wall-clock time at which this process started (10 ms resolution; psutil's is off by up to 1 s)."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - (uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return float("nan")


class TreeRssSampler:
    """Samples the summed RSS of this process and all its descendants every ``interval_s``."""

    def __init__(self, interval_s: float = 0.05):
        import psutil

        self._psutil = psutil
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self.peak_bytes = 0
        self.peak_nprocs = 0
        self.samples = 0

    def _run(self) -> None:
        psutil = self._psutil
        me = psutil.Process()
        while True:
            total, nprocs = 0, 0
            try:
                procs = [me, *me.children(recursive=True)]
            except psutil.Error:
                procs = [me]
            for p in procs:
                try:
                    total += p.memory_info().rss
                    nprocs += 1
                except psutil.Error:
                    pass
            self.samples += 1
            if total > self.peak_bytes:
                self.peak_bytes, self.peak_nprocs = total, nprocs
            if self._stop.wait(self._interval_s):
                return

    def _cpu(self) -> tuple[float, float, float]:
        """CPU seconds used by the whole machine, by this process and its reaped descendants, by this process."""
        m = self._psutil.cpu_times()
        machine = sum(getattr(m, k, 0.0) for k in ("user", "nice", "system", "irq", "softirq", "steal"))
        t = os.times()
        return machine, t.user + t.system + t.children_user + t.children_system, t.user + t.system

    def __enter__(self) -> TreeRssSampler:
        self._cpu0 = self._cpu()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        machine, tree, driver = self._cpu()
        self.tree_cpu_s = tree - self._cpu0[1]
        self.driver_cpu_s = driver - self._cpu0[2]
        # CPU time other processes on the machine took while this run went on: noise for the benchmark.
        self.foreign_cpu_s = max(0.0, (machine - self._cpu0[0]) - self.tree_cpu_s)

    def as_dict(self) -> dict:
        return {
            "peak_rss_mb": self.peak_bytes / 2**20,
            "peak_nprocs": self.peak_nprocs,
            "samples": self.samples,
            "tree_cpu_s": self.tree_cpu_s,
            "driver_cpu_s": self.driver_cpu_s,
            "foreign_cpu_s": self.foreign_cpu_s,
        }


# A probe names a method to time: (module, class, method) or (module, class, method, extract), where
# ``extract(args, kwargs)`` returns something JSON-able about the call (e.g. the failures passed in).
Probe = tuple


def wrap_methods(probes: Iterable[Probe], on_call: Callable[[str, float, float, Any], None]) -> list[str]:
    """Wrap each probed method so that every call reports ``on_call(name, begin, end, extracted)``.

    Benchmark-only instrumentation of internals that are in flux: a module, class or method that no
    longer exists is skipped (its phases show as "-"). Returns the names that were wrapped.
    """
    wrapped = []
    for probe in probes:
        module_name, cls_name, meth = probe[:3]
        extract = probe[3] if len(probe) > 3 else None
        try:
            cls = getattr(importlib.import_module(module_name), cls_name)
            original = getattr(cls, meth)
        except (ImportError, AttributeError):
            continue

        def wrapper(*a, __orig=original, __name=f"{cls_name}.{meth}", __extract=extract, **kw):
            begin = time.time()
            info = None
            if __extract is not None:
                try:
                    info = __extract(a, kw)
                except Exception as exc:  # the probe must never break the run
                    info = f"extract failed: {exc!r}"
            try:
                return __orig(*a, **kw)
            finally:
                on_call(__name, begin, time.time(), info)

        setattr(cls, meth, functools.wraps(original)(wrapper))
        wrapped.append(f"{cls_name}.{meth}")
    return wrapped


# --------------------------------------------------------------------------------------------------
# Running variants in fresh subprocesses.
# --------------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def finish(json_out: str, data: dict, failed: dict) -> int:
    """Write the results JSON, say where, and return the exit code (1 if any run failed)."""
    write_json(json_out, data)
    print(f"\nwrote {os.path.relpath(json_out)}", file=sys.stderr)
    if failed:
        print(f"{sum(len(r) for r in failed.values())} run(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def write_json(path: str, data: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, default=str)
    os.replace(tmp, path)


def wait_for_idle(max_wait_s: float, busy_fraction: float = 0.25) -> float:
    """Wait (at most ``max_wait_s``) until the machine's CPUs are mostly idle; return seconds waited."""
    import psutil

    t = time.time()
    while time.time() - t < max_wait_s:
        if psutil.cpu_percent(interval=0.5) < busy_fraction * 100:
            break
    return time.time() - t


def run_script_variant(
    script: str, variant: str, extra_args: list[str], idle_wait_s: float, timeout_s: float
) -> dict:
    """Run ``script --variant VARIANT --out F --workdir D [extra_args]`` in a fresh process (after
    waiting for idle CPUs) and return the JSON it wrote to ``F``, or ``{"error": ...}``."""
    waited = wait_for_idle(idle_wait_s) if idle_wait_s > 0 else 0.0
    with tempfile.TemporaryDirectory(prefix="trainforge-bench-") as workdir:
        out = os.path.join(workdir, "variant.json")
        cmd = [sys.executable, os.path.abspath(script), "--variant", variant, "--out", out, "--workdir", workdir,
               *extra_args]  # fmt: skip
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, env.get("PYTHONPATH")) if p)
        env.pop("OMP_NUM_THREADS", None)  # the raw driver sets it for its workers; trainforge sets its own
        t = time.time()
        # Its own process group, killed once it is done: a variant that timed out or crashed leaves no
        # workers behind to run on beside the next variant (its retry included).
        proc = subprocess.Popen(cmd, env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)  # fmt: skip
        timed_out = False
        try:
            try:
                stdout, stderr = proc.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc.pid)
                stdout, stderr = proc.communicate()
        finally:  # also on Ctrl-C, which no longer reaches the variant's own process group
            _kill_group(proc.pid)
            proc.wait()
        wall = time.time() - t
        tail = (stdout + stderr)[-6000:]
        if timed_out:
            print(f"  !! {variant} timed out after {timeout_s}s:\n{tail}", file=sys.stderr)
            return {"error": f"timed out after {timeout_s}s", "output_tail": tail}
        if proc.returncode != 0 or not os.path.exists(out):
            print(f"  !! {variant} failed (exit {proc.returncode}):\n{tail}", file=sys.stderr)
            return {"error": f"exit code {proc.returncode}", "output_tail": tail}
        with open(out) as f:
            data = json.load(f)
        data["subprocess_wall_s"] = wall
        data["idle_wait_s"] = waited
        return data


def _kill_group(pgid: int) -> None:
    from trainforge._internal.process_tree import signal_groups  # here: only the orchestrator calls this

    signal_groups([pgid], signal.SIGKILL)


def is_noisy(run: dict, share: float = 0.1) -> bool:
    """True when other processes took more than ``share`` as much CPU as the run itself."""
    return "foreign_cpu_s" in run and run["foreign_cpu_s"] > share * run.get("tree_cpu_s", 0.0)


def noise_warning(runs: dict[str, list[dict]]) -> str | None:
    """A warning line when other processes took >10% as much CPU as the benchmark in some runs."""
    foreign = [
        (v, r["foreign_cpu_s"], r["tree_cpu_s"]) for v, rs in runs.items() for r in rs if "foreign_cpu_s" in r
    ]
    noisy = [(v, f, t) for v, f, t in foreign if f > 0.1 * t]
    if not noisy:
        return None
    return (f"WARNING: other processes took >10% as much CPU as the benchmark in {len(noisy)} of {len(foreign)} "
            "runs (see foreign_cpu_s in the JSON); numbers may be noisy: "
            + ", ".join(f"{v} {f:.1f}/{t:.1f} CPU-s" for v, f, t in noisy))  # fmt: skip


# --------------------------------------------------------------------------------------------------
# Summaries and output.
# --------------------------------------------------------------------------------------------------
def median(values: Iterable[float | None]) -> float | None:
    values = [v for v in values if v is not None and v == v]
    return statistics.median(values) if values else None


def percentile(values: Iterable[float], q: float) -> float | None:
    """The nearest-rank ``q``-th percentile (0 < q <= 100) of ``values``; None if there are none."""
    s = sorted(values)
    return s[max(0, -(-int(q * len(s)) // 100) - 1)] if s else None


def fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def status(ok: bool | None) -> str:
    return "-" if ok is None else ("PASS" if ok else "MISS")


def render_text(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(r: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )

    return "\n".join([line(header), "  ".join("-" * w for w in widths), *(line(r) for r in rows)])


def render_markdown(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True
        )
        if out.returncode != 0:
            return "uncommitted"
        commit = out.stdout.strip()
        # "-dirty": the code that ran differs from the commit. The benchmarks' own results and the pages
        # made from them do not count (running one benchmark rewrites its JSON, which made every later
        # one "-dirty"), nor do untracked files.
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
             ":(exclude)bench/results", ":(exclude)docs/benchmarks"],
            cwd=REPO_ROOT, capture_output=True, text=True,
        )  # fmt: skip
        return commit + ("-dirty" if dirty.stdout.strip() else "")
    except OSError:
        return "uncommitted"


def machine_info() -> dict:
    import psutil

    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "cpu_count_physical": psutil.cpu_count(logical=False),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
    except ImportError:
        info["torch"] = "not installed"
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu_model"] = next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None
            )
    except OSError:
        pass
    try:
        import trainforge

        info["trainforge"] = getattr(trainforge, "__version__", "unknown")
    except Exception as exc:
        info["trainforge"] = f"not importable: {exc!r}"
    return info


def filesystem_of(path: str) -> dict:
    """The mount (device, type, mount point) that holds ``path``, from /proc/mounts."""
    path = os.path.realpath(path)
    best: dict = {}
    try:
        with open("/proc/mounts") as f:
            for line in f:
                dev, mnt, fstype = line.split()[:3]
                if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best.get("mount", "")):
                    best = {"device": dev, "mount": mnt, "type": fstype}
    except OSError:
        pass
    return best


# --------------------------------------------------------------------------------------------------
# The model the serving benchmarks serve, and its requests.
# --------------------------------------------------------------------------------------------------
N_INSTANCES = 1024  # the random 64-float instances the serving benchmarks send


def make_serve_model(seed: int) -> Any:
    """The model the serving benchmarks serve (bench_serve.py, bench_server_models.py): an MLP
    64-256-256-10 whose class is defined inside, so that it is saved by value with the model."""
    import torch

    from trainforge.model import Model

    class MLP(Model):  # defined here: saved by value with the model, so the server needs no import path
        def setup(self, config: dict[str, Any]) -> None:
            torch.manual_seed(config["seed"])
            net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                      torch.nn.ReLU(), torch.nn.Linear(256, 10))  # fmt: skip
            self.register(models=net)

        def preprocess(self, data: Any) -> Any:
            return torch.as_tensor(data, dtype=torch.float32).reshape(-1, 64)

        def postprocess(self, logits: Any) -> Any:
            return logits.argmax(-1)

    return MLP({"seed": seed})


def predict_bodies(instances: list[list[float]]) -> list[bytes]:
    """One ``/predict`` request body per instance: ``{"inputs": [instance]}``."""
    return [json.dumps({"inputs": [x]}).encode() for x in instances]
