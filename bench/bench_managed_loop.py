#!/usr/bin/env python
"""The managed loop (``trainforge.model``) vs a hand-written DDP loop, and a driven run's round trip.

    python bench/bench_managed_loop.py [--repeats 3] [--markdown] [--quick]

Same model, data and workers for both loops: an MLP 64-256-256-10 on synthetic data (``--steps``
(200) batches of 32 per worker per epoch, the same seed in every process), SGD, 2 CPU workers
(gloo), ``--epochs`` (5) epochs, each epoch reported with a checkpoint (model and optimizer state)
written by rank 0.

- **hand loop**: ``trainforge.torch.TorchTrainer`` of a plain loop: ``prepare_model`` (DDP),
  ``prepare_data_loader`` (``DistributedSampler``, ``set_epoch``), zero_grad / forward / backward /
  step, ``loss.item()`` summed per batch for the epoch's mean, ``report(metrics, checkpoint)``.
- **managed loop**: ``ModelTrainer`` of a ``Model`` registering the same network, optimizer, loss and
  loader (``LoopConfig(num_epochs, checkpoint_every_n_epochs=1)``): its train step, sample-weighted
  metrics with one all_reduce per epoch, the checkpoint of its full state.

Measured, each run in a fresh driver process (``--variant``), variants alternating, medians shown:

1. **throughput**: rank 0's time per epoch, from one epoch's first batch to the next's (the report and
   its checkpoint included), the first epoch left out (warm-up); managed minus hand, relative (goal:
   <= 2 %).
2. **driven round trip**: ``ModelTrainer.train(profile=True)`` called ``--calls`` (8) times on the
   same model (``--driven-steps`` (50) batches per epoch); for each call after the first, the driver's
   wall time of ``train()`` minus rank 0's time from receiving the command to just before its report
   (``profile["worker_s"]``): the command's delivery, the report's way back (the driver drains
   reports every 20 ms) and, with a checkpoint every epoch, its staging and commit (goal: <= 20 ms).
   Also without checkpoints (``checkpoint_every_n_epochs=0``).

Prints a table (``--markdown`` for Markdown) and writes every number to
``bench/results/managed_loop.json``. ``--quick``: one repeat, 3 epochs, 5 calls. The wall-clock
figures are only as good as the machine is idle: each run first waits (up to ``--idle-wait`` s) for
idle CPUs and the JSON keeps the load average around each run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH_DIR)

from _common import (  # noqa: E402
    finish,
    fmt,
    git_commit,
    machine_info,
    median,
    render_markdown,
    render_text,
    run_script_variant,
    status,
)

RESULTS = os.path.join(BENCH_DIR, "results", "managed_loop.json")
BATCH = 32  # per worker
WORKERS = 2


# --------------------------------------------------------------------------------------------------
# Worker side. Rank 0 appends (name, time) events to a JSON lines file.
# --------------------------------------------------------------------------------------------------
def _event(path: str, name: str, **extra: Any) -> None:
    with open(path, "a") as f:
        f.write(json.dumps({"name": name, "t": time.perf_counter(), "wall": time.time(), **extra}) + "\n")


def _net() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
    )  # fmt: skip


def _dataset(steps: int) -> Any:
    import torch
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(0)
    n = steps * BATCH * WORKERS
    return TensorDataset(torch.randn(n, 64, generator=g), torch.randint(0, 10, (n,), generator=g))


def hand_loop(config: dict) -> None:
    import torch

    import trainforge
    from trainforge import Checkpoint
    from trainforge.torch import prepare_data_loader, prepare_model

    rank = trainforge.get_context().get_world_rank()
    model = prepare_model(_net())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = torch.nn.CrossEntropyLoss()
    loader = prepare_data_loader(torch.utils.data.DataLoader(_dataset(config["steps"]), batch_size=BATCH, shuffle=True))
    for epoch in range(config["epochs"]):
        loader.sampler.set_epoch(epoch)
        if rank == 0:
            _event(config["events"], "epoch_start", epoch=epoch)
        total, count = 0.0, 0
        for x, y in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            total += loss.item() * len(y)
            count += len(y)
        metrics = {"epoch": epoch + 1, "train_loss": total / count}
        if rank == 0:
            with tempfile.TemporaryDirectory() as d:
                torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict()},
                           os.path.join(d, "model.pt"))  # fmt: skip
                trainforge.report(metrics, checkpoint=Checkpoint.from_directory(d))
        else:
            trainforge.report(metrics)


def _bench_model_cls() -> Any:
    """The Model (defined on first use, so the driver of a hand run never imports torch for it)."""
    import torch

    from trainforge.model import BATCH_SIZE, Model

    class BenchModel(Model):
        def setup(self, config: dict) -> None:
            net = _net()
            self.register(models=net, optimizers=torch.optim.SGD(net.parameters(), lr=0.05),
                          criterion=torch.nn.CrossEntropyLoss())  # fmt: skip

        def setup_data(self, config: dict) -> None:
            self.register_data(train_loader=torch.utils.data.DataLoader(
                _dataset(config["steps"]), batch_size=config[BATCH_SIZE], shuffle=True))  # fmt: skip

        def train_step(self, batch: Any, batch_idx: int) -> Any:
            if batch_idx == 0 and self.world_rank == 0 and self.config.get("events"):
                _event(self.config["events"], "epoch_start", epoch=self.epoch)
            return super().train_step(batch, batch_idx)

    return BenchModel


# --------------------------------------------------------------------------------------------------
# Driver side: one variant per fresh process.
# --------------------------------------------------------------------------------------------------
def run_variant(variant: str, out: str, workdir: str, args: argparse.Namespace) -> None:
    from trainforge import RunConfig, ScalingConfig
    from trainforge.model import BATCH_SIZE, LoopConfig, ModelTrainer
    from trainforge.torch import TorchTrainer

    events = os.path.join(workdir, "events.jsonl")
    rc = RunConfig(storage_path=os.path.join(workdir, "runs"), name="bench", verbose=0)
    scaling = ScalingConfig(num_workers=WORKERS)
    load_before = os.getloadavg()
    result: dict[str, Any] = {}
    kind, which = variant.split(":")
    t0 = time.time()
    if kind == "throughput":
        config = {"steps": args.steps, "epochs": args.epochs, "events": events, BATCH_SIZE: BATCH * WORKERS}
        if which == "hand":
            TorchTrainer(hand_loop, train_loop_config=config, scaling_config=scaling, run_config=rc).fit()
        else:
            ModelTrainer(_bench_model_cls(), config=config, loop_config=LoopConfig(num_epochs=args.epochs),
                         scaling_config=scaling, run_config=rc).fit()  # fmt: skip
        starts = [e["t"] for e in sorted((json.loads(line) for line in open(events)), key=lambda e: e["t"])
                  if e["name"] == "epoch_start"]  # fmt: skip
        result["epoch_s"] = [b - a for a, b in zip(starts[:-1], starts[1:], strict=True)][: args.epochs - 1]
    else:
        every = 1 if which == "ckpt" else 0
        config = {"steps": args.driven_steps, BATCH_SIZE: BATCH * WORKERS}
        calls = []
        with ModelTrainer(_bench_model_cls(), config=config, loop_config=LoopConfig(checkpoint_every_n_epochs=every),
                          scaling_config=scaling, run_config=rc) as trainer:  # fmt: skip
            for _ in range(args.calls):
                t = time.perf_counter()
                metrics = trainer.train(profile=True)
                wall = time.perf_counter() - t
                calls.append({"wall_s": wall, **metrics["profile"]})  # type: ignore[call-overload]
        result["calls"] = calls
    result.update({"wall_s": time.time() - t0, "loadavg_before": load_before, "loadavg_after": os.getloadavg()})
    with open(out, "w") as f:
        json.dump(result, f)


def summarize(variant: str, run: dict) -> dict:
    if variant.startswith("throughput"):
        epochs = run["epoch_s"][1:]  # the first epoch warms up
        return {"epoch_s": statistics.median(epochs) if epochs else None}
    later = run["calls"][1:]  # the first call starts the workers
    return {
        "overhead_s": statistics.median(c["wall_s"] - c["worker_s"] for c in later) if later else None,
        "max_overhead_s": max(c["wall_s"] - c["worker_s"] for c in later) if later else None,
        "epoch_s": statistics.median(c["train_epoch_s"] for c in later) if later else None,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=200, help="batches per worker per epoch (throughput)")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--calls", type=int, default=8, help="train() calls of a driven run")
    p.add_argument("--driven-steps", type=int, default=50, help="batches per worker per driven epoch")
    p.add_argument("--quick", action="store_true", help="1 repeat, 3 epochs, 5 calls")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--idle-wait", type=float, default=30.0)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--json-out", default=RESULTS)
    p.add_argument("--variant", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--workdir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.variant:
        run_variant(args.variant, args.out, args.workdir, args)
        return 0
    if args.quick:
        args.repeats, args.epochs, args.calls = 1, 3, 5

    extra = ["--steps", str(args.steps), "--epochs", str(args.epochs), "--calls", str(args.calls),
             "--driven-steps", str(args.driven_steps)]  # fmt: skip
    variants = ["throughput:hand", "throughput:managed", "driven:ckpt", "driven:nockpt"]
    runs: dict[str, list[dict]] = {}
    failed: dict[str, list[dict]] = {}
    for repeat in range(args.repeats):
        for variant in variants:
            print(f"[{repeat + 1}/{args.repeats}] {variant}", file=sys.stderr, flush=True)
            run = run_script_variant(__file__, variant, extra, args.idle_wait, args.timeout)
            if "error" in run:
                failed.setdefault(variant, []).append(run)
                continue
            run["summary"] = summarize(variant, run)
            runs.setdefault(variant, []).append(run)

    def med(variant: str, key: str) -> float | None:
        return median(r["summary"].get(key) for r in runs.get(variant, []))

    header = ["metric", "hand loop", "managed loop", "difference", "goal", "status"]
    hand, managed = med("throughput:hand", "epoch_s"), med("throughput:managed", "epoch_s")
    rel = None if hand is None or managed is None else (managed - hand) / hand
    rows = [
        [f"time per epoch, {args.steps} steps x {WORKERS} workers (ms)", fmt(hand and hand * 1e3, ".1f"),
         fmt(managed and managed * 1e3, ".1f"), fmt(rel and rel * 100, "+.2f") + " %", "<= +2 %",
         status(None if rel is None else rel <= 0.02)],
    ]  # fmt: skip
    for variant, label in (("driven:ckpt", "checkpoint every epoch"), ("driven:nockpt", "no checkpoint")):
        over, worst = med(variant, "overhead_s"), med(variant, "max_overhead_s")
        epoch = med(variant, "epoch_s")
        rows.append([f"train() round trip beyond the epoch, {label} (ms; epoch {fmt(epoch and epoch * 1e3, '.0f')} ms)",
                     "-", fmt(over and over * 1e3, ".1f"), f"max {fmt(worst and worst * 1e3, '.1f')}", "<= 20 ms",
                     status(None if over is None else over <= 0.020)])  # fmt: skip
    table = (render_markdown if args.markdown else render_text)(header, rows)
    print(table)
    print(f"\n(medians of {args.repeats} run(s) each; {args.epochs} epochs, first left out; driven: {args.calls} "
          f"train() calls of {args.driven_steps} steps, first left out; {WORKERS} CPU workers, gloo)")  # fmt: skip
    data = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "commit": git_commit(),
        "machine": machine_info(),
        "args": {k: v for k, v in vars(args).items() if k not in ("variant", "out", "workdir")},
        "table": {"header": header, "rows": rows},
        "runs": {v: [{k: r[k] for k in ("summary", "epoch_s", "calls", "wall_s", "loadavg_before", "loadavg_after",
                                        "idle_wait_s") if k in r} for r in rs] for v, rs in runs.items()},  # fmt: skip
        "failures": {v: [{"error": r.get("error"), "output_tail": r.get("output_tail")} for r in rs]
                     for v, rs in failed.items()},  # fmt: skip
    }
    return finish(args.json_out, data, failed)


if __name__ == "__main__":
    sys.exit(main())
