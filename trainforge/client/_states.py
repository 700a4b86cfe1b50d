"""``JobState``: the states of a train-server job, and ``JobEvent``: the types of its events, each
defined once. The store keeps them, the API's schemas name them (the OpenAPI enum), the client reads
them and the dashboard gets them from the server (embedded in each page) instead of a copy of its own.

    QUEUED / HELD  ->  STARTING -> RUNNING -> (STOPPING)  ->  SUCCEEDED / FAILED / STOPPED
      (waiting)           (active: a runner holds a grant)        (terminal)

``LOST`` is a passing state: a job whose runner vanished is requeued (``QUEUED``) or fails.
"""

from __future__ import annotations

from trainforge._internal.job_events import EventType
from trainforge._internal.str_enum import StrEnum


class JobState(StrEnum):
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


class JobEvent(StrEnum):
    """The type of a job's event in the server's store: what ``GET /events`` and
    ``GET /jobs/{id}/events`` send as each server-sent event's name, and what the dashboard listens
    for. ``RUN_START``, ``RESTART`` and ``RUN_END`` are the job events file's (:class:`EventType`),
    copied into the store as the server reads the file; the others the server writes itself."""

    SUBMITTED = "submitted"
    HELD = "held"  # held in the queue (PATCH hold)
    RELEASED = "released"  # a held job queued again
    PRIORITY = "priority"  # its priority changed
    STARTING = "starting"  # granted resources; its runner is starting
    RUNNING = "running"
    REATTACHED = "reattached"  # a restarted server found its runner alive
    RUN_START = EventType.RUN_START.value
    RESTART = EventType.RESTART.value
    RUN_END = EventType.RUN_END.value
    GROW = "grow"  # elastic: granted more workers
    SHRINK = "shrink"  # elastic: asked to give workers back
    SHRUNK = "shrunk"  # elastic: gave them back
    PREEMPTING = "preempting"  # asked to stop for a higher-priority job
    PREEMPTED = "preempted"  # stopped and requeued
    STOPPING = "stopping"
    STOPPED = "stopped"  # stopped while it waited
    FAILED = "failed"  # its runner could not start
    LOST = "lost"  # its runner vanished
    REQUEUED = "requeued"  # queued again: its runner was lost, or never started (the server died first)
    ENDED = "ended"
    RETRY = "retry"  # an ended job queued again
    TUNE_DECISION = "tune_decision"  # a Tune scheduler's decision about the trial the job runs
    DELETED = "deleted"


WAITING_STATES = (JobState.QUEUED, JobState.HELD)
"""The states of a job in the queue (it holds nothing): ``client.jobs(state=WAITING_STATES)``."""
ACTIVE_STATES = (JobState.STARTING, JobState.RUNNING, JobState.STOPPING)
"""The states of a job a runner holds resources for."""
TERMINAL_STATES = (JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED)
"""The states of a job that has ended."""
