#!/usr/bin/env python
"""Tune benchmark: ``trainforge.tune`` vs Ray Tune 2.60 on the same trainables, in one run.

    python bench/bench_tune.py [--markdown] [--parts trivial,torch,latency,free,search] [--quick] [--no-ray]

Every measurement runs in a fresh driver subprocess. trainforge gets 2 CPUs
(``$TRAINFORGE_LOCAL_RESOURCES={"CPU": 2}``); Ray is started by that subprocess (``ray.init``,
127.0.0.1 only, no dashboard, its own temp dir, ``_common.RAY_ENV``), its start timed apart from the
figures. Parts:

1. ``trivial``: ``--trivial-trials`` (40) function trials of ``--trivial-reports`` (10) ``report()``
   calls each, no sleep, FIFO, 1 CPU per trial on 2 CPUs (Ray: ``num_cpus=2``): trials per second of
   ``Tuner.fit()`` (the Ray start is not in it). Goal: >= 10x Ray.
2. ``torch``: a 2-worker TorchTrainer trial (CPU, gloo; each rank builds ``nn.Linear(8, 1)`` with
   ``prepare_model``, 5 SGD steps, ``report()`` after each). Per-trial overhead = the wall time per
   trial minus the loop's own time (rank 0, from after the loop's imports - torch, ``torch._dynamo``
   which the first DDP needs, the framework: ~1 s that a fresh process pays and a warm one has done -
   until its last ``report()`` returned; Ray Train's reports block, so its loop time includes them).
   Measured for: a cold local ``trainer.fit()`` (a fresh driver process each, ``--cold-fits`` of them,
   median); a trainforge ``Tuner`` over the same trainer, ``--torch-trials`` (4) trials, with
   ``reuse_actors=False`` and ``True``; Ray's documented Train-in-Tune pattern (a driver function
   building ``ray.train.torch.TorchTrainer(num_workers=2)`` with ``RunConfig(name=f"train-trial_id=...",
   callbacks=[TuneReportCallback()])``), ``--ray-torch-trials`` (3) trials, ``max_concurrent_trials=1``,
   on ``ray.init(num_cpus=3)``: the driver function's trial holds 1 CPU besides the 2 workers. Trials
   run one at a time (each needs both CPUs). Also the steady-state turnaround: one trial's last report
   to the next trial's loop. Goals: Tuner <= cold ``fit()``; with warm workers (``reuse_actors=True``)
   <= 1 s.
3. ``latency``: ``report({"t": time.time()})`` -> the scheduler's ``on_trial_result`` (a FIFO subclass
   recording ``time.time() - result["t"]``): ``--latency-trials`` (4) function trials of
   ``--latency-reports`` (50) reports every 20 ms; and 2-worker trainer trials (trainforge: the
   TorchTrainer as the Tuner's trainable, ``--trainer-latency-trials`` (2) x ``--trainer-latency-reports``
   (50); Ray: the Train-in-Tune pattern, one trial of ``--ray-trainer-latency-reports`` (15) reports,
   each of which blocks Ray Train's workers for seconds). Ray runs on ``num_cpus=3`` here, its function
   trials capped at 2 at a time. p50/p95. Goal: p95 <= 50 ms.
4. ``free``: a scheduler returning STOP at the ``--free-stop-at`` (3rd) report of each of
   ``--free-trials`` (10) function trials (reporting their pid every 20 ms, up to 200 times): from the
   decision to the trial's end handled by the tuner (trainforge: ``TuneController._on_end`` returned,
   having released the trial's resources, ``_release`` timed too; Ray: a Tune
   ``Callback.on_trial_complete``) and to the exit of each of the trial's processes (a pidfd each);
   the headline is the later of the two ("workers gone and resources free"). Also 2-worker trainer
   trials (trainforge: ``--free-trainer-trials`` (4); Ray Train-in-Tune: ``--ray-free-trainer-trials``
   (1)), whose ranks, and Ray's driver function, write their pids to files. Processes still running
   when the end was handled, and any that never exit (10 s wait; ray#54305), are counted. p50/p95.
   Goal: p95 <= 2 s.
5. ``search``: the 2-D Branin function (min 0.397887 on [-5, 10] x [0, 15]), a function trial
   reporting it once, ``--search-trials`` (40) trials, ``--search-seeds`` (5) seeds: the best value
   found by ``OptunaSearch(seed=s)`` (TPE) and by ``BasicVariantGenerator(random_state=s)`` (random),
   both through trainforge's Tuner (2 trials at a time); and Ray's ``OptunaSearch(seed=s)`` driven
   directly (``suggest``/``on_trial_complete``, 2 trials outstanding as in a 2-CPU Tune run, no Tune
   loop: 200 trials through Ray Tune would take 5 minutes). Mean +- sd over the seeds.

Storage goes to temporary directories. Every process the benchmark started (marked by an
environment variable, or by Ray's temp dir in its command line or open files) is killed after each
variant and at the end, never with ``ray stop``. Results: ``bench/results/tune.json`` (every raw
number). No timing is asserted anywhere: goals are reported, not enforced.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import select
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

from _common import (
    BENCH_DIR,
    RAY_ENV,
    git_commit,
    machine_info,
    median,
    render_markdown,
    render_text,
    run_script_variant,
    wrap_methods,
    write_json,
)

DEFAULT_JSON = os.path.join(BENCH_DIR, "results", "tune.json")
PARTS = ("trivial", "torch", "latency", "free", "search")
MARK_ENV = "TRAINFORGE_BENCH_MARK"  # in the environment of every process this benchmark starts
TF_CPUS = {"TRAINFORGE_LOCAL_RESOURCES": '{"CPU": 2}'}
BRANIN_MIN = 0.397887

GOAL_TRIVIAL_X = 10.0  # trials/s >= 10x Ray
GOAL_WARM_OVERHEAD_S = 1.0
GOAL_LATENCY_P95_MS = 50.0
GOAL_FREE_P95_S = 2.0

# name: (default, --quick, help)
SETTINGS: dict[str, tuple[Any, Any, str]] = {
    "trivial_trials": (40, 6, "function trials in part 1"),
    "trivial_reports": (10, 10, "report() calls per trivial trial"),
    "torch_steps": (5, 5, "steps (and reports) of the 2-worker torch loop in part 2"),
    "cold_fits": (3, 1, "cold local fit() runs, each in a fresh process (median)"),
    "torch_trials": (4, 2, "trials of each trainforge Tuner in part 2"),
    "ray_torch_trials": (3, 1, "Ray Train-in-Tune trials in part 2 (~30 s each)"),
    "latency_trials": (4, 2, "function trials in part 3"),
    "latency_reports": (50, 10, "reports per function trial in part 3"),
    "trainer_latency_trials": (2, 1, "trainforge 2-worker trainer trials in part 3"),
    "trainer_latency_reports": (50, 10, "reports per trainforge trainer trial in part 3"),
    "ray_trainer_latency_reports": (15, 4, "reports of the one Ray Train-in-Tune trial in part 3"),
    "report_interval_s": (0.02, 0.02, "sleep between reports in parts 3 and 4"),
    "free_trials": (10, 3, "function trials stopped by the scheduler in part 4"),
    "free_stop_at": (3, 3, "the report at which part 4's scheduler says STOP"),
    "free_trainer_trials": (4, 1, "trainforge 2-worker trainer trials stopped in part 4"),
    "ray_free_trainer_trials": (1, 1, "Ray Train-in-Tune trials stopped in part 4 (~30 s each)"),
    "search_trials": (40, 20, "trials per search in part 5"),
    "search_seeds": (5, 2, "seeds per searcher in part 5"),
}


# --------------------------------------------------------------------------------------------------
# Trainables. Defined in this script (pickled by value into trainforge's and Ray's workers); each
# imports its framework inside, so one function serves both (config["api"]).
# --------------------------------------------------------------------------------------------------
def _report_fn(api: str) -> Any:
    if api == "ray":
        from ray.tune import report
    else:
        from trainforge.tune import report
    return report


def trivial_trainable(config: dict) -> None:
    report = _report_fn(config["api"])
    for i in range(config["reports"]):
        report({"i": i})


def timed_trainable(config: dict) -> None:
    """Reports ``{"t": time.time(), "worker_pid": ...}`` every ``interval_s`` (parts 3 and 4; Ray Tune
    overwrites a reported ``pid`` with its trial actor's)."""
    report = _report_fn(config["api"])
    pid = os.getpid()
    for i in range(config["reports"]):
        report({"t": time.time(), "worker_pid": pid, "i": i})
        time.sleep(config["interval_s"])


def branin_trainable(config: dict) -> None:
    report = _report_fn(config["api"])
    report({"value": branin(config["x1"], config["x2"])})


def branin(x1: float, x2: float) -> float:
    b, c, t = 5.1 / (4 * math.pi**2), 5 / math.pi, 1 / (8 * math.pi)
    return (x2 - b * x1**2 + c * x1 - 6) ** 2 + 10 * (1 - t) * math.cos(x1) + 10


def torch_loop(config: dict) -> None:
    """The 2-worker loop: ``nn.Linear`` through ``prepare_model`` (DDP, gloo), ``steps`` SGD steps, a
    ``report({"t", "worker_pid", ...})`` after each. Rank 0 writes its timings to ``out_dir`` (the loop's own
    time runs from after its imports, which a fresh process pays and a warm one has done, until its
    last ``report()`` returned); with ``pid_dir`` every rank first writes its pid to
    ``pid-{trial_id}-rank{r}``."""
    t_entry = time.time()
    import torch
    import torch._dynamo  # noqa: F401 (what the first DistributedDataParallel imports: ~1 s in a fresh process)

    if config["api"] == "ray":
        import ray.train as train
        from ray.train.torch import prepare_model
    else:
        import trainforge as train
        from trainforge.torch import prepare_model
    t_start = time.time()  # the loop's own time starts here: a fresh process's imports are overhead
    rank = train.get_context().get_world_rank()
    if config.get("pid_dir"):
        trial_id = config.get("trial_id")
        if trial_id is None:  # trainforge: the trial's identity is in the run's metadata
            from trainforge import tune

            trial_id = tune.get_context().get_trial_id()
        with open(os.path.join(config["pid_dir"], f"pid-{trial_id}-rank{rank}"), "w") as f:
            f.write(str(os.getpid()))
    model = prepare_model(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    report_s = 0.0
    for step in range(config["steps"]):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t = time.time()
        train.report({"loss": loss.item(), "step": step, "t": t, "worker_pid": os.getpid()})
        report_s += time.time() - t
        if config.get("interval_s"):
            time.sleep(config["interval_s"])
    t_done = time.time()
    if rank == 0 and config.get("out_dir"):
        path = os.path.join(config["out_dir"], f"loop-{os.getpid()}-{time.time_ns()}.json")
        with open(path, "w") as f:
            json.dump({"t_entry": t_entry, "t_start": t_start, "t_done": t_done, "report_s": report_s,
                       "pid": os.getpid()}, f)  # fmt: skip


def ray_train_driver(config: dict) -> None:
    """Ray's documented Train-in-Tune trial (train/user-guides/hyperparameter-optimization): a
    function that builds and fits a ``TorchTrainer`` whose ``TuneReportCallback`` forwards rank 0's
    reports to the trial."""
    import ray.tune
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    trial_id = ray.tune.get_context().get_trial_id()
    loop_config = {**config["train_loop_config"], "trial_id": trial_id}
    if loop_config.get("pid_dir"):
        with open(os.path.join(loop_config["pid_dir"], f"pid-{trial_id}-driver"), "w") as f:
            f.write(str(os.getpid()))
    trainer = TorchTrainer(
        torch_loop, train_loop_config=loop_config, scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name=f"train-trial_id={trial_id}", storage_path=config["storage_path"],
                             callbacks=[TuneReportCallback()]),
    )  # fmt: skip
    trainer.fit()


# --------------------------------------------------------------------------------------------------
# Driver-side instruments.
# --------------------------------------------------------------------------------------------------
LATENCIES: list[float] = []  # seconds, report -> on_trial_result, filled in the driver process
# Part 4's recorders by name: schedulers and callbacks hold the name only (tuners pickle them).
RECORDERS: dict[str, StopRecorder] = {}


def _record_latency(result: dict) -> None:
    if "t" in result:
        LATENCIES.append(time.time() - result["t"])


def pid_state(pid: int) -> str:
    """"alive", "zombie" (exited, not reaped) or "gone"."""
    import psutil

    try:
        return "zombie" if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE else "alive"
    except psutil.Error:
        return "gone"


class ExitWatcher:
    """When each watched process exited (a pidfd per process, readable at its exit, zombie or not)."""

    def __init__(self) -> None:
        self.exited: dict[int, float | None] = {}
        self._threads: list[threading.Thread] = []

    def watch(self, pid: int) -> None:
        if pid in self.exited:
            return
        self.exited[pid] = None
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            self.exited[pid] = time.time()  # already gone
            return

        def wait() -> None:
            try:
                if select.select([fd], [], [], 300)[0]:
                    self.exited[pid] = time.time()
            finally:
                os.close(fd)

        th = threading.Thread(target=wait, daemon=True, name=f"exit-{pid}")
        th.start()
        self._threads.append(th)


class StopRecorder:
    """The part-4 decision: STOP at the ``stop_at``-th result of each trial; records the decision time
    and the trial's processes (the pid files its ranks and Ray's driver function wrote, else the
    function trial's reported ``worker_pid``)."""

    def __init__(self, stop_at: int, pid_dir: str | None):
        self.stop_at = stop_at
        self.pid_dir = pid_dir
        self.trials: dict[str, dict[str, Any]] = {}
        self.watcher = ExitWatcher()

    def decide(self, trial_id: str, result: dict) -> bool:
        rec = self.trials.get(trial_id)
        if rec is not None:
            rec["results_after_stop"] += 1
            return True
        if result.get("training_iteration", 0) < self.stop_at:
            return False
        pids: dict[str, int] = {}
        if self.pid_dir:  # trainer trials: every rank (and Ray's driver function) wrote its pid
            prefix = f"pid-{trial_id}-"
            for name in os.listdir(self.pid_dir):
                if name.startswith(prefix):
                    with open(os.path.join(self.pid_dir, name)) as f:
                        pids[name[len(prefix):]] = int(f.read())
        if not pids:
            pids["worker"] = int(result["worker_pid"])
        for pid in set(pids.values()):
            self.watcher.watch(pid)
        self.trials[trial_id] = {"t_decision": time.time(), "pids": pids, "results_after_stop": 0}
        return True

    def on_end(self, trial_id: str, t_end: float) -> None:
        rec = self.trials.get(trial_id)
        if rec is not None and "t_end" not in rec:
            rec["t_end"] = t_end
            rec["states_at_end"] = {k: pid_state(p) for k, p in rec["pids"].items()}

    def summary(self, wait_exit_s: float = 10.0) -> dict:
        """Per trial: the times, and the states of its processes now (call right after ``fit()``
        returned), then waits (up to ``wait_exit_s``) for every one to exit."""
        after_fit = {tid: {k: pid_state(p) for k, p in rec["pids"].items()} for tid, rec in self.trials.items()}
        deadline = time.time() + wait_exit_s
        while time.time() < deadline and any(v is None for v in self.watcher.exited.values()):
            time.sleep(0.05)
        trials = {}
        for tid, rec in self.trials.items():
            exits = {k: self.watcher.exited.get(p) for k, p in rec["pids"].items()}
            trials[tid] = {
                **rec,
                "decision_to_end_s": rec["t_end"] - rec["t_decision"] if "t_end" in rec else None,
                "decision_to_exit_s": {k: (v - rec["t_decision"] if v is not None else None) for k, v in exits.items()},
                "states_after_fit": after_fit[tid],
            }  # fmt: skip
        return trials


# --------------------------------------------------------------------------------------------------
# Variants (each in a fresh subprocess): "<part>:<system>".
# --------------------------------------------------------------------------------------------------
def _ray_init(num_cpus: int, temp_root: str) -> dict:
    os.environ.update(RAY_ENV)
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")  # the default in 2.60; the docs set it
    t = time.time()
    import ray
    import ray.train  # noqa: F401
    import ray.tune  # noqa: F401

    import_s = time.time() - t
    temp = tempfile.mkdtemp(prefix="r", dir=temp_root)  # short: Ray's socket paths
    t = time.time()
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1",
             _temp_dir=temp, object_store_memory=200 * 2**20, log_to_driver=False)  # fmt: skip
    return {"ray_import_s": import_s, "ray_init_s": time.time() - t, "ray_num_cpus": num_cpus}


def _ray_shutdown() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()


def _tf_tuner(trainable: Any, workdir: str, name: str, param_space: dict, **tune_config: Any) -> Any:
    from trainforge.tune import RunConfig, TuneConfig, Tuner

    return Tuner(trainable, param_space=param_space, tune_config=TuneConfig(**tune_config),
                 run_config=RunConfig(storage_path=os.path.join(workdir, "tf"), name=name, verbose=0))  # fmt: skip


def _ray_tuner(trainable: Any, workdir: str, name: str, param_space: dict, callbacks: list | None = None,
               **tune_config: Any) -> Any:  # fmt: skip
    from ray import tune

    return tune.Tuner(trainable, param_space=param_space, tune_config=tune.TuneConfig(**tune_config),
                      run_config=tune.RunConfig(storage_path=os.path.join(workdir, "ray"), name=name, verbose=0,
                                                callbacks=callbacks))  # fmt: skip


def _grid_summary(grid: Any) -> dict:
    results = list(grid)
    return {
        "trials": len(results),
        "errors": [repr(r.error)[:500] for r in results if r.error is not None],
        "reports": [len(r.metrics_history or []) if hasattr(r, "metrics_history")
                    else len(r.metrics_dataframe) if r.metrics_dataframe is not None else None
                    for r in results],
    }  # fmt: skip


def _loops(out_dir: str) -> list[dict]:
    loops = []
    for name in sorted(os.listdir(out_dir)):
        if name.startswith("loop-"):
            with open(os.path.join(out_dir, name)) as f:
                loops.append(json.load(f))
    return sorted(loops, key=lambda r: r["t_start"])


def v_trivial(system: str, s: dict, workdir: str, temp_root: str) -> dict:
    out: dict[str, Any] = {}
    config = {"api": system, "reports": s["trivial_reports"], "x": None}
    n = s["trivial_trials"]
    if system == "ray":
        out.update(_ray_init(2, temp_root))
        from ray import tune

        space = {**config, "x": tune.uniform(0, 1)}
        tuner = _ray_tuner(tune.with_resources(trivial_trainable, {"cpu": 1}), workdir, "trivial", space, num_samples=n)
    else:
        os.environ.update(TF_CPUS)
        t = time.time()
        from trainforge import tune

        out["tf_import_s"] = time.time() - t
        space = {**config, "x": tune.uniform(0, 1)}
        tuner = _tf_tuner(tune.with_resources(trivial_trainable, {"cpu": 1}), workdir, "trivial", space, num_samples=n)
    t0 = time.time()
    grid = tuner.fit()
    out["fit_s"] = time.time() - t0
    out.update(_grid_summary(grid))
    out["trials_per_s"] = n / out["fit_s"]
    return out


def v_torch(system: str, s: dict, workdir: str, temp_root: str) -> dict:
    out_dir = os.path.join(workdir, "loops")
    os.makedirs(out_dir)
    loop_config = {"steps": s["torch_steps"], "out_dir": out_dir}
    out: dict[str, Any] = {}
    if system == "ray":
        out.update(_ray_init(3, temp_root))
        from ray import tune

        n = s["ray_torch_trials"]
        space = {"train_loop_config": {**loop_config, "api": "ray", "x": tune.uniform(0, 1)},
                 "storage_path": os.path.join(workdir, "ray-train")}  # fmt: skip
        tuner = _ray_tuner(ray_train_driver, workdir, "torch", space, num_samples=n, max_concurrent_trials=1)
    else:
        os.environ.update(TF_CPUS)
        import torch  # noqa: F401 (imported before the clock, as in bench_core)

        from trainforge import RunConfig, ScalingConfig
        from trainforge import tune as tf_tune
        from trainforge.torch import TorchTrainer

        trainer = TorchTrainer(
            torch_loop, train_loop_config={**loop_config, "api": "trainforge"},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(storage_path=os.path.join(workdir, "fit"), name="fit", verbose=0),
        )  # fmt: skip
        if system == "fit":
            n = 1
            t0 = time.time()
            result = trainer.fit()
            t1 = time.time()
            out.update(fit_s=t1 - t0, t0=t0, t1=t1, errors=[] if result.error is None else [repr(result.error)[:500]])
            tuner = None
        else:
            n = s["torch_trials"]
            space = {"train_loop_config": {"x": tf_tune.uniform(0, 1)}}
            tuner = _tf_tuner(trainer, workdir, "torch", space, num_samples=n, reuse_actors=system == "tf_reuse")
    if tuner is not None:
        t0 = time.time()
        grid = tuner.fit()
        t1 = time.time()
        out.update(fit_s=t1 - t0, t0=t0, t1=t1, **_grid_summary(grid))
    loops = _loops(out_dir)
    out["loops"] = loops
    out["trials_run"] = n
    out["per_trial_s"] = out["fit_s"] / n
    if len(loops) == n:
        loop_s = [r["t_done"] - r["t_start"] for r in loops]
        out["loop_s"] = loop_s
        out["overhead_per_trial_s"] = (out["fit_s"] - sum(loop_s)) / n
        # Where the overhead goes: before the first loop, between trials (one trial's last report ->
        # the next trial's loop entry), after the last loop.
        out["to_first_loop_s"] = loops[0]["t_start"] - out["t0"]
        out["between_trials_s"] = [b["t_start"] - a["t_done"] for a, b in zip(loops, loops[1:], strict=False)]
        out["import_s"] = [r["t_start"] - r["t_entry"] for r in loops]
        out["after_last_loop_s"] = out["t1"] - loops[-1]["t_done"]
    else:
        out["error"] = f"{len(loops)} loop timing files for {n} trials"
    return out


def v_latency(system: str, s: dict, workdir: str, temp_root: str) -> dict:
    interval = s["report_interval_s"]
    fn_config = {"api": system, "reports": s["latency_reports"], "interval_s": interval}
    loop_config = {"interval_s": interval, "api": "ray" if system == "ray" else "trainforge"}
    out: dict[str, Any] = {}
    if system == "ray":
        out.update(_ray_init(3, temp_root))
        from ray import tune
        from ray.tune.schedulers import FIFOScheduler as RayFIFO

        class RayLatencyScheduler(RayFIFO):
            def on_trial_result(self, tune_controller: Any, trial: Any, result: dict) -> str:
                _record_latency(result)
                return super().on_trial_result(tune_controller, trial, result)

        # 3 CPUs (for the Train-in-Tune trial's driver + 2 workers): the function trials are capped at 2.
        space = {**fn_config, "x": tune.uniform(0, 1)}
        fn_tuner = _ray_tuner(one_cpu(timed_trainable, "ray"), workdir, "latency-fn", space,
                              num_samples=s["latency_trials"], scheduler=RayLatencyScheduler(),
                              max_concurrent_trials=2)  # fmt: skip
        space = {"train_loop_config": {**loop_config, "steps": s["ray_trainer_latency_reports"], "x": tune.uniform(0, 1)},
                 "storage_path": os.path.join(workdir, "ray-train")}  # fmt: skip
        trainer_tuner = _ray_tuner(ray_train_driver, workdir, "latency-trainer", space, num_samples=1,
                                   scheduler=RayLatencyScheduler(), max_concurrent_trials=1)  # fmt: skip
    else:
        os.environ.update(TF_CPUS)
        import torch  # noqa: F401

        from trainforge import RunConfig, ScalingConfig
        from trainforge import tune as tf_tune
        from trainforge.torch import TorchTrainer
        from trainforge.tune.schedulers import FIFOScheduler

        class LatencyScheduler(FIFOScheduler):
            def on_trial_result(self, trial_id: str, result: dict) -> str:
                _record_latency(result)
                return super().on_trial_result(trial_id, result)

        space = {**fn_config, "x": tf_tune.uniform(0, 1)}
        fn_tuner = _tf_tuner(one_cpu(timed_trainable, "trainforge"), workdir, "latency-fn", space,
                             num_samples=s["latency_trials"], scheduler=LatencyScheduler())  # fmt: skip
        trainer = TorchTrainer(torch_loop, train_loop_config={**loop_config, "steps": s["trainer_latency_reports"]},
                               scaling_config=ScalingConfig(num_workers=2),
                               run_config=RunConfig(storage_path=workdir, verbose=0))  # fmt: skip
        trainer_tuner = _tf_tuner(trainer, workdir, "latency-trainer", {"train_loop_config": {"x": tf_tune.uniform(0, 1)}},
                                  num_samples=s["trainer_latency_trials"], scheduler=LatencyScheduler())  # fmt: skip
    for kind, tuner in (("fn", fn_tuner), ("trainer", trainer_tuner)):
        LATENCIES.clear()
        t = time.time()
        grid = tuner.fit()
        out[kind] = {"fit_s": time.time() - t, "latencies_s": list(LATENCIES), **_grid_summary(grid)}
    return out


def one_cpu(fn: Any, system: str) -> Any:
    """``fn`` with 1 CPU per trial (Ray's default, made explicit), through the system's ``with_resources``."""
    if system == "ray":
        from ray import tune
    else:
        from trainforge import tune  # type: ignore[no-redef]
    return tune.with_resources(fn, {"cpu": 1})


def v_free(system: str, s: dict, workdir: str, temp_root: str) -> dict:
    pid_dir = os.path.join(workdir, "pids")
    os.makedirs(pid_dir)
    interval = s["report_interval_s"]
    fn_config = {"api": system, "reports": 200, "interval_s": interval}
    loop_config = {"interval_s": interval, "steps": 200, "pid_dir": pid_dir,
                   "api": "ray" if system == "ray" else "trainforge"}  # fmt: skip
    out: dict[str, Any] = {}
    runs: list[tuple[str, Any]] = []
    if system == "ray":
        out.update(_ray_init(3, temp_root))
        import ray
        from ray import tune
        from ray.tune import Callback
        from ray.tune.schedulers import FIFOScheduler as RayFIFO
        from ray.tune.schedulers import TrialScheduler

        class RayStopScheduler(RayFIFO):
            def __init__(self, key: str):
                super().__init__()
                self.key = key

            def on_trial_result(self, tune_controller: Any, trial: Any, result: dict) -> str:
                stop = RECORDERS[self.key].decide(trial.trial_id, result)
                return TrialScheduler.STOP if stop else TrialScheduler.CONTINUE

        class EndCallback(Callback):
            def __init__(self, key: str):
                self.key = key

            def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
                RECORDERS[self.key].on_end(trial.trial_id, time.time())

        for kind, n in (("fn", s["free_trials"]), ("trainer", s["ray_free_trainer_trials"])):
            if n <= 0:
                continue
            RECORDERS[kind] = StopRecorder(s["free_stop_at"], pid_dir if kind == "trainer" else None)
            if kind == "fn":
                space = {**fn_config, "x": tune.uniform(0, 1)}
                runs.append((kind, _ray_tuner(one_cpu(timed_trainable, "ray"), workdir, "free-fn", space,
                                              callbacks=[EndCallback(kind)], num_samples=n,
                                              scheduler=RayStopScheduler(kind), max_concurrent_trials=2)))  # fmt: skip
            else:
                space = {"train_loop_config": {**loop_config, "x": tune.uniform(0, 1)},
                         "storage_path": os.path.join(workdir, "ray-train")}  # fmt: skip
                runs.append((kind, _ray_tuner(ray_train_driver, workdir, "free-trainer", space,
                                              callbacks=[EndCallback(kind)], num_samples=n,
                                              scheduler=RayStopScheduler(kind), max_concurrent_trials=1)))  # fmt: skip
    else:
        os.environ.update(TF_CPUS)
        import torch  # noqa: F401

        from trainforge import RunConfig, ScalingConfig
        from trainforge import tune as tf_tune
        from trainforge.torch import TorchTrainer
        from trainforge.tune.schedulers import FIFOScheduler

        class StopScheduler(FIFOScheduler):
            def __init__(self, key: str):
                super().__init__()
                self.key = key

            def on_trial_result(self, trial_id: str, result: dict) -> str:
                return self.STOP if RECORDERS[self.key].decide(trial_id, result) else self.CONTINUE

        current: list[StopRecorder] = []
        release_s: dict[str, float] = {}

        def on_call(name: str, begin: float, end: float, info: Any) -> None:
            ctrl, trial_id = info
            if name.endswith("_release"):
                release_s.setdefault(trial_id, end)
            elif current:
                current[0].on_end(trial_id, end)
                current[0].trials.get(trial_id, {}).setdefault("free_at_end", dict(ctrl.free))

        wrapped = wrap_methods(
            [("trainforge.tune._controller", "TuneController", "_on_end", lambda a, kw: (a[0], a[1].trial_id)),
             ("trainforge.tune._controller", "TuneController", "_release", lambda a, kw: (a[0], a[1].trial_id))],
            on_call,
        )  # fmt: skip
        out["wrapped"] = wrapped
        for kind, n in (("fn", s["free_trials"]), ("trainer", s["free_trainer_trials"])):
            if n <= 0:
                continue
            RECORDERS[kind] = StopRecorder(s["free_stop_at"], pid_dir if kind == "trainer" else None)
            if kind == "fn":
                space = {**fn_config, "x": tf_tune.uniform(0, 1)}
                tuner = _tf_tuner(one_cpu(timed_trainable, "trainforge"), workdir, "free-fn", space,
                                  num_samples=n, scheduler=StopScheduler(kind))  # fmt: skip
            else:
                trainer = TorchTrainer(torch_loop, train_loop_config=loop_config, scaling_config=ScalingConfig(num_workers=2),
                                       run_config=RunConfig(storage_path=workdir, verbose=0))  # fmt: skip
                tuner = _tf_tuner(trainer, workdir, "free-trainer", {"train_loop_config": {"x": tf_tune.uniform(0, 1)}},
                                  num_samples=n, scheduler=StopScheduler(kind))  # fmt: skip
            runs.append((kind, tuner))
        out["release_t"] = release_s
    for kind, tuner in runs:
        rec = RECORDERS[kind]
        if system != "ray":
            current[:] = [rec]
        t = time.time()
        grid = tuner.fit()
        fit_s = time.time() - t
        out[kind] = {"fit_s": fit_s, **_grid_summary(grid), "trials_detail": rec.summary()}
        if system != "ray":
            for tid, d in out[kind]["trials_detail"].items():
                if tid in release_s:
                    d["decision_to_release_s"] = release_s[tid] - d["t_decision"]
    if system == "ray":
        out["ray_available_cpu_after"] = ray.available_resources().get("CPU")
    return out


def v_search(system: str, s: dict, workdir: str, temp_root: str) -> dict:
    n, seeds = s["search_trials"], list(range(s["search_seeds"]))
    out: dict[str, Any] = {"trials": n, "seeds": seeds, "searches": []}
    if system == "ray":
        # Ray's OptunaSearch driven directly: 2 trials outstanding, as in a Tune run on 2 CPUs.
        from ray import tune
        from ray.tune.search.optuna import OptunaSearch

        space = {"x1": tune.uniform(-5, 10), "x2": tune.uniform(0, 15)}
        for seed in seeds:
            searcher = OptunaSearch(metric="value", mode="min", seed=seed)
            searcher.set_search_properties("value", "min", space)
            t = time.time()
            values: list[float] = []
            live: list[tuple[str, dict]] = []
            i = 0
            while len(values) < n:
                while len(live) < 2 and i < n:
                    live.append((f"t{i:03d}", searcher.suggest(f"t{i:03d}")))
                    i += 1
                done_id, cfg = live.pop(0)
                values.append(branin(cfg["x1"], cfg["x2"]))
                searcher.on_trial_complete(done_id, {"value": values[-1]})
            out["searches"].append({"searcher": "ray_optuna_tpe", "seed": seed, "values": values, "best": min(values),
                                    "wall_s": time.time() - t})  # fmt: skip
        return out
    os.environ.update(TF_CPUS)
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    from trainforge import tune
    from trainforge.tune.search import BasicVariantGenerator
    from trainforge.tune.search.optuna import OptunaSearch as TfOptunaSearch

    space = {"api": "trainforge", "x1": tune.uniform(-5, 10), "x2": tune.uniform(0, 15)}
    for seed in seeds:
        for name in ("tpe", "random"):
            searcher = TfOptunaSearch(seed=seed) if name == "tpe" else BasicVariantGenerator(random_state=seed)
            tuner = _tf_tuner(one_cpu(branin_trainable, "trainforge"), workdir, f"search-{name}-{seed}", space,
                              metric="value", mode="min", num_samples=n, search_alg=searcher)  # fmt: skip
            t = time.time()
            grid = tuner.fit()
            wall = time.time() - t
            values = [r.metrics["value"] for r in grid if r.metrics and "value" in r.metrics]
            out["searches"].append({"searcher": name, "seed": seed, "values": values, "wall_s": wall,
                                    "best": min(values) if values else None, "errors": grid.num_errors})  # fmt: skip
    return out


VARIANTS = {"trivial": v_trivial, "torch": v_torch, "latency": v_latency, "free": v_free, "search": v_search}


def run_variant_here(args: argparse.Namespace) -> None:
    part, system = args.variant.split(":")
    settings = json.loads(args.settings)
    try:
        out = VARIANTS[part](system, settings, args.workdir, args.ray_temp_root)
    finally:
        if system == "ray":
            _ray_shutdown()
    write_json(args.out, out)


# --------------------------------------------------------------------------------------------------
# Orchestrator.
# --------------------------------------------------------------------------------------------------
def plan(part: str, s: dict, ray: bool) -> list[str]:
    if part == "torch":
        fits = ["torch:fit"] * s["cold_fits"]
        others = ["torch:tf", "torch:tf_reuse"] + (["torch:ray"] if ray else [])
        out: list[str] = []
        while fits or others:  # cold fits spread between the others
            if fits:
                out.append(fits.pop())
            if others:
                out.append(others.pop(0))
        return out
    return [f"{part}:tf"] + ([f"{part}:ray"] if ray else [])


def marked_processes(mark: str, ray_root: str) -> list[Any]:
    """Processes this benchmark started that still run: the mark in their environment, or Ray's temp
    dir in their command line or open files (Ray's workers rewrite their title and environment)."""
    import psutil

    me = os.getpid()
    found = []
    for p in psutil.process_iter():
        if p.pid == me:
            continue
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            if p.environ().get(MARK_ENV) == mark or ray_root in " ".join(p.cmdline()):
                found.append(p)
                continue
            name = p.name()
            if (name.startswith(("ray::", "ray_", "raylet", "gcs_server")) or "ray" in name) and any(
                f.path.startswith(ray_root) for f in p.open_files()
            ):
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def cleanup(mark: str, ray_root: str) -> list[str]:
    from trainforge._testing.procs import kill_procs  # here: a --variant process imports no more than it did

    killed: list[str] = []
    for _ in range(3):
        procs = marked_processes(mark, ray_root)
        if not procs:
            break
        killed += kill_procs(procs)
        time.sleep(0.5)
    return killed


def pct(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear interpolation; None for no values."""
    v = sorted(values)
    if not v:
        return None
    k = (len(v) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def _ok(run: dict | None) -> dict | None:
    return run if run and "error" not in run else None


def summarize(runs: dict[str, list[dict]]) -> dict:
    one = {v: _ok(rs[0]) if rs else None for v, rs in runs.items()}
    sm: dict[str, Any] = {}
    for system in ("tf", "ray"):
        r = one.get(f"trivial:{system}")
        if r:
            sm[f"trivial_{system}"] = {"trials_per_s": r["trials_per_s"], "fit_s": r["fit_s"],
                                       "ray_init_s": r.get("ray_init_s"), "errors": len(r["errors"])}  # fmt: skip
    fits = [r for r in runs.get("torch:fit", []) if _ok(r) and "overhead_per_trial_s" in r]
    if fits:
        sm["torch_fit"] = {"overhead_per_trial_s": median(r["overhead_per_trial_s"] for r in fits),
                           "wall_s": median(r["fit_s"] for r in fits), "loop_s": median(r["loop_s"][0] for r in fits),
                           "to_first_loop_s": median(r["to_first_loop_s"] for r in fits),
                           "import_s": median(r["import_s"][0] for r in fits),
                           "after_last_loop_s": median(r["after_last_loop_s"] for r in fits), "runs": len(fits)}  # fmt: skip
    for system in ("tf", "tf_reuse", "ray"):
        r = one.get(f"torch:{system}")
        if r and "overhead_per_trial_s" in r:
            sm[f"torch_{system}"] = {
                "overhead_per_trial_s": r["overhead_per_trial_s"], "per_trial_s": r["per_trial_s"],
                "loop_s_median": median(r["loop_s"]), "between_trials_s_median": median(r["between_trials_s"]),
                "between_trials_s": r["between_trials_s"], "to_first_loop_s": r["to_first_loop_s"],
                "after_last_loop_s": r["after_last_loop_s"], "import_s_median": median(r["import_s"]),
                "trials": r["trials_run"], "ray_init_s": r.get("ray_init_s"),
                "loop_report_s_median": median(x["report_s"] for x in r["loops"]),
            }  # fmt: skip
    for system in ("tf", "ray"):
        r = one.get(f"latency:{system}")
        if r:
            for kind in ("fn", "trainer"):
                lat = [x * 1e3 for x in r[kind]["latencies_s"]]
                sm[f"latency_{kind}_{system}"] = {"p50_ms": pct(lat, 50), "p95_ms": pct(lat, 95), "max_ms": max(lat, default=None),
                                                  "n": len(lat), "errors": len(r[kind]["errors"])}  # fmt: skip
        r = one.get(f"free:{system}")
        if r:
            for kind in ("fn", "trainer"):
                if kind not in r:
                    continue
                det = list(r[kind]["trials_detail"].values())
                end = [d["decision_to_end_s"] for d in det if d["decision_to_end_s"] is not None]
                exits = [x for d in det for x in d["decision_to_exit_s"].values() if x is not None]
                last_exit = {id(d): max(d["decision_to_exit_s"].values()) for d in det
                             if d["decision_to_exit_s"] and None not in d["decision_to_exit_s"].values()}  # fmt: skip
                # "workers gone and resources free": the later of the end handled and the last exit.
                gone_free = [max(d["decision_to_end_s"], last_exit[id(d)]) for d in det
                             if d["decision_to_end_s"] is not None and id(d) in last_exit]  # fmt: skip
                rel = [d["decision_to_release_s"] for d in det if "decision_to_release_s" in d]
                states = [st for d in det for st in d.get("states_at_end", {}).values()]
                sm[f"free_{kind}_{system}"] = {
                    "trials_stopped": len(det), "trials_ended": len(end),
                    "gone_free_p50_s": pct(gone_free, 50), "gone_free_p95_s": pct(gone_free, 95),
                    "end_p50_s": pct(end, 50), "end_p95_s": pct(end, 95),
                    "release_p50_s": pct(rel, 50), "release_p95_s": pct(rel, 95),
                    "exit_p50_s": pct(exits, 50), "exit_p95_s": pct(exits, 95),
                    "last_exit_p50_s": pct(list(last_exit.values()), 50),
                    "last_exit_p95_s": pct(list(last_exit.values()), 95),
                    "processes": sum(len(d["pids"]) for d in det),
                    "alive_at_end": states.count("alive"), "zombie_at_end": states.count("zombie"),
                    "never_exited": sum(1 for d in det for x in d["decision_to_exit_s"].values() if x is None),
                    "alive_after_fit": sum(1 for d in det for st in d["states_after_fit"].values() if st == "alive"),
                    "results_after_stop": sum(d["results_after_stop"] for d in det),
                }  # fmt: skip
    for system in ("tf", "ray"):
        r = one.get(f"search:{system}")
        if r:
            by: dict[str, list[float]] = {}
            for srch in r["searches"]:
                if srch["best"] is not None:
                    by.setdefault(srch["searcher"], []).append(srch["best"])
            for name, bests in by.items():
                sm[f"search_{name}_{system}"] = {
                    "mean": statistics.mean(bests), "sd": statistics.stdev(bests) if len(bests) > 1 else 0.0,
                    "regret_mean": statistics.mean(b - BRANIN_MIN for b in bests), "bests": bests,
                }  # fmt: skip
    return sm


def _f(v: float | None, spec: str, suffix: str = "") -> str:
    return "-" if v is None or v != v else format(v, spec) + suffix


def _x(ratio: float | None) -> str:
    """A ratio as "12x", "3.4x", "0.05x"."""
    if ratio is None or ratio != ratio:
        return "-"
    return f"{ratio:.0f}x" if ratio >= 10 else f"{ratio:.2g}x"


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _met(ok: bool | None) -> str:
    return "" if ok is None else (" (met)" if ok else " (MISSED)")


def _pair(d: dict | None, k50: str, k95: str, spec: str) -> str:
    d = d or {}
    return f"{_f(d.get(k50), spec)} / {_f(d.get(k95), spec)}"


def table(sm: dict, s: dict) -> tuple[list[str], list[list[str]]]:
    """Rows of figure | trainforge | Ray Tune 2.60 | ratio (how many times trainforge is better) | goal."""
    header = ["figure", "trainforge", "Ray Tune 2.60", "ratio", "goal"]
    rows: list[list[str]] = []
    tf, ray = sm.get("trivial_tf"), sm.get("trivial_ray")
    if tf or ray:
        a, b = (tf or {}).get("trials_per_s"), (ray or {}).get("trials_per_s")
        ratio = _div(a, b)
        rows.append([f"trivial function trials/s ({s['trivial_trials']} trials x {s['trivial_reports']} reports, 2 CPUs)",
                     _f(a, ".2f"), _f(b, ".2f"), _x(ratio),
                     f">= {GOAL_TRIVIAL_X:.0f}x Ray" + _met(None if ratio is None else ratio >= GOAL_TRIVIAL_X)])  # fmt: skip
        if ray:
            rows.append(["  Ray's start (ray.init, num_cpus=2), not in trials/s (s)", "-", _f(ray.get("ray_init_s"), ".1f"),
                         "", "(informational)"])  # fmt: skip
    fit = (sm.get("torch_fit") or {}).get("overhead_per_trial_s")
    if any(k in sm for k in ("torch_fit", "torch_tf", "torch_tf_reuse", "torch_ray")):
        rt = sm.get("torch_ray") or {}
        ray_o, ray_b = rt.get("overhead_per_trial_s"), rt.get("between_trials_s_median")
        ray_cell = _f(ray_o, ".2f") + (" (Train-in-Tune)" if ray_o is not None else "")
        rows.append(["2-worker torch trial, overhead = wall - loop: cold local fit() (s)", _f(fit, ".2f"), "-", "",
                     "(the reference)"])  # fmt: skip
        for key, label, goal, limit in (
            ("torch_tf", "  Tuner, reuse_actors=False (s per trial)", "<= cold fit()", fit),
            ("torch_tf_reuse", "  Tuner, reuse_actors=True (s per trial)", f"<= {GOAL_WARM_OVERHEAD_S:.0f} s", GOAL_WARM_OVERHEAD_S),
        ):  # fmt: skip
            v = (sm.get(key) or {}).get("overhead_per_trial_s")
            rows.append([label, _f(v, ".2f"), ray_cell, _x(_div(ray_o, v)),
                         goal + _met(None if v is None or limit is None else v <= limit)])  # fmt: skip
        for key, label, goal, limit in (
            ("torch_tf", "  a trial's last report -> next trial's loop, reuse_actors=False (s)", "(informational)", None),
            ("torch_tf_reuse", "  a trial's last report -> next trial's loop, reuse_actors=True (s)",
             f"<= {GOAL_WARM_OVERHEAD_S:.0f} s", GOAL_WARM_OVERHEAD_S),
        ):  # fmt: skip
            v = (sm.get(key) or {}).get("between_trials_s_median")
            rows.append([label, _f(v, ".2f"), _f(ray_b, ".2f"), _x(_div(ray_b, v)),
                         goal + _met(None if v is None or limit is None else v <= limit)])  # fmt: skip
    for kind, label in (("fn", "function trials"), ("trainer", "2-worker trainer trials")):
        a, b = sm.get(f"latency_{kind}_tf"), sm.get(f"latency_{kind}_ray")
        if a or b:
            p95a, p95b = (a or {}).get("p95_ms"), (b or {}).get("p95_ms")
            n = f"{(a or {}).get('n', '-')} / {(b or {}).get('n', '-')} results"
            rows.append([f"report() -> scheduler decision, {label} ({n}), p50 / p95 (ms)",
                         _pair(a, "p50_ms", "p95_ms", ".1f"), _pair(b, "p50_ms", "p95_ms", ".1f"), _x(_div(p95b, p95a)),
                         f"p95 <= {GOAL_LATENCY_P95_MS:.0f} ms" + _met(None if p95a is None else p95a <= GOAL_LATENCY_P95_MS)])  # fmt: skip
    for kind, label in (("fn", "function trials"), ("trainer", "2-worker trainer trials")):
        a, b = sm.get(f"free_{kind}_tf"), sm.get(f"free_{kind}_ray")
        if not (a or b):
            continue
        a, b = a or {}, b or {}
        n = f"{a.get('trials_stopped', '-')} / {b.get('trials_stopped', '-')} stopped"
        p95a = a.get("gone_free_p95_s")
        rows.append([f"STOP -> processes gone and trial ended, {label} ({n}), p50 / p95 (s)",
                     _pair(a, "gone_free_p50_s", "gone_free_p95_s", ".3f"), _pair(b, "gone_free_p50_s", "gone_free_p95_s", ".3f"),
                     _x(_div(b.get("gone_free_p95_s"), p95a)),
                     f"p95 <= {GOAL_FREE_P95_S:.0f} s" + _met(None if p95a is None else p95a <= GOAL_FREE_P95_S)])  # fmt: skip
        rows.append(["  STOP -> trial's end handled by the tuner, p50 / p95 (s)", _pair(a, "end_p50_s", "end_p95_s", ".3f"),
                     _pair(b, "end_p50_s", "end_p95_s", ".3f"), _x(_div(b.get("end_p95_s"), a.get("end_p95_s"))), ""])  # fmt: skip
        rows.append(["  STOP -> the trial's last process exited, p50 / p95 (s)", _pair(a, "last_exit_p50_s", "last_exit_p95_s", ".3f"),
                     _pair(b, "last_exit_p50_s", "last_exit_p95_s", ".3f"),
                     _x(_div(b.get("last_exit_p95_s"), a.get("last_exit_p95_s"))), ""])  # fmt: skip

        def alive(d: dict) -> str:
            return "-" if not d else f"{d['alive_at_end']} of {d['processes']}; {d['never_exited']}"

        rows.append(["  processes running when the end was handled; never exited", alive(a), alive(b), "",
                     "never exited: 0" + _met(None if not a else a["never_exited"] == 0)])  # fmt: skip
    tpe, rnd, rtpe = sm.get("search_tpe_tf"), sm.get("search_random_tf"), sm.get("search_ray_optuna_tpe_ray")
    if tpe or rnd or rtpe:
        def ms(d: dict | None) -> str:
            return "-" if not d else f"{d['mean']:.3f} +- {d['sd']:.3f}"

        rows.append([f"Branin, best of {s['search_trials']} trials, OptunaSearch (TPE), mean +- sd of {s['search_seeds']} seeds",
                     ms(tpe), ms(rtpe) + (" (searcher only)" if rtpe else ""),
                     _x(_div((rtpe or {}).get("regret_mean"), (tpe or {}).get("regret_mean"))) + " (regret)",
                     f"(minimum {BRANIN_MIN})"])  # fmt: skip
        better = None if not (tpe and rnd) else tpe["mean"] < rnd["mean"]
        rows.append(["  random search (BasicVariantGenerator), same seeds and budget", ms(rnd), "-",
                     _x(_div((rnd or {}).get("regret_mean"), (tpe or {}).get("regret_mean"))) + " (random/TPE regret)",
                     "TPE better than random" + _met(better)])  # fmt: skip
    return header, rows


NOTES = [
    "ratio: how many times trainforge is better (Ray / trainforge for times and regrets, trainforge / Ray for "
    "trials/s); below 1: Ray is better.",
    "every variant is a fresh driver process; Ray is started by it (ray.init on 127.0.0.1, no dashboard), its start "
    "is not in any figure; trainforge gets CPU=2 ($TRAINFORGE_LOCAL_RESOURCES).",
    "torch overhead: per-trial wall time of Tuner.fit() (or of a cold local fit()) minus rank 0's loop time (from "
    "after its imports to its last report() returning; Ray Train's reports block, so its loop includes them). Trials "
    "run one at a time. Ray: the documented Train-in-Tune pattern (driver function + TorchTrainer(num_workers=2) + "
    "TuneReportCallback), max_concurrent_trials=1, ray.init(num_cpus=3): the driver function's trial holds 1 CPU.",
    "latency: the scheduler's on_trial_result gets time.time() - result['t'] (t taken just before report()); Ray "
    "trainer: rank 0's report, forwarded by TuneReportCallback.",
    "STOP -> gone: the later of the trial's end handled (trainforge: TuneController._on_end returned, the trial's "
    "resources released; Ray: Callback.on_trial_complete, Ray frees the trial's placement group asynchronously) and "
    "the exit of its last process (pidfd): the function trial's worker, or both ranks (and Ray's driver function).",
    "search: trainforge's searchers run inside its Tuner (2 trials at a time); Ray's OptunaSearch is driven "
    "directly (suggest/on_trial_complete, 2 trials outstanding), without Ray Tune's loop.",
]


def diagnostics(sm: dict, runs: dict[str, list[dict]]) -> list[str]:
    out = []
    for key, label in (("torch_tf", "trainforge Tuner"), ("torch_tf_reuse", "trainforge Tuner, reuse_actors=True"),
                       ("torch_ray", "Ray Train-in-Tune")):  # fmt: skip
        d = sm.get(key)
        if d:
            out.append(f"{label}: {d['per_trial_s']:.2f} s per trial ({d['trials']} trials), of which the loop "
                       f"{d['loop_s_median']:.2f} s (median; in report() {d['loop_report_s_median']:.2f} s); rank 0's "
                       f"imports in the loop {_f(d['import_s_median'], '.2f')} s; before the first loop "
                       f"{_f(d['to_first_loop_s'], '.2f')} s, after the last {_f(d['after_last_loop_s'], '.2f')} s"
                       + (f"; ray.init {d['ray_init_s']:.1f} s (num_cpus=3) not counted" if d.get("ray_init_s") else ""))  # fmt: skip
    d = sm.get("torch_fit")
    if d:
        out.append(f"cold fit(): {d['wall_s']:.2f} s wall, loop {d['loop_s']:.3f} s (medians of {d['runs']} fresh "
                   f"processes); fit() -> rank-0 loop {_f(d['to_first_loop_s'], '.2f')} s (of which its imports "
                   f"{_f(d['import_s'], '.2f')} s), loop end -> fit() returned {_f(d['after_last_loop_s'], '.2f')} s")  # fmt: skip
    for kind in ("fn", "trainer"):
        for system in ("tf", "ray"):
            lat = sm.get(f"latency_{kind}_{system}")
            if lat:
                out.append(f"latency {kind} {system}: {lat['n']} results, max {_f(lat['max_ms'], '.1f')} ms")
    for kind in ("fn", "trainer"):
        for system in ("tf", "ray"):
            d = sm.get(f"free_{kind}_{system}")
            if d:
                out.append(f"free {kind} {system}: STOP -> resources released (trainforge's _release) p50/p95 "
                           f"{_pair(d, 'release_p50_s', 'release_p95_s', '.3f')} s; each process exited p50/p95 "
                           f"{_pair(d, 'exit_p50_s', 'exit_p95_s', '.3f')} s; {d['processes']} processes: alive at the "
                           f"end {d['alive_at_end']}, zombies {d['zombie_at_end']}, alive when fit() returned "
                           f"{d['alive_after_fit']}, never exited {d['never_exited']}; results delivered after STOP "
                           f"{d['results_after_stop']}")  # fmt: skip
    for r in runs.get("free:tf", []):
        missing = {"TuneController._on_end", "TuneController._release"} - set(r.get("wrapped") or [])
        if _ok(r) and missing:
            out.append(f"free:tf: could not instrument {sorted(missing)} (renamed?): the end/release times are missing")
    for part in PARTS:
        for system in ("tf", "tf_reuse", "fit", "ray"):
            for r in runs.get(f"{part}:{system}", []):
                errs = list(r.get("errors") or []) + [e for k in ("fn", "trainer") for e in (r.get(k) or {}).get("errors", [])]
                if errs:
                    out.append(f"{part}:{system}: trial errors: {errs[:3]}")
                if "error" in r:
                    out.append(f"{part}:{system}: failed: {r['error']}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma list of {','.join(PARTS)}")
    p.add_argument("--quick", action="store_true", help="a smoke run with small counts (~3 min)")
    p.add_argument("--no-ray", dest="ray", action="store_false", help="measure trainforge only")
    for name, (default, quick, help_) in SETTINGS.items():
        p.add_argument("--" + name.replace("_", "-"), type=type(default), default=None,
                       help=f"{help_} (default {default}, --quick {quick})")  # fmt: skip
    p.add_argument("--idle-wait", type=float, default=5.0, help="before each variant, wait up to this long for idle CPUs")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per variant subprocess")
    p.add_argument("--markdown", action="store_true", help="also print the table as Markdown")
    p.add_argument("--json-out", default=DEFAULT_JSON, help="where to write the JSON results")
    p.add_argument("--variant", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--workdir", help=argparse.SUPPRESS)
    p.add_argument("--settings", help=argparse.SUPPRESS)
    p.add_argument("--ray-temp-root", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.variant:
        run_variant_here(args)
        return 0
    parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    bad = sorted(set(parts) - set(PARTS))
    if bad:
        p.error(f"--parts: unknown {bad}; choose from {','.join(PARTS)}")
    settings = {k: (getattr(args, k) if getattr(args, k) is not None else (q if args.quick else d))
                for k, (d, q, _) in SETTINGS.items()}  # fmt: skip

    import psutil

    t_start = time.time()
    load0 = os.getloadavg()
    psutil.cpu_percent()
    mark = f"tune-bench-{uuid.uuid4().hex[:10]}"
    os.environ[MARK_ENV] = mark
    for k in ("RAY_ADDRESS", "TRAINFORGE_ADDRESS"):
        os.environ.pop(k, None)
    ray_root = tempfile.mkdtemp(prefix="tfbt-", dir="/tmp")  # short: Ray's socket paths
    extra = ["--settings", json.dumps(settings), "--ray-temp-root", ray_root]
    runs: dict[str, list[dict]] = {}
    part_s: dict[str, float] = {}
    leftovers: dict[str, list[str]] = {}
    try:
        for part in parts:
            t = time.time()
            for variant in plan(part, settings, args.ray):
                print(f"{variant} ...", file=sys.stderr, flush=True)
                t_v = time.time()
                cpu0 = psutil.cpu_times()
                run = run_script_variant(__file__, variant, extra, args.idle_wait, args.timeout)
                cpu1 = psutil.cpu_times()
                busy = sum(getattr(cpu1, k) - getattr(cpu0, k) for k in ("user", "nice", "system", "irq", "softirq"))
                run["machine_cpu_busy_percent"] = 100 * busy / max(1e-9, (time.time() - t_v) * (os.cpu_count() or 1))
                killed = cleanup(mark, ray_root)
                if killed:
                    leftovers.setdefault(variant, []).extend(killed)
                    run["leftover_processes_killed"] = killed
                runs.setdefault(variant, []).append(run)
                print(f"  {variant}: {time.time() - t_v:.0f} s" + (f", killed {len(killed)} leftover process(es)"
                                                                    if killed else ""), file=sys.stderr, flush=True)  # fmt: skip
            part_s[part] = time.time() - t
    finally:
        killed = cleanup(mark, ray_root)
        if killed:
            leftovers.setdefault("end", []).extend(killed)
        shutil.rmtree(ray_root, ignore_errors=True)

    sm = summarize(runs)
    header, rows = table(sm, settings)
    diag = diagnostics(sm, runs)
    commit, date = git_commit(), datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    info = machine_info()
    for mod in ("ray", "optuna"):
        try:
            info[mod] = __import__(mod).__version__
        except ImportError:
            info[mod] = "not installed"
    busy = psutil.cpu_percent()
    load1 = os.getloadavg()
    diag.append(f"machine: {busy:.0f}% CPU busy on average over the run, load {load0[0]:.1f} -> {load1[0]:.1f}; "
                f"parts took {', '.join(f'{k} {v:.0f} s' for k, v in part_s.items())}; total {time.time() - t_start:.0f} s")  # fmt: skip
    busy_start = [v for v, rs in runs.items() for r in rs if args.idle_wait > 0 and r.get("idle_wait_s", 0) >= args.idle_wait - 0.05]
    if busy_start:
        diag.append(f"WARNING: these variants started on a busy machine (CPUs still over 25% busy after the {args.idle_wait:.0f} s "
                    f"idle wait; other processes compete with them): {', '.join(busy_start)}")  # fmt: skip
    if leftovers:
        diag.append(f"processes left behind and killed by the benchmark: {leftovers}")
    failed = {v: [r["error"] for r in rs if "error" in r] for v, rs in runs.items()}
    failed = {v: e for v, e in failed.items() if e}
    print(f"\ntrainforge tune benchmark  {date}  commit {commit}  python {info['python']}  torch {info['torch']}  "
          f"ray {info['ray']}  optuna {info['optuna']}  {info['cpu_count']} CPUs{'  (--quick)' if args.quick else ''}\n")  # fmt: skip
    print(render_text(header, rows))
    print("\nnotes:\n" + "\n".join(f"- {n}" for n in NOTES))
    print("\ndiagnostics:\n" + "\n".join(f"- {x}" for x in diag))
    if failed:
        print("\nfailed variants:\n" + "\n".join(f"- {v}: {e}" for v, e in failed.items()))
    if args.markdown:
        print("\n" + render_markdown(header, rows))
    os.makedirs(os.path.dirname(os.path.abspath(args.json_out)), exist_ok=True)
    write_json(args.json_out, {
        "benchmark": "tune", "date": date, "git_commit": commit, "machine": info, "quick": args.quick,
        "settings": settings, "parts": parts, "ray": args.ray,
        "goals": {"trivial_x_ray": GOAL_TRIVIAL_X, "warm_overhead_s": GOAL_WARM_OVERHEAD_S,
                  "latency_p95_ms": GOAL_LATENCY_P95_MS, "free_p95_s": GOAL_FREE_P95_S},
        "summary": sm, "table": {"header": header, "rows": rows}, "notes": NOTES, "diagnostics": diag, "part_s": part_s,
        "cpu_busy_percent": busy, "loadavg": [load0, load1], "leftovers_killed": leftovers, "failed": failed,
        "runs": runs,
    })  # fmt: skip
    print(f"\nwrote {os.path.relpath(args.json_out)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
