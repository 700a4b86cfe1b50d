"""A 2-worker fit() whose console output the live-view test reads through a pseudo-terminal."""

import os
import sys
import tempfile

import trainforge
from trainforge import Checkpoint, DataParallelTrainer, RunConfig, ScalingConfig


def loop():
    for step in range(4):
        with tempfile.TemporaryDirectory() as d:
            ckpt = Checkpoint.from_directory(d) if step == 2 else None
            trainforge.report({"step": step, "loss": 1.0 / (step + 1)}, checkpoint=ckpt)


result = DataParallelTrainer(
    loop, scaling_config=ScalingConfig(num_workers=2),
    run_config=RunConfig(name="live", storage_path=sys.argv[1], verbose=1),
).fit()
print("PIDS-DONE", os.getpid(), result.metrics["step"], flush=True)
