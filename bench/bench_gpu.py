#!/usr/bin/env python
"""One GPU worker: trainforge's ``TorchTrainer`` vs a raw torch loop, mixed precision, the usage sampler.

    python bench/bench_gpu.py [--quick] [--repeats 3] [--markdown] [--require-gpu] [--json-out PATH]

The workload keeps the GPU busy: an MLP of ``--depth`` (8) layers ``--width`` (4096) wide (134 M
parameters), synthetic data already on the GPU, batch ``--batch`` (512), SGD with momentum. Each
variant runs in a fresh driver process (``--variant``), variants alternating, medians shown:

- ``raw``: a plain loop in the driver process (model to ``cuda``, forward, backward, step,
  ``loss.item()`` every step);
- ``trainforge``: the same loop in ``TorchTrainer`` on one worker with ``use_gpu=True``
  (``prepare_model``), plus ``trainforge.report({"loss", "step"})`` every step;
- ``trainforge-fp16`` / ``trainforge-bf16``: that loop with ``accelerate(amp=True)`` (float16 with a
  gradient scaler) or ``amp_dtype="bfloat16"``.

Measured: the **step time** over ``--steps`` steps after ``--warmup`` (CUDA synchronised at both
ends), trainforge / raw as a **speed ratio** (raw step time / trainforge step time; goal >= 0.98); the
**AMP speed-up** (fp32 step time / AMP step time, both through trainforge); the **time to first
step** (wall time from just before the loop is set up, or ``fit()`` is called, to the end of the
first optimizer step: trainforge's includes starting the worker process and its CUDA context); and
the dashboard's **usage sampler** cost: one NVML reading of every GPU's processes
(``trainforge.server.jobs.usage._Gpus.sample``, as the server takes every second), median of
``--samples`` (200) calls while this process holds GPU memory.

Prints a table (``--markdown`` for Markdown) and writes every number to ``bench/results/gpu.json``.
``--quick`` (what scripts/gpu_check.sh runs, well under 2 minutes): one repeat, 10 warm-up and 60
timed steps. Without a CUDA device it says so and exits 0 (``--require-gpu``: exit 2).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from typing import Any

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH_DIR)

from _common import (  # noqa: E402
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

RESULTS = os.path.join(BENCH_DIR, "results", "gpu.json")
VARIANTS = ("raw", "trainforge", "trainforge-fp16", "trainforge-bf16")
STEP_RATIO_GOAL = 0.98


# --------------------------------------------------------------------------------------------------
# The loop (run by the raw driver itself, or by trainforge's worker).
# --------------------------------------------------------------------------------------------------
def _net(width: int, depth: int) -> Any:
    import torch

    torch.manual_seed(0)
    layers: list[Any] = []
    for _ in range(depth - 1):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 10))


def train_loop(config: dict[str, Any]) -> None:
    """``steps + warmup`` steps; writes ``{"first_step_end", "step_s"}`` to ``config["out"]``."""
    import torch

    on_cuda = config["device"] == "cuda"
    in_trainforge = config["mode"] != "raw"
    report: Any = None
    backward: Any = None
    if in_trainforge:
        import trainforge
        from trainforge.torch import accelerate, get_device, prepare_model, prepare_optimizer
        from trainforge.torch import backward as scaled_backward

        if config["amp"]:
            accelerate(amp=True, amp_dtype=config["amp"])
        device = get_device()
        model = prepare_model(_net(config["width"], config["depth"]))
        opt = prepare_optimizer(torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9))
        report, backward = trainforge.report, scaled_backward
    else:
        device = torch.device("cuda", 0) if on_cuda else torch.device("cpu")
        model = _net(config["width"], config["depth"]).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
        backward = torch.Tensor.backward

    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(config["batch"], config["width"], device=device, generator=g)
    y = torch.randint(0, 10, (config["batch"],), device=device, generator=g)
    loss_fn = torch.nn.CrossEntropyLoss()
    first_step_end = None
    t0 = 0.0
    for step in range(config["warmup"] + config["steps"]):
        if step == config["warmup"]:
            if on_cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x).float(), y)
        backward(loss)
        opt.step()
        value = loss.item()  # both loops wait for the step here, as a loop that logs its loss does
        if first_step_end is None:
            first_step_end = time.time()
        if report is not None:
            report({"loss": value, "step": step})
    if on_cuda:
        torch.cuda.synchronize()
    step_s = (time.perf_counter() - t0) / config["steps"]
    with open(config["out"], "w") as f:
        json.dump({"first_step_end": first_step_end, "step_s": step_s, "device": str(device),
                   "gpu": torch.cuda.get_device_name(device) if on_cuda else None}, f)  # fmt: skip


# --------------------------------------------------------------------------------------------------
# Driver side: one variant per fresh process.
# --------------------------------------------------------------------------------------------------
def run_variant(variant: str, out: str, workdir: str, args: argparse.Namespace) -> None:
    worker_out = os.path.join(workdir, "worker.json")
    amp = {"trainforge-fp16": "float16", "trainforge-bf16": "bfloat16"}.get(variant)
    device = "cpu" if args.smoke_on_cpu else "cuda"
    config = {"mode": "raw" if variant == "raw" else "trainforge", "amp": amp, "out": worker_out, "device": device,
              "width": args.width, "depth": args.depth, "batch": args.batch, "warmup": args.warmup,
              "steps": args.steps}  # fmt: skip
    import torch  # noqa: F401  (both variants start the clock with torch imported)

    t0 = time.time()
    if variant == "raw":
        train_loop(config)
    else:
        from trainforge import RunConfig, ScalingConfig
        from trainforge.torch import TorchTrainer

        scaling = ScalingConfig(num_workers=1, use_gpu=device == "cuda")
        TorchTrainer(train_loop, train_loop_config=config, scaling_config=scaling,
                     run_config=RunConfig(storage_path=os.path.join(workdir, "runs"), name="gpu", verbose=0)).fit()  # fmt: skip
    with open(worker_out) as f:
        result = json.load(f)
    result["first_step_s"] = result.pop("first_step_end") - t0
    result["wall_s"] = time.time() - t0
    with open(out, "w") as f:
        json.dump(result, f)


def sampler_cost(samples: int) -> dict[str, Any]:
    """Seconds per NVML reading of every GPU's processes, while this process holds 256 MiB there."""
    import torch

    try:
        from trainforge.server.jobs.usage import _Gpus
    except ImportError as exc:  # the server's dependencies (fastapi) are not installed
        return {"error": f"trainforge.server is not importable here ({exc}): pip install 'trainforge[server]'"}
    t = time.perf_counter()
    gpus = _Gpus()
    init_s = time.perf_counter() - t
    if gpus.problem:
        return {"error": gpus.problem, "init_s": init_s}
    held = torch.ones(256 * 2**20, dtype=torch.uint8, device="cuda") if torch.cuda.is_available() else None
    times, seen = [], False
    for _ in range(samples):
        t = time.perf_counter()
        reading = gpus.sample()
        times.append(time.perf_counter() - t)
        seen = seen or os.getpid() in reading
    del held
    return {"init_s": init_s, "sample_s": statistics.median(times), "samples": samples, "sees_this_process": seen}


def summarize(runs: dict[str, list[dict[str, Any]]], sampler: dict[str, Any]) -> dict[str, Any]:
    def med(variant: str, key: str) -> float | None:
        return median(r.get(key) for r in runs.get(variant, []) if "error" not in r)

    step = {v: med(v, "step_s") for v in VARIANTS}
    raw, tf = step["raw"], step["trainforge"]
    ratio = raw / tf if raw and tf else None
    return {
        "step_ms": {v: (s * 1e3 if s else None) for v, s in step.items()},
        "step_ratio": ratio,  # raw step time / trainforge step time: >= 0.98 is the goal
        "step_ratio_ok": ratio >= STEP_RATIO_GOAL if ratio is not None else None,
        "amp_speedup_fp16": tf / step["trainforge-fp16"] if tf and step["trainforge-fp16"] else None,
        "amp_speedup_bf16": tf / step["trainforge-bf16"] if tf and step["trainforge-bf16"] else None,
        "first_step_s": {v: med(v, "first_step_s") for v in ("raw", "trainforge")},
        "sampler_ms": sampler["sample_s"] * 1e3 if "sample_s" in sampler else None,
    }


def table(summary: dict[str, Any], runs: dict[str, list[dict[str, Any]]], markdown: bool) -> str:
    step, first = summary["step_ms"], summary["first_step_s"]
    rows = [[v, fmt(step[v], ".2f"), fmt(first.get(v), ".2f"), str(sum("error" not in r for r in runs.get(v, [])))]
            for v in VARIANTS]  # fmt: skip
    header = ["variant", "step ms", "first step s", "runs"]
    goals = [
        ["speed vs raw (raw/trainforge)", fmt(summary["step_ratio"], ".3f"), f">= {STEP_RATIO_GOAL}",
         status(summary["step_ratio_ok"])],
        ["AMP float16 speed-up", fmt(summary["amp_speedup_fp16"], ".2f"), "(informational)", "-"],
        ["AMP bfloat16 speed-up", fmt(summary["amp_speedup_bf16"], ".2f"), "(informational)", "-"],
        ["usage sampler (NVML) ms/sample", fmt(summary["sampler_ms"], ".3f"), "(informational)", "-"],
    ]  # fmt: skip
    render = render_markdown if markdown else render_text
    return render(header, rows) + "\n\n" + render(["metric", "value", "goal", "status"], goals)


def cuda_problem() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device"
    return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="one repeat, 10 warm-up and 60 timed steps (< 2 minutes)")
    p.add_argument("--repeats", type=int, help="runs of each variant (3; --quick: 1)")
    p.add_argument("--steps", type=int, help="timed steps (300; --quick: 60)")
    p.add_argument("--warmup", type=int, help="steps before the timed ones (20; --quick: 10)")
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--samples", type=int, help="usage sampler readings to time (200; --quick: 100)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds a variant may take")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--require-gpu", action="store_true", help="exit 2 (not 0) when there is no CUDA device")
    p.add_argument("--json-out", default=RESULTS)
    # A smoke run of this script on the CPU (tests/test_gpu_readiness.py): its figures mean nothing.
    p.add_argument("--smoke-on-cpu", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--variant", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--workdir", help=argparse.SUPPRESS)
    args = p.parse_args()
    defaults = {"repeats": 1, "warmup": 10, "steps": 60, "samples": 100} if args.quick else \
        {"repeats": 3, "warmup": 20, "steps": 300, "samples": 200}  # fmt: skip
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.variant:
        run_variant(args.variant, args.out, args.workdir, args)
        return 0
    problem = None if args.smoke_on_cpu else cuda_problem()
    if problem is not None:
        print(f"bench_gpu: no CUDA device ({problem}): nothing measured, {os.path.relpath(args.json_out)} left as it "
              "was. Run it on a GPU machine (bash scripts/gpu_check.sh OUTDIR runs it there).")  # fmt: skip
        return 2 if args.require_gpu else 0
    extra = [f"--{k}={getattr(args, k)}" for k in ("width", "depth", "batch", "warmup", "steps")]
    extra += ["--smoke-on-cpu"] if args.smoke_on_cpu else []
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for r in range(args.repeats):
        for v in VARIANTS:
            print(f"[{r + 1}/{args.repeats}] {v} ...", file=sys.stderr, flush=True)
            runs[v].append(run_script_variant(__file__, v, extra, idle_wait_s=0, timeout_s=args.timeout))
    sampler = sampler_cost(args.samples)
    summary = summarize(runs, sampler)
    print(table(summary, runs, args.markdown))
    if "error" in sampler:
        print(f"usage sampler: {sampler['error']}")
    import torch

    data = {
        "benchmark": "gpu", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": os.environ.get("GPU_CHECK_COMMIT") or git_commit(), "machine": machine_info(),
        "gpu": {"name": torch.cuda.get_device_name(0), "cuda": torch.version.cuda,
                "memory_gb": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)}
        if not args.smoke_on_cpu else {"name": None, "smoke_on_cpu": True},
        "config": {k: getattr(args, k) for k in ("quick", "repeats", "steps", "warmup", "width", "depth", "batch")},
        "runs": runs, "sampler": sampler, "summary": summary,
    }  # fmt: skip
    os.makedirs(os.path.dirname(os.path.abspath(args.json_out)), exist_ok=True)
    write_json(args.json_out, data)
    print(f"\nwrote {os.path.relpath(args.json_out)}", file=sys.stderr)
    failed = [v for v, rs in runs.items() if any("error" in r for r in rs)]
    if failed:
        print(f"failed runs: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
