"""What crosses between the driver and the workers of a 1.x ``Trainer``.

Driver -> workers: a :class:`V1Command` on the command channel of ``trainforge.model``'s driven
runs (an authenticated connection per worker; a restarted worker gets the pending command again):

    ping   answer at once (``Trainer.start()`` waits for it: the workers are up)
    run    run ``payload`` (a cloudpickled :class:`RunPayload`: the train function, its config, the
           checkpoint to start from, every rank's dataset shard) and answer with its return value
    stop   end the worker's loop

Workers -> driver: every answer is a :class:`Message` reported by every rank through the core's
ordinary report path (``metrics[MESSAGE_KEY]``), so a report every rank made arrives as one
``TrainingReport`` and a checkpoint is committed by the core (and survives a restart):

    result      one ``train.report(**metrics)`` (the metrics, auto-filled)
    checkpoint  one ``train.save_checkpoint(**state)``: rank 0's message holds the dict, and rank 0
                passes the core a checkpoint directory holding ``CHECKPOINT_FILE`` (the command's
                number and the dict), which a restarted group resumes from
    done        the train function returned (its value)
    error       the train function raised (a :class:`RemoteError`); the worker waits for the next command

A message's value is cloudpickled by the worker (classes of the driver's ``__main__`` travel by
value), so the core only carries bytes; its ``repr`` is short, which is what the core's metrics log
keeps of it.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from trainforge import Checkpoint
from trainforge.model import Command
from trainforge.v1._constants import CHECKPOINT_FILE

PING, RUN, STOP = "ping", "run", "stop"
RESULT, CHECKPOINT, DONE, ERROR = "result", "checkpoint", "done", "error"


@dataclass
class V1Command(Command):
    """A command of the model package's channel with a payload of its own (``run``)."""

    payload: bytes | None = None


@dataclass
class RunPayload:
    """What one ``Trainer.run()`` sends to every worker."""

    train_func: Callable[..., Any]
    takes_config: bool
    config: dict[str, Any]
    checkpoint: dict[str, Any] | None
    shards: list[Any] = field(default_factory=list)  # one entry per rank (None: no dataset)


@dataclass(repr=False)
class Message:
    """One rank's answer to command ``seq`` (see the module docstring)."""

    kind: str
    seq: int
    blob: bytes = b""

    def value(self) -> Any:
        return cloudpickle.loads(self.blob) if self.blob else None

    def __repr__(self) -> str:
        return f"<trainforge.v1 {self.kind} of command {self.seq}, {len(self.blob)} bytes>"


def message(kind: str, seq: int, value: Any = None) -> Message:
    return Message(kind, seq, cloudpickle.dumps(value) if value is not None else b"")


@dataclass
class RemoteError:
    """An exception raised by the train function on a worker."""

    rank: int
    type_name: str
    text: str
    traceback: str
    exception: bytes | None  # cloudpickled, when it pickles

    @classmethod
    def capture(cls, exc: BaseException, rank: int) -> RemoteError:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        try:
            blob: bytes | None = cloudpickle.dumps(exc)
        except Exception:  # an exception holding something that does not pickle: its text goes
            blob = None
        return cls(rank, type(exc).__name__, str(exc), tb, blob)

    def to_exception(self, other_ranks: list[int]) -> BaseException:
        """The original exception (else a RuntimeError with its text), caused by a
        :class:`RemoteTraceback` that shows where it was raised."""
        exc: BaseException | None = None
        if self.exception is not None:
            try:
                exc = cloudpickle.loads(self.exception)
            except Exception:  # its class takes other constructor arguments, or is gone here
                exc = None
        if not isinstance(exc, BaseException):
            exc = RuntimeError(f"{self.type_name}: {self.text}")
        also = f" (the same function also raised on rank(s) {other_ranks})" if other_ranks else ""
        exc.__cause__ = RemoteTraceback(f"\nthe train function raised on rank {self.rank}{also}:\n\n{self.traceback}")
        return exc


class RemoteTraceback(Exception):
    """The worker's traceback of an exception re-raised on the driver (as ``concurrent.futures``)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def write_checkpoint_dir(directory: str, seq: int, data: dict[str, Any]) -> None:
    with open(os.path.join(directory, CHECKPOINT_FILE), "wb") as f:
        cloudpickle.dump({"seq": seq, "data": data}, f)


def read_checkpoint(checkpoint: Checkpoint) -> tuple[int | None, dict[str, Any]]:
    """(the command that saved it, the dict) of a core checkpoint written by :func:`write_checkpoint_dir`."""
    with checkpoint.as_directory() as directory:
        path = os.path.join(directory, CHECKPOINT_FILE)
        if not os.path.exists(path):
            raise ValueError(
                f"{checkpoint.path} holds no {CHECKPOINT_FILE}: it was not saved by trainforge.v1.save_checkpoint()"
            )
        with open(path, "rb") as f:
            saved = cloudpickle.load(f)
    return saved.get("seq"), saved["data"]
