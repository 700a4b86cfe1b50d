"""Ray Train 1.x's Fashion-MNIST example (Ray 1.12, ``python/ray/train/examples/train_fashion_mnist_example.py``)
on trainforge, with the import lines changed and synthetic images in place of the download:

    python examples/v1_fashion_mnist.py [--num-workers 2] [--use-gpu]

A 3-layer MLP classifies 28x28 images into 10 classes on workers that a ``Trainer`` started: each
worker gets ``batch_size // train.world_size()`` images per batch and its share of the data
(``train.torch.prepare_data_loader``), the model is wrapped in DistributedDataParallel
(``prepare_model``), every epoch reports the test loss (``train.report(loss=...)``, written to
``{logdir}/run_001/results.json`` by ``JsonLoggerCallback``), and ``trainer.run`` returns each
worker's list of losses.

What changed from Ray's file, line by line:

- ``import ray.train as train`` -> ``import trainforge.v1 as train``
- ``from ray.train.trainer import Trainer`` -> ``from trainforge.v1 import Trainer``
- ``from ray.train.callbacks import JsonLoggerCallback`` -> ``from trainforge.v1.callbacks import JsonLoggerCallback``
- ``datasets.FashionMNIST(root="~/data", train=..., download=True, transform=ToTensor())`` ->
  ``SyntheticFashionMNIST(train=...)`` (defined below; no torchvision, no download): 1x28x28
  images in [0, 1] whose class draws a bright band, as learnable as the real thing and as fast as
  a test needs. The ``torchvision`` imports went with it.
- ``Dict`` annotations -> ``dict`` (this repository's linter, pyupgrade).
- ``train_fashion_mnist`` returns ``result`` (the tests read it); ``__main__``: no ``ray.init(...)`` (nor
  ``--address``); the argument parsing is a ``main()``.
"""

from __future__ import annotations

import argparse
import sys

# fmt: off
# __train_fashion_mnist_example__
import torch
from torch import nn
from torch.utils.data import DataLoader

import trainforge.v1 as train
from trainforge.v1 import Trainer
from trainforge.v1.callbacks import JsonLoggerCallback


class SyntheticFashionMNIST(torch.utils.data.Dataset):
    """Stands in for torchvision's FashionMNIST: (image of shape 1x28x28, label) pairs."""

    def __init__(self, train=True, size=None):
        size = size or (512 if train else 128)
        generator = torch.Generator().manual_seed(0 if train else 1)
        self.labels = torch.randint(0, 10, (size,), generator=generator)
        self.images = 0.5 * torch.rand(size, 1, 28, 28, generator=generator)
        for i, label in enumerate(self.labels.tolist()):
            self.images[i, 0, 2 * label:2 * label + 4, :] += 0.5  # the class's band

    def __getitem__(self, index):
        return self.images[index], self.labels[index]

    def __len__(self):
        return len(self.labels)


# Download training data from open datasets.
training_data = SyntheticFashionMNIST(train=True)

# Download test data from open datasets.
test_data = SyntheticFashionMNIST(train=False)


# Define model
class NeuralNetwork(nn.Module):
    def __init__(self):
        super().__init__()
        self.flatten = nn.Flatten()
        self.linear_relu_stack = nn.Sequential(
            nn.Linear(28 * 28, 512),
            nn.ReLU(),
            nn.Dropout(0.25),
            nn.Linear(512, 512),
            nn.ReLU(),
            nn.Dropout(0.25),
            nn.Linear(512, 10),
            nn.ReLU(),
        )

    def forward(self, x):
        x = self.flatten(x)
        logits = self.linear_relu_stack(x)
        return logits


def train_epoch(dataloader, model, loss_fn, optimizer):
    size = len(dataloader.dataset) // train.world_size()
    model.train()
    for batch, (X, y) in enumerate(dataloader):
        # Compute prediction error
        pred = model(X)
        loss = loss_fn(pred, y)

        # Backpropagation
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

        if batch % 100 == 0:
            loss, current = loss.item(), batch * len(X)
            print(f"loss: {loss:>7f}  [{current:>5d}/{size:>5d}]")


def validate_epoch(dataloader, model, loss_fn):
    size = len(dataloader.dataset) // train.world_size()
    num_batches = len(dataloader)
    model.eval()
    test_loss, correct = 0, 0
    with torch.no_grad():
        for X, y in dataloader:
            pred = model(X)
            test_loss += loss_fn(pred, y).item()
            correct += (pred.argmax(1) == y).type(torch.float).sum().item()
    test_loss /= num_batches
    correct /= size
    print(
        f"Test Error: \n "
        f"Accuracy: {(100 * correct):>0.1f}%, "
        f"Avg loss: {test_loss:>8f} \n"
    )
    return test_loss


def train_func(config: dict):
    batch_size = config["batch_size"]
    lr = config["lr"]
    epochs = config["epochs"]

    worker_batch_size = batch_size // train.world_size()

    # Create data loaders.
    train_dataloader = DataLoader(training_data, batch_size=worker_batch_size)
    test_dataloader = DataLoader(test_data, batch_size=worker_batch_size)

    train_dataloader = train.torch.prepare_data_loader(train_dataloader)
    test_dataloader = train.torch.prepare_data_loader(test_dataloader)

    # Create model.
    model = NeuralNetwork()
    model = train.torch.prepare_model(model)

    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)

    loss_results = []

    for _ in range(epochs):
        train_epoch(train_dataloader, model, loss_fn, optimizer)
        loss = validate_epoch(test_dataloader, model, loss_fn)
        train.report(loss=loss)
        loss_results.append(loss)

    return loss_results


def train_fashion_mnist(num_workers=2, use_gpu=False):
    trainer = Trainer(backend="torch", num_workers=num_workers, use_gpu=use_gpu)
    trainer.start()
    result = trainer.run(
        train_func=train_func,
        config={"lr": 1e-3, "batch_size": 64, "epochs": 4},
        callbacks=[JsonLoggerCallback()],
    )
    trainer.shutdown()
    print(f"Loss results: {result}")
    return result
# fmt: on


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-workers", "-n", type=int, default=2, help="Sets number of workers for training.")
    parser.add_argument("--use-gpu", action="store_true", default=False, help="Enables GPU training")
    parser.add_argument("--smoke-test", action="store_true", default=False, help="Finish quickly for testing.")
    args = parser.parse_args(argv)
    train_fashion_mnist(num_workers=args.num_workers, use_gpu=args.use_gpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
