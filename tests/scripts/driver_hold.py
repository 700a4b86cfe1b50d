"""A driver whose workers write their pid (and the pid of a child they start) and then wait forever.
Used to check that SIGTERM / SIGINT / SIGKILL to the driver leaves no process behind.

usage: driver_hold.py STORAGE_DIR PID_DIR NUM_WORKERS
"""

import os
import signal
import subprocess
import sys
import time

import trainforge as train
from trainforge import DataParallelTrainer, RunConfig, ScalingConfig


def loop(config):
    rank = train.get_context().get_world_rank()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    path = os.path.join(config["pid_dir"], f"rank_{rank}.pid")
    with open(path + ".tmp", "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    os.replace(path + ".tmp", path)
    while True:
        time.sleep(0.2)


if __name__ == "__main__":
    # Python raises KeyboardInterrupt on SIGINT only if SIGINT was not ignored when it started, and a
    # non-interactive shell starts background jobs with SIGINT ignored: restore it, as in a terminal.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    storage, pid_dir, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    trainer = DataParallelTrainer(
        loop,
        train_loop_config={"pid_dir": pid_dir},
        scaling_config=ScalingConfig(num_workers=n),
        run_config=RunConfig(storage_path=storage, name="hold"),
    )
    try:
        trainer.fit()
    finally:
        print("driver cleanup done", flush=True)
