"""Train a small CNN on scikit-learn's handwritten digits with data-parallel workers.

    python examples/digits.py --num-workers 2 --epochs 10

The 1,797 8x8 images ship with scikit-learn (no download). Each epoch every worker trains on its
half of the training set (DistributedDataParallel averages the gradients), evaluates the whole test
set, and reports its metrics; rank 0 also saves the model as a checkpoint. Pass ``--resume-from``
a checkpoint directory to continue from it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainforge as train
from trainforge import Checkpoint, CheckpointConfig, RunConfig, ScalingConfig
from trainforge.torch import TorchTrainer, prepare_data_loader, prepare_model


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),  # 8x8 -> 4x4
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, 64),
        nn.ReLU(),
        nn.Linear(64, 10),
    )


def load_data(seed: int = 0) -> dict[str, np.ndarray]:
    """Standardized images shaped (N, 1, 8, 8), split 80/20."""
    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.data, digits.target, test_size=0.2, random_state=seed, stratify=digits.target
    )
    scaler = StandardScaler().fit(x_train)

    def images(x: np.ndarray) -> np.ndarray:
        return scaler.transform(x).astype(np.float32).reshape(-1, 1, 8, 8)

    return {"x_train": images(x_train), "y_train": y_train, "x_test": images(x_test), "y_test": y_test}


def train_loop_per_worker(config: dict) -> None:
    world_size = train.get_context().get_world_size()
    rank = train.get_context().get_world_rank()
    torch.manual_seed(config["seed"])

    def dataset(x: np.ndarray, y: np.ndarray) -> TensorDataset:
        return TensorDataset(torch.from_numpy(x), torch.from_numpy(y).long())

    train_loader = prepare_data_loader(
        DataLoader(
            dataset(config["x_train"], config["y_train"]), batch_size=config["batch_size"], shuffle=True
        )
    )
    # Every rank scores the whole (small) test set, so all ranks report the same accuracy.
    test_loader = prepare_data_loader(
        DataLoader(dataset(config["x_test"], config["y_test"]), batch_size=256), add_dist_sampler=False
    )

    model = build_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])
    start_epoch = 0
    checkpoint = train.get_checkpoint()
    if checkpoint is not None:  # resume: after a worker failure, or with resume_from_checkpoint
        with checkpoint.as_directory() as ckpt_dir:
            model.load_state_dict(torch.load(os.path.join(ckpt_dir, "model.pt")))
            state = torch.load(os.path.join(ckpt_dir, "train_state.pt"))
            optimizer.load_state_dict(state["optimizer"])
            start_epoch = state["epoch"] + 1
    model = prepare_model(model)  # DistributedDataParallel when world_size > 1
    inner: nn.Module = getattr(model, "module", model)  # the model itself, unwrapped
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(start_epoch, config["epochs"]):
        if world_size > 1:
            train_loader.sampler.set_epoch(epoch)
        model.train()
        total_loss, batches = 0.0, 0
        for x, y in train_loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            total_loss += loss.item()
            batches += 1

        inner.eval()
        correct, seen = 0, 0
        with torch.no_grad():
            for x, y in test_loader:
                correct += (inner(x).argmax(dim=1) == y).sum().item()
                seen += len(y)
        metrics = {"epoch": epoch, "loss": total_loss / max(batches, 1), "test_accuracy": correct / seen}

        with tempfile.TemporaryDirectory() as tmpdir:
            ckpt = None
            if rank == 0:
                torch.save(inner.state_dict(), os.path.join(tmpdir, "model.pt"))
                torch.save(
                    {"optimizer": optimizer.state_dict(), "epoch": epoch},
                    os.path.join(tmpdir, "train_state.pt"),
                )
                ckpt = Checkpoint.from_directory(tmpdir)
            train.report(metrics, checkpoint=ckpt)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--storage-path", default=None, help="where results go (default: trainforge's)")
    parser.add_argument("--resume-from", default=None, help="a checkpoint directory to continue from")
    args = parser.parse_args(argv)

    config = {"epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr, "seed": 0, **load_data()}
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=args.num_workers),
        run_config=RunConfig(
            storage_path=args.storage_path,
            checkpoint_config=CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="test_accuracy"),
        ),
        resume_from_checkpoint=Checkpoint(args.resume_from) if args.resume_from else None,
    )
    start = time.perf_counter()
    result = trainer.fit()
    elapsed = time.perf_counter() - start

    metrics = result.metrics or {}
    print(f"final metrics: {metrics}")
    print(f"checkpoint: {result.checkpoint.path if result.checkpoint else None}")
    accuracy = metrics.get("test_accuracy", 0.0)
    print(f"test_accuracy={accuracy:.4f} ({args.num_workers} workers, {elapsed:.1f}s)")
    if accuracy < 0.95:
        print(f"test accuracy {accuracy:.4f} is below 0.95 after {args.epochs} epoch(s): train longer "
              "(5 epochs reach it; the default is 10)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
