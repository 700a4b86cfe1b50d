"""A job script for the CLI tests whose train loop raises in its one worker (a failed ``fit()``)."""

from trainforge import DataParallelTrainer, RunConfig, ScalingConfig


def loop(config):
    if config["lr"] < 0:
        raise ValueError(f"bad lr {config['lr']}")


if __name__ == "__main__":
    DataParallelTrainer(loop, train_loop_config={"lr": -1}, scaling_config=ScalingConfig(num_workers=1),
                        run_config=RunConfig(verbose=0)).fit()
