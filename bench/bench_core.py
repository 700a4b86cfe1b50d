#!/usr/bin/env python
"""Core benchmark: trainforge vs raw torch DDP (``torch.multiprocessing.spawn``), 2 CPU workers, gloo.

    python bench/bench_core.py [--repeats 3] [--markdown]

Measures, for the same small MLP (64->256->256->10, synthetic data, batch 64, SGD):

1. time to first step: driver start (after ``import torch``; just before ``mp.spawn`` / ``trainer.fit()``)
   until rank 0 has finished its first ``optimizer.step()``;
2. steady throughput: steps/s over ``--steps`` steps after ``--warmup`` steps, trainforge calling
   ``trainforge.report({"loss": ..., "step": i})`` every step, raw DDP not reporting (both call ``loss.item()``);
3. ``report()`` cost: microseconds per metrics-only call in a tight loop inside a worker;
4. peak RSS of the driver's process tree (driver + all descendants, sampled every 50 ms) during the
   throughput runs.

Every measurement runs in a fresh driver subprocess (``--variant NAME``), so that no variant benefits
from imports warmed up by another; variants alternate (raw, trainforge, raw, ...) and the table shows
medians. Results go to ``bench/results/core.json``. Ray Train is measured too when ``ray.train`` imports,
over a bounded number of steps and report() calls (``--ray-train-steps``, ``--ray-train-report-calls``):
each of its reports blocks for ~2 s. A failed run is done once more; failures are printed and kept.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from _common import (
    BENCH_DIR,
    RAY_ENV,
    TreeRssSampler,
    finish,
    git_commit,
    machine_info,
    noise_warning,
    proc_start_wall,
    render_markdown,
    render_text,
)
from _common import fmt as _fmt
from _common import median as _median
from _common import write_json as _write_json
from _core_workload import (
    BATCH,
    HIDDEN,
    IN_DIM,
    LR,
    OUT_DIM,
    PHASE_LABELS,
    RAY_TRAIN_REPORT_CALLS,
    RAY_TRAIN_STEPS,
    RAY_TRAIN_WARMUP,
    WORLD_SIZE,
    derive,
    drive_raw,
    make_batches,
    make_mlp,
    run_core_variant,
    timed_loop,
    train_step,
)
from torch.nn.parallel import DistributedDataParallel

DEFAULT_JSON = os.path.join(BENCH_DIR, "results", "core.json")

FRAMEWORKS = ("raw", "trainforge", "ray")
METRICS = ("first_step", "throughput", "report_cost")
LABELS = {"raw": "raw DDP", "trainforge": "trainforge", "ray": "Ray Train"}

TARGET_FIRST_STEP_RATIO = 1.2  # trainforge / raw, at most
TARGET_THROUGHPUT_RATIO = 0.98  # trainforge / raw, at least
TARGET_REPORT_US = 50.0  # at most

# --------------------------------------------------------------------------------------------------
# trainforge / Ray Train loops (the same code runs on both; config["framework"] picks the API).
# --------------------------------------------------------------------------------------------------
def _train_api(framework: str):
    if framework == "ray":
        import ray.train as train
        from ray.train.torch import prepare_model
    else:
        import trainforge as train
        from trainforge.torch import prepare_model
    return train, prepare_model


def _fw_result(train, config: dict, rank: int, metrics: dict) -> None:
    """Rank 0 writes its figures to ``config["out_dir"]`` for the driver, then every rank reports them.

    The driver reads the file, not ``Result.metrics``: Ray Train 2.x keeps no metrics-only reports
    (its ``Result.metrics`` is ``None`` for a run without checkpoints).
    """
    if rank == 0:
        _write_json(os.path.join(config["out_dir"], "rank0.json"), metrics)
    train.report(metrics)


def fw_first_step_loop(config: dict) -> None:
    t_entry = time.time()
    t_proc = proc_start_wall()
    pg_ready = dist.is_available() and dist.is_initialized()
    train, prepare_model = _train_api(config["framework"])
    rank = train.get_context().get_world_rank()
    model = prepare_model(make_mlp())
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    loss_fn = nn.CrossEntropyLoss()
    batches = make_batches(rank, n=1)
    t_model = time.time()
    loss = train_step(model, opt, loss_fn, batches[0])
    t_step = time.time()
    _fw_result(
        train,
        config,
        rank,
        {
            "first_step_t": t_step,
            "t_proc": t_proc,
            "t_entry": t_entry,
            "t_pg": t_entry if pg_ready else float("nan"),
            "t_model": t_model,
            "loss": loss.item(),
            "rank": rank,
            "ddp": isinstance(model, DistributedDataParallel),
            "num_threads": torch.get_num_threads(),
        },
    )


def fw_throughput_loop(config: dict) -> None:
    train, prepare_model = _train_api(config["framework"])
    rank = train.get_context().get_world_rank()
    model = prepare_model(make_mlp())
    opt = torch.optim.SGD(model.parameters(), lr=LR)

    in_report = [0.0]  # seconds spent inside report() during the timed steps

    def on_step(loss_value: float, i: int) -> None:
        t = time.perf_counter()
        train.report({"loss": loss_value, "step": i})
        if i >= config["warmup"]:
            in_report[0] += time.perf_counter() - t

    timing = timed_loop(
        model, opt, nn.CrossEntropyLoss(), make_batches(rank), config["steps"], config["warmup"], on_step,
        chunks=min(10, config["steps"]),
    )  # fmt: skip
    _fw_result(
        train,
        config,
        rank,
        {
            **timing,
            "steps": config["steps"],
            "report_share": in_report[0] * timing["steps_per_s"] / config["steps"],
            "rank": rank,
            "ddp": isinstance(model, DistributedDataParallel),
            "num_threads": torch.get_num_threads(),
        },
    )


def fw_report_cost_loop(config: dict) -> None:
    train, _ = _train_api(config["framework"])
    rank = train.get_context().get_world_rank()
    calls, chunk = config["calls"], config["chunk"]
    for i in range(config["warmup_calls"]):  # first calls may start threads, allocate buffers
        train.report({"loss": 0.1, "step": i})
    chunks_us = []
    i = 0
    for _ in range(calls // chunk):
        t = time.perf_counter()
        for _ in range(chunk):
            train.report({"loss": 0.1, "step": i})
            i += 1
        chunks_us.append((time.perf_counter() - t) / chunk * 1e6)
    _fw_result(
        train,
        config,
        rank,
        {
            "report_us": statistics.median(chunks_us),
            "chunks_us": chunks_us,
            "calls": calls,
            "loop_done_t": time.time(),
            "rank": rank,
        },
    )


# --------------------------------------------------------------------------------------------------
# Driver side of one variant (runs in a fresh subprocess).
# --------------------------------------------------------------------------------------------------
# Driver-side start-up phases of trainforge, taken by wrapping internal methods (benchmark-only
# instrumentation; a method that no longer exists is skipped and its phase shows as "-").
TF_DRIVER_PROBES = (
    ("trainforge._internal.worker_group.local", "LocalWorkerGroup", "start"),
    ("trainforge._internal.worker_group.local", "LocalWorkerGroup", "_wait_connected"),
    ("trainforge._internal.worker_group.local_pool", "LocalProcessPool", "wait_connected"),
    ("trainforge._internal.torch.config", "_TorchBackend", "on_start"),
    ("trainforge._internal.worker_group.local", "LocalWorkerGroup", "start_training"),
    ("trainforge._internal.worker_group.local", "LocalWorkerGroup", "shutdown"),
)


def instrument_trainforge(events: dict[str, float]) -> None:
    import functools
    import importlib

    for module_name, cls_name, meth in TF_DRIVER_PROBES:
        try:
            cls = getattr(importlib.import_module(module_name), cls_name)
            original = getattr(cls, meth)
        except (ImportError, AttributeError):
            continue

        def wrapper(*a, __orig=original, __name=meth, **kw):
            events.setdefault(f"{__name}:begin", time.time())
            try:
                return __orig(*a, **kw)
            finally:
                events.setdefault(f"{__name}:end", time.time())

        setattr(cls, meth, functools.wraps(original)(wrapper))


def drive_framework(framework: str, kind: str, args: argparse.Namespace) -> dict:
    ray_train = framework == "ray"
    t_import = time.time()
    if ray_train:
        os.environ.update(RAY_ENV)
        import ray.train  # noqa: F401
        from ray.train import RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer

        run_config = RunConfig(storage_path=args.workdir, name="bench")
    else:
        import trainforge  # noqa: F401
        from trainforge import RunConfig, ScalingConfig
        from trainforge.torch import TorchTrainer

        run_config = RunConfig(storage_path=args.workdir, name="bench", verbose=0)
    t_construct = time.time()
    loop = {
        "first_step": fw_first_step_loop,
        "throughput": fw_throughput_loop,
        "report_cost": fw_report_cost_loop,
    }[kind]
    # Ray Train's report() blocks for ~2 s: it runs a bounded number of steps / calls (see NOTES).
    calls = args.ray_train_report_calls if ray_train else args.report_calls
    config = {
        "framework": framework,
        "out_dir": os.path.join(args.workdir, "out"),
        "steps": args.ray_train_steps if ray_train else args.steps,
        "warmup": args.ray_train_warmup if ray_train else args.warmup,
        "calls": calls,
        "chunk": max(1, calls // 2) if ray_train else args.report_chunk,
        "warmup_calls": 2 if ray_train else 200,
    }
    os.makedirs(config["out_dir"])
    trainer = TorchTrainer(
        loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=WORLD_SIZE),
        run_config=run_config,
    )
    driver_events: dict[str, float] = {}
    if framework == "trainforge" and kind == "first_step":
        instrument_trainforge(driver_events)
    with TreeRssSampler() as rss:
        t0 = time.time()
        result = trainer.fit()
        t_end = time.time()
    if getattr(result, "error", None) is not None:
        raise RuntimeError(f"{framework} run failed: {result.error!r}")
    worker_out = os.path.join(config["out_dir"], "rank0.json")
    if not os.path.exists(worker_out):
        raise RuntimeError(f"{framework} run returned but rank 0 did not write {worker_out}")
    with open(worker_out) as f:
        metrics = json.load(f)
    out = {
        "t0": t0,
        "t_end": t_end,
        "import_s": t_construct - t_import,
        "construct_s": t0 - t_construct,
        "metrics": metrics,
        "driver_events": {k: v - t0 for k, v in driver_events.items()},
        **rss.as_dict(),
    }
    try:
        out["n_reports_rank0"] = len(result.metrics_dataframe)
    except Exception as exc:  # the frame is informational only
        out["n_reports_rank0"] = f"unavailable: {exc!r}"
    return out


def run_variant_here(args: argparse.Namespace) -> None:
    framework, kind = args.variant.split(":")
    data = drive_raw(kind, args) if framework == "raw" else drive_framework(framework, kind, args)
    _write_json(args.out, data)


# --------------------------------------------------------------------------------------------------
# Orchestrator.
# --------------------------------------------------------------------------------------------------
def ray_available() -> bool:
    if importlib.util.find_spec("ray") is None:
        return False
    try:
        out = subprocess.run(
            [sys.executable, "-c", "import ray.train.torch"], capture_output=True, timeout=120
        )
    except subprocess.TimeoutExpired:
        return False
    return out.returncode == 0


def summarize(runs: dict[str, list[dict]], frameworks: list[str]) -> dict:
    summary: dict[str, dict] = {}

    def med(framework: str, metric: str, key: str) -> float | None:
        return _median(
            [d.get(key) for d in (derive(metric, r) for r in runs.get(f"{framework}:{metric}", []))]
        )

    rows = [
        ("first_step_s", "first_step", "first_step_s"),
        ("steps_per_s", "throughput", "steps_per_s"),
        ("report_us", "report_cost", "report_us"),
        ("peak_rss_mb", "throughput", "peak_rss_mb"),
    ]
    for name, metric, key in rows:
        summary[name] = {fw: med(fw, metric, key) for fw in frameworks}
    summary["report_drain_s"] = {fw: med(fw, "report_cost", "drain_s") for fw in frameworks}
    summary["runs_ok"] = {v: (sum("error" not in r for r in rs), len(rs)) for v, rs in runs.items()}
    # Ray Train runs a bounded number of steps / report() calls; the table says how many.
    summary["ray_bounded"] = {
        "steps": med("ray", "throughput", "steps"),
        "calls": med("ray", "report_cost", "calls"),
    }
    summary["throughput_best_chunk_steps_per_s"] = {
        fw: med(fw, "throughput", "best_chunk_steps_per_s") for fw in frameworks
    }
    summary["throughput_cpu_ms_per_step"] = {
        fw: med(fw, "throughput", "cpu_ms_per_step") for fw in frameworks
    }
    summary["throughput_driver_cpu_s"] = {fw: med(fw, "throughput", "driver_cpu_s") for fw in frameworks}
    summary["throughput_report_share"] = {fw: med(fw, "throughput", "report_share") for fw in frameworks}
    phase_names = list(PHASE_LABELS)
    summary["first_step_phases"] = {
        fw: {
            p: _median(
                [derive("first_step", r).get("phases", {}).get(p) for r in runs.get(f"{fw}:first_step", [])]
            )
            for p in phase_names
        }
        for fw in frameworks
    }
    return summary


ROW_METRIC = {
    "first_step_s": "first_step",
    "steps_per_s": "throughput",
    "report_us": "report_cost",
    "peak_rss_mb": "throughput",
}


def table_rows(summary: dict, frameworks: list[str], ray_note: str) -> tuple[list[str], list[list[str]]]:
    def ratio(name: str) -> float | None:
        raw, tf = summary[name].get("raw"), summary[name].get("trainforge")
        return tf / raw if raw and tf is not None else None

    def status(ok: bool | None) -> str:
        return "-" if ok is None else ("PASS" if ok else "MISS")

    def col(fw: str, name: str, spec: str) -> str:
        """The median, and how many runs it rests on when some failed (even after their retry)."""
        text = _fmt(summary[name].get(fw), spec)
        ok, total = summary["runs_ok"].get(f"{fw}:{ROW_METRIC[name]}", (0, 0))
        return text + (f" ({ok} of {total} runs)" if ok < total else "")

    def ray_col(name: str, spec: str) -> str:
        if "ray" not in frameworks:
            return ray_note
        bound = {"steps_per_s": ("steps", "steps"), "report_us": ("calls", "calls")}.get(name)
        count = summary["ray_bounded"].get(bound[0]) if bound else None
        return col("ray", name, spec) + (f" ({count:.0f} {bound[1]})" if count is not None else "")

    r_fs, r_tp, r_mem = ratio("first_step_s"), ratio("steps_per_s"), ratio("peak_rss_mb")
    rep = summary["report_us"].get("trainforge")
    header = ["metric", "raw DDP", "trainforge", "ratio", "target", "status", "Ray Train"]
    rows = [
        [
            "time to first step (s)",
            col("raw", "first_step_s", ".2f"),
            col("trainforge", "first_step_s", ".2f"),
            _fmt(r_fs, ".2f") + ("x" if r_fs else ""),
            f"<= {TARGET_FIRST_STEP_RATIO}x raw",
            status(None if r_fs is None else r_fs <= TARGET_FIRST_STEP_RATIO),
            ray_col("first_step_s", ".2f"),
        ],
        [
            "throughput (steps/s)",
            col("raw", "steps_per_s", ".0f"),
            col("trainforge", "steps_per_s", ".0f"),
            _fmt(r_tp, ".3f") + ("x" if r_tp else ""),
            f">= {TARGET_THROUGHPUT_RATIO}x raw",
            status(None if r_tp is None else r_tp >= TARGET_THROUGHPUT_RATIO),
            ray_col("steps_per_s", ".2f"),
        ],
        [
            "report() cost (us/call)",
            "n/a",
            col("trainforge", "report_us", ".1f"),
            "-",
            f"<= {TARGET_REPORT_US:.0f} us",
            status(None if rep is None else rep <= TARGET_REPORT_US),
            ray_col("report_us", ".0f"),
        ],
        [
            "peak RSS, process tree (MB)",
            col("raw", "peak_rss_mb", ".0f"),
            col("trainforge", "peak_rss_mb", ".0f"),
            _fmt(r_mem, ".2f") + ("x" if r_mem else ""),
            "-",
            "-",
            ray_col("peak_rss_mb", ".0f"),
        ],
    ]
    return header, rows


def render_phases(summary: dict, frameworks: list[str]) -> str:
    labels = PHASE_LABELS
    fws = [fw for fw in frameworks if fw != "ray" or summary["first_step_phases"].get("ray")]
    header = ["first-step timeline, s after driver start (median)", *(LABELS[fw] for fw in fws)]
    rows = [
        [label, *(_fmt(summary["first_step_phases"][fw][key], ".3f") for fw in fws)]
        for key, label in labels.items()
    ]
    return render_text(header, rows)


NOTES = [
    "2 workers, gloo, CPU; MLP 64-256-256-10, batch 64, SGD, synthetic data; each run in a fresh driver process.",
    "OMP_NUM_THREADS=1 for the raw DDP workers too (trainforge gives each worker its CPUs per worker, 1 by default).",
    "first step: from just before mp.spawn()/trainer.fit() (after `import torch` in the driver) to rank 0's first "
    "optimizer.step().",
    "throughput: trainforge calls report({'loss', 'step'}) every step; raw DDP only calls loss.item().",
    "Ray Train runs the same loops (report() every step), but each of its report() calls blocks for ~2 s "
    "(Ray 2.60): it times a bounded number of steps (--ray-train-steps, after --ray-train-warmup) and of "
    "report() calls (--ray-train-report-calls), given in its cells; its steps/s is bound by report(). Its "
    "first step includes starting Ray inside fit(); its workers' figures come from a file rank 0 writes "
    "(Result.metrics is None without checkpoints).",
    "peak RSS: sum over driver + descendants, sampled every 50 ms during the throughput runs (shared pages of "
    "torch are counted once per process).",
]


def failure_lines(runs: dict[str, list[dict]], failed_attempts: dict[str, list[dict]]) -> list[str]:
    """One line per failed run: the error, the last line of its output, and how its retry went."""

    def why(run: dict) -> str:
        tail = [ln for ln in run.get("output_tail", "").splitlines() if ln.strip()]
        return run["error"] + (f": {tail[-1].strip()[:160]}" if tail else "")

    lines = []
    for variant, attempts in failed_attempts.items():
        for a in attempts:
            retry = runs[variant][a["repeat"] - 1]
            outcome = f"failed too ({why(retry)})" if "error" in retry else "ok"
            lines.append(f"{variant} repeat {a['repeat']}: {why(a)}; its retry: {outcome}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3, help="runs per variant (median reported)")
    p.add_argument(
        "--steps", type=int, default=1000, help="timed steps for throughput (~3 s; 300 was too noisy)"
    )
    p.add_argument("--warmup", type=int, default=20, help="warm-up steps before timing")
    p.add_argument("--report-calls", type=int, default=20_000, help="report() calls timed per worker")
    p.add_argument(
        "--report-chunk", type=int, default=2_000, help="calls per timed chunk (median over chunks)"
    )
    p.add_argument(
        "--ray-train-steps", type=int, default=RAY_TRAIN_STEPS,
        help="timed steps for Ray Train's throughput (each of its reports blocks for ~2 s)",
    )  # fmt: skip
    p.add_argument("--ray-train-warmup", type=int, default=RAY_TRAIN_WARMUP, help="Ray Train's warm-up steps")
    p.add_argument(
        "--ray-train-report-calls",
        type=int,
        default=RAY_TRAIN_REPORT_CALLS,
        help="report() calls timed in Ray Train",
    )
    p.add_argument(
        "--frameworks", default="auto", help="comma list of raw,trainforge,ray (default: all available)"
    )
    p.add_argument("--metrics", default=",".join(METRICS), help=f"comma list of {','.join(METRICS)}")
    p.add_argument("--markdown", action="store_true", help="also print the table as Markdown")
    p.add_argument("--json-out", default=DEFAULT_JSON, help="where to write the JSON results")
    p.add_argument(
        "--idle-wait",
        type=float,
        default=30,
        help="before each run, wait up to this many seconds for idle CPUs",
    )
    p.add_argument("--timeout", type=float, default=600, help="seconds allowed per variant run")
    # Internal: run one variant in this (fresh) process.
    p.add_argument("--variant", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--workdir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.variant:
        run_variant_here(args)
        return 0

    ray_note = "not installed"
    if args.frameworks == "auto":
        frameworks = ["raw", "trainforge"]
        if ray_available():
            frameworks.append("ray")
        elif importlib.util.find_spec("ray") is not None:
            ray_note = "import failed"
    else:
        frameworks = [fw.strip() for fw in args.frameworks.split(",") if fw.strip()]
        ray_note = "not run"
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    for name, allowed, got in (("frameworks", FRAMEWORKS, frameworks), ("metrics", METRICS, metrics)):
        bad = sorted(set(got) - set(allowed))
        if bad:
            p.error(f"--{name}: unknown {bad}; choose from {','.join(allowed)}")

    runs: dict[str, list[dict]] = {}
    failed_attempts: dict[str, list[dict]] = {}  # runs that failed and were done again
    for metric in metrics:
        for rep in range(args.repeats):
            for fw in frameworks:  # alternate raw, trainforge, raw, ... to spread noise
                if fw == "raw" and metric == "report_cost":
                    continue
                variant = f"{fw}:{metric}"
                print(f"[{rep + 1}/{args.repeats}] {variant} ...", file=sys.stderr, flush=True)
                run = run_core_variant(variant, args)
                if "error" in run:  # once more, and the failure stays in the output and the JSON
                    print(
                        f"  {variant} failed ({run['error']}); running it again", file=sys.stderr, flush=True
                    )
                    failed_attempts.setdefault(variant, []).append({"repeat": rep + 1, **run})
                    run = run_core_variant(variant, args)
                runs.setdefault(variant, []).append(run)

    summary = summarize(runs, frameworks)
    header, rows = table_rows(summary, frameworks, ray_note)
    commit, date = git_commit(), datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    info = machine_info()
    print(f"\ntrainforge core benchmark  {date}  commit {commit}  python {info['python']}  torch {info['torch']}  "
          f"{info['cpu_count']} CPUs  repeats={args.repeats}\n")  # fmt: skip
    print(render_text(header, rows))
    if "first_step" in metrics:
        print()
        print(render_phases(summary, frameworks))
    failures = failure_lines(runs, failed_attempts)
    if failures:
        print("\nfailed runs (each is done once more; a median over fewer runs says so in its cell):")
        print("\n".join(f"- {line}" for line in failures))
    # Ray's daemons and workers are not reaped children of the driver: their CPU counts as "other
    # processes" in a Ray Train run's accounting, so the check looks at the other frameworks (as bench_ray.py).
    warning = noise_warning({v: rs for v, rs in runs.items() if not v.startswith("ray:")})
    if warning:
        print("\n" + warning)
    diag = []
    cpu = summary["throughput_driver_cpu_s"]
    if "throughput" in metrics:
        diag.append("driver process CPU during a throughput run: "
                    + ", ".join(f"{LABELS[fw]} {_fmt(cpu.get(fw), '.2f')} s" for fw in frameworks))  # fmt: skip
    if "throughput" in metrics:
        best, cpu_step = summary["throughput_best_chunk_steps_per_s"], summary["throughput_cpu_ms_per_step"]
        diag.append("throughput of the fastest tenth of the timed steps (less sensitive to other processes): "
                    + ", ".join(f"{LABELS[fw]} {_fmt(best.get(fw), '.2f' if fw == 'ray' else '.0f')} steps/s"
                       for fw in frameworks))  # fmt: skip
        diag.append("rank-0 worker CPU time per step (all its threads; robust to a busy machine): "
                    + ", ".join(f"{LABELS[fw]} {_fmt(cpu_step.get(fw), '.3f')} ms" for fw in frameworks))  # fmt: skip
    shares = {fw: v for fw, v in summary["throughput_report_share"].items() if v is not None}
    if shares:
        diag.append("share of the timed steps spent inside report(): "
                    + ", ".join(f"{LABELS[fw]} {v * 100:.2f}%" for fw, v in shares.items()))  # fmt: skip
    drain = summary["report_drain_s"].get("trainforge")
    if drain is not None:
        diag.append(
            f"after {args.report_calls:,} report() calls per rank, fit() returned {drain:.2f}s after the loop ended"
        )
    if diag:
        print("\ndiagnostics (medians):\n" + "\n".join(f"- {d}" for d in diag))
    print("\nnotes:\n" + "\n".join(f"- {n}" for n in NOTES))
    if args.markdown:
        print("\n" + render_markdown(header, rows))

    failed = {v: [r for r in rs if "error" in r] for v, rs in runs.items()}
    failed = {v: rs for v, rs in failed.items() if rs}
    os.makedirs(os.path.dirname(os.path.abspath(args.json_out)), exist_ok=True)
    return finish(
        args.json_out,
        {
            "benchmark": "core",
            "date": date,
            "git_commit": commit,
            "machine": info,
            "settings": {
                "repeats": args.repeats,
                "steps": args.steps,
                "warmup": args.warmup,
                "report_calls": args.report_calls,
                "report_chunk": args.report_chunk,
                "ray_train_steps": args.ray_train_steps,
                "ray_train_warmup": args.ray_train_warmup,
                "ray_train_report_calls": args.ray_train_report_calls,
                "world_size": WORLD_SIZE,
                "backend": "gloo",
                "model": f"MLP {IN_DIM}-{HIDDEN}-{HIDDEN}-{OUT_DIM}",
                "batch_size": BATCH,
                "raw_omp_num_threads": 1,
                "frameworks": frameworks,
                "ray": "measured" if "ray" in frameworks else ray_note,
            },
            "targets": {
                "first_step_ratio_max": TARGET_FIRST_STEP_RATIO,
                "throughput_ratio_min": TARGET_THROUGHPUT_RATIO,
                "report_us_max": TARGET_REPORT_US,
            },
            "summary": summary,
            "table": {"header": header, "rows": rows},
            "failed_attempts": failed_attempts,
            "failures": failures,
            "runs": {v: [{**r, "derived": derive(v.split(":")[1], r)} for r in rs] for v, rs in runs.items()},
            "notes": NOTES,
        },
        failed,
    )


if __name__ == "__main__":
    sys.exit(main())
