#!/usr/bin/env python
"""Keras under MultiWorkerMirroredStrategy on trainforge vs launching the workers by hand.

    python bench/bench_tensorflow.py [--repeats 3] [--markdown] [--quick] [--epochs 10]

Same data (scikit-learn's digits: 1437 training rows, 360 validation rows), same 2 CPU workers, same
training: a tf-keras MLP 64-256-256-10, Adam, ``--epochs`` (10) epochs of global batches of 64 (32
rows per worker and step, TensorFlow's auto-sharding), validation and a checkpoint (``model.keras``,
saved by both workers: it is a collective) every epoch. Each worker runs with ``TF_USE_LEGACY_KERAS=1``
and one intra-op and one inter-op thread (``TF_NUM_INTRAOP_THREADS`` / ``TF_NUM_INTEROP_THREADS``),
what trainforge gives a worker with one CPU.

- **by hand**: this script picks two free ports and starts two worker processes with ``TF_CONFIG`` (the
  cluster, the worker's index) set; rank 0 saves each epoch's model into the output directory, rank 1
  into a scratch one. With ``hand-kill`` it restarts once by hand: when a worker dies it SIGKILLs the
  other, picks new ports and starts both again, resuming from the last epoch rank 0 saved.
- **trainforge**: ``TensorflowTrainer.fit()`` of the same loop with ``ReportCheckpointCallback`` (its
  checkpoints are also copied into the run's storage), resuming from ``get_checkpoint()``.

Measured, each run in a fresh driver process (``--variant``), variants alternating, medians shown:

1. **overhead**: wall time from just before the launch (the first worker's ``Popen`` / ``fit()``)
   until it returned: TensorFlow's import in the workers, the cluster, the training, the checkpoints
   and the teardown are in both; trainforge minus by hand is its overhead (goal: <= 1 s per run, or
   <= 5 % of a longer run). Also the time to rank 0's first finished training step, and rank 0's
   time inside ``model.fit()``.
2. **recovery after a worker kill**: rank 1 SIGKILLs itself after the first step of epoch 3 (the last
   checkpoint: epoch 2's) with ``FailureConfig(max_failures=1)``; recovery = from the kill (rank 1
   records the time just before) until rank 0 finished its first training step after resuming.
   Baseline: the by-hand restart above (``hand-kill``).

Prints a table (``--markdown`` for Markdown) and writes every number to
``bench/results/tensorflow.json``. ``--quick``: one repeat, 4 epochs (a smoke run). The wall-clock
figures are only as good as the machine is idle: each run first waits (up to ``--idle-wait`` s) for
idle CPUs and the JSON keeps the load average around each run.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH_DIR)

from _common import (  # noqa: E402
    finish,
    fmt,
    free_port,
    git_commit,
    machine_info,
    median,
    render_markdown,
    render_text,
    run_script_variant,
    status,
)

RESULTS = os.path.join(BENCH_DIR, "results", "tensorflow.json")
KILL_EPOCH = 3
# What every worker runs with, by hand and (trainforge's defaults for one CPU per worker) on trainforge.
WORKER_ENV = {
    "TF_USE_LEGACY_KERAS": "1", "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1",
    "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
}  # fmt: skip


# --------------------------------------------------------------------------------------------------
# Worker side: the same training for both launchers. Events (rank, attempt, name, time) go to a JSON
# lines file; the attempt is TORCHELASTIC_RESTART_COUNT, which trainforge sets and this script too.
# --------------------------------------------------------------------------------------------------
def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _attempt() -> int:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def _event(cfg: dict, name: str, **extra: Any) -> None:
    line = json.dumps({"rank": _rank(), "attempt": _attempt(), "name": name, "t": time.time(), **extra})
    with open(cfg["events"], "a") as f:
        f.write(line + "\n")


def tf_work(cfg: dict, trainforge: bool) -> None:
    import numpy as np
    import tensorflow as tf
    from sklearn.datasets import load_digits

    _event(cfg, "imported")
    x, y = load_digits(return_X_y=True)
    x = (x / 16).astype(np.float32)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    train_ds = tf.data.Dataset.from_tensor_slices((x[:1437], y[:1437])).shuffle(1437, seed=0).batch(64)
    val_ds = tf.data.Dataset.from_tensor_slices((x[1437:], y[1437:])).batch(128)

    class Probe(tf.keras.callbacks.Callback):
        first = True

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.epoch = epoch

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if self.first:
                self.first = False
                _event(cfg, "first_step", epoch=self.epoch)
            # After epoch 3's first step: its all-reduce waited for rank 0 to finish epoch 2's checkpoint.
            if cfg["kill"] and _attempt() == 0 and _rank() == 1 and self.epoch == KILL_EPOCH and batch == 0:
                _event(cfg, "killed")
                os.kill(os.getpid(), signal.SIGKILL)

    class SaveEveryEpoch(tf.keras.callbacks.Callback):
        """By hand: every worker saves (a collective); rank 0 into the output directory."""

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if _rank() == 0:
                path = os.path.join(cfg["output_dir"], f"epoch_{epoch:04d}", "model.keras")
            else:
                path = os.path.join(tempfile.mkdtemp(prefix="bench_tf_"), "model.keras")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self.model.save(path)

    initial_epoch, model = 0, None
    with strategy.scope():
        if trainforge:
            import trainforge as train
            from trainforge.tensorflow import TensorflowCheckpoint
            from trainforge.tensorflow.keras import ReportCheckpointCallback

            saver: Any = ReportCheckpointCallback()
            checkpoint = train.get_checkpoint()
            if checkpoint:
                model = TensorflowCheckpoint(checkpoint.path, checkpoint.filesystem).get_model()
                initial_epoch = checkpoint.get_metadata()["epoch"] + 1
        else:
            saver = SaveEveryEpoch()
            saved = sorted(glob.glob(os.path.join(cfg["output_dir"], "epoch_*", "model.keras")))
            if saved:
                model = tf.keras.models.load_model(saved[-1])
                initial_epoch = int(saved[-1].split("epoch_")[1].split(os.sep)[0]) + 1
        if model is None:
            tf.keras.utils.set_random_seed(0)
            model = tf.keras.Sequential([
                tf.keras.layers.Dense(256, activation="relu", input_shape=(64,)),
                tf.keras.layers.Dense(256, activation="relu"),
                tf.keras.layers.Dense(10),
            ])  # fmt: skip
            model.compile(
                optimizer=tf.keras.optimizers.Adam(1e-3),
                loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"],
            )
    _event(cfg, "train_start", env={k: os.environ.get(k) for k in WORKER_ENV}, initial_epoch=initial_epoch)
    model.fit(train_ds, validation_data=val_ds, epochs=cfg["epochs"], initial_epoch=initial_epoch, verbose=0,
              callbacks=[Probe(), saver])  # fmt: skip
    _event(cfg, "train_end")


# --------------------------------------------------------------------------------------------------
# Driver side: one variant per fresh process.
# --------------------------------------------------------------------------------------------------
def _launch_by_hand(cfg: dict, attempt: int, log: Any) -> list[subprocess.Popen]:
    """Start the two workers with TF_CONFIG naming two ports free now (in this process group: the
    variant's kill reaches them)."""
    ports: list[int] = []
    while len(ports) < 2:
        port = free_port()
        if port not in ports:
            ports.append(port)
    cluster = [f"127.0.0.1:{port}" for port in ports]
    procs = []
    for rank in range(2):
        tf_config = {"cluster": {"worker": cluster}, "task": {"type": "worker", "index": rank}}
        env = {**os.environ, **WORKER_ENV, "TF_CONFIG": json.dumps(tf_config), "RANK": str(rank),
               "TORCHELASTIC_RESTART_COUNT": str(attempt)}  # fmt: skip
        cmd = [sys.executable, os.path.abspath(__file__), "--role", "tf-worker", "--role-config", json.dumps(cfg)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
    return procs


def run_by_hand(cfg: dict, restarts: int, timeout_s: float, log_path: str) -> int:
    """Run the workers to the end, restarting both (new ports) up to ``restarts`` times when one dies;
    return the number of restarts."""
    deadline = time.time() + timeout_s
    with open(log_path, "w") as log:
        for attempt in range(restarts + 1):
            procs = _launch_by_hand(cfg, attempt, log)
            while True:
                codes = [p.poll() for p in procs]
                if all(code == 0 for code in codes):
                    return attempt
                if any(code not in (None, 0) for code in codes) or time.time() > deadline:
                    for p in procs:
                        if p.poll() is None:
                            p.kill()
                        p.wait()
                    break
                time.sleep(0.02)
            if time.time() > deadline:
                break
    raise RuntimeError(f"the workers failed (attempts: {restarts + 1}):\n{open(log_path).read()[-6000:]}")


def run_variant(variant: str, out: str, workdir: str, args: argparse.Namespace) -> None:
    kill = variant.endswith("-kill")
    cfg = {
        "events": os.path.join(workdir, "events.jsonl"), "output_dir": os.path.join(workdir, "output"),
        "epochs": args.epochs, "kill": kill,
    }  # fmt: skip
    load_before = os.getloadavg()
    result: dict[str, Any] = {}
    if variant.startswith("trainforge"):
        os.environ.update({k: v for k, v in WORKER_ENV.items() if k in ("OMP_NUM_THREADS", "TF_CPP_MIN_LOG_LEVEL")})
        from trainforge import FailureConfig, RunConfig, ScalingConfig
        from trainforge.tensorflow import TensorflowTrainer

        t0 = time.time()
        fit = TensorflowTrainer(
            lambda: tf_work(cfg, True),
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(
                storage_path=os.path.join(workdir, "runs"), name="bench", verbose=0,
                failure_config=FailureConfig(max_failures=1 if kill else 0),
            ),
        ).fit()  # fmt: skip
        wall = time.time() - t0
        result["failures"] = len(fit.failures)
    else:
        t0 = time.time()
        result["failures"] = run_by_hand(cfg, 1 if kill else 0, args.launch_timeout, os.path.join(workdir, "hand.log"))
        wall = time.time() - t0
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
    """Per-run figures: first step after t0, rank 0's time in fit(), recovery after the kill."""
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
        resumed = [e for e in ev if e["name"] == "train_start" and e["attempt"] == 1]
        out["resumed_at_epoch"] = resumed[0]["initial_epoch"] if resumed else None
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--quick", action="store_true", help="1 repeat, 4 epochs")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--idle-wait", type=float, default=30.0)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument(
        "--launch-timeout", type=float, default=240.0, help="a by-hand launch is killed after this"
    )
    p.add_argument("--json-out", default=RESULTS)
    p.add_argument("--variant", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--workdir", help=argparse.SUPPRESS)
    p.add_argument("--role", help=argparse.SUPPRESS)
    p.add_argument("--role-config", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role == "tf-worker":  # a worker started by hand
        tf_work(json.loads(args.role_config), False)
        return 0
    if args.variant:
        run_variant(args.variant, args.out, args.workdir, args)
        return 0
    if args.quick:
        args.repeats, args.epochs = 1, 4

    extra = ["--epochs", str(args.epochs), "--launch-timeout", str(args.launch_timeout)]
    variants = ["hand", "trainforge", "hand-kill", "trainforge-kill"]
    runs: dict[str, list[dict]] = {}
    failed: dict[str, list[dict]] = {}
    for repeat in range(args.repeats):
        for variant in variants:
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
    hand, tf = med("hand", "wall_s"), med("trainforge", "wall_s")
    diff = None if hand is None or tf is None else tf - hand
    ok = None if diff is None or hand is None else (diff <= 1.0 or diff <= 0.05 * hand)
    rows = [["run wall time (s)", fmt(hand, ".2f"), fmt(tf, ".2f"), fmt(diff, "+.2f"), "<= +1 s or +5 %", status(ok)]]
    for key, label in (("first_step_s", "launch -> first step (s)"), ("train_s", "rank 0 in model.fit() (s)")):
        h, t = med("hand", key), med("trainforge", key)
        rows.append([label, fmt(h, ".2f"), fmt(t, ".2f"), fmt(None if h is None or t is None else t - h, "+.2f"),
                     "(info)", "-"])  # fmt: skip
    base, rec = med("hand-kill", "recovery_s"), med("trainforge-kill", "recovery_s")
    rows.append(["kill -> first step after restart (s); by hand = kill the other, relaunch both", fmt(base, ".2f"),
                 fmt(rec, ".2f"), fmt(None if base is None or rec is None else rec - base, "+.2f"), "<= by hand",
                 status(None if base is None or rec is None else rec <= base)])  # fmt: skip
    hk, tk = med("hand-kill", "wall_s"), med("trainforge-kill", "wall_s")
    rows.append(["run wall time with the kill (s)", fmt(hk, ".2f"), fmt(tk, ".2f"),
                 fmt(None if hk is None or tk is None else tk - hk, "+.2f"), "(info)", "-"])  # fmt: skip
    table = (render_markdown if args.markdown else render_text)(header, rows)
    print(table)
    print(f"\n(medians of {args.repeats} run(s) each; {args.epochs} epochs; 2 CPU workers, MultiWorkerMirroredStrategy)")
    data = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "commit": git_commit(),
        "machine": {**machine_info(), "tensorflow": _version("tensorflow-cpu", "tensorflow"),
                    "tf_keras": _version("tf-keras")},  # fmt: skip
        "args": {k: v for k, v in vars(args).items() if k not in ("variant", "out", "workdir", "role", "role_config")},
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


def _version(*names: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    for name in names:
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return "not installed"


if __name__ == "__main__":
    sys.exit(main())
