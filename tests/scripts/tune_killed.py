"""A tuner run in its own process (killed with SIGKILL by test_tune.py, then run again): 4 trials of
10 slow steps, 1 at a time, each step checkpointed; every step a trial runs is appended to
``<root>/steps.log`` as ``trial_index step worker_pid``, so the test sees what was rerun (and which
processes must be gone after a kill). Also stopped with SIGINT (Ctrl-C) by a test."""

import json
import os
import sys
import tempfile
import time

from trainforge import tune
from trainforge.tune import RunConfig, Tuner

root = sys.argv[1]


def trainable(config):
    start = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d, open(os.path.join(d, "state.json")) as f:
            start = json.load(f)["step"] + 1
    for step in range(start, 10):
        with open(os.path.join(root, "steps.log"), "a") as f:
            f.write(f"{config['i']} {step} {os.getpid()}\n")
        time.sleep(0.1)
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "state.json"), "w") as f:
                json.dump({"step": step}, f)
            tune.report({"step": step, "i": config["i"]}, checkpoint=tune.Checkpoint.from_directory(d))


grid = Tuner(
    tune.with_resources(trainable, {"cpu": 2}),
    param_space={"i": tune.grid_search([0, 1, 2, 3])},
    run_config=RunConfig(name="killed", storage_path=os.path.join(root, "results"), verbose=0),
).fit()
print("DONE", len(grid), grid.num_errors, flush=True)
