"""Driver for the restore tests: trains until the loop blocks at `block_at`, then waits to be killed.

usage: driver_restore.py STORAGE NAME GATE_DIR BLOCK_AT
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from restore_loop import loop  # noqa: E402

from trainforge import DataParallelTrainer, RunConfig, ScalingConfig  # noqa: E402

if __name__ == "__main__":
    storage, name, gate_dir, block_at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    DataParallelTrainer(
        loop,
        train_loop_config={"epochs": 6, "block_at": block_at, "gate_dir": gate_dir},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=storage, name=name),
    ).fit()
