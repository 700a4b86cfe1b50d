"""The worker-side API: what ``trainforge.report``, ``get_context`` and friends talk to.

One ``Session`` exists per worker process while its train loop runs. ``report`` never waits for
other ranks: metrics are pickled and queued for a sender thread (a few microseconds). A checkpoint
is copied before ``report`` returns, so the caller may delete its directory at once: into the rank's
staging directory in storage (``CheckpointUploadMode.SYNC``, the default), or into a local temporary
directory that a background uploader then sends to storage (``ASYNC``; see ``uploader.py``). The
driver commits a checkpoint once every rank has made that report.
"""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainforge._internal.checkpoint import Checkpoint
from trainforge._internal.config import CheckpointUploadMode
from trainforge._internal.local_files import copy_tree
from trainforge._internal.uploader import Uploader

# Set by the worker's reader thread when the driver asks the run to stop (``TrainingIterator.stop()``,
# a tuner's decision): the loop's next report() raises StopTraining. One per process: a worker
# process runs one train loop.
_stop_requested = threading.Event()


class StopTraining(SystemExit):
    """Raised by ``report()`` once the driver asked the run to stop: the train loop ends there as after
    ``sys.exit(0)`` (its ``finally`` blocks and context managers run; ``except Exception`` does not
    catch it), after the report itself was sent."""

    def __init__(self) -> None:
        super().__init__(0)


def request_stop() -> None:
    """End this worker's train loop at its next ``report()`` (called from the reader thread)."""
    _stop_requested.set()


@dataclass
class TrainContext:
    """What a worker knows about its place in the run. Returned by ``trainforge.get_context()``."""

    world_size: int
    world_rank: int
    local_rank: int
    local_world_size: int
    node_rank: int
    experiment_name: str
    metadata: dict[str, Any] = field(default_factory=dict)
    trial_dir: str = ""
    attempt: int = 0
    # The run's RunConfig.verbose (trainforge extension): built-in loops log as it says (the GBDT
    # trainers' per-round evaluation log: on rank 0 at 1 and 2, nowhere at 0).
    verbose: int = 1

    def get_world_size(self) -> int:
        return self.world_size

    def get_world_rank(self) -> int:
        return self.world_rank

    def get_local_rank(self) -> int:
        return self.local_rank

    def get_local_world_size(self) -> int:
        return self.local_world_size

    def get_node_rank(self) -> int:
        return self.node_rank

    def get_experiment_name(self) -> str:
        return self.experiment_name

    def get_metadata(self) -> dict[str, Any]:
        return dict(self.metadata)

    def get_trial_dir(self) -> str:
        return self.trial_dir

    def get_attempt(self) -> int:
        """0 for the first attempt, n after n restarts."""
        return self.attempt


class Session:
    def __init__(
        self,
        context: TrainContext,
        send: Callable[..., None],
        storage: Any,
        checkpoint: Checkpoint | None,
        dataset_shards: dict[str, Any],
        upload_mode: CheckpointUploadMode | str = CheckpointUploadMode.SYNC,
    ):
        self.context = context
        self._send = send
        self._storage = storage
        self._checkpoint = checkpoint
        self._shards = dataset_shards
        self._upload_mode = CheckpointUploadMode.parse(upload_mode, "CheckpointConfig.checkpoint_upload_mode")
        self._uploader: Uploader | None = None  # created by the first ASYNC checkpoint
        self.report_count = 0

    def report(
        self,
        metrics: dict[str, Any],
        checkpoint: Checkpoint | None = None,
        checkpoint_upload_mode: CheckpointUploadMode | str | None = None,
    ) -> None:
        self._report(metrics, checkpoint, checkpoint_upload_mode)
        if _stop_requested.is_set():
            raise StopTraining()

    def _report(
        self,
        metrics: dict[str, Any],
        checkpoint: Checkpoint | None,
        checkpoint_upload_mode: CheckpointUploadMode | str | None,
    ) -> None:
        if not isinstance(metrics, dict):
            raise TypeError(f"report(metrics=...) takes a dict of metrics, got {type(metrics).__name__}.")
        if checkpoint is not None and not isinstance(checkpoint, Checkpoint):
            raise TypeError(
                f"report(checkpoint=...) takes a trainforge.Checkpoint, got {type(checkpoint).__name__}; "
                "wrap a directory with Checkpoint.from_directory(path)."
            )
        try:
            payload = pickle.dumps(metrics, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            raise TypeError(
                f"report(metrics=...) must be picklable; {exc}. Report plain numbers, e.g. loss.item()."
            ) from exc
        mode = self._upload_mode
        if checkpoint_upload_mode is not None:
            mode = CheckpointUploadMode.parse(checkpoint_upload_mode, "report(checkpoint_upload_mode=...)")
        index = self.report_count
        self.report_count += 1
        uploader = self._uploader
        if checkpoint is None:
            msg = ("report", index, payload, False, time.time())
            if uploader is None:
                self._send(msg)
            elif uploader.busy or uploader.error is not None:
                uploader.submit(msg)  # behind the pending uploads, so the driver gets reports in order
            else:
                self._send(msg)
            return
        msg = ("report", index, payload, True, time.time())
        attempt, rank = self.context.attempt, self.context.world_rank
        if mode is CheckpointUploadMode.ASYNC:
            local_dir = tempfile.mkdtemp(prefix=f"trainforge_upload_r{rank}_")
            try:
                if checkpoint.is_local:  # the staging copy's way (kernel copies, big files side by side)
                    copy_tree(checkpoint.path, local_dir)
                else:
                    checkpoint.to_directory(local_dir)
            except BaseException:
                shutil.rmtree(local_dir, ignore_errors=True)
                raise
            if uploader is None:
                uploader = self._uploader = Uploader(self._send)

            def upload() -> None:
                self._storage.stage_checkpoint(local_dir, attempt, index, rank)

            uploader.submit(msg, upload, local_dir)
            return
        if uploader is not None:
            uploader.drain()  # earlier asynchronous uploads go first
        with checkpoint.as_directory() as local_dir:
            self._storage.stage_checkpoint(local_dir, attempt, index, rank)
        # A checkpoint report is handed to the socket before returning: once every rank's report()
        # returned, the driver will commit it even if a worker dies the next instant.
        self._send(msg, wait=True)

    def close(self, wait: bool = True) -> None:
        """End of the train loop: wait for pending asynchronous uploads (raising the error of a failed
        one), or with ``wait=False`` (the loop failed) drop them."""
        if self._uploader is not None:
            self._uploader.close(wait)

    def get_checkpoint(self) -> Checkpoint | None:
        return self._checkpoint

    def get_dataset_shard(self, name: str) -> Any:
        if name not in self._shards:
            available = sorted(self._shards) or "none"
            raise KeyError(
                f"get_dataset_shard({name!r}): no dataset named {name!r}; datasets passed to the trainer: "
                f"{available}. Pass datasets={{{name!r}: ...}} to the trainer."
            )
        return self._shards[name]


_session: Session | None = None


def set_session(session: Session | None) -> None:
    """Install ``session`` as this worker process's current one (None: none); the worker's train
    function does it around the user's loop, and ``trainforge.v1`` puts a guard in front of it."""
    global _session
    _session = session


def get_session() -> Session:
    if _session is None:
        raise RuntimeError(
            "This function can only be called inside a train loop run by a trainforge trainer "
            "(e.g. TorchTrainer(train_loop_per_worker).fit()); no trainforge worker session is active "
            f"in this process (pid {os.getpid()})."
        )
    return _session


def in_session() -> bool:
    return _session is not None


# Public functions (re-exported from trainforge).
def report(
    metrics: dict[str, Any],
    checkpoint: Checkpoint | None = None,
    checkpoint_upload_mode: CheckpointUploadMode | str | None = None,
) -> None:
    """Report metrics (and optionally a checkpoint) from this worker. Never blocks on other ranks.

    ``checkpoint_upload_mode`` (trainforge extension): ``CheckpointUploadMode.SYNC`` returns once the
    checkpoint files are in the run's storage; ``ASYNC`` (or "async") returns once they are copied to
    a local temporary directory and uploads them in the background. None: the run's default,
    ``CheckpointConfig.checkpoint_upload_mode``. Reports reach the driver in order either way, and the
    worker waits for pending uploads before its loop counts as finished; a failed upload raises
    ``StorageError`` at the next ``report()`` or when the loop returns.
    """
    get_session().report(metrics, checkpoint, checkpoint_upload_mode)


def get_context() -> TrainContext:
    """This worker's world size, ranks, experiment name and metadata."""
    return get_session().context


def get_checkpoint() -> Checkpoint | None:
    """The latest committed checkpoint to resume from (after a restart or with resume_from_checkpoint)."""
    return get_session().get_checkpoint()


def get_dataset_shard(name: str = "train") -> Any:
    """This worker's part of ``datasets[name]`` ("train" is split across workers, others are whole)."""
    return get_session().get_dataset_shard(name)
