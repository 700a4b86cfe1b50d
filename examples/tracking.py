"""Send every report to experiment trackers: CSV/JSON files, TensorBoard, MLflow, Weights & Biases.

    python examples/tracking.py --storage-path /tmp/tracking [--no-mlflow] [--no-wandb]

A softmax regression on scikit-learn's digits (no download) trains on 2 data-parallel workers
(DistributedDataParallel averages the gradients); each epoch every worker reports its loss and the
test accuracy. The sinks run on the driver, off the training path: ``report()`` never waits for them.
Then a small Tuner tries two learning rates with the same sinks: one tracker run per trial (nested
under the experiment's run in MLflow, in its group in W&B).

MLflow writes to a file store under the storage path (no server); W&B runs offline (no login, no
network): ``wandb sync <run dir>/wandb/offline-run-*`` uploads a run later. Look at the TensorBoard
files with ``tensorboard --logdir <storage path>``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

import trainforge as train
from trainforge import RunConfig, ScalingConfig, tune
from trainforge.torch import TorchTrainer, prepare_model
from trainforge.tune.logger import CSVLoggerCallback, JsonLoggerCallback, TBXLoggerCallback


def load_data() -> dict[str, np.ndarray]:
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(x, digits.target, test_size=0.2, random_state=0)
    return {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test}


def train_loop_per_worker(config: dict) -> None:
    ctx = train.get_context()
    torch.manual_seed(0)
    rank, size = ctx.get_world_rank(), ctx.get_world_size()
    x = torch.from_numpy(config["x_train"][rank::size])  # this worker's half
    y = torch.from_numpy(config["y_train"][rank::size]).long()
    x_test, y_test = torch.from_numpy(config["x_test"]), torch.from_numpy(config["y_test"]).long()
    model = prepare_model(nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    for epoch in range(config["epochs"]):
        for i in range(0, len(x), 32):
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x[i : i + 32]), y[i : i + 32])
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        train.report({"epoch": epoch, "loss": loss.item(), "eval": {"accuracy": accuracy}})


def sinks(args: argparse.Namespace) -> list:
    out = [CSVLoggerCallback(), JsonLoggerCallback()]
    if importlib.util.find_spec("tensorboardX"):
        out.append(TBXLoggerCallback())
    if args.mlflow and importlib.util.find_spec("mlflow"):
        from trainforge.air.integrations.mlflow import MLflowLoggerCallback

        uri = "file://" + os.path.abspath(os.path.join(args.storage_path, "mlruns"))
        out.append(MLflowLoggerCallback(tracking_uri=uri, experiment_name="tracking-example"))
    if args.wandb and importlib.util.find_spec("wandb"):
        from trainforge.air.integrations.wandb import WandbLoggerCallback

        out.append(WandbLoggerCallback(project="tracking-example", mode="offline"))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--storage-path", default=os.path.expanduser("~/trainforge_results"))
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--no-mlflow", dest="mlflow", action="store_false")
    p.add_argument("--no-wandb", dest="wandb", action="store_false")
    args = p.parse_args()

    callbacks = sinks(args)
    print("sinks:", ", ".join(type(s).__name__ for s in callbacks))
    config = {**load_data(), "lr": 0.5, "epochs": args.epochs}
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name="tracking-fit", storage_path=args.storage_path, callbacks=callbacks, verbose=0
        ),
    )
    result = trainer.fit()
    print(f"fit: accuracy {result.metrics['eval']['accuracy']:.3f}; files in {result.path}")
    for sink in callbacks:
        stats = sink.stats()
        print(f"  {type(sink).__name__}: logged {stats.logged}, dropped {stats.dropped}")

    # The Tuner's trials get the callbacks of tune's RunConfig *and* of the trainer's own RunConfig:
    # give the sinks to one of them only.
    tune_trainer = TorchTrainer(
        train_loop_per_worker, train_loop_config=config, scaling_config=ScalingConfig(num_workers=2)
    )
    grid = tune.Tuner(
        tune_trainer,
        param_space={"train_loop_config": {"lr": tune.grid_search([0.1, 1.0])}},
        tune_config=tune.TuneConfig(metric="eval/accuracy", mode="max", server=False),
        run_config=tune.RunConfig(
            name="tracking-tune", storage_path=args.storage_path, callbacks=sinks(args), verbose=0
        ),
    ).fit()
    best = grid.get_best_result()
    print(
        f"tune: best lr {best.config['train_loop_config']['lr']} (accuracy {best.metrics['eval']['accuracy']:.3f})"
    )
    for r in grid:
        print(f"  trial {os.path.basename(r.path)}: {sorted(f for f in os.listdir(r.path) if '.' in f)}")


if __name__ == "__main__":
    main()
