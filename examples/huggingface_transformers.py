"""Train a tiny Vision Transformer (built from a config: nothing downloaded) with the Hugging Face
``Trainer`` on scikit-learn's handwritten digits, on data-parallel workers.

    python examples/huggingface_transformers.py --num-workers 2 --epochs 6

Each 8x8 image is cut into 16 patches of 2x2 pixels: no image processor, no download
(``HF_HUB_OFFLINE=1``). The ``Trainer`` is built inside the train loop, so
Accelerate joins the workers' process group; ``RayTrainReportCallback`` reports its logs and
evaluation metrics and turns each of its checkpoints into the run's (saved once, not once per rank);
``prepare_trainer`` lets it read the workers' shards of ``datasets=``. With ``--max-failures`` a
crashed worker restarts the run from the latest checkpoint.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a tiny model from a config: never reach the Hub

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import trainforge as train
from trainforge import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from trainforge.huggingface.transformers import RayTrainReportCallback, prepare_trainer
from trainforge.torch import TorchTrainer


def load_data(seed: int = 0) -> dict[str, dict[str, np.ndarray]]:
    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.data, digits.target, test_size=0.2, random_state=seed, stratify=digits.target
    )
    pixels = lambda x: (x / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)  # noqa: E731
    return {
        "train": {"pixel_values": pixels(x_train), "labels": y_train.astype(np.int64)},
        "eval": {"pixel_values": pixels(x_test), "labels": y_test.astype(np.int64)},
    }


def train_loop_per_worker(config: dict) -> None:
    import transformers

    transformers.set_seed(config["seed"])
    model = transformers.ViTForImageClassification(
        transformers.ViTConfig(
            image_size=8, patch_size=2, num_channels=1, hidden_size=64, num_hidden_layers=2,
            num_attention_heads=4, intermediate_size=128, num_labels=10,
        )
    )  # fmt: skip
    args = transformers.TrainingArguments(
        output_dir=config["output_dir"],
        num_train_epochs=config["epochs"],
        per_device_train_batch_size=32,
        per_device_eval_batch_size=128,
        learning_rate=2e-3,
        average_tokens_across_devices=False,  # else the logged loss is num_workers times the mean
        warmup_steps=10,
        logging_steps=10,
        eval_strategy="epoch",
        save_strategy="epoch",
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        ddp_find_unused_parameters=False,
    )

    def accuracy(pred: transformers.EvalPrediction) -> dict[str, float]:
        return {"accuracy": float((pred.predictions.argmax(-1) == pred.label_ids).mean())}

    trainer = transformers.Trainer(
        model=model,
        args=args,
        train_dataset=train.get_dataset_shard("train"),
        eval_dataset=train.get_dataset_shard("eval"),
        compute_metrics=accuracy,
        callbacks=[RayTrainReportCallback()],
    )
    trainer = prepare_trainer(trainer)
    checkpoint = train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            trainer.train(resume_from_checkpoint=os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME))
    else:
        trainer.train()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-failures", type=int, default=0)
    parser.add_argument(
        "--storage-path", default=None, help="where runs are kept (default ~/trainforge_results)"
    )
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="hf_digits_") as output_dir:  # the Trainer's scratch files
        result = TorchTrainer(
            train_loop_per_worker,
            train_loop_config={"epochs": args.epochs, "seed": args.seed, "output_dir": output_dir},
            datasets=load_data(args.seed),
            dataset_config={"datasets_to_split": "all"},  # each worker evaluates its half of the test set
            scaling_config=ScalingConfig(num_workers=args.num_workers),
            run_config=RunConfig(
                storage_path=args.storage_path,
                checkpoint_config=CheckpointConfig(
                    num_to_keep=2, checkpoint_score_attribute="eval_accuracy", checkpoint_score_order="max"
                ),
                failure_config=FailureConfig(max_failures=args.max_failures),
            ),
        ).fit()
    m = result.metrics
    print(f"epochs: {m['epoch']:.0f}  steps: {m['step']}  train_loss: {m['train_loss']:.4f}")
    print(f"eval_accuracy: {m['eval_accuracy']:.4f}")
    best, best_metrics = max(result.best_checkpoints, key=lambda pair: pair[1]["eval_accuracy"])
    print(f"best checkpoint (eval_accuracy {best_metrics['eval_accuracy']:.4f}): {best.path}")
    print(f"checkpoint: {result.checkpoint.path if result.checkpoint else None}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
