"""A driven run: ``ModelTrainer.train()`` / ``validate()`` one epoch at a time, RaySGD style, on a
worker group that stays up between calls.

The first call starts the trainer's ordinary run (``fit_iter()``) with a command channel in its
``train_loop_config``; each call sends one command and advances the run's generator until the
report answering it arrives (the driver drains reports every 20 ms). Between calls the generator
is not advanced and the workers wait for their next command. A worker that dies mid-command fails
the attempt; the controller restarts the group from the latest checkpoint (``FailureConfig``), the
new workers connect and get the pending command again (see commands.py), and the call returns that
command's answer. ``close()`` sends "stop" and drains the run to its end.
"""

from __future__ import annotations

import weakref
from typing import Any

from trainforge import Checkpoint, Result, TrainingReport
from trainforge.model._commands import SEQ_KEY, Command, CommandServer


class DrivenRun:
    def __init__(self, run: Any, server: CommandServer):
        self._run = run  # the TrainingIterator of fit_iter()
        self._server = server
        self._seq = 0
        self.epochs: int | None = None  # epochs completed, as the last train() answer said
        self.dirty = False  # trained since the latest committed checkpoint
        self.latest_checkpoint: Checkpoint | None = None
        self.result: Result | None = None
        self.closed = False

    def call(self, kind: str, **fields: Any) -> TrainingReport:
        """Send one command and return the report (every rank's) that answers it."""
        if self.closed:
            raise RuntimeError(f"{kind}(): this trainer's run has ended; create a new trainer (or call fit()).")
        self._seq += 1
        command = Command(kind, self._seq, self.epochs, **fields)
        self._server.send(command)
        try:
            for report in self._run:
                if report.checkpoint is not None:
                    self.latest_checkpoint = report.checkpoint
                    self.dirty = False
                if report.metrics.get(SEQ_KEY) == command.seq:
                    self._server.done(command.seq)
                    self._answered(kind, report)
                    return report
        except BaseException:
            self._end()
            raise
        self._end()  # the run ended without answering: its workers failed for good
        error = self.result.error if self.result is not None else None
        if error is not None:
            raise error
        raise RuntimeError(f"{kind}(): the run ended before its workers answered (see the run's logs)")

    def _answered(self, kind: str, report: TrainingReport) -> None:
        if kind == "train":
            epoch = report.metrics.get("epoch")
            self.epochs = int(epoch) if isinstance(epoch, (int, float)) else self.epochs
            self.dirty = report.checkpoint is None
        elif kind == "apply":
            self.dirty = True

    def checkpoint(self) -> Checkpoint | None:
        """A committed checkpoint of the workers' current state (one is taken now if needed)."""
        if self.dirty or self.latest_checkpoint is None:
            self.call("checkpoint")
        return self.latest_checkpoint

    def close(self) -> Result | None:
        """Stop the workers (rank 0 first checkpoints what was trained since the last checkpoint) and
        drain the run to its end; returns its Result."""
        if self.closed:
            return self.result
        self._seq += 1
        self._server.send(Command("stop", self._seq, self.epochs, checkpoint=self.dirty))
        try:
            for report in self._run:
                if report.checkpoint is not None:
                    self.latest_checkpoint = report.checkpoint
        finally:
            self._end()
        return self.result

    def _end(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.result = self._run.result
        self._run.close()
        self._server.close()

    def abort(self) -> None:
        """Stop at once (no last checkpoint): the generator's close stops the workers."""
        if not self.closed:
            self.closed = True
            try:
                self._run.close()
            finally:
                self._server.close()


def finalizer(owner: object, run: DrivenRun, server: CommandServer) -> weakref.finalize:
    """When ``owner`` (the trainer) is collected or the interpreter exits with the run still going:
    stop its workers. Holds only a weak reference to ``run`` (which references ``owner``)."""
    return weakref.finalize(owner, _abort, weakref.ref(run), server)


def _abort(run_ref: weakref.ref[DrivenRun], server: CommandServer) -> None:
    run = run_ref()
    if run is not None:
        run.abort()
    else:
        server.close()  # the workers see the driver gone and end their loops
