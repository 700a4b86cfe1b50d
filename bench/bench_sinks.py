#!/usr/bin/env python
"""Tracker sinks benchmark: what a sink costs ``report()``, the driver and ``fit()``.

    python bench/bench_sinks.py [--markdown] [--quick] [--repeats 3] [--variants none,slow_async,...]

Every variant is a fresh driver subprocess running the same 2-worker ``DataParallelTrainer``: each
worker does ``--reports`` (100) steps of ``--step-ms`` (10) ms (a sleep standing in for compute) and
calls ``report({"loss", "acc", "nested": {...}, "t": time.time()})`` after each. Rank 0 times every
``report()`` call (``perf_counter`` around it); a last driver callback records ``time.time() -
metrics["t"]`` at ``on_report`` (report -> driver callbacks). Variants:

- ``none``: no sink (the baseline).
- ``slow_async``: a ``LoggerCallback`` whose ``log_trial_result`` sleeps 200 ms per call (a slow
  remote tracker): the headline. Goal: ``report()`` p95 <= ``none`` + 1 ms.
- ``slow_batch``: the same 200 ms per call, but per batch (``log_trial_results``, as the MLflow sink
  writes with one ``log_batch``): how the end-of-run flush shrinks.
- ``slow_sync``: a plain ``Callback`` sleeping 200 ms in ``on_report``: the naive design, for contrast
  (the driver falls behind; ``report()`` itself only feels it once the report ring is full).
- ``csv``, ``json``, ``tbx``, ``mlflow`` (file store), ``wandb`` (offline), ``all``: the real sinks.
- ``hand_tbx``, ``hand_mlflow``, ``hand_wandb``: no sink; rank 0 logs the same metrics itself in the
  loop, synchronously (``SummaryWriter.add_scalar``; ``mlflow.log_metrics`` to a file store;
  ``run.log`` offline): the "by hand" way the sinks replace. Its column is report() + the logging call.
- ``restart_none``, ``restart_all``: ``FailureConfig(max_failures=1)``, a checkpoint every 10 reports,
  rank 1 exits at report 55 of attempt 0: recovery with and without all sinks, and whether every
  file sink's file equals ``Result.metrics_dataframe`` after it.

Columns: report() p50/p95 on rank 0 (ms); report -> on_report p95 (ms); ``fit()`` wall (s); "end
wait": from rank 0's last ``report()`` returning to ``fit()`` returning (s; includes the workers'
shutdown, and the sinks' flush); the sinks' logged/dropped counts. Also, in-process: the driver's cost
of one ``on_report`` of a sink (µs, 10,000 calls). Medians over ``--repeats``. Writes every number to
``bench/results/sinks.json``. The machine may be shared: each variant first waits (``--idle-wait``)
for idle CPUs, and the numbers are wall-clock.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (  # noqa: E402
    BENCH_DIR,
    fmt,
    git_commit,
    machine_info,
    median,
    render_markdown,
    render_text,
    run_script_variant,
    status,
    write_json,
)

DEFAULT_JSON = os.path.join(BENCH_DIR, "results", "sinks.json")
SLOW_S = 0.2
VARIANTS = [
    "none", "slow_async", "slow_batch", "slow_sync", "csv", "json", "tbx", "mlflow", "wandb", "all",
    "hand_tbx", "hand_mlflow", "hand_wandb", "restart_none", "restart_all",
]  # fmt: skip
GOAL_MS = 1.0


def pct(values: list[float], q: float) -> float | None:
    v = sorted(values)
    if not v:
        return None
    k = (len(v) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


# --------------------------------------------------------------------------------------------------
# One variant, in its own process.
# --------------------------------------------------------------------------------------------------
def _loop(config: dict) -> None:
    import trainforge as train

    ctx = train.get_context()
    rank, attempt = ctx.get_world_rank(), ctx.get_attempt()
    hand = config["hand"] if rank == 0 else None
    log = _hand_logger(hand, config) if hand else None
    start = 0
    ckpt = train.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            start = int(open(os.path.join(d, "step")).read()) + 1
    times, last = [], 0.0
    for step in range(start, config["reports"]):
        time.sleep(config["step_ms"] / 1000)
        metrics = {"loss": 1.0 / (step + 1), "acc": step / config["reports"], "nested": {"lr": 0.1, "m": 0.9},
                   "step": step, "t": time.time()}  # fmt: skip
        checkpoint = None
        if config["restart"] and step % 10 == 9 and rank == 0:
            d = os.path.join(config["workdir"], f"ck{step}")
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "step"), "w") as f:
                f.write(str(step))
            checkpoint = train.Checkpoint.from_directory(d)
        t0 = time.perf_counter()
        if log is not None:
            log(metrics, step)
        train.report(metrics, checkpoint=checkpoint)
        times.append(time.perf_counter() - t0)
        last = time.time()
        if config["restart"] and attempt == 0 and rank == 1 and step == 55:
            os._exit(1)
    if rank == 0:
        with open(os.path.join(config["workdir"], f"rank0_a{attempt}.json"), "w") as f:
            json.dump({"report_s": times, "last_report_wall": last}, f)


def _hand_logger(kind: str, config: dict) -> Any:
    workdir = config["workdir"]
    if kind == "hand_tbx":
        from tensorboardX import SummaryWriter

        writer = SummaryWriter(logdir=os.path.join(workdir, "hand_tb"))
        return lambda m, step: [writer.add_scalar(k, v, step) for k, v in _numbers(m).items()]
    if kind == "hand_mlflow":
        from trainforge.air.integrations.mlflow import setup_mlflow

        mlflow = setup_mlflow(tracking_uri=f"file://{workdir}/hand_mlruns", experiment_name="hand",
                              create_experiment_if_not_exists=True)  # fmt: skip
        return lambda m, step: mlflow.log_metrics(_numbers(m), step=step)
    if kind == "hand_wandb":
        from trainforge.air.integrations.wandb import setup_wandb

        run = setup_wandb(project="bench", dir=os.path.join(workdir, "hand_wandb"), mode="offline")
        return lambda m, step: run.log(_numbers(m), step=step)
    raise ValueError(kind)


def _numbers(m: dict) -> dict:
    from trainforge._internal.sinks.values import numeric_metrics

    return numeric_metrics(m)


def _sinks(variant: str, workdir: str) -> list[Any]:
    from trainforge import Callback
    from trainforge.air.integrations.mlflow import MLflowLoggerCallback
    from trainforge.air.integrations.wandb import WandbLoggerCallback
    from trainforge.tune.logger import (
        CSVLoggerCallback,
        JsonLoggerCallback,
        LoggerCallback,
        TBXLoggerCallback,
    )

    class SlowAsync(LoggerCallback):
        def log_trial_result(self, iteration, trial, result):  # type: ignore[no-untyped-def]
            time.sleep(SLOW_S)

    class SlowBatch(LoggerCallback):
        def log_trial_results(self, trial, records):  # type: ignore[no-untyped-def]
            time.sleep(SLOW_S)

    class SlowSync(Callback):
        def on_report(self, report):  # type: ignore[no-untyped-def]
            time.sleep(SLOW_S)

    def real(name: str) -> Any:
        return {
            "csv": CSVLoggerCallback, "json": JsonLoggerCallback, "tbx": TBXLoggerCallback,
            "mlflow": lambda: MLflowLoggerCallback(tracking_uri=f"file://{workdir}/mlruns", experiment_name="bench"),
            "wandb": lambda: WandbLoggerCallback(project="bench", mode="offline"),
        }[name]()  # fmt: skip

    if variant in ("none", "restart_none") or variant.startswith("hand_"):
        return []
    if variant == "slow_async":
        return [SlowAsync(flush_timeout_s=600)]
    if variant == "slow_batch":
        return [SlowBatch(flush_timeout_s=600)]
    if variant == "slow_sync":
        return [SlowSync()]
    if variant in ("all", "restart_all"):
        return [real(n) for n in ("csv", "json", "tbx", "mlflow", "wandb")]
    return [real(variant)]


def run_variant_here(args: argparse.Namespace) -> None:
    from trainforge import Callback, DataParallelTrainer, FailureConfig, RunConfig, ScalingConfig

    settings = json.loads(args.settings)
    variant = args.variant
    lags: list[float] = []

    class Lag(Callback):
        def on_report(self, report):  # type: ignore[no-untyped-def]
            lags.append(time.time() - report.metrics["t"])

    if variant == "hook":
        write_json(args.out, hook_cost())
        return
    sinks = _sinks(variant, args.workdir)
    restart = variant.startswith("restart_")
    config = {"reports": settings["reports"], "step_ms": settings["step_ms"], "workdir": args.workdir,
              "hand": variant if variant.startswith("hand_") else None, "restart": restart}  # fmt: skip
    trainer = DataParallelTrainer(
        _loop, train_loop_config=config, scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="bench", storage_path=os.path.join(args.workdir, "results"), verbose=0,
                             callbacks=[*sinks, Lag()], failure_config=FailureConfig(max_failures=1 if restart else 0)),
    )  # fmt: skip
    t0 = time.time()
    result = trainer.fit()
    end = time.time()
    attempts = sorted(f for f in os.listdir(args.workdir) if f.startswith("rank0_a"))
    with open(os.path.join(args.workdir, attempts[-1])) as f:
        rank0 = json.load(f)
    report_s = []
    for name in attempts:
        with open(os.path.join(args.workdir, name)) as f:
            report_s += json.load(f)["report_s"]
    out: dict[str, Any] = {
        "variant": variant, "fit_s": end - t0, "end_wait_s": end - rank0["last_report_wall"],
        "report_ms": [s * 1000 for s in report_s], "lag_ms": [s * 1000 for s in lags],
        "sinks": {type(s).__name__: vars(s.stats()) | {"last_error": repr(s.stats().last_error)} for s in sinks
                  if hasattr(s, "stats")},
        "history_rows": len(result.metrics_history),
    }  # fmt: skip
    if restart and sinks:
        out["files_equal_history"] = files_equal_history(result)
    if any(type(s).__name__ == "WandbLoggerCallback" for s in sinks) or variant == "hand_wandb":
        import wandb

        wandb.teardown()
    write_json(args.out, out)


def files_equal_history(result: Any) -> bool:
    import csv

    rows = [{**r, "training_iteration": i + 1} for i, r in enumerate(result.metrics_history)]
    with open(os.path.join(result.path, "result.json")) as f:
        json_ok = [json.loads(line) for line in f] == rows
    with open(os.path.join(result.path, "progress.csv"), newline="") as f:
        csv_ok = [int(r["step"]) for r in csv.DictReader(f)] == [r["step"] for r in rows]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(result.path)
    acc.Reload()
    tb_ok = [(e.step, int(e.value)) for e in acc.Scalars("step")] == [
        (r["training_iteration"], r["step"]) for r in rows
    ]
    return json_ok and csv_ok and tb_ok


def hook_cost(n: int = 10_000) -> dict:
    """The driver's cost of ``on_report`` for one sink whose thread is busy (every result queued)."""
    import tempfile
    import threading

    from trainforge import Result, TrainingReport
    from trainforge.tune.logger import LoggerCallback

    gate = threading.Event()

    class Blocked(LoggerCallback):
        def log_trial_start(self, trial):  # type: ignore[no-untyped-def]
            gate.wait(60)

    sink = Blocked(queue_size=n)
    path = tempfile.mkdtemp()
    sink.on_run_start(path, 1)
    reports = [TrainingReport(index=i, metrics={"loss": 0.5, "step": i}, all_metrics=[], checkpoint=None)
               for i in range(n)]  # fmt: skip
    t = time.perf_counter()
    for r in reports:
        sink.on_report(r)
    per_call_us = (time.perf_counter() - t) / n * 1e6
    gate.set()
    sink.on_run_end(Result(metrics=None, checkpoint=None, error=None, path=path))
    return {"variant": "hook", "on_report_us": per_call_us, "queued": n, "logged": sink.stats().logged}


# --------------------------------------------------------------------------------------------------
# Orchestrator.
# --------------------------------------------------------------------------------------------------
def summarize(runs: dict[str, list[dict]]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for variant, rs in runs.items():
        ok = [r for r in rs if "error" not in r]
        if not ok:
            out[variant] = {"error": rs[0].get("error") if rs else "not run"}
            continue
        if variant == "hook":
            out[variant] = {"on_report_us": median(r["on_report_us"] for r in ok)}
            continue
        logged = [sum(s["logged"] for s in r["sinks"].values()) for r in ok]
        dropped = [sum(s["dropped"] for s in r["sinks"].values()) for r in ok]
        out[variant] = {
            "report_p50_ms": median(pct(r["report_ms"], 50) for r in ok),
            "report_p95_ms": median(pct(r["report_ms"], 95) for r in ok),
            "lag_p95_ms": median(pct(r["lag_ms"], 95) for r in ok),
            "fit_s": median(r["fit_s"] for r in ok),
            "end_wait_s": median(r["end_wait_s"] for r in ok),
            "logged": logged[-1], "dropped": dropped[-1], "sinks": len(ok[-1]["sinks"]),
            "files_equal_history": all(r.get("files_equal_history", True) for r in ok) if "restart" in variant else None,
            "runs": len(ok),
        }  # fmt: skip
    return out


def table(sm: dict[str, dict], reports: int) -> tuple[list[str], list[list[str]]]:
    header = ["variant", "report() p50 ms", "report() p95 ms", "p95 vs none", "report->on_report p95 ms",
              "fit() s", "end wait s", "logged/dropped", "goal", "status"]  # fmt: skip
    base = sm.get("none", {}).get("report_p95_ms")
    rows = []
    for variant in VARIANTS:
        s = sm.get(variant)
        if s is None:
            continue
        if "error" in s:
            rows.append([variant, *["-"] * 7, "", f"failed: {s['error']}"])
            continue
        delta = s["report_p95_ms"] - base if base is not None and s["report_p95_ms"] is not None else None
        goal, ok = "", None
        if variant == "slow_async":
            goal, ok = f"<= +{GOAL_MS:g} ms", delta is not None and delta <= GOAL_MS
        if s.get("files_equal_history") is not None:
            goal, ok = "files == history", s["files_equal_history"]
        counts = f"{s['logged']}/{s['dropped']}" if s["sinks"] else "-"
        rows.append([
            variant, fmt(s["report_p50_ms"], ".3f"), fmt(s["report_p95_ms"], ".3f"),
            "-" if variant == "none" or delta is None else f"{delta:+.3f}", fmt(s["lag_p95_ms"], ".1f"),
            fmt(s["fit_s"], ".2f"), fmt(s["end_wait_s"], ".2f"), counts, goal, status(ok),
        ])  # fmt: skip
    if "hook" in sm and "on_report_us" in sm["hook"]:
        rows.append(["on_report() of a sink (driver, in-process)", f"{sm['hook']['on_report_us']:.1f} µs",
                     *[""] * 8])  # fmt: skip
    return header, rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", default=",".join(VARIANTS + ["hook"]), help="comma list")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--reports", type=int, default=100, help="reports per worker")
    p.add_argument("--step-ms", type=float, default=10.0, help="sleep per step before each report")
    p.add_argument("--quick", action="store_true", help="1 repeat of 60 reports (~3 min)")
    p.add_argument(
        "--idle-wait", type=float, default=5.0, help="before each variant, wait up to this long for idle CPUs"
    )
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per variant subprocess")
    p.add_argument("--markdown", action="store_true", help="also print the table as Markdown")
    p.add_argument("--json-out", default=DEFAULT_JSON)
    p.add_argument("--variant", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--workdir", help=argparse.SUPPRESS)
    p.add_argument("--settings", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.variant:
        run_variant_here(args)
        return 0
    if args.quick:
        args.repeats, args.reports = 1, 60
    settings = {"reports": max(args.reports, 60), "step_ms": args.step_ms}  # restart_* kill at report 55
    chosen = [v for v in args.variants.split(",") if v]
    runs: dict[str, list[dict]] = {v: [] for v in chosen}
    t = time.time()
    for rep in range(args.repeats):
        for variant in chosen:  # variants alternate within each repeat
            print(f"[{rep + 1}/{args.repeats}] {variant} ...", file=sys.stderr, flush=True)
            env = {
                "WANDB_MODE": "offline",
                "WANDB_SILENT": "true",
                "MLFLOW_TRACKING_URI": "",
                "MLFLOW_EXPERIMENT_NAME": "",
            }
            os.environ.update({k: v for k, v in env.items() if v})
            for k, v in env.items():
                if not v:
                    os.environ.pop(k, None)
            extra = ["--settings", json.dumps(settings)]
            runs[variant].append(run_script_variant(__file__, variant, extra, args.idle_wait, args.timeout))
    sm = summarize(runs)
    header, rows = table(sm, settings["reports"])
    print()
    print(render_text(header, rows))
    if args.markdown:
        print()
        print(render_markdown(header, rows))
    data = {"settings": settings, "repeats": args.repeats, "summary": sm, "runs": runs, "machine": machine_info(),
            "git_commit": git_commit(), "date": time.strftime("%Y-%m-%d %H:%M:%S"), "wall_s": time.time() - t}  # fmt: skip
    os.makedirs(os.path.dirname(args.json_out), exist_ok=True)
    write_json(args.json_out, data)
    print(f"\nwrote {os.path.relpath(args.json_out)}", file=sys.stderr)
    failed = [v for v, s in sm.items() if "error" in s]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
