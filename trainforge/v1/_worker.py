"""The worker side: the loop of a started ``Trainer``'s workers, and the loop of a tuner's trial.

``serve`` is the ``train_loop_per_worker`` of the core run behind a started ``Trainer``: it connects
to the driver's command channel and answers commands until "stop" (see _protocol.py). A ``run``
command runs the train function under a 1.x :class:`WorkerSession` whose results and checkpoints
go to the driver as they happen (:class:`DrivenSink`). After a restart (a worker died; the core
restarts the group from its latest committed checkpoint) the new workers get the pending ``run``
again, and ``load_checkpoint()`` returns the latest checkpoint this run saved, else the run's own.

``TuneLoop`` is the train loop of ``Trainer.to_tune_trainable()``: the train function runs once per
trial, its reports become the trial's results (:class:`PairingSink`).
"""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

import cloudpickle

import trainforge
from trainforge import Checkpoint
from trainforge._internal import session as core_session
from trainforge.model import DRIVER_KEY, CommandClient
from trainforge.v1._constants import MESSAGE_KEY
from trainforge.v1._data import split_dataset
from trainforge.v1._protocol import (
    CHECKPOINT,
    DONE,
    ERROR,
    PING,
    RESULT,
    RUN,
    STOP,
    RemoteError,
    RunPayload,
    V1Command,
    message,
    read_checkpoint,
    write_checkpoint_dir,
)
from trainforge.v1._session import WorkerSession, activated


def serve(config: dict[str, Any]) -> None:
    """Answer the driver's commands until "stop", or until the driver is gone."""
    ctx = trainforge.get_context()
    core = core_session.get_session()
    client = CommandClient.connect(config[DRIVER_KEY], ctx.get_attempt(), ctx.get_world_rank())
    # The checkpoint this attempt started from (the group's latest committed one) matters to its first
    # run only: a restart's new workers get the pending run again, and continue from it.
    restart_from = core.get_checkpoint()
    try:
        while True:
            command = client.recv()
            if command is None or command.kind == STOP:
                return
            if command.kind == PING:
                core.report({MESSAGE_KEY: message(DONE, command.seq)})
            elif command.kind == RUN and isinstance(command, V1Command) and command.payload is not None:
                _run(core, ctx, command.seq, command.payload, restart_from)
                restart_from = None
            else:
                raise ValueError(f"unknown command {command.kind!r} from the trainforge.v1 driver")
    finally:
        client.close()


def _run(core: core_session.Session, ctx: Any, seq: int, blob: bytes, restart_from: Checkpoint | None) -> None:
    rank = ctx.get_world_rank()
    try:
        payload: RunPayload = cloudpickle.loads(blob)
    except Exception as exc:  # e.g. the function's module cannot be imported here
        core.report({MESSAGE_KEY: message(ERROR, seq, RemoteError.capture(exc, rank))})
        return
    checkpoint = payload.checkpoint
    if restart_from is not None:
        saved_by, data = read_checkpoint(restart_from)
        if saved_by == seq:  # a restart of this run: continue from what it saved
            checkpoint = data
    shard = payload.shards[rank] if payload.shards else None
    sink = DrivenSink(core, seq, rank)
    try:
        with activated(WorkerSession(ctx, checkpoint, shard, sink)):
            value = payload.train_func(payload.config) if payload.takes_config else payload.train_func()
    except Exception as exc:  # answered, not raised: the worker stays up for the next run (as 1.x)
        core.report({MESSAGE_KEY: message(ERROR, seq, RemoteError.capture(exc, rank))})
        return
    try:
        answer = message(DONE, seq, value)
    except Exception as exc:
        error = TypeError(f"the train function's return value must be picklable (cloudpickle) to reach the driver: {exc}")
        answer = message(ERROR, seq, RemoteError.capture(error, rank))
    core.report({MESSAGE_KEY: answer})


def _checkpoint_report(core: core_session.Session, rank: int, metrics: dict[str, Any], seq: int,
                       data: dict[str, Any]) -> None:  # fmt: skip
    """Every rank reports; rank 0 with a core checkpoint holding ``data`` (as 1.x: rank 0's is kept),
    which a restart of the group resumes from."""
    if rank != 0:
        core.report(metrics)
        return
    directory = tempfile.mkdtemp(prefix="trainforge-v1-checkpoint-")
    try:
        write_checkpoint_dir(directory, seq, data)
        core.report(metrics, checkpoint=Checkpoint.from_directory(directory))
    finally:
        shutil.rmtree(directory, ignore_errors=True)


class DrivenSink:
    """Each result and checkpoint goes to the driver at once, tagged with the command's number."""

    def __init__(self, core: core_session.Session, seq: int, rank: int):
        self._core, self._seq, self._rank = core, seq, rank

    def result(self, metrics: dict[str, Any]) -> None:
        self._core.report({MESSAGE_KEY: message(RESULT, self._seq, metrics)})

    def checkpoint(self, data: dict[str, Any]) -> None:
        # Rank 0's message carries the dict too: by the time the driver handles this report the core may
        # have replaced its checkpoint by a newer one (it keeps only the latest).
        msg = message(CHECKPOINT, self._seq, data if self._rank == 0 else None)
        _checkpoint_report(self._core, self._rank, {MESSAGE_KEY: msg}, self._seq, data)


class PairingSink:
    """A tuner's trial: each core report is one result (one ``training_iteration``), so a checkpoint
    rides with a result: with the last one not yet sent, else with the next one. A result is held
    until the next call shows whether a checkpoint follows it (results arrive one call late); what
    is held at the end is sent then."""

    def __init__(self, core: core_session.Session, rank: int):
        self._core, self._rank = core, rank
        self._metrics: dict[str, Any] | None = None  # a result not sent yet
        self._data: dict[str, Any] | None = None  # a checkpoint not sent yet
        self._last: dict[str, Any] = {}

    def result(self, metrics: dict[str, Any]) -> None:
        if self._metrics is not None:
            self._send(self._metrics, self._data)
            self._data = None
        self._metrics = metrics

    def checkpoint(self, data: dict[str, Any]) -> None:
        if self._metrics is not None:
            self._send(self._metrics, data)
            self._metrics, self._data = None, None
        else:
            self._data = data

    def flush(self) -> None:
        if self._metrics is not None:
            self._send(self._metrics, self._data)
        elif self._data is not None:
            self._send(self._last, self._data)  # a checkpoint after the last result: sent with its metrics again
        self._metrics, self._data = None, None

    def _send(self, metrics: dict[str, Any], data: dict[str, Any] | None) -> None:
        self._last = metrics
        if data is None:
            self._core.report(metrics)
        else:
            _checkpoint_report(self._core, self._rank, metrics, 0, data)


class TuneLoop:
    """The ``train_loop_per_worker`` of ``Trainer.to_tune_trainable(train_func)``: the trial's config
    (``param_space["train_loop_config"]``) is the train function's; rank 0's results are the trial's."""

    def __init__(self, train_func: Any, takes_config: bool, dataset: Any = None):
        self.train_func = train_func
        self.takes_config = takes_config
        self.dataset = dataset

    def __call__(self, config: dict[str, Any]) -> None:
        ctx = trainforge.get_context()
        core = core_session.get_session()
        latest = core.get_checkpoint()  # a retried, restored or exploited trial continues from it
        checkpoint = read_checkpoint(latest)[1] if latest is not None else None
        shard = split_dataset(self.dataset, ctx.get_world_size())[ctx.get_world_rank()]
        sink = PairingSink(core, ctx.get_world_rank())
        with activated(WorkerSession(ctx, checkpoint, shard, sink)):
            if self.takes_config:
                self.train_func(config)
            else:
                self.train_func()
        sink.flush()

    def __repr__(self) -> str:
        return f"<trainforge.v1 trainable of {getattr(self.train_func, '__qualname__', self.train_func)!r}>"
