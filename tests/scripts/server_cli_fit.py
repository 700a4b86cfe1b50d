"""A job script for the CLI tests: prints its arguments, fits a one-worker trainer that reports
three steps (storage: $TRAINFORGE_STORAGE_PATH; a console line each), prints the result's last step."""

import sys

import trainforge
from trainforge import DataParallelTrainer, RunConfig, ScalingConfig


def loop(config):
    for step in range(3):
        trainforge.report({"step": step})


if __name__ == "__main__":
    print(f"script argv {sys.argv[1:]}", flush=True)
    run_config = RunConfig(name="cli_fit", verbose=2)  # a console line for every report
    trainer = DataParallelTrainer(loop, scaling_config=ScalingConfig(num_workers=1), run_config=run_config)
    result = trainer.fit()
    print(f"script done: step={result.metrics['step']}", flush=True)
