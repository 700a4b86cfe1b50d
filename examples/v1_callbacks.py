"""Ray Train 1.x's callback and checkpoint examples (Ray 1.12 user guide, "Logging, Monitoring, and
Callbacks" and "Checkpointing") on trainforge, with the import lines changed:

    python examples/v1_callbacks.py [--num-workers 2]

A ``TrainingCallback`` of your own (``handle_result`` gets one dict per worker at every
``train.report()``) next to the built-in ``JsonLoggerCallback`` and ``TBXLoggerCallback``; then a
run whose ``train.save_checkpoint()`` s are kept by a ``CheckpointStrategy`` (the two lowest
losses, in ``{logdir}/run_002/checkpoints/``), and a third run that resumes from the best one
(``run(checkpoint=trainer.best_checkpoint_path)``, read back with ``train.load_checkpoint()``).
The workers stay up for the three runs.

What changed from the guide's snippets:

- ``from ray import train`` -> ``from trainforge import v1 as train``
- ``from ray.train import Trainer, TrainingCallback, CheckpointStrategy`` -> ``from trainforge.v1 import ...``
- ``from ray.train.callbacks import JsonLoggerCallback, TBXLoggerCallback`` -> ``from trainforge.v1.callbacks import ...``
- ``List[Dict]`` annotations -> ``list[dict]`` (this repository's linter, pyupgrade).
- the guide's snippets are put together in ``train_with_callbacks()``, whose values the tests read;
  ``"model"`` is a number that training "improves" (the guide's placeholder, ``model = 0``).
"""

from __future__ import annotations

import argparse
import sys

# fmt: off
# __callbacks_example__
from trainforge import v1 as train
from trainforge.v1 import CheckpointStrategy, Trainer, TrainingCallback
from trainforge.v1.callbacks import JsonLoggerCallback, TBXLoggerCallback


class PrintingCallback(TrainingCallback):
    def handle_result(self, results: list[dict], **info):
        print(results)


class LossHistoryCallback(TrainingCallback):
    """Keeps every worker's reported loss, per report, on the driver."""

    def __init__(self):
        self.history = []

    def start_training(self, logdir, config, **info):
        self.logdir = logdir

    def handle_result(self, results: list[dict], **info):
        self.history.append([result["loss"] for result in results])


def train_func(config):
    checkpoint = train.load_checkpoint()
    model = checkpoint["model"] if checkpoint else 0  # This should be replaced with a real model.
    start_epoch = checkpoint["epoch"] + 1 if checkpoint else 0
    for epoch in range(start_epoch, start_epoch + config["num_epochs"]):
        model += epoch
        loss = abs(config.get("target", 5) - model)
        train.report(epoch=epoch, loss=loss, rank=train.world_rank())
        train.save_checkpoint(epoch=epoch, model=model, loss=loss)
    return model


def train_with_callbacks(num_workers=2):
    trainer = Trainer(backend="torch", num_workers=num_workers)
    trainer.start()

    history = LossHistoryCallback()
    trainer.run(train_func, config={"num_epochs": 3},
                callbacks=[PrintingCallback(), history, JsonLoggerCallback(), TBXLoggerCallback()])

    checkpoint_strategy = CheckpointStrategy(num_to_keep=2, checkpoint_score_attribute="loss",
                                             checkpoint_score_order="min")
    trainer.run(train_func, config={"num_epochs": 5}, checkpoint_strategy=checkpoint_strategy)
    print(trainer.best_checkpoint_path)
    best_checkpoint = trainer.best_checkpoint

    resumed = trainer.run(train_func, config={"num_epochs": 1}, checkpoint=trainer.best_checkpoint_path)
    print(resumed)
    trainer.shutdown()
    return {"history": history.history, "first_run_dir": history.logdir, "best": best_checkpoint,
            "latest": trainer.latest_checkpoint, "resumed": resumed, "logdir": trainer.logdir}
# fmt: on


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-workers", "-n", type=int, default=2, help="Sets number of workers for training.")
    args = parser.parse_args(argv)
    train_with_callbacks(num_workers=args.num_workers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
