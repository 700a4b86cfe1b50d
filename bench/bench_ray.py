#!/usr/bin/env python
"""Ray benchmark: trainforge on Ray actors vs trainforge on local processes vs raw torch DDP vs Ray
Train's ``ray.train.torch.TorchTrainer``, one run, the same local Ray instance and workload.

    python bench/bench_ray.py [--repeats 3] [--markdown]

Workload: ``bench_core.py``'s MLP (64-256-256-10, batch 64, SGD), 2 CPU workers, gloo. Frameworks:

- ``tf_ray``: trainforge, ``ScalingConfig(executor="ray")``;
- ``tf_local``: trainforge, local worker processes;
- ``raw``: ``torch.multiprocessing.spawn`` + DistributedDataParallel (``bench_core.drive_raw``);
- ``ray_train``: Ray Train 2.x ``TorchTrainer`` (``ray.train`` is imported here only, never by trainforge).

Figures:

1. time to first step, cold: from just before ``fit()`` (after ``import torch``) until rank 0 finished its
   first ``optimizer.step()``; the Ray frameworks start Ray inside ``fit()`` (no cluster running);
2. time to first step, Ray already up: the same, with the driver connected (``ray.init(address=...)``
   before the clock starts) to a Ray instance started once for the benchmark (``ray start --head``,
   2 CPUs, 127.0.0.1); the local frameworks do not use Ray (their cold numbers are repeated);
3. throughput with ``report({"loss", "step"})`` every step (steps/s; raw DDP does not report). Ray Train
   runs ``--ray-train-steps`` steps only: each of its reports takes seconds;
4. ``report()`` cost, µs per metrics-only call in a loop in a worker (Ray Train: ``--ray-train-report-calls``);
5. recovery after a worker crash: rank 1 calls ``os._exit(1)`` right after a checkpoint report; time from
   its death to rank 0's first ``optimizer.step()`` in the restarted group (``max_failures=1``);
6. peak RSS of the process tree during the throughput runs, Ray's processes included (the driver,
   its descendants, and every process of the Ray instance: raylet, GCS, agents, pooled workers, actors).

Steps 2-6 use the shared Ray instance. Every measurement runs in a fresh driver subprocess; variants
alternate; the table shows medians. Results go to ``bench/results/ray.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
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
    RAY_ENV,
    TreeRssSampler,
    finish,
    fmt,
    free_port,
    git_commit,
    machine_info,
    median,
    noise_warning,
    render_markdown,
    render_text,
    run_script_variant,
    write_json,
)

DEFAULT_JSON = os.path.join(BENCH_DIR, "results", "ray.json")
FRAMEWORKS = ("tf_ray", "tf_local", "raw", "ray_train")
LABELS = {"tf_ray": "trainforge on Ray", "tf_local": "trainforge local", "raw": "raw DDP", "ray_train": "Ray Train"}
METRICS = ("first_step_cold", "first_step_warm", "throughput", "report_cost", "recovery")
RAY_FRAMEWORKS = ("tf_ray", "ray_train")


# --------------------------------------------------------------------------------------------------
# Worker loops: the same code for trainforge and Ray Train (config["api"] picks the module). Results go
# to JSON files written by rank 0 (Ray Train's Result keeps no metrics-only reports).
# --------------------------------------------------------------------------------------------------
def _api(name: str) -> tuple[Any, Any, Any]:
    if name == "ray":
        import ray.train as train
        from ray.train import Checkpoint
        from ray.train.torch import prepare_model
    else:
        import trainforge as train
        from trainforge import Checkpoint
        from trainforge.torch import prepare_model
    return train, prepare_model, Checkpoint


def first_step_loop(config: dict) -> None:
    t_entry = time.time()
    train, prepare_model, _ = _api(config["api"])
    rank = train.get_context().get_world_rank()
    model = prepare_model(core.make_mlp())
    opt = torch.optim.SGD(model.parameters(), lr=core.LR)
    loss = core.train_step(model, opt, nn.CrossEntropyLoss(), core.make_batches(rank, n=1)[0])
    t_step = time.time()
    if rank == 0:
        write_json(os.path.join(config["out_dir"], "first_step.json"),
                   {"t_step": t_step, "t_entry": t_entry, "loss": loss.item(), "pid": os.getpid()})  # fmt: skip
    train.report({"loss": loss.item()})


def throughput_loop(config: dict) -> None:
    train, prepare_model, _ = _api(config["api"])
    rank = train.get_context().get_world_rank()
    model = prepare_model(core.make_mlp())
    opt = torch.optim.SGD(model.parameters(), lr=core.LR)

    def on_step(loss_value: float, i: int) -> None:
        train.report({"loss": loss_value, "step": i})

    timing = core.timed_loop(
        model, opt, nn.CrossEntropyLoss(), core.make_batches(rank), config["steps"], config["warmup"], on_step,
        chunks=min(10, config["steps"]),
    )  # fmt: skip
    if rank == 0:
        write_json(os.path.join(config["out_dir"], "throughput.json"), {**timing, "steps": config["steps"]})


def report_cost_loop(config: dict) -> None:
    train, _, _ = _api(config["api"])
    rank = train.get_context().get_world_rank()
    calls, chunk = config["calls"], config["chunk"]
    for i in range(config["warmup_calls"]):
        train.report({"loss": 0.1, "step": i})
    chunks_us = []
    for _ in range(calls // chunk):
        t = time.perf_counter()
        for i in range(chunk):
            train.report({"loss": 0.1, "step": i})
        chunks_us.append((time.perf_counter() - t) / chunk * 1e6)
    if rank == 0:
        write_json(os.path.join(config["out_dir"], "report_cost.json"),
                   {"report_us": statistics.median(chunks_us), "chunks_us": chunks_us, "calls": calls})  # fmt: skip


def recovery_loop(config: dict) -> None:
    """Checkpoint every ``ckpt_every`` steps; rank 1 dies right after the ``die_at`` checkpoint (once);
    rank 0 of the restarted group records its first step."""
    t_entry = time.time()
    train, prepare_model, Checkpoint = _api(config["api"])
    rank = train.get_context().get_world_rank()
    death = os.path.join(config["out_dir"], "death.json")
    restarted = os.path.exists(death)
    model = core.make_mlp()
    start = 0
    checkpoint = train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"))
        model.load_state_dict(state["model"])
        start = state["step"]
    model = prepare_model(model)
    opt = torch.optim.SGD(model.parameters(), lr=core.LR)
    loss_fn = nn.CrossEntropyLoss()
    batches = core.make_batches(rank)
    for step in range(start, config["steps"]):
        core.train_step(model, opt, loss_fn, batches[step % len(batches)])
        if restarted and step == start and rank == 0:
            write_json(os.path.join(config["out_dir"], "first_step_after.json"),
                       {"t_step": time.time(), "t_entry": t_entry, "resumed_from_step": start})  # fmt: skip
        if (step + 1) % config["ckpt_every"] == 0:
            d = tempfile.mkdtemp(prefix="bench-ckpt-")
            try:
                if rank == 0:
                    torch.save({"model": getattr(model, "module", model).state_dict(), "step": step + 1},
                               os.path.join(d, "state.pt"))  # fmt: skip
                train.report({"step": step + 1}, checkpoint=Checkpoint.from_directory(d) if rank == 0 else None)
            finally:
                shutil.rmtree(d, ignore_errors=True)
        if not restarted and rank == 1 and step + 1 == config["die_at"]:
            write_json(death, {"t_death": time.time()})
            os._exit(1)


# --------------------------------------------------------------------------------------------------
# Driver side of one variant (a fresh subprocess).
# --------------------------------------------------------------------------------------------------
class RaySampler(TreeRssSampler):
    """Peak summed RSS of this process, its descendants and every process of the Ray instance."""

    def _run(self) -> None:
        psutil = self._psutil
        me = psutil.Process()
        while True:
            procs = {me.pid: me}
            try:
                procs.update({p.pid: p for p in me.children(recursive=True)})
            except psutil.Error:
                pass
            for p in psutil.process_iter(["name", "cmdline"]):
                name, cmd = p.info.get("name") or "", " ".join(p.info.get("cmdline") or [])
                if name.startswith("ray::") or name in ("raylet", "gcs_server") or "/tmp/ray/session_" in cmd:
                    procs.setdefault(p.pid, p)
            total = 0
            for p in procs.values():
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
            self.samples += 1
            if total > self.peak_bytes:
                self.peak_bytes, self.peak_nprocs = total, len(procs)
            if self._stop.wait(self._interval_s):
                return


def _trainer(framework: str, loop: Any, config: dict, workdir: str, max_failures: int = 0) -> Any:
    storage = os.path.join(workdir, "storage")
    if framework == "ray_train":
        from ray.train import FailureConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer

        rc = RunConfig(storage_path=storage, name="bench", failure_config=FailureConfig(max_failures=max_failures))
        return TorchTrainer(loop, train_loop_config={**config, "api": "ray"},
                            scaling_config=ScalingConfig(num_workers=core.WORLD_SIZE), run_config=rc)  # fmt: skip
    from trainforge import FailureConfig, RunConfig, ScalingConfig
    from trainforge.torch import TorchTrainer

    executor = "ray" if framework == "tf_ray" else "local"
    rc = RunConfig(storage_path=storage, name="bench", verbose=0, failure_config=FailureConfig(max_failures=max_failures))
    return TorchTrainer(loop, train_loop_config={**config, "api": "trainforge"},
                        scaling_config=ScalingConfig(num_workers=core.WORLD_SIZE, executor=executor),
                        run_config=rc)  # fmt: skip


def _read(out_dir: str, name: str) -> dict:
    path = os.path.join(out_dir, name)
    if not os.path.exists(path):
        raise RuntimeError(f"{name} was not written (the run did not get there): {os.listdir(out_dir)}")
    with open(path) as f:
        return json.load(f)


def drive(framework: str, metric: str, args: argparse.Namespace) -> dict:
    if framework == "raw":
        kind = "first_step" if metric.startswith("first_step") else metric
        return core.drive_raw(kind, argparse.Namespace(workdir=args.workdir, steps=args.steps, warmup=args.warmup))
    out_dir = os.path.join(args.workdir, "out")
    os.makedirs(out_dir)
    ray_train = framework == "ray_train"
    if framework in RAY_FRAMEWORKS and metric != "first_step_cold":
        import ray

        ray.init(address=os.environ["RAY_ADDRESS"])  # Ray already up: connect before the clock starts
    config: dict[str, Any] = {"out_dir": out_dir}
    if metric.startswith("first_step"):
        loop, result_file = first_step_loop, "first_step.json"
    elif metric == "throughput":
        loop, result_file = throughput_loop, "throughput.json"
        config.update(steps=args.ray_train_steps if ray_train else args.steps,
                      warmup=args.ray_train_warmup if ray_train else args.warmup)  # fmt: skip
    elif metric == "report_cost":
        loop, result_file = report_cost_loop, "report_cost.json"
        config.update(
            calls=args.ray_train_report_calls if ray_train else args.report_calls,
            chunk=max(1, args.ray_train_report_calls // 2) if ray_train else args.report_chunk,
            warmup_calls=2 if ray_train else 200,
        )
    elif metric == "recovery":
        loop, result_file = recovery_loop, "first_step_after.json"
        config.update(steps=args.recovery_steps, ckpt_every=args.ckpt_every, die_at=args.die_at)
    else:
        raise ValueError(metric)
    trainer = _trainer(framework, loop, config, args.workdir, max_failures=1 if metric == "recovery" else 0)
    sampler = RaySampler() if framework in RAY_FRAMEWORKS else TreeRssSampler()
    with sampler as rss:
        t0 = time.time()
        result = trainer.fit()
        t_end = time.time()
    error = getattr(result, "error", None)
    if error is not None:
        raise RuntimeError(f"{framework} run failed: {error!r}")
    out = {"t0": t0, "t_end": t_end, "worker": _read(out_dir, result_file), **rss.as_dict()}
    if metric == "recovery":
        out["death"] = _read(out_dir, "death.json")
    return out


def run_variant_here(args: argparse.Namespace) -> None:
    framework, metric = args.variant.split(":")
    os.environ.update(RAY_ENV)
    write_json(args.out, drive(framework, metric, args))


# --------------------------------------------------------------------------------------------------
# Orchestrator.
# --------------------------------------------------------------------------------------------------
class SharedRay:
    """``ray start --head`` once (2 CPUs, 127.0.0.1); ``ray stop`` at the end."""

    def __init__(self) -> None:
        self.address = f"127.0.0.1:{free_port()}"
        self._ray = os.path.join(os.path.dirname(sys.executable), "ray")

    def __enter__(self) -> SharedRay:
        env = {**os.environ, **RAY_ENV}
        subprocess.run(
            [self._ray, "start", "--head", f"--port={self.address.rsplit(':', 1)[1]}", "--node-ip-address=127.0.0.1",
             f"--num-cpus={core.WORLD_SIZE}", "--include-dashboard=false", "--disable-usage-stats"],
            check=True, env=env, capture_output=True, timeout=120,
        )  # fmt: skip
        os.environ["RAY_ADDRESS"] = self.address
        return self

    def __exit__(self, *exc: Any) -> None:
        os.environ.pop("RAY_ADDRESS", None)
        subprocess.run([self._ray, "stop", "--force"], capture_output=True, timeout=120)


def run_variant(variant: str, args: argparse.Namespace) -> dict:
    extra = [
        "--steps", str(args.steps), "--warmup", str(args.warmup), "--report-calls", str(args.report_calls),
        "--report-chunk", str(args.report_chunk), "--ray-train-steps", str(args.ray_train_steps),
        "--ray-train-warmup", str(args.ray_train_warmup), "--ray-train-report-calls", str(args.ray_train_report_calls),
        "--recovery-steps", str(args.recovery_steps), "--ckpt-every", str(args.ckpt_every), "--die-at", str(args.die_at),
    ]  # fmt: skip
    return run_script_variant(__file__, variant, extra, args.idle_wait, args.timeout)


def derive(framework: str, metric: str, run: dict) -> dict:
    if "error" in run:
        return {}
    if framework == "raw":
        m = run["metrics"]
        if metric.startswith("first_step"):
            return {"value": m["first_step_t"] - run["t0"]}
        return {"value": m["steps_per_s"], "peak_rss_mb": run["peak_rss_mb"]}
    w = run["worker"]
    if metric.startswith("first_step"):
        return {"value": w["t_step"] - run["t0"], "driver_returned_s": run["t_end"] - run["t0"]}
    if metric == "throughput":
        return {"value": w["steps_per_s"], "peak_rss_mb": run["peak_rss_mb"], "steps": w["steps"],
                "cpu_ms_per_step": w["cpu_ms_per_step"]}  # fmt: skip
    if metric == "report_cost":
        return {"value": w["report_us"]}
    if metric == "recovery":
        return {"value": w["t_step"] - run["death"]["t_death"], "resumed_from_step": w["resumed_from_step"]}
    raise ValueError(metric)


def summarize(runs: dict[str, list[dict]]) -> dict[str, dict[str, float | None]]:
    out: dict[str, dict[str, float | None]] = {}
    for metric in METRICS:
        out[metric] = {}
        for fw in FRAMEWORKS:
            source = metric
            if metric == "first_step_warm" and fw not in RAY_FRAMEWORKS:
                source = "first_step_cold"  # no Ray involved: the same measurement
            out[metric][fw] = median(derive(fw, source, r).get("value") for r in runs.get(f"{fw}:{source}", []))
    out["peak_rss_mb"] = {
        fw: median(derive(fw, "throughput", r).get("peak_rss_mb") for r in runs.get(f"{fw}:throughput", []))
        for fw in FRAMEWORKS
    }
    return out


ROWS = [
    ("first_step_cold", "time to first step, cold (s)", ".2f", "lower"),
    ("first_step_warm", "time to first step, Ray already up (s)", ".2f", "lower"),
    ("throughput", "steps/s, report() every step", ".1f", "higher"),
    ("report_cost", "report() cost (us/call)", ".1f", "lower"),
    ("recovery", "recovery after a worker crash (s)", ".2f", "lower"),
    ("peak_rss_mb", "peak RSS, process tree incl. Ray (MB)", ".0f", "lower"),
]


def table(summary: dict) -> tuple[list[str], list[list[str]]]:
    header = ["metric", *(LABELS[fw] for fw in FRAMEWORKS), "tf-on-Ray vs Ray Train", "target"]
    rows = []
    for key, label, spec, better in ROWS:
        values = summary[key]
        ours, theirs = values.get("tf_ray"), values.get("ray_train")
        if ours is None or theirs is None:
            verdict = "-"
        else:
            ratio = theirs / ours if better == "lower" else ours / theirs
            ok = ours <= theirs if better == "lower" else ours >= theirs
            verdict = f"{ratio:.1f}x {'better' if ratio >= 1 else 'worse'}"
            verdict += " PASS" if ok else " MISS"
        cells = [fmt(values.get(fw), spec) if not (key == "report_cost" and fw == "raw") else "n/a" for fw in FRAMEWORKS]
        if key == "recovery":
            cells[FRAMEWORKS.index("raw")] = "n/a"
        rows.append([label, *cells, verdict, "<= Ray Train" if better == "lower" else ">= Ray Train"])
    return header, rows


NOTES = [
    "2 workers, gloo, CPU; MLP 64-256-256-10, batch 64, SGD, synthetic data; each run in a fresh driver process.",
    "cold: the driver starts Ray inside fit() (trainforge executor='ray' calls ray.init(); Ray Train auto-inits). "
    "Ray already up: the driver connected to a running `ray start --head --num-cpus=2` instance before the clock.",
    "the local frameworks (trainforge local, raw DDP) do not use Ray: their cold time is shown in both rows.",
    "steps/s and report() cost: Ray Train runs fewer steps/calls (see settings) because each report() blocks for seconds.",
    "recovery: rank 1 os._exit(1)s right after a checkpoint report; from its death to rank 0's first step after restart.",
    "peak RSS: driver + descendants + every process of the Ray instance (raylet, GCS, agents, pooled workers, actors), "
    "sampled every 50 ms during the throughput runs.",
]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--report-calls", type=int, default=20_000)
    p.add_argument("--report-chunk", type=int, default=2_000)
    p.add_argument("--ray-train-steps", type=int, default=10, help="timed steps for Ray Train's throughput")
    p.add_argument("--ray-train-warmup", type=int, default=2)
    p.add_argument("--ray-train-report-calls", type=int, default=10)
    p.add_argument("--recovery-steps", type=int, default=60)
    p.add_argument("--ckpt-every", type=int, default=20)
    p.add_argument("--die-at", type=int, default=20)
    p.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    p.add_argument("--metrics", default=",".join(METRICS))
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--json-out", default=DEFAULT_JSON)
    p.add_argument("--idle-wait", type=float, default=30)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--variant", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--workdir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.variant:
        run_variant_here(args)
        return 0

    frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    for name, allowed, got in (("frameworks", FRAMEWORKS, frameworks), ("metrics", METRICS, metrics)):
        bad = sorted(set(got) - set(allowed))
        if bad:
            p.error(f"--{name}: unknown {bad}; choose from {','.join(allowed)}")
    os.environ.update(RAY_ENV)
    os.environ.pop("RAY_ADDRESS", None)

    def plan(metric: str) -> list[str]:
        fws = [fw for fw in frameworks if not (fw == "raw" and metric in ("report_cost", "recovery"))]
        if metric == "first_step_warm":
            fws = [fw for fw in fws if fw in RAY_FRAMEWORKS]
        return [f"{fw}:{metric}" for fw in fws]

    runs: dict[str, list[dict]] = {}

    def run_all(metric_list: list[str]) -> None:
        for metric in metric_list:
            for rep in range(args.repeats):
                for variant in plan(metric):
                    print(f"[{rep + 1}/{args.repeats}] {variant} ...", file=sys.stderr, flush=True)
                    runs.setdefault(variant, []).append(run_variant(variant, args))

    run_all([m for m in metrics if m == "first_step_cold"])  # no Ray instance running
    warm = [m for m in metrics if m != "first_step_cold"]
    if warm:
        with SharedRay():
            run_all(warm)

    summary = summarize(runs)
    header, rows = table(summary)
    commit, date = git_commit(), datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    info = machine_info()
    try:
        import ray

        info["ray"] = ray.__version__
    except ImportError:
        info["ray"] = "not installed"
    print(f"\ntrainforge Ray benchmark  {date}  commit {commit}  python {info['python']}  torch {info['torch']}  "
          f"ray {info['ray']}  {info['cpu_count']} CPUs  repeats={args.repeats}\n")  # fmt: skip
    print(render_text(header, rows))
    # Ray's own processes (its daemons are not our children, or not reaped) count as "other processes"
    # in a Ray run's accounting: the check is meaningful for the local frameworks only.
    warning = noise_warning({v: rs for v, rs in runs.items() if v.split(":")[0] not in RAY_FRAMEWORKS})
    if warning:
        print("\n" + warning)
    print("\nnotes:\n" + "\n".join(f"- {n}" for n in NOTES))
    if args.markdown:
        print("\n" + render_markdown(header, rows))
    failed = {v: [r for r in rs if "error" in r] for v, rs in runs.items()}
    failed = {v: rs for v, rs in failed.items() if rs}
    os.makedirs(os.path.dirname(os.path.abspath(args.json_out)), exist_ok=True)
    return finish(
        args.json_out,
        {
            "benchmark": "ray",
            "date": date,
            "git_commit": commit,
            "machine": info,
            "settings": {k: v for k, v in vars(args).items() if k not in ("variant", "out", "workdir")},
            "summary": summary,
            "table": {"header": header, "rows": rows},
            "runs": {v: [{**r, "derived": derive(v.split(":")[0], v.split(":")[1], r)} for r in rs]
                     for v, rs in runs.items()},  # fmt: skip
            "notes": NOTES,
        },
        failed,
    )


if __name__ == "__main__":
    sys.exit(main())
