"""How a job's run ended, as the changes the service records: from the outcome its runner wrote
(``exit.json``), or, without one, from why the runner is gone (killed while the job was stopping;
else *lost*: requeued while the job has retries left, failed after that). A job that was being
preempted goes back to the queue (unless it had just succeeded). A job whose runner never started
(the server died after recording it STARTING, before its runner's pid: no runner found alive at
restart, no outcome) goes back to the queue as it was, its attempt not counted: that spends no
retry, and a job with ``max_retries=0`` still runs once. A job whose files are incomplete never
runs: it fails, saying what is missing (:func:`broken`). A job stopped because its run is complete
(``complete_on_stop``: a tuner's stop criteria met, a trial's ``max_t`` reached, as Ray Tune counts
such a trial TERMINATED) ends SUCCEEDED, not STOPPED: its run did what it was asked to."""

from __future__ import annotations

import signal
from typing import Any

from trainforge._internal.run_outcome import FailureClass, RunOutcome, RunStatus
from trainforge.client import JobEvent, JobState
from trainforge.server.store.database import Change, JobRow


def broken(job_id: int, missing: str, now: float) -> Change:
    """The end of a job that cannot run because its files are incomplete (``missing``: which)."""
    error = f"the job's files are incomplete (missing {missing} in the server's state directory): it cannot run; submit it again"
    return job_id, JobEvent.ENDED, {"error": error}, {"state": JobState.FAILED, "failure_class": FailureClass.INFRA, "error": error,
                                                      "ended_at": now, "pid": None}  # fmt: skip


def run_ended(job: JobRow, outcome: RunOutcome | None, returncode: int | None, now: float) -> tuple[list[Change], bool]:
    """The changes that record the end of ``job``'s run (its runner's ``outcome``, None if it left
    none; ``returncode`` None when the runner was not the server's child) and whether the job goes
    back to the queue (a lost runner, with retries left, or a preempted job: it continues the
    interrupted run)."""
    common: dict[str, Any] = {"ended_at": now, "pid": None}
    if job.preempting and (outcome is None or outcome.status != RunStatus.SUCCEEDED):
        # Preempted for a higher-priority job: back to the queue, to continue the run from its latest
        # committed checkpoint (a retry of the job's own is not spent on it).
        spec = dict(job.spec)
        if job.run_path:
            spec["resume_run_path"] = job.run_path
        payload = {"exit_code": outcome.exit_code if outcome else returncode, "resume": job.run_path}
        return [(job.id, JobEvent.PREEMPTED, payload, {"state": JobState.QUEUED, "spec": spec, "pid": None})], True
    if outcome is not None:
        state = {RunStatus.SUCCEEDED: JobState.SUCCEEDED, RunStatus.STOPPED: JobState.STOPPED}.get(
            outcome.status, JobState.FAILED)  # fmt: skip
        if job.state == JobState.STOPPING and state == JobState.FAILED:
            state = JobState.STOPPED
        failure = outcome.failure_class if state == JobState.FAILED else (
            FailureClass.STOPPED if state == JobState.STOPPED else None
        )  # fmt: skip
        payload = {"exit_code": outcome.exit_code, "error": outcome.error}
        if state == JobState.STOPPED and job.complete_on_stop:
            state, failure, payload["complete"] = JobState.SUCCEEDED, None, True
        fields = {"state": state, "exit_code": outcome.exit_code, "error": outcome.error, "failure_class": failure,
                  **common}  # fmt: skip
        return [(job.id, JobEvent.ENDED, payload, fields)], False
    if job.state == JobState.STOPPING:
        state, failure = (JobState.SUCCEEDED, None) if job.complete_on_stop else (JobState.STOPPED, FailureClass.STOPPED)
        fields = {"state": state, "exit_code": returncode, "failure_class": failure, **common}
        payload = {"exit_code": returncode, "killed": True, **({"complete": True} if job.complete_on_stop else {})}
        return [(job.id, JobEvent.ENDED, payload, fields)], False
    if job.state == JobState.STARTING and job.pid is None:  # the server died before starting its runner
        attempt = max(0, job.attempt - 1)
        payload = {"attempt": attempt, "max_retries": job.max_retries, "not_started": True}
        return [(job.id, JobEvent.REQUEUED, payload, {"state": JobState.QUEUED, "attempt": attempt, "pid": None})], True
    how = f"exit code {returncode}" if returncode is not None and returncode >= 0 else (
        f"killed by {signal.Signals(-returncode).name}" if returncode is not None else "gone"
    )  # fmt: skip
    error = f"the job's runner (pid {job.pid}) ended without an outcome ({how})"
    if job.attempt <= job.max_retries:
        spec = dict(job.spec)
        if job.run_path:
            spec["resume_run_path"] = job.run_path
        return [
            (job.id, JobEvent.LOST, {"error": error}, {"state": JobState.LOST, "error": error, "pid": None}),
            (job.id, JobEvent.REQUEUED, {"attempt": job.attempt, "max_retries": job.max_retries},
             {"state": JobState.QUEUED, "spec": spec}),
        ], True  # fmt: skip
    return [
        (job.id, JobEvent.LOST, {"error": error}, {"state": JobState.LOST, "error": error}),
        (job.id, JobEvent.ENDED, {"error": error}, {"state": JobState.FAILED, "failure_class": FailureClass.LOST, "error": error,
                                                   **common}),
    ], False
