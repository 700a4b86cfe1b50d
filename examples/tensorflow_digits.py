"""Train a small Keras MLP on scikit-learn's handwritten digits with data-parallel TensorFlow workers.

    python examples/tensorflow_digits.py --num-workers 2 --epochs 5

Each worker builds ``tf.distribute.MultiWorkerMirroredStrategy()`` inside the train loop: trainforge
gave every worker its ``TF_CONFIG`` (the cluster and its own index), so the strategy joins them and
all-reduces the gradients. Every worker reads the whole data set; TensorFlow's auto-sharding gives
each one half of every global batch. ``ReportCheckpointCallback`` reports Keras's logs at each
epoch's end with the model as a checkpoint (saved by every worker, kept once). Keras is tf-keras
(Keras 2: ``pip install tf-keras==2.21.0 --no-deps`` for TensorFlow 2.21), which ``tf.keras`` is on
the workers. With ``--max-failures`` a crashed worker restarts the run from the latest checkpoint,
at the epoch after it. At the end the driver loads the last checkpoint's model and scores it.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ info lines, on every worker

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import trainforge as train
from trainforge import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from trainforge.tensorflow import TensorflowCheckpoint, TensorflowTrainer


def load_data(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    x, y = load_digits(return_X_y=True)
    x_train, x_val, y_train, y_val = train_test_split(
        (x / 16.0).astype(np.float32), y, test_size=0.2, random_state=seed, stratify=y
    )
    return x_train, y_train, x_val, y_val


def train_loop_per_worker(config: dict) -> None:
    import tensorflow as tf  # tf.keras is tf-keras here: trainforge set TF_USE_LEGACY_KERAS=1

    from trainforge.tensorflow.keras import ReportCheckpointCallback

    strategy = tf.distribute.MultiWorkerMirroredStrategy()  # joins the workers named in TF_CONFIG
    x_train, y_train, x_val, y_val = load_data(config["seed"])
    global_batch_size = config["batch_size"] * strategy.num_replicas_in_sync
    train_ds = (
        tf.data.Dataset.from_tensor_slices((x_train, y_train))
        .shuffle(len(x_train), seed=config["seed"])  # the same order on every worker
        .batch(global_batch_size)
    )
    val_ds = tf.data.Dataset.from_tensor_slices((x_val, y_val)).batch(global_batch_size)

    checkpoint = train.get_checkpoint()
    initial_epoch = 0
    with strategy.scope():  # the model's variables are mirrored on every worker
        if checkpoint:  # a restart: continue from the run's latest checkpoint
            model = TensorflowCheckpoint(checkpoint.path, checkpoint.filesystem).get_model()
            initial_epoch = checkpoint.get_metadata()["epoch"] + 1
        else:
            tf.keras.utils.set_random_seed(config["seed"])
            model = tf.keras.Sequential(
                [
                    tf.keras.layers.Dense(128, activation="relu", input_shape=(64,)),
                    tf.keras.layers.Dense(10),
                ]
            )
            model.compile(
                optimizer=tf.keras.optimizers.Adam(config["lr"]),
                loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"],
            )
    model.fit(
        train_ds,
        validation_data=val_ds,
        epochs=config["epochs"],
        initial_epoch=initial_epoch,
        verbose=0,
        callbacks=[ReportCheckpointCallback()],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32, help="rows per worker and step")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-failures", type=int, default=0)
    parser.add_argument(
        "--storage-path", default=None, help="where runs are kept (default ~/trainforge_results)"
    )
    args = parser.parse_args(argv)

    result = TensorflowTrainer(
        train_loop_per_worker,
        train_loop_config={"epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr, "seed": args.seed},
        scaling_config=ScalingConfig(num_workers=args.num_workers),
        run_config=RunConfig(
            storage_path=args.storage_path,
            checkpoint_config=CheckpointConfig(num_to_keep=2),
            failure_config=FailureConfig(max_failures=args.max_failures),
        ),
    ).fit()
    m = result.metrics
    print(f"epochs: {args.epochs}  loss: {m['loss']:.4f}  accuracy: {m['accuracy']:.4f}  val_loss: {m['val_loss']:.4f}")
    print(f"val_accuracy: {m['val_accuracy']:.4f}")
    assert result.checkpoint is not None
    # The last epoch's model, loaded on the driver (tf_keras.models.load_model: no TF_USE_LEGACY_KERAS needed).
    model = TensorflowCheckpoint(result.checkpoint.path, result.checkpoint.filesystem).get_model()
    _, _, x_val, y_val = load_data(args.seed)
    accuracy = float((model.predict(x_val, verbose=0).argmax(-1) == y_val).mean())
    print(f"checkpoint model val_accuracy: {accuracy:.4f}")
    print(f"checkpoint: {result.checkpoint.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
