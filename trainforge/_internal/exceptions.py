"""The trainforge exception tree.

    TrainforgeError
    ├── TrainingFailedError        fit() gave up: one or more workers failed (max_failures exceeded)
    ├── StorageError               a storage operation failed: a permanent error, or a transient one
    │                              (connection, timeout, HTTP 5xx/throttling) that outlasted its retries
    └── WorkerGroupError           a worker group could not be started or driven
        └── WorkerStartError       a worker process did not come up

Configuration mistakes raise the built-in ``ValueError`` / ``TypeError`` before any worker starts.
A failure inside a worker is described by a :class:`WorkerFailure` record (rank, pid, exit code or
signal, exception type and message, traceback); identical failures of several ranks are grouped.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass


class TrainforgeError(Exception):
    """Base class of every error trainforge raises on purpose."""


class StorageError(TrainforgeError):
    """A storage operation failed for good. The message names the operation, the storage URL, the
    cause and what to do; ``operation``, ``url`` and ``attempts`` hold them, ``__cause__`` is the
    original exception. Raised on the driver (ending the run) and in workers (failing that rank)."""

    def __init__(self, message: str, operation: str = "", url: str = "", attempts: int = 1):
        super().__init__(message)
        self.operation = operation
        self.url = url
        self.attempts = attempts

    def __reduce__(self) -> tuple:
        return (type(self), (str(self), self.operation, self.url, self.attempts))


class WorkerGroupError(TrainforgeError):
    """The worker group could not be started or driven."""


class WorkerStartError(WorkerGroupError):
    """A worker process did not start or did not connect back in time."""


@dataclass
class WorkerFailure:
    """What went wrong in one worker.

    ``kind`` is "exception" (the train loop raised), "died" (the process exited without saying why:
    os._exit, SIGKILL, segfault), or "hung" (alive but silent past the hang timeout). ``attempt`` is
    the attempt it happened in, numbered as ``get_context().get_attempt()`` (0 for the first, n after
    n restarts or resizes); the driver sets it when it handles the failure.
    """

    rank: int
    pid: int | None
    kind: str
    exc_type: str | None = None
    message: str = ""
    traceback: str = ""
    exit_code: int | None = None
    log_tail: str = ""
    time: float = 0.0
    attempt: int | None = None

    def exit_description(self) -> str:
        if self.exit_code is None:
            if self.kind == "died" and self.message:  # no exit status (a Ray actor): the reason given
                return self.message
            return "still running"
        if self.exit_code < 0:
            try:
                name = signal.Signals(-self.exit_code).name
            except ValueError:
                name = f"signal {-self.exit_code}"
            return f"killed by {name} (exit code {self.exit_code})"
        return f"exit code {self.exit_code}"

    def group_key(self) -> tuple:
        # Hung workers are listed one by one: each one's stack is the useful part.
        return (
            self.kind,
            self.exc_type,
            self.message,
            self.exit_code if self.kind == "died" else None,
            self.rank if self.kind == "hung" else None,
        )

    def headline(self) -> str:
        if self.kind == "exception":
            return f"{self.exc_type}: {self.message}"
        if self.kind == "died":
            return f"worker process died unexpectedly: {self.exit_description()}"
        return f"worker hung: {self.message}"

    def stack_label(self) -> str:
        return "stacks (all threads) of hung rank" if self.kind == "hung" else "traceback of rank"


def _ranks_text(failures: list[WorkerFailure]) -> str:
    ranks = ", ".join(str(f.rank) for f in failures)
    pids = ", ".join(str(f.pid) for f in failures)
    word = "rank" if len(failures) == 1 else "ranks"
    pword = "pid" if len(failures) == 1 else "pids"
    return f"{word} {ranks} ({pword} {pids})"


def format_failures(failures: list[WorkerFailure]) -> str:
    """Group identical failures; the earliest (the likely root cause) comes first."""
    groups: dict[tuple, list[WorkerFailure]] = {}
    for f in sorted(failures, key=lambda f: (f.time, f.rank)):
        groups.setdefault(f.group_key(), []).append(f)
    parts = []
    for members in groups.values():
        first = members[0]
        text = f"{_ranks_text(sorted(members, key=lambda f: f.rank))}: {first.headline()}"
        if first.traceback:
            text += f"\n  {first.stack_label()} {first.rank}:\n" + _indent(first.traceback.rstrip())
        if first.log_tail:
            text += f"\n  last output of rank {first.rank}:\n" + _indent(first.log_tail.rstrip())
        parts.append(text)
    return "\n".join(parts)


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


class TrainingFailedError(TrainforgeError):
    """Training failed and was not (or no longer) retried.

    ``failures`` holds one list of :class:`WorkerFailure` per failed attempt, oldest first; the
    message names every attempt's failure, the root cause of each first, as ``[attempt N]`` with N
    numbered as ``get_context().get_attempt()`` (0 for the first attempt).
    """

    def __init__(self, message: str, failures: list[list[WorkerFailure]] | None = None):
        super().__init__(message)
        self.failures: list[list[WorkerFailure]] = failures or []

    @classmethod
    def from_attempts(cls, attempts: list[list[WorkerFailure]], max_failures: int) -> TrainingFailedError:
        lines = []
        if len(attempts) == 1:
            lines.append("Training failed: " + format_failures(attempts[0]))
        else:
            lines.append(
                f"Training failed {len(attempts)} times (FailureConfig(max_failures={max_failures})); "
                "every attempt's failure, oldest first:"
            )
            for i, attempt in enumerate(attempts):
                number = attempt[0].attempt if attempt and attempt[0].attempt is not None else i
                lines.append(f"[attempt {number}] " + format_failures(attempt))
        return cls("\n".join(lines), attempts)

