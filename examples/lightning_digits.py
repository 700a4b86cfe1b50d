"""Train a small PyTorch Lightning model on scikit-learn's handwritten digits with data-parallel workers.

    python examples/lightning_digits.py --num-workers 2 --epochs 5

The ``Trainer`` is built inside the train loop with trainforge's ``RayDDPStrategy`` (this worker's
device, the run's ranks), ``RayLightningEnvironment`` and ``RayTrainReportCallback`` (each epoch's
``callback_metrics`` and a checkpoint, written once by rank 0), then checked by ``prepare_trainer``.
Lightning shards the training set with a ``DistributedSampler``; ``self.log(..., sync_dist=True)``
averages the validation metrics over the workers. Works with the ``lightning`` package or the
standalone ``pytorch_lightning`` (``--namespace``). With ``--max-failures`` a crashed worker
restarts the run from the latest checkpoint.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import tempfile

import trainforge as train
from trainforge import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from trainforge.lightning import (
    RayDDPStrategy,
    RayLightningEnvironment,
    RayTrainReportCallback,
    prepare_trainer,
)
from trainforge.torch import TorchTrainer


def train_loop_per_worker(config: dict) -> None:
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from torch.utils.data import DataLoader, TensorDataset

    pl = importlib.import_module(config["namespace"])  # lightning.pytorch or pytorch_lightning

    class DigitsClassifier(pl.LightningModule):
        def __init__(self, lr: float) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
            )

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self.net(x), y)
            self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            logits = self.net(x)
            self.log("val_loss", torch.nn.functional.cross_entropy(logits, y), sync_dist=True)
            self.log("val_accuracy", (logits.argmax(-1) == y).float().mean(), sync_dist=True)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)

    x, y = load_digits(return_X_y=True)
    x_train, x_val, y_train, y_val = train_test_split(x / 16.0, y, test_size=0.2, random_state=0, stratify=y)

    def loader(x, y, shuffle: bool) -> DataLoader:
        data = TensorDataset(torch.tensor(x, dtype=torch.float32), torch.tensor(y))
        return DataLoader(data, batch_size=32, shuffle=shuffle)

    pl.seed_everything(config["seed"])
    trainer = pl.Trainer(
        max_epochs=config["epochs"],
        devices="auto",
        accelerator="auto",
        strategy=RayDDPStrategy(),
        plugins=[RayLightningEnvironment()],
        callbacks=[RayTrainReportCallback()],
        enable_checkpointing=False,  # the report callback checkpoints
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=config["root_dir"],
    )
    trainer = prepare_trainer(trainer)
    model = DigitsClassifier(lr=config["lr"])
    train_loader, val_loader = loader(x_train, y_train, True), loader(x_val, y_val, False)
    checkpoint = train.get_checkpoint()
    if checkpoint:  # a restart: continue from the run's latest checkpoint
        with checkpoint.as_directory() as d:
            ckpt_path = os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME)
            trainer.fit(model, train_loader, val_loader, ckpt_path=ckpt_path)
    else:
        trainer.fit(model, train_loader, val_loader)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--namespace", choices=["lightning.pytorch", "pytorch_lightning"], default=None,
                        help="default: lightning.pytorch if the lightning package is installed")  # fmt: skip
    parser.add_argument("--max-failures", type=int, default=0)
    parser.add_argument(
        "--storage-path", default=None, help="where runs are kept (default ~/trainforge_results)"
    )
    args = parser.parse_args(argv)
    namespace = args.namespace
    if namespace is None:
        namespace = "lightning.pytorch" if importlib.util.find_spec("lightning") else "pytorch_lightning"

    with tempfile.TemporaryDirectory(prefix="lightning_digits_") as root_dir:  # Lightning's scratch files
        result = TorchTrainer(
            train_loop_per_worker,
            train_loop_config={
                "epochs": args.epochs,
                "lr": args.lr,
                "seed": args.seed,
                "namespace": namespace,
                "root_dir": root_dir,
            },  # fmt: skip
            scaling_config=ScalingConfig(num_workers=args.num_workers),
            run_config=RunConfig(
                storage_path=args.storage_path,
                checkpoint_config=CheckpointConfig(num_to_keep=2),
                failure_config=FailureConfig(max_failures=args.max_failures),
            ),
        ).fit()
    m = result.metrics
    print(f"namespace: {namespace}")
    print(
        f"epoch: {m['epoch']}  step: {m['step']}  train_loss: {m['train_loss']:.4f}  val_loss: {m['val_loss']:.4f}"
    )
    print(f"val_accuracy: {m['val_accuracy']:.4f}")
    print(f"checkpoint: {result.checkpoint.path if result.checkpoint else None}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
