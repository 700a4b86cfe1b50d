"""RaySGD's linear-regression example (Ray 1.x, ``python/ray/util/sgd/torch/examples/train_example.py``)
on trainforge, with the import lines changed:

    python examples/raysgd_linear.py [--num-workers 2] [--use-gpu]

Fits ``y = 2x + 5`` (``LinearDataset``) with a ``TrainingOperator`` built from RaySGD's creator
functions, five ``trainer.train()`` epochs driven from here on workers that stay up, then
``trainer.validate()``, ``get_model()`` and ``shutdown()``.

What changed from RaySGD's file, line by line:

- ``from ray.util.sgd import TorchTrainer`` -> ``from trainforge.sgd import TorchTrainer``
- ``from ray.util.sgd.torch import TrainingOperator`` -> ``from trainforge.sgd.torch import TrainingOperator``
- in ``train_example``: ``import ray`` and ``get_model(to_cpu=ray.util.client.ray.is_connected())``
  (Ray Client) -> ``get_model()`` (the model always comes back on the CPU)
- ``__main__``: no ``ray.init(...)`` (and no ``--address``/``--server-address``/``--tune``): the
  workers are local processes (or Ray actors when this process is connected to a Ray cluster); the
  argument parsing is a ``main()`` as in the other examples.
"""

from __future__ import annotations

import argparse
import sys

# fmt: off
# __torch_train_example__
import numpy as np
import torch
import torch.nn as nn

from trainforge.sgd import TorchTrainer
from trainforge.sgd.torch import TrainingOperator


class LinearDataset(torch.utils.data.Dataset):
    """y = a * x + b"""

    def __init__(self, a, b, size=1000):
        x = np.arange(0, 10, 10 / size, dtype=np.float32)
        self.x = torch.from_numpy(x)
        self.y = torch.from_numpy(a * x + b)

    def __getitem__(self, index):
        return self.x[index, None], self.y[index, None]

    def __len__(self):
        return len(self.x)


def model_creator(config):
    """Returns a torch.nn.Module object."""
    return nn.Linear(1, config.get("hidden_size", 1))


def optimizer_creator(model, config):
    """Returns optimizer defined upon the model parameters."""
    return torch.optim.SGD(model.parameters(), lr=config.get("lr", 1e-2))


def scheduler_creator(optimizer, config):
    """Returns a learning rate scheduler wrapping the optimizer.

    You will need to set ``TorchTrainer(scheduler_step_freq="epoch")``
    for the scheduler to be incremented correctly.

    If using a scheduler for validation loss, be sure to call
    ``trainer.update_scheduler(validation_loss)``.
    """
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.9)


def data_creator(config):
    """Returns training dataloader, validation dataloader."""
    train_dataset = LinearDataset(2, 5, size=config.get("data_size", 1000))
    val_dataset = LinearDataset(2, 5, size=config.get("val_size", 400))
    train_loader = torch.utils.data.DataLoader(
        train_dataset,
        batch_size=config.get("batch_size", 32),
    )
    validation_loader = torch.utils.data.DataLoader(
        val_dataset,
        batch_size=config.get("batch_size", 32))
    return train_loader, validation_loader


def train_example(num_workers=1, use_gpu=False):
    CustomTrainingOperator = TrainingOperator.from_creators(
        model_creator=model_creator, optimizer_creator=optimizer_creator,
        data_creator=data_creator, scheduler_creator=scheduler_creator,
        loss_creator=nn.MSELoss)
    trainer1 = TorchTrainer(
        training_operator_cls=CustomTrainingOperator,
        num_workers=num_workers,
        use_gpu=use_gpu,
        config={
            "lr": 1e-2,  # used in optimizer_creator
            "hidden_size": 1,  # used in model_creator
            "batch_size": 4,  # used in data_creator
        },
        backend="gloo",
        scheduler_step_freq="epoch")
    for i in range(5):  # noqa: B007 - RaySGD's code as it is
        stats = trainer1.train()
        print(stats)

    print(trainer1.validate())

    m = trainer1.get_model()
    print("trained weight: % .2f, bias: % .2f" % (  # noqa: UP031
        m.weight.item(), m.bias.item()))
    trainer1.shutdown()
    print("success!")
# fmt: on


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-workers", "-n", type=int, default=1, help="Sets number of workers for training.")
    parser.add_argument("--use-gpu", action="store_true", default=False, help="Enables GPU training")
    parser.add_argument("--smoke-test", action="store_true", default=False, help="Finish quickly for testing.")
    args = parser.parse_args(argv)
    train_example(num_workers=args.num_workers, use_gpu=args.use_gpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
