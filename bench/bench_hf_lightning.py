#!/usr/bin/env python
"""Hugging Face Transformers and PyTorch Lightning on trainforge vs launching them by hand.

    python bench/bench_hf_lightning.py [--repeats 3] [--markdown] [--quick] [--frameworks hf,lightning]

Same data (scikit-learn's digits), same 2 CPU workers (gloo, ``OMP_NUM_THREADS=1``), same training:

- **hf**: a ``transformers.Trainer`` on a tiny BERT built from a config (hidden 64, 2 layers; the
  8x8 pixel intensities are the token ids: no tokenizer, nothing downloaded), ``--hf-steps`` (150)
  steps of 32 rows per worker, a log every 10 steps, evaluation and a checkpoint every 50.
  By hand: ``torchrun --standalone --nproc_per_node 2`` of a script that builds the same Trainer.
  trainforge: ``TorchTrainer.fit()`` of a loop that builds it with ``RayTrainReportCallback`` and
  ``prepare_trainer`` (its checkpoints are also copied into the run's storage).
- **lightning**: an MLP 64-256-256-10 ``LightningModule``, ``--pl-epochs`` (10) epochs of batches of
  32 over each worker's half of the data, validation and a checkpoint every epoch. By hand: the same
  script with ``Trainer(accelerator="cpu", devices=2, strategy="ddp")`` (Lightning starts the second
  process itself) and ``ModelCheckpoint(every_n_epochs=1, save_top_k=-1)``. trainforge:
  ``RayDDPStrategy``, ``RayLightningEnvironment``, ``RayTrainReportCallback``, ``prepare_trainer``.

Measured, each run in a fresh driver process (``--variant``), variants alternating, medians shown:

1. **overhead**: wall time from just before the launch (``torchrun`` / ``fit()`` / the hand script's
   ``import lightning``) until it returned: the framework's import in the workers, the process group,
   the training, the checkpoints and the teardown are in both; trainforge minus by hand is its
   overhead (goal: <= 1 s per run, or <= 5 % of a longer run). Also the time to rank 0's first
   finished training step, and rank 0's time inside ``train()`` / ``fit()``.
2. **recovery after a worker kill**: rank 1 SIGKILLs itself (hf: after step 60, the last checkpoint
   at 50; lightning: after the first step of epoch 3, the last checkpoint after epoch 2) with
   ``FailureConfig(max_failures=1)``; recovery = from the kill (rank 1 records the time just before)
   until rank 0 finished its first training step after resuming from the checkpoint. hf baseline:
   ``torchrun --max-restarts 1`` of the hand script resuming from the Trainer's last checkpoint (the
   same kill). lightning has no restart of its own: its baseline is a cold launch by hand, from the
   launch to the first finished step.

Prints a table (``--markdown`` for Markdown) and writes every number to
``bench/results/hf_lightning.json``. ``--quick``: one repeat, fewer steps and epochs (a smoke run).
The wall-clock figures are only as good as the machine is idle: each run first waits (up to
``--idle-wait`` s) for idle CPUs and the JSON keeps the load average around each run.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import signal
import subprocess
import sys
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

RESULTS = os.path.join(BENCH_DIR, "results", "hf_lightning.json")
HF_KILL_STEP, HF_EVERY = 60, 50
PL_KILL_EPOCH = 3


# --------------------------------------------------------------------------------------------------
# Worker side: the same training for both launchers. Events (rank, attempt, name, time) go to a JSON
# lines file; the attempt is TORCHELASTIC_RESTART_COUNT, which torchrun and trainforge both set.
# --------------------------------------------------------------------------------------------------
def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _attempt() -> int:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def _event(cfg: dict, name: str, **extra: Any) -> None:
    line = json.dumps({"rank": _rank(), "attempt": _attempt(), "name": name, "t": time.time(), **extra})
    with open(cfg["events"], "a") as f:
        f.write(line + "\n")


def _die(cfg: dict) -> None:
    _event(cfg, "killed")
    os.kill(os.getpid(), signal.SIGKILL)


def hf_work(cfg: dict, trainforge: bool) -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"
    import numpy as np
    import torch
    import transformers
    from sklearn.datasets import load_digits
    from transformers.trainer_utils import get_last_checkpoint

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x.astype(np.int64))
    rows = [{"input_ids": x[i], "labels": int(y[i])} for i in range(len(y))]
    transformers.set_seed(0)
    model = transformers.BertForSequenceClassification(
        transformers.BertConfig(
            vocab_size=17, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            max_position_embeddings=64, num_labels=10,
        )
    )  # fmt: skip
    args = transformers.TrainingArguments(
        output_dir=cfg["output_dir"], max_steps=cfg["steps"], per_device_train_batch_size=32,
        per_device_eval_batch_size=128, logging_steps=10, eval_strategy="steps", eval_steps=HF_EVERY,
        save_steps=HF_EVERY, learning_rate=1e-3, report_to="none", disable_tqdm=True, use_cpu=True,
        ddp_find_unused_parameters=False, average_tokens_across_devices=False,
    )  # fmt: skip

    class Probe(transformers.TrainerCallback):
        first = True

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.first:
                self.first = False
                _event(cfg, "first_step", step=state.global_step)
            if cfg["kill"] and _attempt() == 0 and _rank() == 1 and state.global_step == HF_KILL_STEP:
                _die(cfg)

    callbacks: list[Any] = [Probe()]
    if trainforge:
        from trainforge.huggingface.transformers import RayTrainReportCallback

        callbacks.append(RayTrainReportCallback())
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=rows[:1437], eval_dataset=rows[1437:], callbacks=callbacks
    )
    with contextlib.ExitStack() as stack:
        resume = None
        if trainforge:
            import trainforge as train
            from trainforge.huggingface.transformers import RayTrainReportCallback, prepare_trainer

            trainer = prepare_trainer(trainer)
            checkpoint = train.get_checkpoint()
            if checkpoint:
                d = stack.enter_context(checkpoint.as_directory())
                resume = os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME)
        elif os.path.isdir(cfg["output_dir"]):
            resume = get_last_checkpoint(cfg["output_dir"])
        _event(cfg, "train_start", threads=torch.get_num_threads(), interop=torch.get_num_interop_threads())
        trainer.train(resume_from_checkpoint=resume)
        _event(cfg, "train_end")


def pl_work(cfg: dict, trainforge: bool) -> None:
    import lightning.pytorch as pl
    import torch
    from sklearn.datasets import load_digits
    from torch.utils.data import DataLoader, TensorDataset

    class Net(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
                torch.nn.Linear(256, 10),
            )  # fmt: skip

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1])
            self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            logits = self.net(batch[0])
            self.log("val_loss", torch.nn.functional.cross_entropy(logits, batch[1]), sync_dist=True)

        def configure_optimizers(self) -> Any:
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    class Probe(pl.Callback):
        first = True

        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            if self.first:
                self.first = False
                _event(cfg, "first_step", step=trainer.global_step)
            # After epoch 3's first step: its all-reduce waited for rank 0 to finish reporting epoch 2.
            if cfg["kill"] and _attempt() == 0 and _rank() == 1 and trainer.current_epoch == PL_KILL_EPOCH:
                _die(cfg)

    x, y = load_digits(return_X_y=True)
    data = TensorDataset(torch.tensor(x / 16, dtype=torch.float32), torch.tensor(y))
    train_data, val_data = torch.utils.data.random_split(
        data, [1437, 360], generator=torch.Generator().manual_seed(0)
    )
    common = {"max_epochs": cfg["epochs"], "logger": False, "enable_progress_bar": False,
              "enable_model_summary": False, "default_root_dir": cfg["output_dir"]}  # fmt: skip
    pl.seed_everything(0)
    ckpt_path = None
    stack = contextlib.ExitStack()
    if trainforge:
        import trainforge as train
        from trainforge.lightning import (
            RayDDPStrategy,
            RayLightningEnvironment,
            RayTrainReportCallback,
            prepare_trainer,
        )

        trainer = pl.Trainer(
            devices="auto", accelerator="cpu", strategy=RayDDPStrategy(), plugins=[RayLightningEnvironment()],
            callbacks=[Probe(), RayTrainReportCallback()], enable_checkpointing=False, **common,
        )  # fmt: skip
        trainer = prepare_trainer(trainer)
        checkpoint = train.get_checkpoint()
        if checkpoint:
            d = stack.enter_context(checkpoint.as_directory())
            ckpt_path = os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME)
    else:
        every_epoch = pl.callbacks.ModelCheckpoint(dirpath=cfg["output_dir"], every_n_epochs=1, save_top_k=-1)
        trainer = pl.Trainer(
            devices=2, accelerator="cpu", strategy="ddp", callbacks=[Probe(), every_epoch], **common
        )
    loaders = DataLoader(train_data, batch_size=32, shuffle=True), DataLoader(val_data, batch_size=128)
    with stack:
        _event(cfg, "train_start", threads=torch.get_num_threads(), interop=torch.get_num_interop_threads())
        trainer.fit(Net(), *loaders, ckpt_path=ckpt_path)
        _event(cfg, "train_end")


WORK = {"hf": hf_work, "lightning": pl_work}


# --------------------------------------------------------------------------------------------------
# Driver side: one variant per fresh process.
# --------------------------------------------------------------------------------------------------
def run_variant(variant: str, out: str, workdir: str, args: argparse.Namespace) -> None:
    framework, launcher = variant.split(":")
    kill = launcher.endswith("-kill")
    cfg = {
        "events": os.path.join(workdir, "events.jsonl"), "output_dir": os.path.join(workdir, "output"),
        "steps": args.hf_steps, "epochs": args.pl_epochs, "kill": kill,
    }  # fmt: skip
    os.environ["OMP_NUM_THREADS"] = "1"  # what trainforge gives each worker (1 CPU per worker)
    load_before = os.getloadavg()
    result: dict[str, Any] = {}
    if launcher.startswith("trainforge"):
        from trainforge import FailureConfig, RunConfig, ScalingConfig
        from trainforge.torch import TorchTrainer

        work = WORK[framework]
        t0 = time.time()
        fit = TorchTrainer(
            lambda: work(cfg, True),
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(
                storage_path=os.path.join(workdir, "runs"), name="bench", verbose=0,
                failure_config=FailureConfig(max_failures=1 if kill else 0),
            ),
        ).fit()  # fmt: skip
        wall = time.time() - t0
        result["failures"] = len(fit.failures)
    elif framework == "hf":  # torchrun, optionally restarting once
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               *(["--max-restarts", "1"] if kill else []), os.path.abspath(__file__), "--role", "hf-worker",
               "--role-config", json.dumps(cfg)]  # fmt: skip
        log_path = os.path.join(workdir, "torchrun.log")
        with open(log_path, "w") as log:
            t0 = time.time()
            proc = subprocess.Popen(
                cmd, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            try:
                returncode: int | str = proc.wait(timeout=args.launch_timeout)
            except subprocess.TimeoutExpired:  # say why here: the caller's timeout would lose the log
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                returncode = f"none (killed after {args.launch_timeout:g} s)"
            wall = time.time() - t0
        if returncode != 0:
            raise RuntimeError(f"torchrun exited with {returncode}:\n{open(log_path).read()[-6000:]}")
    else:  # Lightning's own launcher: this process is rank 0 and starts rank 1 (a copy of this command)
        t0 = time.time()
        pl_work(cfg, False)
        wall = time.time() - t0
        if int(os.environ.get("LOCAL_RANK", "0")) != 0:
            return  # the copy Lightning started: rank 0 writes the results
    events = [json.loads(line) for line in open(cfg["events"])]
    result.update({"wall_s": wall, "t0": t0, "events": events, "loadavg_before": load_before,
                   "loadavg_after": os.getloadavg()})  # fmt: skip
    with open(out, "w") as f:
        json.dump(result, f)


def _first(events: list[dict], name: str, rank: int = 0, attempt: int | None = None) -> float | None:
    times = [
        e["t"]
        for e in events
        if e["name"] == name and e["rank"] == rank and (attempt is None or e["attempt"] == attempt)
    ]
    return min(times) if times else None


def summarize(run: dict) -> dict:
    """Per-run figures: first step after t0, rank 0's time in train(), recovery after the kill."""
    ev, t0 = run["events"], run["t0"]
    first = _first(ev, "first_step", attempt=0)
    start, end = _first(ev, "train_start", attempt=0), _first(ev, "train_end")
    out = {"wall_s": run["wall_s"], "first_step_s": None if first is None else first - t0}
    if start is not None and end is not None:
        out["train_s"] = end - start
    killed = _first(ev, "killed", rank=1, attempt=0)
    again = _first(ev, "first_step", attempt=1)
    if killed is not None and again is not None:
        out["recovery_s"] = again - killed
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--frameworks", default="hf,lightning")
    p.add_argument("--hf-steps", type=int, default=150)
    p.add_argument("--pl-epochs", type=int, default=10)
    p.add_argument("--quick", action="store_true", help="1 repeat, 100 hf steps, 5 lightning epochs")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--idle-wait", type=float, default=30.0)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument(
        "--launch-timeout", type=float, default=240.0, help="a torchrun launch is killed after this"
    )
    p.add_argument("--json-out", default=RESULTS)
    p.add_argument("--variant", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--workdir", help=argparse.SUPPRESS)
    p.add_argument("--role", help=argparse.SUPPRESS)
    p.add_argument("--role-config", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role == "hf-worker":  # a torchrun worker
        hf_work(json.loads(args.role_config), False)
        return 0
    if args.variant:
        run_variant(args.variant, args.out, args.workdir, args)
        return 0
    if args.quick:
        args.repeats, args.hf_steps, args.pl_epochs = 1, 100, 5

    frameworks = [f for f in args.frameworks.split(",") if f]
    extra = ["--hf-steps", str(args.hf_steps), "--pl-epochs", str(args.pl_epochs)]
    launchers = ["hand", "trainforge", "hand-kill", "trainforge-kill"]
    runs: dict[str, list[dict]] = {}
    failed: dict[str, list[dict]] = {}
    for repeat in range(args.repeats):
        for framework in frameworks:
            for launcher in launchers:
                if framework == "lightning" and launcher == "hand-kill":
                    continue  # no restart of its own: the cold launch ("hand") is the baseline
                variant = f"{framework}:{launcher}"
                print(f"[{repeat + 1}/{args.repeats}] {variant}", file=sys.stderr, flush=True)
                run = run_script_variant(__file__, variant, extra, args.idle_wait, args.timeout)
                if "error" in run:
                    failed.setdefault(variant, []).append(run)
                    continue
                run["summary"] = summarize(run)
                runs.setdefault(variant, []).append(run)

    def med(variant: str, key: str) -> float | None:
        return median(r["summary"].get(key) for r in runs.get(variant, []))

    header = ["metric", "by hand", "trainforge", "difference", "goal", "status"]
    rows = []
    for framework in frameworks:
        hand, tf = med(f"{framework}:hand", "wall_s"), med(f"{framework}:trainforge", "wall_s")
        diff = None if hand is None or tf is None else tf - hand
        ok = None if diff is None or hand is None else (diff <= 1.0 or diff <= 0.05 * hand)
        rows.append([f"{framework}: run wall time (s)", fmt(hand, ".2f"), fmt(tf, ".2f"), fmt(diff, "+.2f"),
                     "<= +1 s or +5 %", status(ok)])  # fmt: skip
        for key, label in (
            ("first_step_s", "launch -> first step (s)"),
            ("train_s", "rank 0 in train()/fit() (s)"),
        ):
            h, t = med(f"{framework}:hand", key), med(f"{framework}:trainforge", key)
            rows.append([f"{framework}: {label}", fmt(h, ".2f"), fmt(t, ".2f"),
                         fmt(None if h is None or t is None else t - h, "+.2f"), "(info)", "-"])  # fmt: skip
        base_key = ("hf:hand-kill", "recovery_s") if framework == "hf" else ("lightning:hand", "first_step_s")
        base, rec = med(*base_key), med(f"{framework}:trainforge-kill", "recovery_s")
        label = "torchrun --max-restarts 1" if framework == "hf" else "cold launch by hand"
        rows.append([f"{framework}: kill -> first step after restart (s); by hand = {label}", fmt(base, ".2f"),
                     fmt(rec, ".2f"), fmt(None if base is None or rec is None else rec - base, "+.2f"),
                     "<= by hand", status(None if base is None or rec is None else rec <= base)])  # fmt: skip
    table = (render_markdown if args.markdown else render_text)(header, rows)
    print(table)
    print(f"\n(medians of {args.repeats} run(s) each; hf {args.hf_steps} steps, lightning {args.pl_epochs} epochs; "
          "2 CPU workers)")  # fmt: skip
    data = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "commit": git_commit(),
        "machine": machine_info(),
        "args": {
            k: v
            for k, v in vars(args).items()
            if k not in ("variant", "out", "workdir", "role", "role_config")
        },
        "table": {"header": header, "rows": rows},
        "runs": {
            v: [
                {
                    k: r[k]
                    for k in ("summary", "loadavg_before", "loadavg_after", "failures", "idle_wait_s")
                    if k in r
                }
                for r in rs
            ]
            for v, rs in runs.items()
        },  # fmt: skip
        "failures": {
            v: [{"error": r.get("error"), "output_tail": r.get("output_tail")} for r in rs]
            for v, rs in failed.items()
        },  # fmt: skip
    }
    return finish(args.json_out, data, failed)


if __name__ == "__main__":
    sys.exit(main())
