"""Train a ``trainforge.model.Model`` on scikit-learn's handwritten digits with the managed loop, then
use the same object for inference, save it and load it back.

    python examples/model_digits.py --num-workers 2 --epochs 5 [--fp16] [--register NAME [--alias ALIAS]]
    python examples/model_digits.py --tune 8 --register NAME       # the best of 8 trials (ASHA)

``DigitsModel`` carries everything about the model: ``setup`` builds and registers the network, its
optimizer, loss and learning-rate scheduler; ``setup_data`` the loaders (``config[BATCH_SIZE]`` is
the global batch, split over the workers); ``preprocess``/``postprocess`` turn raw 8x8 images into
inputs and logits into digits; ``hyperparameter_space`` is what ``Tuner(DigitsModel)`` searches.
``ModelTrainer.fit()`` runs the epochs on data-parallel workers (metrics averaged over them,
weighted by samples; ``--fp16``: bfloat16 autocast on the CPU, float16 with a gradient scaler on a
GPU; a checkpoint every epoch; with ``--max-failures`` a crashed worker restarts from the latest).
``trainer.get_model()`` is the trained model on the CPU: ``model(images)`` predicts digits.

``--tune N`` searches ``hyperparameter_space()`` with N trials instead (ASHA stops the poor ones
early; on a train server when one runs, each trial a job) and goes on with the best trial's model.
``--register NAME`` registers the result (the run's, or the best trial's) in the model registry
(``$TRAINFORGE_REGISTRY``, else ``~/trainforge/registry``), ``--alias`` pointing an alias at it. Run
as a script, ``DigitsModel`` is defined in ``__main__``, so it is saved by value with the model:
``trainforge serve`` loads it from any directory, with no import path.
"""

from __future__ import annotations

import argparse
import sys
import tempfile

import torch

from trainforge import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from trainforge.model import BATCH_SIZE, LoopConfig, Model, ModelTrainer


def digits_split() -> tuple:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    images, labels = load_digits(return_X_y=True)
    return train_test_split(images.reshape(-1, 8, 8), labels, test_size=0.2, random_state=0, stratify=labels)


class DigitsModel(Model):
    def setup(self, config: dict) -> None:
        torch.manual_seed(config.get("seed", 0))
        net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
        optimizer = torch.optim.Adam(net.parameters(), lr=config.get("lr", 3e-3))
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
        self.register(models=net, optimizers=optimizer, criterion=torch.nn.CrossEntropyLoss(), schedulers=scheduler)

    def setup_data(self, config: dict) -> None:
        from torch.utils.data import DataLoader, TensorDataset

        x_train, x_val, y_train, y_val = digits_split()

        def dataset(images, labels):
            return TensorDataset(self.preprocess(images), torch.as_tensor(labels))

        self.register_data(
            train_loader=DataLoader(dataset(x_train, y_train), batch_size=config[BATCH_SIZE], shuffle=True),
            validation_loader=DataLoader(dataset(x_val, y_val), batch_size=256),
        )

    def preprocess(self, images):
        """Raw 8x8 images (pixel values 0-16) -> normalized rows of 64 features."""
        return torch.as_tensor(images, dtype=torch.float32).reshape(-1, 64) / 16.0

    def postprocess(self, logits):
        return logits.argmax(-1)

    @classmethod
    def hyperparameter_space(cls) -> dict:
        from trainforge import tune

        return {"lr": tune.loguniform(1e-4, 1e-2)}


def tune_lr(trainer: ModelTrainer, num_samples: int, epochs: int, storage_path: str | None):
    """The best of ``num_samples`` trials of ``trainer`` over ``DigitsModel.hyperparameter_space()``."""
    from trainforge import tune
    from trainforge.tune import TuneConfig, Tuner
    from trainforge.tune.schedulers import ASHAScheduler

    grid = Tuner(
        trainer,  # no param_space: the model's hyperparameter_space() is searched
        tune_config=TuneConfig(metric="val_accuracy", mode="max", num_samples=num_samples,
                               scheduler=ASHAScheduler(max_t=epochs, grace_period=1, reduction_factor=2)),
        run_config=tune.RunConfig(storage_path=storage_path),
    ).fit()  # fmt: skip
    best = grid.get_best_result()
    print(f"best of {len(grid)} trials: lr={best.config['train_loop_config']['lr']:.2e}")
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size, split over the workers")
    parser.add_argument("--fp16", action="store_true", help="mixed precision (bfloat16 on the CPU)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-failures", type=int, default=0)
    parser.add_argument(
        "--storage-path", default=None, help="where runs are kept (default ~/trainforge_results)"
    )
    parser.add_argument("--tune", type=int, default=0, metavar="N", help="tune lr over N trials (ASHA)")
    parser.add_argument("--register", default=None, metavar="NAME", help="register the model as NAME")
    parser.add_argument("--alias", default=None, help="with --register: point this alias at the new version")
    args = parser.parse_args(argv)
    if args.alias and not args.register:
        parser.error("--alias needs --register NAME")

    trainer = ModelTrainer(
        DigitsModel,
        config={"lr": args.lr, BATCH_SIZE: args.batch_size, "seed": args.seed},
        loop_config=LoopConfig(num_epochs=args.epochs, use_fp16=args.fp16, scheduler_step_freq="epoch"),
        scaling_config=ScalingConfig(num_workers=args.num_workers),
        run_config=RunConfig(
            storage_path=args.storage_path,
            checkpoint_config=CheckpointConfig(num_to_keep=2),
            failure_config=FailureConfig(max_failures=args.max_failures),
        ),
    )
    if args.tune:
        result = tune_lr(trainer, args.tune, args.epochs, args.storage_path)
        model = DigitsModel.from_checkpoint(result.checkpoint)  # the best trial's model, on the CPU
    else:
        result = trainer.fit()
        model = trainer.get_model()  # the trained DigitsModel, on the CPU
    m = result.metrics
    print(f"epoch: {m['epoch']}  train_loss: {m['train_loss']:.4f}  val_loss: {m['val_loss']:.4f}")
    print(f"val_accuracy: {m['val_accuracy']:.4f}")
    print(f"checkpoint: {result.checkpoint.path if result.checkpoint else None}")
    if args.register:
        from trainforge.registry import Registry

        # The run's latest checkpoint, its metrics and lineage (run directory, config, git commit).
        mv = Registry().register(args.register, result, model_cls=DigitsModel, alias=args.alias)
        alias = f" ({args.alias} -> version {mv.version})" if args.alias else ""
        print(f"registered {mv.uri}{alias}: val_accuracy {mv.metrics['val_accuracy']:.4f}")

    _, x_val, _, y_val = digits_split()
    predicted = model(x_val)  # preprocess -> forward (eval mode, no grad) -> postprocess
    accuracy = float((predicted == torch.as_tensor(y_val)).float().mean())
    print(f"inference accuracy: {accuracy:.4f}  first digits: {predicted[:10].tolist()}")

    with tempfile.TemporaryDirectory(prefix="model_digits_") as directory:
        model.save(directory)
        loaded = Model.load(directory)  # its class by import path (pickled with it when in __main__, as here)
        same = torch.equal(loaded(x_val), predicted)
        print(f"saved and loaded {type(loaded).__name__}: same predictions: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
