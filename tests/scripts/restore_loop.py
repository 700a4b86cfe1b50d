"""A train loop shared by the restore tests' driver script and the tests themselves."""

import os
import tempfile
import time

import trainforge as train
from trainforge import Checkpoint


def loop(config):
    start = 0
    ckpt = train.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            start = int(open(os.path.join(d, "epoch")).read()) + 1
    for epoch in range(start, config["epochs"]):
        if epoch == config.get("block_at"):
            open(os.path.join(config["gate_dir"], f"blocked_{train.get_context().get_world_rank()}"), "w").close()
            while True:
                time.sleep(0.1)
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "epoch"), "w") as f:
                f.write(str(epoch))
            train.report({"epoch": epoch, "start": start}, checkpoint=Checkpoint.from_directory(d))
