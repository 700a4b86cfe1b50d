"""A job as the store holds it (:class:`JobRow`, one row of ``jobs``), one of its events (:class:`Event`),
and one change of it (:data:`Change`, what :meth:`JobStore.update_many
<trainforge.server.store.database.JobStore.update_many>` takes), with the columns a change may set."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from typing import Any

from trainforge.client import JobEvent, JobState


@dataclasses.dataclass
class JobRow:
    id: int
    name: str
    submission_id: str | None
    kind: str
    state: JobState
    priority: int
    spec: dict[str, Any]
    submitted_at: float
    started_at: float | None
    ended_at: float | None
    attempt: int
    max_retries: int
    grant: dict[str, float] | None
    workers: int | None
    gpu_ids: list[str] | None
    pid: int | None
    pid_start_time: float | None
    run_path: str | None
    exit_code: int | None
    failure_class: str | None
    error: str | None
    events_offset: int
    last_metrics: dict[str, Any] | None
    reports: int
    submission_digest: str | None = None
    owner: str = "admin"  # who submitted it (the state directory's token is the user "admin")
    preemptible: bool = False
    preempted_at: float | None = None  # when it was last asked to give its resources back
    preemptions: int = 0
    complete_on_stop: bool = False  # asked to stop because its run is complete: it ends SUCCEEDED

    @property
    def preempting(self) -> bool:
        """Asked to stop for a higher-priority job: it is requeued once its runner has ended."""
        return self.state == JobState.STOPPING and self.preempted_at is not None and (
            self.started_at is None or self.preempted_at >= self.started_at
        )

    @classmethod
    def from_sql(cls, row: sqlite3.Row) -> JobRow:
        d = dict(row)
        d["preemptible"] = bool(d.get("preemptible"))
        d["complete_on_stop"] = bool(d.get("complete_on_stop"))
        d["spec"] = json.loads(d["spec"])
        d["state"] = JobState(d["state"])
        grant = d.pop("grant_json")
        d["grant"] = json.loads(grant) if grant else None
        d["gpu_ids"] = json.loads(d["gpu_ids"]) if d["gpu_ids"] else None
        d["last_metrics"] = json.loads(d["last_metrics"]) if d["last_metrics"] else None
        return cls(**d)


@dataclasses.dataclass(frozen=True)
class Event:
    seq: int
    job_id: int
    ts: float
    type: str
    payload: dict[str, Any]


# One change of a job (JobStore.update_many): (job id, event or None, its payload, the fields to set).
Change = tuple[int, JobEvent | None, dict[str, Any] | None, dict[str, Any]]

JSON_COLUMNS = {"spec", "grant_json", "gpu_ids", "last_metrics"}
COLUMNS = {  # what JobStore.update may set ("grant" is stored as grant_json)
    "name", "state", "priority", "started_at", "ended_at", "attempt", "max_retries", "grant_json", "workers",
    "gpu_ids", "pid", "pid_start_time", "run_path", "exit_code", "failure_class", "error", "events_offset",
    "last_metrics", "reports", "spec", "preempted_at", "preemptions", "complete_on_stop",
}  # fmt: skip
