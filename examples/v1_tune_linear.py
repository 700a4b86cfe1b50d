"""Ray Train 1.x's Tune example (Ray 1.12, ``python/ray/train/examples/tune_linear_example.py``) on
trainforge: a ``Trainer``'s ``to_tune_trainable(train_func)`` searched by ``trainforge.tune``:

    python examples/v1_tune_linear.py [--num-workers 2] [--num-samples 2] [--use-gpu]

Every trial trains ``examples/v1_linear_regression.py``'s ``train_func`` on its own workers
(``num_workers`` each, the trainer's resources) with a sampled ``lr`` and ``batch_size``; its
``train.report(loss=..., model=...)`` results are the trial's, and the best trial's config by
``loss`` is printed.

What changed from Ray's file, line by line:

- ``from ray import tune`` -> ``from trainforge import tune``
- ``from ray.train import Trainer`` -> ``from trainforge.v1 import Trainer``
- ``from ray.train.examples.train_linear_example import train_func`` -> ``from v1_linear_regression
  import train_func`` (this directory's port of it)
- ``tune.run(Trainable, num_samples=..., config={...})`` and ``analysis.get_best_config(metric, mode)``
  -> ``tune.Tuner(Trainable, param_space={"train_loop_config": {...}},
  tune_config=tune.TuneConfig(num_samples=...)).fit()`` and
  ``.get_best_result(metric, mode).config["train_loop_config"]``: ``trainforge.tune`` has Ray Tune
  2.x's API (``Tuner``), whose trainer trainables take the train function's config under
  ``"train_loop_config"``.
- ``"data_size": 200`` added to the searched config (1000 by default: a smaller set keeps every
  trial a few seconds).
- ``__main__``: no ``ray.init(...)`` (nor ``--address``); the argument parsing is a ``main()``.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # v1_linear_regression, beside this file

# fmt: off
# __tune_linear_example__
from v1_linear_regression import train_func

from trainforge import tune
from trainforge.v1 import Trainer


def tune_linear(num_workers, num_samples, use_gpu):
    trainer = Trainer("torch", num_workers=num_workers, use_gpu=use_gpu)
    Trainable = trainer.to_tune_trainable(train_func)
    tuner = tune.Tuner(
        Trainable,
        param_space={"train_loop_config": {
            "lr": tune.loguniform(1e-4, 1e-1),
            "batch_size": tune.choice([4, 16, 32]),
            "epochs": 3,
            "data_size": 200,
        }},
        tune_config=tune.TuneConfig(num_samples=num_samples),
    )
    analysis = tuner.fit()
    results = analysis.get_best_result(metric="loss", mode="min").config["train_loop_config"]
    print(results)
    return results
# fmt: on


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-workers", "-n", type=int, default=2, help="Sets number of workers for training.")
    parser.add_argument("--num-samples", type=int, default=2, help="Sets number of samples for training.")
    parser.add_argument("--use-gpu", action="store_true", default=False, help="Use GPU for training.")
    args = parser.parse_args(argv)
    tune_linear(num_workers=args.num_workers, num_samples=args.num_samples, use_gpu=args.use_gpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
