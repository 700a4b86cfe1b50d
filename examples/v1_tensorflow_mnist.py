"""Ray Train 1.x's TensorFlow MNIST example (Ray 1.12, ``python/ray/train/examples/tensorflow_mnist_example.py``)
on trainforge, with the import lines changed and synthetic digits in place of the download:

    python examples/v1_tensorflow_mnist.py [--num-workers 2] [--epochs 4] [--use-gpu]

``Trainer(backend="tensorflow")`` gives every worker its ``TF_CONFIG``, so the
``tf.distribute.MultiWorkerMirroredStrategy()`` built in ``train_func`` joins the workers and
all-reduces the gradients of a small CNN; a Keras callback reports each epoch's logs with
``train.report(**logs)``, and ``trainer.run`` returns each worker's ``history.history``.

What changed from Ray's file, line by line:

- ``import ray.train as train`` -> ``import trainforge.v1 as train``
- ``from ray.train import Trainer`` -> ``from trainforge.v1 import Trainer``
- before ``import tensorflow``: ``TF_USE_LEGACY_KERAS=1`` (and ``TF_CPP_MIN_LOG_LEVEL=2``) unless set.
  trainforge's TensorFlow workers run tf-keras (Keras 2: Keras 3 does not work with
  ``MultiWorkerMirroredStrategy``); the driver imports the same Keras, so ``TrainReportCallback``,
  defined here on ``tensorflow.keras.callbacks.Callback``, is a tf-keras callback on the workers too.
- ``tf.keras.datasets.mnist.load_data()`` -> ``synthetic_mnist()`` (defined below; no download):
  28x28 images in [0, 255] whose class draws a bright band.
- ``train_func``'s ``steps_per_epoch`` default 70 -> 20 (the synthetic set is small; the config
  key still sets it).
- ``__main__``: no ``ray.init(...)`` (nor ``--address``); the argument parsing is a ``main()``.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # tf.keras is tf-keras (Keras 2), as on the workers
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ info lines, on every worker

# fmt: off
# __tensorflow_mnist_example__
import json

import numpy as np
import tensorflow as tf
from tensorflow.keras.callbacks import Callback

import trainforge.v1 as train
from trainforge.v1 import Trainer


class TrainReportCallback(Callback):
    def on_epoch_end(self, epoch, logs=None):
        train.report(**logs)


def synthetic_mnist(size=2048, seed=0):
    """Stands in for ``tf.keras.datasets.mnist.load_data()`` (training part): uint8 images, int labels."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 10, size)
    x = rng.integers(0, 128, (size, 28, 28))
    for i, label in enumerate(y):
        x[i, 2 * label:2 * label + 4, :] += 127  # the class's band
    return (x.astype(np.uint8), y.astype(np.uint8)), None


def mnist_dataset(batch_size):
    (x_train, y_train), _ = synthetic_mnist()
    # The `x` arrays are in uint8 and have values in the [0, 255] range.
    # You need to convert them to float32 with values in the [0, 1] range.
    x_train = x_train / np.float32(255)
    y_train = y_train.astype(np.int64)
    train_dataset = (
        tf.data.Dataset.from_tensor_slices((x_train, y_train))
        .shuffle(60000)
        .repeat()
        .batch(batch_size)
    )
    return train_dataset


def build_and_compile_cnn_model(config):
    learning_rate = config.get("lr", 0.001)
    model = tf.keras.Sequential(
        [
            tf.keras.Input(shape=(28, 28)),
            tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
            tf.keras.layers.Conv2D(32, 3, activation="relu"),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(128, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.SGD(learning_rate=learning_rate),
        metrics=["accuracy"],
    )
    return model


def train_func(config):
    per_worker_batch_size = config.get("batch_size", 64)
    epochs = config.get("epochs", 3)
    steps_per_epoch = config.get("steps_per_epoch", 20)

    tf_config = json.loads(os.environ["TF_CONFIG"])
    num_workers = len(tf_config["cluster"]["worker"])

    strategy = tf.distribute.MultiWorkerMirroredStrategy()

    global_batch_size = per_worker_batch_size * num_workers
    multi_worker_dataset = mnist_dataset(global_batch_size)

    with strategy.scope():
        # Model building/compiling need to be within `strategy.scope()`.
        multi_worker_model = build_and_compile_cnn_model(config)

    history = multi_worker_model.fit(
        multi_worker_dataset,
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        callbacks=[TrainReportCallback()],
    )
    results = history.history
    return results


def train_tensorflow_mnist(num_workers=2, use_gpu=False, epochs=4):
    trainer = Trainer(backend="tensorflow", num_workers=num_workers, use_gpu=use_gpu)
    trainer.start()
    results = trainer.run(
        train_func=train_func, config={"lr": 1e-3, "batch_size": 64, "epochs": epochs}
    )
    trainer.shutdown()
    print(f"Results: {results[0]}")
    return results
# fmt: on


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-workers", "-n", type=int, default=2, help="Sets number of workers for training.")
    parser.add_argument("--use-gpu", action="store_true", default=False, help="Enables GPU training")
    parser.add_argument("--epochs", type=int, default=3, help="Number of epochs to train for.")
    parser.add_argument("--smoke-test", action="store_true", default=False, help="Finish quickly for testing.")
    args = parser.parse_args(argv)
    if args.smoke_test:
        train_tensorflow_mnist(num_workers=2, use_gpu=False, epochs=1)
    else:
        train_tensorflow_mnist(num_workers=args.num_workers, use_gpu=args.use_gpu, epochs=args.epochs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
