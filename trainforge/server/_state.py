"""``JobState``: the states of a train-server job, defined once. The store keeps them, the API's
schemas name them (the OpenAPI enum), the client reads them and the dashboard gets them from the
server (:func:`states_json`, embedded in each page) instead of a copy of its own.

    QUEUED / HELD  ->  STARTING -> RUNNING -> (STOPPING)  ->  SUCCEEDED / FAILED / STOPPED
      (waiting)           (active: a runner holds a grant)        (terminal)

``LOST`` is a passing state: a job whose runner vanished is requeued (``QUEUED``) or fails.
"""

from __future__ import annotations

import enum
from typing import Any


class JobState(str, enum.Enum):
    """A job's state: QUEUED or HELD while it waits; STARTING, RUNNING, STOPPING while it holds
    resources; SUCCEEDED, FAILED or STOPPED once it has ended; LOST for a moment when its runner
    vanished (it is then requeued, or fails). In Python a ``str`` (``JobState.RUNNING == "RUNNING"``)."""

    QUEUED = "QUEUED"
    HELD = "HELD"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"
    LOST = "LOST"

    def __str__(self) -> str:  # "RUNNING", not "JobState.RUNNING" (as enum.StrEnum, which 3.10 lacks)
        return str.__str__(self)

    def __format__(self, format_spec: str) -> str:
        return str.__format__(self, format_spec)

    @property
    def waiting(self) -> bool:
        """In the queue (queued or held): it holds nothing."""
        return self in WAITING_STATES

    @property
    def active(self) -> bool:
        """A runner holds a grant for it."""
        return self in ACTIVE_STATES

    @property
    def terminal(self) -> bool:
        """Ended: nothing of it runs, and nothing will unless it is retried."""
        return self in TERMINAL_STATES


WAITING_STATES = (JobState.QUEUED, JobState.HELD)
ACTIVE_STATES = (JobState.STARTING, JobState.RUNNING, JobState.STOPPING)
TERMINAL_STATES = (JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED)
ALL_STATES = tuple(JobState)


def states_json() -> dict[str, Any]:
    """The states as the dashboard's script takes them: every name in order and each grouping."""
    return {
        "all": [s.value for s in ALL_STATES],
        "waiting": [s.value for s in WAITING_STATES],
        "active": [s.value for s in ACTIVE_STATES],
        "terminal": [s.value for s in TERMINAL_STATES],
    }
