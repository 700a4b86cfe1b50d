"""The worker group of a started ``Trainer``: one core run, driven one command at a time.

This is the mechanism of ``trainforge.model``'s driven runs (its command channel: ``CommandServer``
on the driver, ``CommandClient`` in each worker; a restarted worker gets the pending command again)
with a driver of its own: a model's ``DrivenRun.call()`` waits for the one report that answers a
command, while a 1.x ``run()`` needs every report on the way (each ``train.report()`` is a result for
the iterator and the callbacks, each ``train.save_checkpoint()`` a checkpoint to keep), so
:meth:`WorkerGroup.next_answer` hands them out one at a time.

Between commands the core run's generator is not advanced and the workers wait for the next
command. A worker that dies fails the attempt; the core restarts the group from its latest committed
checkpoint (``FailureConfig(max_failures=max_retries)``) and the new workers run the pending command
again. When the core gives up, the next answer raises its ``TrainingFailedError``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainforge import DataParallelTrainer, Result, TrainingReport
from trainforge.model import DRIVER_KEY, CommandServer
from trainforge.v1._constants import MESSAGE_KEY
from trainforge.v1._protocol import DONE, ERROR, PING, STOP, Message, RemoteError, V1Command

logger = logging.getLogger("trainforge")

MISMATCH = (
    "Some workers returned results with different types. Make sure `train.report()` and `train.save_checkpoint()` "
    "are called the same number of times and in the same order on each worker."
)


BUSY = (
    "the previous run_iterator() of this Trainer is not finished: iterate it to its end, or call its "
    "get_final_results(force=True), before starting another run."
)


@dataclass
class Answer:
    """One report every rank made for the current command: its kind and each rank's value."""

    kind: str
    values: list[Any]

    def error(self) -> BaseException:
        """The exception to raise for an ERROR answer (the lowest rank's; the others are named)."""
        errors: list[RemoteError] = [v for v in self.values if isinstance(v, RemoteError)]
        return errors[0].to_exception([e.rank for e in errors[1:]])


class WorkerGroup:
    def __init__(self, run: Any, server: CommandServer):
        self._run = run  # the TrainingIterator of the core trainer's fit_iter()
        self._server = server
        self._seq = 0
        self.busy: int | None = None  # the command in flight
        self.closed = False
        self.result: Result | None = None

    @classmethod
    def start(cls, make_trainer: Callable[[dict[str, Any]], DataParallelTrainer], host: str) -> WorkerGroup:
        """Start the workers (``make_trainer(train_loop_config)`` builds the core trainer) and return
        once every one of them answered."""
        server = CommandServer(host)
        try:
            run = make_trainer({DRIVER_KEY: server.worker_info()}).fit_iter()
        except BaseException:
            server.close()
            raise
        group = cls(run, server)
        group.begin(PING)
        answer = group.next_answer()
        assert answer.kind == DONE, answer
        return group

    def begin(self, kind: str, payload: bytes | None = None) -> None:
        """Send a command (PING or RUN) to every worker; its answers come from :meth:`next_answer`."""
        if self.closed:
            raise RuntimeError("the worker group is stopped")
        if self.busy is not None:
            raise RuntimeError(BUSY)
        self._seq += 1
        self.busy = self._seq
        self._server.send(V1Command(kind, self._seq, payload=payload))

    def next_answer(self) -> Answer:
        """The next report of the command in flight (every rank's). An exception here stops the group.
        An ERROR answer (the train function raised) leaves it up when every rank has left the function
        (it raised or returned: the workers are idle), and stops it otherwise."""
        assert self.busy is not None
        try:
            for report in self._run:
                answer = self._decode(report)
                if answer.kind in (DONE, ERROR) and not self.closed:
                    self._server.done(self.busy)
                    self.busy = None
                return answer
        except BaseException:
            self.abort()
            raise
        self._ended()  # the run ended without answering: the core gave up (max_retries)
        error = self.result.error if self.result is not None else None
        raise error if error is not None else RuntimeError(
            "the worker group ended before its workers answered (see the worker logs above)"
        )

    def _decode(self, report: TrainingReport) -> Answer:
        messages = [metrics.get(MESSAGE_KEY) for metrics in report.all_metrics]
        if not all(isinstance(m, Message) and m.seq == self.busy for m in messages):
            self.abort()
            raise RuntimeError(f"the workers sent a report that is not trainforge.v1's: {report.all_metrics!r}")
        kinds = {m.kind for m in messages if isinstance(m, Message)}
        values = [m.value() for m in messages if isinstance(m, Message)]
        if ERROR in kinds:
            if not kinds <= {ERROR, DONE}:  # some ranks are still in the function: stop them
                self.abort()
            return Answer(ERROR, values)
        if len(kinds) > 1:
            self.abort()
            raise RuntimeError(f"{MISMATCH} (got {sorted(kinds)} from the workers at the same step)")
        return Answer(kinds.pop(), values)

    def close(self) -> Result | None:
        """Stop the workers (at once if a command is in flight) and return the core run's Result."""
        if self.closed:
            return self.result
        if self.busy is not None:
            self.abort()
            return self.result
        self._seq += 1
        self._server.send(V1Command(STOP, self._seq))
        try:
            for _ in self._run:
                pass
        finally:
            self._ended()
        return self.result

    def _ended(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.busy = None
        self.result = self._run.result
        self._run.close()
        self._server.close()

    def abort(self) -> None:
        """Stop the workers now (closing the core run's generator stops its group)."""
        if self.closed:
            return
        self.closed = True
        self.busy = None
        try:
            self._run.close()
        finally:
            self._server.close()
