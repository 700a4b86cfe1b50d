"""How a train-server job's run ended: the outcome its runner writes on its way out (``exit.json`` in
the job's directory) and the server reads to record the job's end. The one definition of the file,
its writer (:func:`write_outcome`) and its reader (:func:`read_outcome`) beside each other, and of
the two enums the server's API and the client take from here: how the run ended
(:class:`RunStatus`) and, for a job that did not succeed, whose the failure is
(:class:`FailureClass`, a job's ``failure_class``). One JSON object::

    {"status": "succeeded" | "failed" | "stopped", "exit_code": 0, "failure_class": "user_error", "error": "..."}

A runner that ends without writing it is *lost* (the server retries the job, or fails it ``LOST``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from trainforge._internal import state_files
from trainforge._internal.str_enum import StrEnum

MAX_OUTCOME_BYTES = 1 << 20  # a runner's error text is cut well before this


class RunStatus(StrEnum):
    """How a job's run ended, as its runner saw it."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"  # the runner was told to stop (SIGINT/SIGTERM: KeyboardInterrupt)


class FailureClass(StrEnum):
    """Why a job ended without success (its ``failure_class``): its own code or spec
    (``USER_ERROR``: fix the job), the server or its files (``INFRA``: the server's side), someone
    stopped it (``STOPPED``), or its runner vanished without an outcome with its retries spent
    (``LOST``)."""

    USER_ERROR = "user_error"
    INFRA = "infra"
    STOPPED = "stopped"
    LOST = "lost"


@dataclass(frozen=True)
class RunOutcome:
    """What a runner writes on its way out: ``status``, the process' ``exit_code``, and for a failed
    run whose fault it is (``failure_class``) and what happened (``error``)."""

    status: RunStatus
    exit_code: int
    failure_class: FailureClass | None = None
    error: str | None = None

    @classmethod
    def succeeded(cls) -> RunOutcome:
        return cls(RunStatus.SUCCEEDED, 0)

    @classmethod
    def stopped(cls) -> RunOutcome:
        return cls(RunStatus.STOPPED, 130)

    @classmethod
    def failed(cls, failure_class: FailureClass, error: str, exit_code: int = 1) -> RunOutcome:
        return cls(RunStatus.FAILED, exit_code, failure_class, error)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status.value, "exit_code": self.exit_code}
        if self.failure_class is not None:
            out["failure_class"] = self.failure_class.value
        if self.error is not None:
            out["error"] = self.error
        return out

    @classmethod
    def from_json(cls, value: Any) -> RunOutcome | None:
        """The outcome ``value`` (a JSON object) says, None when it is no outcome. A status this
        version does not know counts as failed; an unknown failure class as none."""
        if not isinstance(value, dict):
            return None
        status = _member(RunStatus, value.get("status")) or RunStatus.FAILED
        code = value.get("exit_code")
        error = value.get("error")
        return cls(status=status, exit_code=code if isinstance(code, int) and not isinstance(code, bool) else 1,
                   failure_class=_member(FailureClass, value.get("failure_class")),
                   error=error if isinstance(error, str) else None)  # fmt: skip


def _member(enum: Any, value: Any) -> Any:
    try:
        return enum(value)
    except ValueError:
        return None


def write_outcome(path: str, outcome: RunOutcome) -> None:
    """Write ``outcome`` to ``path`` atomically and durably (the server may read it after a crash)."""
    state_files.write_atomic(path, json.dumps(outcome.to_json()), fsync=True)


def read_outcome(path: str) -> RunOutcome | None:
    """The outcome at ``path``, or None (none written: the runner was lost; or not an outcome)."""
    try:
        with state_files.open_regular(path) as f:
            return RunOutcome.from_json(json.loads(f.read(MAX_OUTCOME_BYTES)))
    except (OSError, ValueError):
        return None
