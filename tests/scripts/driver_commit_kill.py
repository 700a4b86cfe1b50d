"""A driver that is SIGKILLed in the middle of persisting a checkpoint.

Its storage filesystem (a local or an s3fs filesystem with one method overridden) copies the files of
the second checkpoint into ``checkpoint_000001/`` as usual, but when the driver is about to write that
checkpoint's commit marker it writes READY_FILE and blocks until the test kills the process.

usage: driver_commit_kill.py STORAGE_PATH NAME READY_FILE local|s3
"""

import os
import sys
import tempfile
import threading

from fsspec.implementations.local import LocalFileSystem

import trainforge as train
from trainforge import CheckpointConfig, DataParallelTrainer, RunConfig, ScalingConfig
from trainforge._internal.storage import COMMIT_MARKER

BLOCK_ON = f"checkpoint_000001/{COMMIT_MARKER}"


class BlockOnSecondMarker:
    """Mixin for an fsspec filesystem: writing the second checkpoint's marker never returns."""

    cachable = False

    def __init__(self, ready_file: str = "", **kwargs):
        super().__init__(**kwargs)
        self.ready_file = ready_file

    def pipe_file(self, path, value, *args, **kwargs):
        if str(path).endswith(BLOCK_ON):
            with open(self.ready_file + ".tmp", "w") as f:
                f.write(str(path))
            os.replace(self.ready_file + ".tmp", self.ready_file)
            threading.Event().wait()  # until SIGKILL
        return super().pipe_file(path, value, *args, **kwargs)


def loop(config):
    rank = train.get_context().get_world_rank()
    for step in range(2):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, f"rank_{rank}.txt"), "w") as f:
                f.write(f"run1-step{step}")
            if step == 1:
                with open(os.path.join(d, "run1_only.txt"), "w") as f:
                    f.write("must never be seen")
            train.report({"step": step}, checkpoint=train.Checkpoint.from_directory(d))


class BlockingLocalFS(BlockOnSecondMarker, LocalFileSystem):
    pass


try:
    import s3fs

    class BlockingS3FS(BlockOnSecondMarker, s3fs.S3FileSystem):
        pass

except ImportError:  # the local variant does not need it
    pass


if __name__ == "__main__":
    # Use this file's classes through its module name, so that the workers (which get this sys.path)
    # unpickle them by reference: fsspec filesystem classes cannot be pickled by value.
    import driver_commit_kill as me

    storage_path, name, ready_file, kind = sys.argv[1:5]
    fs_cls = me.BlockingS3FS if kind == "s3" else me.BlockingLocalFS
    trainer = DataParallelTrainer(
        me.loop,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name=name,
            storage_path=storage_path,
            storage_filesystem=fs_cls(ready_file=ready_file),
            checkpoint_config=CheckpointConfig(),
            verbose=0,
        ),
    )
    trainer.fit()
    print("not reached: the test kills this driver while it commits", flush=True)
