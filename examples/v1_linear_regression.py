"""Ray Train 1.x's linear-regression example (Ray 1.12, ``python/ray/train/examples/train_linear_example.py``)
on trainforge, with the import lines changed:

    python examples/v1_linear_regression.py [--num-workers 2] [--epochs 3] [--use-gpu]

Fits ``y = 2x + 5`` (``LinearDataset``) with ``train.torch.prepare_model`` (DistributedDataParallel)
and ``prepare_data_loader`` (a DistributedSampler) on workers that a ``Trainer`` started; every
epoch each worker reports its validation loss and model with ``train.report(**result)``, which
``JsonLoggerCallback`` and ``TBXLoggerCallback`` write to ``{logdir}/run_001/`` (``results.json``
and TensorBoard event files). ``trainer.run`` returns each worker's list of results.

What changed from Ray's file, line by line:

- ``import ray.train as train`` -> ``import trainforge.v1 as train``
- ``from ray.train import Trainer`` -> ``from trainforge.v1 import Trainer``
- ``from ray.train.callbacks import ...`` -> ``from trainforge.v1.callbacks import ...``
- ``__main__``: no ``import ray`` / ``ray.init(...)`` (nor ``--address``): the workers are local
  processes (or Ray actors when this process is connected to a Ray cluster); the argument parsing
  is a ``main()`` as in the other examples.
"""

from __future__ import annotations

import argparse
import sys

# fmt: off
# __train_linear_example__
import numpy as np
import torch
import torch.nn as nn

import trainforge.v1 as train
from trainforge.v1 import Trainer
from trainforge.v1.callbacks import JsonLoggerCallback, TBXLoggerCallback


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


def train_epoch(dataloader, model, loss_fn, optimizer):
    for X, y in dataloader:
        # Compute prediction error
        pred = model(X)
        loss = loss_fn(pred, y)

        # Backpropagation
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def validate_epoch(dataloader, model, loss_fn):
    num_batches = len(dataloader)
    model.eval()
    loss = 0
    with torch.no_grad():
        for X, y in dataloader:
            pred = model(X)
            loss += loss_fn(pred, y).item()
    loss /= num_batches
    import copy

    model_copy = copy.deepcopy(model)
    result = {"model": model_copy.cpu().state_dict(), "loss": loss}
    return result


def train_func(config):
    data_size = config.get("data_size", 1000)
    val_size = config.get("val_size", 400)
    batch_size = config.get("batch_size", 32)
    hidden_size = config.get("hidden_size", 1)
    lr = config.get("lr", 1e-2)
    epochs = config.get("epochs", 3)

    train_dataset = LinearDataset(2, 5, size=data_size)
    val_dataset = LinearDataset(2, 5, size=val_size)
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=batch_size)
    validation_loader = torch.utils.data.DataLoader(val_dataset, batch_size=batch_size)

    train_loader = train.torch.prepare_data_loader(train_loader)
    validation_loader = train.torch.prepare_data_loader(validation_loader)

    model = nn.Linear(1, hidden_size)
    model = train.torch.prepare_model(model)

    loss_fn = nn.MSELoss()

    optimizer = torch.optim.SGD(model.parameters(), lr=lr)

    results = []

    for _ in range(epochs):
        train_epoch(train_loader, model, loss_fn, optimizer)
        result = validate_epoch(validation_loader, model, loss_fn)
        train.report(**result)
        results.append(result)

    return results


def train_linear(num_workers=2, use_gpu=False, epochs=3):
    trainer = Trainer(backend="torch", num_workers=num_workers, use_gpu=use_gpu)
    config = {"lr": 1e-2, "hidden_size": 1, "batch_size": 4, "epochs": epochs}
    trainer.start()
    results = trainer.run(
        train_func, config, callbacks=[JsonLoggerCallback(), TBXLoggerCallback()]
    )
    trainer.shutdown()

    print(results)
    return results
# fmt: on


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-workers", "-n", type=int, default=2, help="Sets number of workers for training.")
    parser.add_argument("--use-gpu", action="store_true", help="Whether to use GPU for training.")
    parser.add_argument("--epochs", type=int, default=3, help="Number of epochs to train for.")
    parser.add_argument("--smoke-test", action="store_true", default=False, help="Finish quickly for testing.")
    args = parser.parse_args(argv)
    if args.smoke_test:
        train_linear()
    else:
        train_linear(num_workers=args.num_workers, use_gpu=args.use_gpu, epochs=args.epochs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
