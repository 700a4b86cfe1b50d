#!/usr/bin/env python
"""Recovery and checkpoint benchmark: how fast trainforge gets back to training after a worker dies,
how fast it persists checkpoints, and how long a checkpoint stalls the training loop.

    python bench/bench_recovery.py [--repeats 3] [--markdown] [--parts recovery,persist,stall]

1. recovery time: 2 workers, gloo, the MLP of ``bench_core.py``; a checkpoint every ``--ckpt-every``
   steps; at attempt 0 rank 1 records ``time.time()`` and dies (``os._exit(1)``, or SIGKILL) after
   ``--die-at`` steps; at attempt 1 rank 0 loads the checkpoint, builds the model and records the time
   of its first ``optimizer.step()``. Recovery = first step - death, compared with the cold start of raw
   DDP (``bench_core.py``'s ``raw:first_step`` variant, run here). Phases come from worker timestamps and
   from wrapping a few controller / worker-group methods in the driver.
2. checkpoint persist throughput: 10 MB and 100 MB of random bytes (2 and 4 files), reported by a single
   worker to local storage; bytes / (time from just before ``report()`` to the commit), against
   ``shutil.copytree`` (and ``cp -r``) of the same directory to the same filesystem, alternating.
3. training-step stall: a fixed compute step (MLP steps, ~``--stall-step-ms``) with a 100 MB checkpoint
   every ``--stall-every`` steps, SYNC vs ASYNC checkpoint upload, on local disk and on a local
   filesystem slowed to ``--slow-mbps`` (``bench/_slowfs.py``).

Every run is a fresh driver subprocess (``--variant NAME``); variants alternate; the table shows medians.
Results go to ``bench/results/recovery.json``.
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import _core_workload as core
import torch
import torch.nn as nn
from _common import (
    BENCH_DIR,
    TreeRssSampler,
    filesystem_of,
    finish,
    fmt,
    git_commit,
    is_noisy,
    machine_info,
    median,
    noise_warning,
    proc_start_wall,
    render_markdown,
    render_text,
    run_script_variant,
    status,
    wrap_methods,
    write_json,
)

DEFAULT_JSON = os.path.join(BENCH_DIR, "results", "recovery.json")

MB = 1e6  # throughput in MB/s = 10^6 bytes per second
PERSIST_SIZES = {"10MB": (10, 2), "100MB": (100, 4)}  # name -> (MB, files)
STALL_CKPT = (100, 4)
COMMIT_MARKER = ".trainforge_checkpoint.json"  # trainforge._internal.storage.COMMIT_MARKER

TARGET_RECOVERY_RATIO = 1.2  # recovery / raw DDP cold start, at most
TARGET_RECOVERY_S = 0.8  # death -> first step, at most (issue 28), even early in the run
TARGET_PERSIST_RATIO = 0.9  # trainforge MB/s / shutil.copytree MB/s, at least (issue 28)

PARTS = ("recovery", "persist", "stall")
UPLOAD_MODES = ("SYNC", "ASYNC")
STORAGES = ("local", "slow")


# --------------------------------------------------------------------------------------------------
# Worker-side loops (defined here, shipped to the workers by cloudpickle).
# --------------------------------------------------------------------------------------------------
def _report_checkpoint(train: Any, model: nn.Module, opt: torch.optim.Optimizer, step: int, loss: float) -> None:
    """Rank 0 saves a small state dict and reports it; the other ranks report metrics only."""
    if train.get_context().get_world_rank() != 0:
        train.report({"step": step, "loss": loss})
        return
    d = tempfile.mkdtemp(prefix="bench-ckpt-")
    try:
        module = getattr(model, "module", model)
        state = {"model": module.state_dict(), "optimizer": opt.state_dict(), "step": step}
        torch.save(state, os.path.join(d, "state.pt"))
        train.report({"step": step, "loss": loss}, checkpoint=train.Checkpoint.from_directory(d))
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _wait_for_commits(run_path: str, n: int, timeout_s: float = 30.0) -> None:
    """Until ``n`` checkpoints of the run are committed (at most ``timeout_s``: a slow commit is then
    measured as such, not an error)."""
    import contextlib

    from trainforge._testing.wait import wait_until

    def committed() -> bool:
        try:
            names = os.listdir(run_path)
        except OSError:
            names = []
        done = [x for x in names if x.startswith("checkpoint_") and os.path.exists(os.path.join(run_path, x, COMMIT_MARKER))]
        return len(done) >= n

    with contextlib.suppress(TimeoutError):
        wait_until(committed, timeout_s, f"{n} committed checkpoints", interval=0.002)


def recovery_loop(config: dict) -> None:
    t_entry = time.time()
    t_proc = proc_start_wall()
    import trainforge as train
    from trainforge.torch import prepare_model

    ctx = train.get_context()
    rank, attempt = ctx.get_world_rank(), ctx.get_attempt()
    model = core.make_mlp()
    opt_state, start = None, 0
    checkpoint = train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"))
        model.load_state_dict(state["model"])
        opt_state, start = state["optimizer"], state["step"]
    t_ckpt = time.time()
    model = prepare_model(model)
    opt = torch.optim.SGD(model.parameters(), lr=core.LR, momentum=0.9)
    if opt_state is not None:
        opt.load_state_dict(opt_state)
    loss_fn = nn.CrossEntropyLoss()
    batches = core.make_batches(rank)
    t_model = time.time()
    steady = config["how"].endswith("_steady")
    every = STEADY_CKPT_EVERY if steady else config["ckpt_every"]
    # Steady variant: attempt 0 trains until rank 1 dies; the restarted attempt stops soon after.
    end = (10**9 if attempt == 0 else start + config["steps"]) if steady else config["steps"]
    for step in range(start, end):
        loss = core.train_step(model, opt, loss_fn, batches[step % len(batches)])
        if step == start and rank == 0:
            t_step = time.time()
            write_json(
                os.path.join(config["marks"], f"first_step_a{attempt}.json"),
                {"t_proc": t_proc, "t_entry": t_entry, "t_ckpt": t_ckpt, "t_model": t_model, "t_step": t_step,
                 "resumed_from_step": start, "had_checkpoint": checkpoint is not None},
            )  # fmt: skip
        if (step + 1) % every == 0:
            _report_checkpoint(train, model, opt, step + 1, loss.item())
        if steady:
            dies = (step + 1) % every == 0 and time.time() - t_model >= config["steady_after_s"]
        else:
            dies = step + 1 == config["die_at"]
        if attempt == 0 and rank == 1 and dies:
            # Die only once the last checkpoint is committed: a metrics-only report is sent up to 50 ms
            # late (batching), and a rank that dies before sending it leaves that checkpoint uncommitted.
            _wait_for_commits(ctx.get_trial_dir(), (step + 1) // every)
            write_json(os.path.join(config["marks"], "death.json"), {"t_death": time.time(), "how": config["how"]})
            if config["how"].startswith("sigkill"):
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(1)


def persist_loop(config: dict) -> None:
    """One worker: alternately copy a directory with shutil.copytree / ``cp -r`` and report it as a
    checkpoint; wait for each commit (and for the driver to delete it) before the next measurement."""
    import trainforge as train

    samples = []
    seq = 0
    for it in range(config["iters"]):
        for name, src, nbytes in config["sources"]:
            rec: dict[str, Any] = {"size": name, "bytes": nbytes, "iter": it}
            order = ("copytree", "cp", "report") if it % 2 == 0 else ("report", "cp", "copytree")
            for method in order:
                if method in ("copytree", "cp"):
                    dst = os.path.join(config["copy_root"], f"{name}_{it}_{method}")
                    t = time.perf_counter()
                    if method == "copytree":
                        shutil.copytree(src, dst)
                    else:
                        subprocess.run(["cp", "-r", src, dst], check=True)
                    rec[f"{method}_s"] = time.perf_counter() - t
                    shutil.rmtree(dst)
                    continue
                ckpt_dir = os.path.join(config["run_path"], f"checkpoint_{seq:06d}")
                marker = os.path.join(ckpt_dir, COMMIT_MARKER)
                checkpoint = train.Checkpoint.from_directory(src)
                t = time.perf_counter()
                train.report({"t_before": time.time(), "size": name, "seq": seq}, checkpoint=checkpoint)
                rec["report_s"] = time.perf_counter() - t
                # The driver deletes each checkpoint as soon as fit_iter() yields it, then says so in a
                # file of its own (keeping the deletion out of the next measurement). A commit faster
                # than this poll is deleted before the marker is seen: that sample has no commit_seen.
                done = os.path.join(config["done_dir"], str(seq))
                deadline = time.monotonic() + 120
                while not os.path.exists(marker) and not os.path.exists(done) and time.monotonic() < deadline:
                    time.sleep(0.0005)
                if os.path.exists(marker):
                    rec["commit_seen_s"] = time.perf_counter() - t
                while not os.path.exists(done) and time.monotonic() < deadline:
                    time.sleep(0.0005)
                seq += 1
            samples.append(rec)
    train.report({"samples": samples})


def stall_loop(config: dict) -> None:
    """A fixed compute step (``inner`` MLP steps, calibrated to ~step_ms) with a checkpoint report at the
    first step of every interval of ``every`` steps; returns every step's duration."""
    import trainforge as train

    model = core.make_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=core.LR)
    loss_fn = nn.CrossEntropyLoss()
    batches = core.make_batches(0)
    for i in range(20):
        core.train_step(model, opt, loss_fn, batches[i % len(batches)])
    t = time.perf_counter()
    for i in range(50):
        core.train_step(model, opt, loss_fn, batches[i % len(batches)])
    per = (time.perf_counter() - t) / 50
    inner = max(1, round(config["step_ms"] / 1e3 / per))
    kwargs = {}
    if config["per_call_mode"]:
        kwargs["checkpoint_upload_mode"] = train.CheckpointUploadMode[config["mode"]]
    checkpoint = train.Checkpoint.from_directory(config["src"])
    warmup, every = config["warmup"], config["every"]
    durs, report_s, ckpt_steps = [], [], []
    for i in range(warmup + config["n_ckpt"] * every):
        t = time.perf_counter()
        for j in range(inner):
            core.train_step(model, opt, loss_fn, batches[(i * inner + j) % len(batches)])
        if i >= warmup and (i - warmup) % every == 0:
            tr = time.perf_counter()
            train.report({"step": i, "t_before": time.time()}, checkpoint=checkpoint, **kwargs)
            report_s.append(time.perf_counter() - tr)
            ckpt_steps.append(i)
        durs.append(time.perf_counter() - t)
    train.report(
        {"durs": durs, "ckpt_steps": ckpt_steps, "report_s": report_s, "inner": inner, "mlp_step_s": per,
         "t_loop_end": time.time(), "num_threads": torch.get_num_threads()}
    )  # fmt: skip


# --------------------------------------------------------------------------------------------------
# Driver side of one variant (runs in a fresh subprocess).
# --------------------------------------------------------------------------------------------------
def _failures(a: tuple, kw: dict) -> list[dict]:
    failures = a[1] if len(a) > 1 else kw.get("failures", [])
    return [
        {k: getattr(f, k, None) for k in ("rank", "kind", "exit_code", "time")} for f in failures
    ]


def _worker_states(a: tuple, kw: dict) -> dict:
    """At shutdown: which workers were still running (None) or their exit codes; graceful or not."""
    group = a[0]
    graceful = a[1] if len(a) > 1 else kw.get("graceful", True)
    return {
        "graceful": graceful,
        "exit_codes": [w.proc.poll() for w in getattr(group, "_workers", [])],
    }


def _standby(a: tuple, kw: dict) -> dict:
    """At LocalProcessPool.acquire: how many pre-started standby workers were waiting."""
    return {"n": a[1] if len(a) > 1 else kw.get("n"), "standby": getattr(a[0], "standby_count", None)}


# Benchmark-only instrumentation (internals are in flux: a probe that no longer matches is skipped).
RECOVERY_PROBES = (
    ("trainforge._internal.controller", "Controller", "_on_failure", _failures),
    ("trainforge._internal.controller", "Controller", "_restart"),
    ("trainforge._internal.controller", "Controller", "_schedule"),
    ("trainforge._internal.worker_group.local", "LocalWorkerGroup", "shutdown", _worker_states),
    ("trainforge._internal.worker_group.local", "LocalWorkerGroup", "_await_and_close"),
    ("trainforge._internal.worker_group.local", "LocalWorkerGroup", "execute_single"),
    ("trainforge._internal.worker_group.local", "LocalWorkerGroup", "start"),
    ("trainforge._internal.worker_group.local", "LocalWorkerGroup", "_wait_connected"),
    ("trainforge._internal.worker_group.local_pool", "LocalProcessPool", "acquire", _standby),
    ("trainforge._internal.worker_group.local_pool", "LocalProcessPool", "wait_connected"),
    ("trainforge._internal.torch.config", "_TorchBackend", "on_start"),
    ("trainforge._internal.worker_group.local", "LocalWorkerGroup", "start_training"),
)


def drive_recovery(how: str, args: argparse.Namespace) -> dict:
    from trainforge import FailureConfig, RunConfig, ScalingConfig
    from trainforge.torch import TorchTrainer

    calls: list[dict] = []
    wrapped = wrap_methods(
        RECOVERY_PROBES, lambda name, b, e, info: calls.append({"name": name, "begin": b, "end": e, "info": info})
    )
    marks = os.path.join(args.workdir, "marks")
    os.makedirs(marks)
    config = {"steps": args.steps, "ckpt_every": args.ckpt_every, "die_at": args.die_at, "how": how, "marks": marks,
              "steady_after_s": args.steady_after_s}  # fmt: skip
    trainer = TorchTrainer(
        recovery_loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=core.WORLD_SIZE),
        run_config=RunConfig(
            name="bench",
            storage_path=os.path.join(args.workdir, "storage"),
            failure_config=FailureConfig(max_failures=1),
            verbose=0,
        ),
    )
    with TreeRssSampler() as rss:
        t0 = time.time()
        result = trainer.fit()
        t_end = time.time()
    if getattr(result, "error", None) is not None:
        raise RuntimeError(f"recovery run failed: {result.error!r}")
    out: dict[str, Any] = {"t0": t0, "t_end": t_end, "wrapped": wrapped, "calls": calls, **rss.as_dict()}
    for key, fname in (("death", "death.json"), ("first_step", "first_step_a1.json"),
                       ("first_step_a0", "first_step_a0.json")):  # fmt: skip
        path = os.path.join(marks, fname)
        if not os.path.exists(path):
            raise RuntimeError(f"{fname} missing: rank 1 did not die or attempt 1 did not step ({os.listdir(marks)})")
        with open(path) as f:
            out[key] = json.load(f)
    out["metrics"] = {k: v for k, v in dict(result.metrics or {}).items() if not isinstance(v, (dict, list))}
    return out


def _write_sources(root: str, sizes: dict[str, tuple[int, int]]) -> list[list]:
    """Random-byte checkpoint directories, written once (so every method reads them from the page cache)."""
    out = []
    for name, (mb, nfiles) in sizes.items():
        d = os.path.join(root, name)
        os.makedirs(d)
        per_file = int(mb * MB) // nfiles
        for i in range(nfiles):
            with open(os.path.join(d, f"shard_{i}.bin"), "wb") as f:
                f.write(os.urandom(per_file))
        out.append([name, d, per_file * nfiles])
    return out


PERSIST_PROBES = (
    ("trainforge._internal.controller", "Controller", "_complete_report", lambda a, kw: a[1] if len(a) > 1 else None),
    ("trainforge._internal.storage", "StorageContext", "commit_checkpoint"),
    ("trainforge._internal.metrics_log", "MetricsLog", "flush"),
)


def drive_persist(args: argparse.Namespace) -> dict:
    from trainforge import DataParallelTrainer, RunConfig, ScalingConfig

    calls: list[dict] = []
    wrap_methods(
        PERSIST_PROBES, lambda name, b, e, info: calls.append({"name": name, "begin": b, "end": e, "info": info})
    )

    sources = _write_sources(os.path.join(args.workdir, "src"), PERSIST_SIZES)
    storage = os.path.join(args.workdir, "storage")
    copy_root = os.path.join(args.workdir, "copies")
    os.makedirs(copy_root)
    done_dir = os.path.join(args.workdir, "done")
    os.makedirs(done_dir)
    config = {
        "sources": sources,
        "iters": args.persist_iters,
        "copy_root": copy_root,
        "run_path": os.path.join(storage, "bench"),
        "done_dir": done_dir,
    }
    trainer = DataParallelTrainer(
        persist_loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(name="bench", storage_path=storage, verbose=0),
    )
    commits, final = [], {}
    with TreeRssSampler() as rss:
        run = trainer.fit_iter()
        for report in run:
            t = time.time()
            if report.checkpoint is None:
                final = report.metrics
                continue
            marker = os.path.join(report.checkpoint.path, COMMIT_MARKER)
            try:
                mtime = os.stat(marker).st_mtime
            except OSError:
                mtime = None
            m = report.metrics
            commits.append({"seq": m.get("seq"), "size": m.get("size"), "t_before": m.get("t_before"),
                            "t_yield": t, "marker_mtime": mtime})  # fmt: skip
            shutil.rmtree(report.checkpoint.path, ignore_errors=True)
            with open(os.path.join(done_dir, str(m.get("seq"))), "w"):
                pass
        result = run.result
    if result is None or result.error is not None:
        raise RuntimeError(f"persist run failed: {getattr(result, 'error', None)!r}")
    return {
        "persist_samples": final.get("samples", []),
        "commits": commits,
        "calls": calls,
        "filesystem": filesystem_of(storage),
        **rss.as_dict(),
    }


def drive_stall(mode: str, storage_kind: str, args: argparse.Namespace) -> dict:
    from trainforge import CheckpointConfig, DataParallelTrainer, RunConfig, ScalingConfig

    (src_name, src, nbytes), = _write_sources(os.path.join(args.workdir, "src"), {"100MB": STALL_CKPT})  # fmt: skip
    fs = None
    if storage_kind == "slow":
        from _slowfs import SlowLocalFileSystem

        fs = SlowLocalFileSystem(mbps=args.slow_mbps)
    per_call_mode = upload_mode_supported()
    if mode != "SYNC" and not per_call_mode:
        raise RuntimeError(f"{mode} upload requested, but trainforge.report() takes no checkpoint_upload_mode= "
                           "(not implemented yet, or the module is being edited)")  # fmt: skip
    config = {
        "src": src,
        "mode": mode,
        "per_call_mode": per_call_mode,
        "step_ms": args.stall_step_ms,
        "every": args.stall_every,
        "n_ckpt": args.stall_checkpoints,
        "warmup": args.stall_warmup,
    }
    trainer = DataParallelTrainer(
        stall_loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(
            name="bench",
            storage_path=os.path.join(args.workdir, "storage"),
            storage_filesystem=fs,
            checkpoint_config=CheckpointConfig(num_to_keep=1, checkpoint_upload_mode=mode),
            verbose=0,
        ),
    )
    commits, final = [], {}
    with TreeRssSampler() as rss:
        t0 = time.time()
        run = trainer.fit_iter()
        for report in run:
            if report.checkpoint is None:
                final = report.metrics
            else:
                commits.append({"step": report.metrics.get("step"), "t_before": report.metrics.get("t_before"),
                                "t_yield": time.time()})  # fmt: skip
        t_end = time.time()
        result = run.result
    if result is None or result.error is not None:
        raise RuntimeError(f"stall run failed: {getattr(result, 'error', None)!r}")
    return {"t0": t0, "t_end": t_end, "metrics": final, "commits": commits, "bytes": nbytes,
            "per_call_mode": config["per_call_mode"], **rss.as_dict()}  # fmt: skip


def run_variant_here(args: argparse.Namespace) -> None:
    kind, *rest = args.variant.split(":")
    if kind == "recovery":
        data = drive_recovery(rest[0], args)
    elif kind == "persist":
        data = drive_persist(args)
    elif kind == "stall":
        data = drive_stall(rest[0], rest[1], args)
    else:
        raise ValueError(f"unknown variant {args.variant!r}")
    write_json(args.out, data)


def upload_mode_supported() -> bool:
    """True once ``trainforge.report`` takes ``checkpoint_upload_mode=`` (ASYNC persisting exists)."""
    try:
        import trainforge

        return "checkpoint_upload_mode" in inspect.signature(trainforge.report).parameters
    except Exception:  # the session module may be mid-edit
        return False


# --------------------------------------------------------------------------------------------------
# Orchestrator.
# --------------------------------------------------------------------------------------------------
def run_variant(variant: str, args: argparse.Namespace) -> dict:
    if variant in ("raw:first_step", "trainforge:first_step"):  # bench_core's own variants, unchanged
        ns = argparse.Namespace(steps=1000, warmup=20, report_calls=20_000, report_chunk=2_000,
                                idle_wait=args.idle_wait, timeout=args.timeout)  # fmt: skip
        return core.run_core_variant(variant, ns)
    extra = [
        "--steps", str(args.steps), "--ckpt-every", str(args.ckpt_every), "--die-at", str(args.die_at),
        "--steady-after-s", str(args.steady_after_s),
        "--persist-iters", str(args.persist_iters), "--stall-step-ms", str(args.stall_step_ms),
        "--stall-every", str(args.stall_every), "--stall-checkpoints", str(args.stall_checkpoints),
        "--stall-warmup", str(args.stall_warmup), "--slow-mbps", str(args.slow_mbps),
    ]  # fmt: skip
    return run_script_variant(__file__, variant, extra, args.idle_wait, args.timeout)


# Recovery variants: how rank 1 dies, and when. "_steady": at the first checkpoint (every
# STEADY_CKPT_EVERY steps) after --steady-after-s seconds of training, when the standby workers are ready;
# the others die --die-at steps in, a second or two after the start, while standby workers still import.
RECOVERY_KINDS = {
    "exit": "os._exit(1) early in the run",
    "sigkill": "SIGKILL early in the run",
    "exit_steady": "os._exit(1) after {steady:g} s (standby ready)",
}
STEADY_CKPT_EVERY = 500

RECOVERY_PHASES = {
    "death": "rank 1 dies (t = 0)",
    "detected": "failure detected by the driver",
    "failure_handled": "controller handles the failure",
    "old_group_stopped": "old worker group stopped",
    "old_workers_reaped": "old workers reaped (in the background, meanwhile the next rows)",
    "restart_scheduled": "restart: scheduling the new group",
    "worker_proc_started": "new rank-0 worker process started (< 0: standby)",
    "workers_connected": "new workers connected to the driver",
    "first_command_done": "rank 0 answered its first command (late if a standby still imports)",
    "process_group_ready": "process group ready",
    "train_fn_sent": "train function sent to workers",
    "loop_entered": "train function entered (rank 0)",
    "checkpoint_loaded": "checkpoint loaded (rank 0)",
    "model_ready": "model DDP-wrapped, optimizer ready",
    "first_step_done": "first optimizer step done",
}


def derive_recovery(run: dict) -> dict:
    if "error" in run:
        return {}
    d = run["death"]["t_death"]
    fs = run["first_step"]

    def call(name: str) -> dict | None:
        return next((c for c in run["calls"] if c["name"] == name and c["begin"] >= d - 1e-3), None)

    def at(name: str, key: str) -> float | None:
        c = call(name)
        return None if c is None else c[key] - d

    on_failure = call("Controller._on_failure")
    detected = None
    failures = on_failure.get("info") if on_failure else None
    if isinstance(failures, list):
        times = [f["time"] for f in failures if isinstance(f.get("time"), (int, float))]
        detected = min(times) - d if times else None
    shutdown = call("LocalWorkerGroup.shutdown")
    phases = {
        "death": 0.0,
        "detected": detected,
        "failure_handled": at("Controller._on_failure", "begin"),
        "old_group_stopped": at("LocalWorkerGroup.shutdown", "end"),
        "old_workers_reaped": at("LocalWorkerGroup._await_and_close", "end"),
        "restart_scheduled": at("Controller._schedule", "begin"),
        "worker_proc_started": fs["t_proc"] - d,
        "workers_connected": at("LocalWorkerGroup._wait_connected", "end")
        or at("LocalProcessPool.wait_connected", "end"),
        "first_command_done": at("LocalWorkerGroup.execute_single", "end"),
        "process_group_ready": at("_TorchBackend.on_start", "end"),
        "train_fn_sent": at("LocalWorkerGroup.start_training", "begin"),
        "loop_entered": fs["t_entry"] - d,
        "checkpoint_loaded": fs["t_ckpt"] - d,
        "model_ready": fs["t_model"] - d,
        "first_step_done": fs["t_step"] - d,
    }
    a0 = run.get("first_step_a0")
    return {
        "recovery_s": phases["first_step_done"],
        "cold_start_s": None if a0 is None else a0["t_step"] - run["t0"],  # attempt 0 of this restartable run
        "phases": phases,
        "shutdown_s": None if shutdown is None else shutdown["end"] - shutdown["begin"],
        "shutdown_info": None if shutdown is None else shutdown.get("info"),
        "acquire_info": (call("LocalProcessPool.acquire") or {}).get("info"),
        "failures": failures,
        "resumed_from_step": fs.get("resumed_from_step"),
    }


PERSIST_STEPS = {
    "report_extra_ms": "report() minus a plain copytree (worker: staging copy + hand-off)",
    "to_driver_ms": "report() returned -> driver starts completing the report",
    "complete_ms": "driver completes the report (metrics flush, commit, bookkeeping)",
    "commit_ms": "  of which StorageContext.commit_checkpoint (merge + marker)",
    "flush_ms": "  of which MetricsLog.flush",
    "to_yield_ms": "report completed -> fit_iter() yields it",
}


def derive_persist(run: dict) -> dict:
    """MB/s per size and method, one value per sample (median taken across runs later), and where the
    time between report() and the commit goes (ms, per sample)."""
    if "error" in run:
        return {}
    commits = {c["seq"]: c for c in run["commits"]}
    calls = run.get("calls", [])
    complete = {c["info"]: c for c in calls if c["name"] == "Controller._complete_report"}
    commit_calls = [c for c in calls if c["name"] == "StorageContext.commit_checkpoint"]
    flushes = [c for c in calls if c["name"] == "MetricsLog.flush"]
    out: dict[str, dict[str, list[float]]] = {}
    # The worker reported in the order of its samples: report index == checkpoint seq, in (iter, size) order.
    for seq, s in enumerate(run["persist_samples"]):
        nbytes = s["bytes"]
        per = out.setdefault(s["size"], {})
        for method in ("copytree", "cp", "report", "commit_seen"):
            if f"{method}_s" in s:
                per.setdefault(method, []).append(nbytes / MB / s[f"{method}_s"])
        c = commits.get(seq)
        if not (c and c.get("t_before")):
            continue
        per.setdefault("commit", []).append(nbytes / MB / (c["t_yield"] - c["t_before"]))
        if c.get("marker_mtime"):
            per.setdefault("commit_marker", []).append(nbytes / MB / (c["marker_mtime"] - c["t_before"]))
        per.setdefault("report_extra_ms", []).append((s["report_s"] - s["copytree_s"]) * 1e3)
        cr = complete.get(seq)
        if cr is None:
            continue
        report_end = c["t_before"] + s["report_s"]
        per.setdefault("to_driver_ms", []).append((cr["begin"] - report_end) * 1e3)
        per.setdefault("complete_ms", []).append((cr["end"] - cr["begin"]) * 1e3)
        per.setdefault("to_yield_ms", []).append((c["t_yield"] - cr["end"]) * 1e3)
        inside = [x for x in commit_calls if cr["begin"] <= x["begin"] <= cr["end"]]
        per.setdefault("commit_ms", []).append(sum(x["end"] - x["begin"] for x in inside) * 1e3)
        inside = [x for x in flushes if cr["begin"] <= x["begin"] <= cr["end"]]
        per.setdefault("flush_ms", []).append(sum(x["end"] - x["begin"] for x in inside) * 1e3)
    return out


def derive_stall(run: dict) -> dict:
    """Per checkpoint interval [report step, next report step): the normal step is the median of the
    interval's last 10 steps (by then an asynchronous upload is long done, and it follows any drift);
    stall = report step - normal; interval excess = the whole interval - its length x normal."""
    if "error" in run:
        return {}
    m = run["metrics"]
    durs = m["durs"]
    steps = sorted(m["ckpt_steps"])
    bounds = [*steps, len(durs)]
    stalls, interval, normals = [], [], []
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        tail = durs[max(a + 1, b - 10):b]
        if not tail:
            continue
        normal = statistics.median(tail)
        normals.append(normal)
        stalls.append(durs[a] - normal)
        interval.append(sum(durs[a:b]) - (b - a) * normal)
    commit_lag = [c["t_yield"] - c["t_before"] for c in run["commits"] if c.get("t_before")]
    return {
        "stall_ms": median(stalls) * 1e3 if stalls else None,
        "interval_excess_ms": median(interval) * 1e3 if interval else None,
        "report_ms": statistics.median(m["report_s"]) * 1e3,
        "normal_step_ms": median(normals) * 1e3 if normals else None,
        "commit_lag_ms": statistics.median(commit_lag) * 1e3 if commit_lag else None,
        "drain_s": run["t_end"] - m["t_loop_end"],
    }


def summarize(runs: dict[str, list[dict]]) -> dict:
    s: dict[str, Any] = {}
    raw_fs = [core.derive("first_step", r) for r in runs.get("raw:first_step", [])]
    tf_fs = [core.derive("first_step", r) for r in runs.get("trainforge:first_step", [])]
    s["raw_cold_start_s"] = median(d.get("first_step_s") for d in raw_fs)
    s["trainforge_cold_start_s"] = median(d.get("first_step_s") for d in tf_fs)
    s["cold_start_phases"] = {
        label: {p: median(d.get("phases", {}).get(p) for d in ds) for p in core.PHASE_LABELS}
        for label, ds in (("raw", raw_fs), ("trainforge", tf_fs))
    }
    for how in RECOVERY_KINDS:
        ds = [derive_recovery(r) for r in runs.get(f"recovery:{how}", [])]
        s[f"recovery_{how}"] = {
            "recovery_s": median(d.get("recovery_s") for d in ds),
            "cold_start_s": median(d.get("cold_start_s") for d in ds),
            "shutdown_s": median(d.get("shutdown_s") for d in ds),
            "phases": {p: median(d.get("phases", {}).get(p) for d in ds) for p in RECOVERY_PHASES},
        }
    persist: dict[str, dict[str, float | None]] = {}
    derived = [derive_persist(r) for r in runs.get("persist", [])]
    for size in PERSIST_SIZES:
        methods = ("copytree", "cp", "report", "commit", "commit_seen", "commit_marker")
        persist[size] = {
            f"{m}_mbps": median(v for d in derived for v in d.get(size, {}).get(m, [])) for m in methods
        }
        persist[size].update(
            {k: median(v for d in derived for v in d.get(size, {}).get(k, [])) for k in PERSIST_STEPS}
        )
        nbytes = int(PERSIST_SIZES[size][0] * MB)
        persist[size]["copytree_ms"] = nbytes / MB / persist[size]["copytree_mbps"] * 1e3 if persist[size]["copytree_mbps"] else None
        persist[size]["commit_total_ms"] = nbytes / MB / persist[size]["commit_mbps"] * 1e3 if persist[size]["commit_mbps"] else None
    s["persist"] = persist
    stall: dict[str, dict] = {}
    for storage in STORAGES:
        for mode in UPLOAD_MODES:
            ds = [derive_stall(r) for r in runs.get(f"stall:{mode}:{storage}", [])]
            keys = ("stall_ms", "interval_excess_ms", "report_ms", "normal_step_ms", "commit_lag_ms", "drain_s")
            stall[f"{mode}:{storage}"] = {k: median(d.get(k) for d in ds) for k in keys} if ds else None
    s["stall"] = stall
    return s


def table_rows(s: dict, args: argparse.Namespace, async_ok: bool) -> tuple[list[str], list[list[str]]]:
    def ratio(a: float | None, b: float | None) -> float | None:
        return b / a if a and b is not None else None

    def r(x: float | None, spec: str = ".2f") -> str:
        return fmt(x, spec) + ("x" if x is not None else "")

    header = ["metric", "baseline", "trainforge", "ratio", "target", "status"]
    rows = []
    raw = s["raw_cold_start_s"]
    for how, label in RECOVERY_KINDS.items():
        if how not in {k.split(":", 1)[1] for k in args.ran_variants if k.startswith("recovery:")}:
            continue
        label = label.format(steady=args.steady_after_s)
        v = s[f"recovery_{how}"]["recovery_s"]
        q = ratio(raw, v)
        rows.append([f"recovery after {label}, death -> first step (s)", fmt(raw, ".2f"), fmt(v, ".2f"), r(q),
                     f"<= {TARGET_RECOVERY_RATIO}x raw cold start and <= {TARGET_RECOVERY_S} s",
                     status(None if q is None or v is None else q <= TARGET_RECOVERY_RATIO and v <= TARGET_RECOVERY_S)])  # fmt: skip
    tf = s["trainforge_cold_start_s"]
    rows.append(["cold start, driver start -> first step (s)", fmt(raw, ".2f"), fmt(tf, ".2f"), r(ratio(raw, tf)),
                 "(info)", "-"])  # fmt: skip
    restartable = median(s.get(f"recovery_{how}", {}).get("cold_start_s") for how in ("exit", "sigkill"))
    if restartable is not None:
        rows.append(["cold start of the early-death runs (max_failures=1), driver start -> first step (s)",
                     fmt(raw, ".2f"), fmt(restartable, ".2f"), r(ratio(raw, restartable)), "(info)", "-"])  # fmt: skip
    for size in PERSIST_SIZES:
        p = s["persist"][size]
        base, commit, rep = p["copytree_mbps"], p["commit_mbps"], p["report_mbps"]
        q = ratio(base, commit)
        rows.append([f"persist {size[:-2]} MB, until committed (MB/s)", fmt(base, ".0f"), fmt(commit, ".0f"), r(q),
                     f">= {TARGET_PERSIST_RATIO}x copytree", status(None if q is None else q >= TARGET_PERSIST_RATIO)])  # fmt: skip
        rows.append([f"persist {size[:-2]} MB, until report() returns (MB/s)", fmt(base, ".0f"), fmt(rep, ".0f"),
                     r(ratio(base, rep)), "(info)", "-"])  # fmt: skip
    for storage, label in (("local", "local disk"), ("slow", f"storage at {args.slow_mbps:g} MB/s")):
        sync, asyn = s["stall"].get(f"SYNC:{storage}"), s["stall"].get(f"ASYNC:{storage}")
        sv = sync["stall_ms"] if sync else None
        av = asyn["stall_ms"] if asyn else None
        rows.append([f"step stall per 100 MB checkpoint, {label} (ms): SYNC vs ASYNC", fmt(sv, ".0f"),
                     fmt(av, ".0f") if async_ok else "pending", r(ratio(sv, av)) if async_ok else "-",
                     "(info)", "-"])  # fmt: skip
    return header, rows


def render_recovery_phases(s: dict) -> str:
    header = ["recovery timeline (median s)", "os._exit(1)", "SIGKILL", "os._exit(1), steady", "tf cold start",
              "raw cold start"]  # fmt: skip
    cold_key = {"worker_proc_started": "worker_proc_started", "workers_connected": "workers_connected",
                "process_group_ready": "process_group_ready", "train_fn_sent": "train_fn_sent",
                "loop_entered": "loop_entered", "model_ready": "model_ready", "first_step_done": "first_step_done"}  # fmt: skip
    rows = []
    for key, label in RECOVERY_PHASES.items():
        ck = cold_key.get(key)
        rows.append([
            label,
            fmt(s["recovery_exit"]["phases"].get(key), ".3f"),
            fmt(s["recovery_sigkill"]["phases"].get(key), ".3f"),
            fmt(s["recovery_exit_steady"]["phases"].get(key), ".3f"),
            fmt(s["cold_start_phases"]["trainforge"].get(ck) if ck else None, ".3f"),
            fmt(s["cold_start_phases"]["raw"].get(ck) if ck else None, ".3f"),
        ])
    note = ("(recovery columns: seconds after rank 1's death; cold-start columns: seconds after the driver "
            "calls fit() / mp.spawn())")  # fmt: skip
    return render_text(header, rows) + "\n" + note


NOTES = [
    "recovery: 2 workers, gloo, CPU, MLP 64-256-256-10 (bench_core's workload), SGD+momentum; a checkpoint "
    "(model + optimizer state dict, ~0.6 MB) every --ckpt-every steps; rank 1 dies after --die-at steps of "
    "attempt 0; FailureConfig(max_failures=1). Baseline: raw DDP cold start (bench_core's raw:first_step: "
    "mp.spawn + init_process_group + DDP + first optimizer.step()).",
    "persist: 1 worker; random bytes in 2 files (10 MB) / 4 files (100 MB) written once (page cache), reported "
    "to a local storage path on the same filesystem as the plain-copy target; methods alternate; 'until "
    "committed' = from just before report() until fit_iter() yields the committed checkpoint (driver side). "
    "Baseline: shutil.copytree of the same directory.",
    "stall: 1 worker; compute step = MLP steps calibrated to --stall-step-ms; stall = duration of the step "
    "that calls report(checkpoint=100 MB) minus a normal step (median of that interval's last 10 steps); 'slow' storage is a local fsspec "
    "filesystem whose put() is throttled to --slow-mbps (bench/_slowfs.py). Baseline column: SYNC, "
    "trainforge column: ASYNC.",
]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3, help="runs per variant (median reported)")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma list of {','.join(PARTS)}")
    p.add_argument("--steps", type=int, default=30, help="recovery: total training steps")
    p.add_argument("--ckpt-every", type=int, default=10, help="recovery: steps between checkpoints")
    p.add_argument("--die-at", type=int, default=15, help="recovery: rank 1 dies after this many steps")
    p.add_argument("--steady-after-s", type=float, default=12.0,
                   help="recovery, steady variant: rank 1 dies at the first checkpoint after this many seconds of "
                        "training (the standby workers have long finished their imports)")  # fmt: skip
    p.add_argument("--persist-iters", type=int, default=5, help="persist: measurements per size in one run")
    p.add_argument("--stall-step-ms", type=float, default=20.0, help="stall: length of one compute step")
    p.add_argument("--stall-every", type=int, default=50, help="stall: steps between checkpoints")
    p.add_argument("--stall-checkpoints", type=int, default=4, help="stall: checkpoints per run")
    p.add_argument("--stall-warmup", type=int, default=10, help="stall: steps before the first checkpoint")
    p.add_argument("--slow-mbps", type=float, default=200.0, help="stall: bandwidth of the slowed storage")
    p.add_argument("--markdown", action="store_true", help="also print the table as Markdown")
    p.add_argument("--json-out", default=DEFAULT_JSON, help="where to write the JSON results")
    p.add_argument("--idle-wait", type=float, default=60, help="before each run, wait up to this many seconds for idle CPUs")
    p.add_argument("--timeout", type=float, default=600, help="seconds allowed per variant run")
    p.add_argument(
        "--noisy-retries", type=int, default=2,
        help="run a variant again (up to this many times) when other processes took >10%% as much CPU as it",
    )  # fmt: skip
    p.add_argument(
        "--variants", default="",
        help="only these variants of the chosen parts (comma list, e.g. recovery:exit,recovery:sigkill for a "
             "quick recovery-only run); all by default",
    )  # fmt: skip
    p.add_argument("--variant", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--workdir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.variant:
        run_variant_here(args)
        return 0

    parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    bad = sorted(set(parts) - set(PARTS))
    if bad:
        p.error(f"--parts: unknown {bad}; choose from {','.join(PARTS)}")
    if args.die_at <= args.ckpt_every or args.die_at >= args.steps:
        p.error("--die-at must be after the first checkpoint (> --ckpt-every) and before --steps")
    async_ok = upload_mode_supported()
    variants = {
        "recovery": ["raw:first_step", "recovery:exit", "trainforge:first_step", "recovery:sigkill",
                     "recovery:exit_steady"],
        "persist": ["persist"],
        "stall": [f"stall:{mode}:{storage}" for storage in STORAGES for mode in UPLOAD_MODES
                  if async_ok or mode == "SYNC"],  # fmt: skip
    }
    only = {x.strip() for x in args.variants.split(",") if x.strip()}
    known = {v for part in parts for v in variants[part]}
    if only - known:
        p.error(f"--variants: unknown {sorted(only - known)}; choose from {','.join(sorted(known))}")
    if only:
        variants = {part: [v for v in vs if v in only] for part, vs in variants.items()}
    args.ran_variants = [v for part in parts for v in variants[part]]
    runs: dict[str, list[dict]] = {}
    discarded: dict[str, list[dict]] = {}  # runs redone because other processes used the CPUs meanwhile
    for part in parts:
        for rep in range(args.repeats):
            for variant in variants[part]:
                print(f"[{rep + 1}/{args.repeats}] {variant} ...", file=sys.stderr, flush=True)
                for retry in range(args.noisy_retries + 1):
                    run = run_variant(variant, args)
                    if not is_noisy(run) or retry == args.noisy_retries:
                        break
                    print(f"  noisy (other processes: {run['foreign_cpu_s']:.1f} CPU-s), running it again",
                          file=sys.stderr, flush=True)  # fmt: skip
                    discarded.setdefault(variant, []).append(run)
                runs.setdefault(variant, []).append(run)

    s = summarize(runs)
    header, rows = table_rows(s, args, async_ok)
    commit, date = git_commit(), datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    info = machine_info()
    info["tmp_filesystem"] = filesystem_of(tempfile.gettempdir())
    print(f"\ntrainforge recovery & checkpoint benchmark  {date}  commit {commit}  python {info['python']}  "
          f"torch {info['torch']}  {info['cpu_count']} CPUs  repeats={args.repeats}\n")  # fmt: skip
    print(render_text(header, rows))
    if "recovery" in parts:
        print()
        print(render_recovery_phases(s))
    warning = noise_warning(runs)
    if warning:
        print("\n" + warning)
    if discarded:
        print(f"\n{sum(map(len, discarded.values()))} noisy run(s) were run again (kept in the JSON under "
              "discarded_noisy_runs): " + ", ".join(f"{v} x{len(r)}" for v, r in discarded.items()))  # fmt: skip

    diag = []
    if "recovery" in parts:
        for how in RECOVERY_KINDS:
            ds = [derive_recovery(r) for r in runs.get(f"recovery:{how}", [])]
            if not ds:
                continue
            firsts = [
                ", ".join(f"rank {f['rank']} {f['kind']} (exit {f['exit_code']})" for f in d["failures"])
                for d in ds if d.get("failures")
            ]
            states = [d["shutdown_info"] for d in ds if d.get("shutdown_info")]
            acquired = [d["acquire_info"] for d in ds if d.get("acquire_info")]
            diag.append(f"{how}: failures handled: {firsts[0] if firsts else '-'}; old-group shutdown took "
                        f"{fmt(s[f'recovery_{how}']['shutdown_s'], '.3f')} s (worker exit codes when it began: "
                        f"{states[0]['exit_codes'] if states else '-'}); standby workers waiting at the restart: "
                        f"{acquired[0]['standby'] if acquired else '-'}")  # fmt: skip
    if "persist" in parts:
        for size in PERSIST_SIZES:
            pz = s["persist"][size]
            diag.append(f"persist {size}: cp -r {fmt(pz['cp_mbps'], '.0f')} MB/s; commit seen by the worker "
                        f"(polling the marker every 0.5 ms; '-' if the driver deleted it first) {fmt(pz['commit_seen_mbps'], '.0f')} MB/s; by marker mtime "
                        f"{fmt(pz['commit_marker_mbps'], '.0f')} MB/s; plain copytree {fmt(pz['copytree_ms'], '.1f')} ms "
                        f"vs report -> committed {fmt(pz['commit_total_ms'], '.1f')} ms: "
                        + "; ".join(f"{label.strip()} {fmt(pz[k], '.2f')}" for k, label in PERSIST_STEPS.items()))  # fmt: skip
    if "stall" in parts:
        for key, st in s["stall"].items():
            if st:
                diag.append(f"stall {key}: report() {fmt(st['report_ms'], '.0f')} ms, extra time over the whole "
                            f"checkpoint interval {fmt(st['interval_excess_ms'], '.0f')} ms, normal step "
                            f"{fmt(st['normal_step_ms'], '.1f')} ms, commit {fmt(st['commit_lag_ms'], '.0f')} ms "
                            f"after report(), fit() returned {fmt(st['drain_s'], '.2f')} s after the loop")  # fmt: skip
        if not async_ok:
            diag.append("ASYNC upload: pending (trainforge.report has no checkpoint_upload_mode= yet); "
                        "the ASYNC variants run as soon as it does")  # fmt: skip
    if diag:
        print("\ndiagnostics (medians):\n" + "\n".join(f"- {d}" for d in diag))
    print("\nnotes:\n" + "\n".join(f"- {n}" for n in NOTES))
    if args.markdown:
        print("\n" + render_markdown(header, rows))

    failed = {v: [r for r in rs if "error" in r] for v, rs in runs.items()}
    failed = {v: rs for v, rs in failed.items() if rs}
    os.makedirs(os.path.dirname(os.path.abspath(args.json_out)), exist_ok=True)
    derivers = {"recovery": derive_recovery, "persist": derive_persist, "stall": derive_stall}
    return finish(
        args.json_out,
        {
            "benchmark": "recovery",
            "date": date,
            "git_commit": commit,
            "machine": info,
            "settings": {k: v for k, v in vars(args).items() if k not in ("variant", "out", "workdir")}
            | {"world_size": core.WORLD_SIZE, "backend": "gloo", "async_upload": "measured" if async_ok else "pending",
               "persist_sizes": PERSIST_SIZES, "stall_checkpoint": STALL_CKPT},  # fmt: skip
            "targets": {"recovery_ratio_max": TARGET_RECOVERY_RATIO, "recovery_s_max": TARGET_RECOVERY_S,
                        "persist_ratio_min": TARGET_PERSIST_RATIO},
            "summary": s,
            "table": {"header": header, "rows": rows},
            "runs": {
                v: [{**r, "derived": (derivers[v.split(":")[0]](r) if v.split(":")[0] in derivers
                                      else core.derive("first_step", r))} for r in rs]
                for v, rs in runs.items()
            },  # fmt: skip
            "discarded_noisy_runs": discarded,
            "notes": NOTES,
        },
        failed,
    )


if __name__ == "__main__":
    sys.exit(main())
