"""``trainforge submit server_cli_trainer:make_trainer STORAGE STEPS`` (the CLI tests): a module
whose function returns a two-worker DataParallelTrainer (not fitted)."""

import trainforge
from trainforge import DataParallelTrainer, RunConfig, ScalingConfig


def _loop(config):
    for step in range(config["steps"]):
        trainforge.report({"step": step, "world_size": trainforge.get_context().get_world_size()})


def make_trainer(storage, steps):
    return DataParallelTrainer(
        _loop, train_loop_config={"steps": int(steps)}, scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="cli_function", storage_path=storage),
    )  # fmt: skip
