"""The core benchmark's workload and raw-DDP variants, shared by ``bench_core.py``, ``bench_ray.py`` and
``bench_recovery.py`` (no benchmark script imports another): the MLP (64-256-256-10), its synthetic
batches and training step, the timed loop, the raw torch DDP workers and their driver, running one of
``bench_core.py``'s variants in a fresh process, and what a run contributes to the table.

Imports torch at module level: only the variant processes and scripts that train import this.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from _common import BENCH_DIR, TreeRssSampler, free_port, proc_start_wall, run_script_variant, write_json
from torch.nn.parallel import DistributedDataParallel

CORE_SCRIPT = os.path.join(BENCH_DIR, "bench_core.py")

WORLD_SIZE = 2
BATCH = 64
IN_DIM, HIDDEN, OUT_DIM = 64, 256, 10
LR = 0.01
N_BATCHES = 16  # pre-generated synthetic batches, cycled

# Ray Train's report() blocks for ~2 s (Ray 2.60): its throughput and report() cost variants run this
# many steps / calls (as bench_ray.py does); the table labels its cells with the count.
RAY_TRAIN_STEPS, RAY_TRAIN_WARMUP, RAY_TRAIN_REPORT_CALLS = 10, 2, 10


# --------------------------------------------------------------------------------------------------
# The model, its data and its step.
# --------------------------------------------------------------------------------------------------
def make_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(IN_DIM, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT_DIM)
    )


def make_batches(rank: int, n: int = N_BATCHES) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1234 + rank)
    return [
        (torch.randn(BATCH, IN_DIM, generator=g), torch.randint(0, OUT_DIM, (BATCH,), generator=g))
        for _ in range(n)
    ]


def train_step(
    model: nn.Module, opt: torch.optim.Optimizer, loss_fn: nn.Module, batch: tuple
) -> torch.Tensor:
    x, y = batch
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    return loss


def timed_loop(model, opt, loss_fn, batches, steps: int, warmup: int, on_step, chunks: int = 10) -> dict:
    """Run warmup + timed steps; ``on_step(loss_value, i)`` after each.

    Returns steps/s over all timed steps, steps/s of each of ``chunks`` equal slices (to see noise
    from other processes) and this process's CPU time per step (all its threads; waiting for the
    other rank does not count, so this stays meaningful on a busy machine).
    """
    for i in range(warmup):
        on_step(train_step(model, opt, loss_fn, batches[i % len(batches)]).item(), i)
    bounds = [warmup + steps * k // chunks for k in range(chunks + 1)]
    chunk_rates = []
    cpu0 = time.process_time()
    t = time.perf_counter()
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        tc = time.perf_counter()
        for i in range(lo, hi):
            on_step(train_step(model, opt, loss_fn, batches[i % len(batches)]).item(), i)
        chunk_rates.append((hi - lo) / (time.perf_counter() - tc))
    elapsed = time.perf_counter() - t
    return {
        "steps_per_s": steps / elapsed,
        "chunk_steps_per_s": chunk_rates,
        "cpu_ms_per_step": (time.process_time() - cpu0) / steps * 1e3,
    }


# --------------------------------------------------------------------------------------------------
# Raw DDP workers (module level so that mp.spawn children can unpickle them).
# --------------------------------------------------------------------------------------------------
def _raw_teardown() -> None:
    """End a raw worker cleanly; the caller has already dropped its DDP model (``del model``).

    DDP's reducer holds the process group: while the model lives, ``destroy_process_group()`` leaves
    gloo's threads to the interpreter's exit, where they may abort the process with SIGABRT
    ("terminate called without an active exception") and the repeat is lost. So: model gone (and
    collected), a barrier (no rank disconnects while the other still uses the group), then destroy.
    """
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def raw_first_step_worker(rank: int, port: int, out_path: str) -> None:
    t_entry = time.time()
    t_proc = proc_start_wall()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE)
    t_pg = time.time()
    model = DistributedDataParallel(make_mlp())
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    loss_fn = nn.CrossEntropyLoss()
    batches = make_batches(rank, n=1)
    t_model = time.time()
    loss = train_step(model, opt, loss_fn, batches[0])
    t_step = time.time()
    loss_value = loss.item()
    if rank == 0:
        write_json(
            out_path,
            {
                "first_step_t": t_step,
                "t_proc": t_proc,
                "t_entry": t_entry,
                "t_pg": t_pg,
                "t_model": t_model,
                "loss": loss_value,
                "num_threads": torch.get_num_threads(),
            },
        )
    del model, opt, loss
    _raw_teardown()


def raw_throughput_worker(rank: int, port: int, out_path: str, steps: int, warmup: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE)
    model = DistributedDataParallel(make_mlp())
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    timing = timed_loop(
        model, opt, nn.CrossEntropyLoss(), make_batches(rank), steps, warmup, lambda v, i: None
    )
    if rank == 0:
        write_json(out_path, {**timing, "num_threads": torch.get_num_threads()})
    del model, opt
    _raw_teardown()


# --------------------------------------------------------------------------------------------------
# Driver side of a raw variant (runs in a fresh subprocess).
# --------------------------------------------------------------------------------------------------
def drive_raw(kind: str, args: argparse.Namespace) -> dict:
    os.environ["OMP_NUM_THREADS"] = "1"  # what trainforge gives each worker by default (1 CPU per worker)
    port = free_port()
    worker_out = os.path.join(args.workdir, "rank0.json")
    if kind == "first_step":
        fn, fn_args = raw_first_step_worker, (port, worker_out)
    elif kind == "throughput":
        fn, fn_args = raw_throughput_worker, (port, worker_out, args.steps, args.warmup)
    else:
        raise ValueError(f"raw DDP has no {kind!r} variant")
    with TreeRssSampler() as rss:
        t0 = time.time()
        mp.spawn(fn, args=fn_args, nprocs=WORLD_SIZE, join=True)
        t_end = time.time()
    with open(worker_out) as f:
        metrics = json.load(f)
    return {"t0": t0, "t_end": t_end, "metrics": metrics, **rss.as_dict()}


# --------------------------------------------------------------------------------------------------
# A variant in a fresh process, and what its run contributes.
# --------------------------------------------------------------------------------------------------
def run_core_variant(variant: str, args: argparse.Namespace) -> dict:
    """Run one of bench_core.py's variants (``framework:metric``) in a fresh ``bench_core.py --variant``
    process; its JSON, or ``{"error": ...}``."""
    extra = [
        "--steps", str(args.steps), "--warmup", str(args.warmup),
        "--report-calls", str(args.report_calls), "--report-chunk", str(args.report_chunk),
        # bench_recovery.py calls this with a namespace that has no Ray Train options
        "--ray-train-steps", str(getattr(args, "ray_train_steps", RAY_TRAIN_STEPS)),
        "--ray-train-warmup", str(getattr(args, "ray_train_warmup", RAY_TRAIN_WARMUP)),
        "--ray-train-report-calls", str(getattr(args, "ray_train_report_calls", RAY_TRAIN_REPORT_CALLS)),
    ]  # fmt: skip
    return run_script_variant(CORE_SCRIPT, variant, extra, args.idle_wait, args.timeout)


def derive(metric: str, run: dict) -> dict:
    """The numbers one run contributes to the table."""
    if "error" in run:
        return {}
    m = run["metrics"]
    if metric == "first_step":
        t0, ev = run["t0"], run.get("driver_events", {})
        phases = {
            "worker_proc_started": m["t_proc"] - t0,
            "workers_connected": ev.get("_wait_connected:end", ev.get("wait_connected:end")),
            "process_group_ready": ev.get("on_start:end", m["t_pg"] - t0),
            "train_fn_sent": ev.get("start_training:begin"),
            "loop_entered": m["t_entry"] - t0,
            "model_ready": m["t_model"] - t0,
            "first_step_done": m["first_step_t"] - t0,
            "teardown_started": ev.get("shutdown:begin"),
            "driver_returned": run["t_end"] - t0,
        }
        return {
            "first_step_s": phases["first_step_done"],
            "phases": phases,
            "peak_rss_mb": run["peak_rss_mb"],
        }
    if metric == "throughput":
        return {
            "steps_per_s": m["steps_per_s"],
            "peak_rss_mb": run["peak_rss_mb"],
            "best_chunk_steps_per_s": max(m["chunk_steps_per_s"]),
            "cpu_ms_per_step": m["cpu_ms_per_step"],
            "driver_cpu_s": run.get("driver_cpu_s"),
            "report_share": m.get("report_share"),
            "steps": m.get("steps"),
        }
    if metric == "report_cost":
        return {
            "report_us": m["report_us"],
            "drain_s": run["t_end"] - m["loop_done_t"],
            "calls": m.get("calls"),
        }
    raise ValueError(metric)


PHASE_LABELS = {
    "worker_proc_started": "rank-0 worker process started",
    "workers_connected": "all workers connected to the driver",
    "process_group_ready": "process group ready",
    "train_fn_sent": "train function sent to workers",
    "loop_entered": "train function entered (rank 0)",
    "model_ready": "model DDP-wrapped, optimizer ready",
    "first_step_done": "first optimizer step done",
    "teardown_started": "driver starts stopping workers",
    "driver_returned": "driver returned (join / fit)",
}
