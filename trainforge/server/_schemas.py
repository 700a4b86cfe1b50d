"""The train server API's schemas: every pydantic model its routes take and answer (and the
annotated types of their parameters), in one place, as they appear in the OpenAPI document
(``/api/v1/openapi.json``). A job's state is :class:`~trainforge.client.JobState` (the
OpenAPI enum ``JobState``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Path
from fastapi.exceptions import RequestValidationError
from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from trainforge._internal.failure_reason import reason_of
from trainforge._internal.http import json_safe
from trainforge._internal.json_depth import shallow
from trainforge._internal.run_outcome import FailureClass
from trainforge._internal.trainer_job import NUM_WORKERS, num_workers_of
from trainforge.client import JobEvent, JobState
from trainforge.registry import NAME_PATTERN
from trainforge.server.scheduling.decision import Pending
from trainforge.server.store.database import JobRow
from trainforge.server.team.users import NAME_PATTERN as USER_NAME_PATTERN

KindName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:/-]+$")]
Amount = Annotated[float, Field(ge=0, le=1e15, allow_inf_nan=False)]
JobId = Annotated[int, Path(ge=0, le=2**62, description="the job's id")]
ConfigKey = Annotated[str, Field(min_length=1, max_length=200)]
# A JSON scalar kept as the type it was sent as: strict, so 0 stays 0 (not False) and "0" stays text.
ConfigValue = Annotated[
    StrictBool | StrictInt | StrictFloat | Annotated[StrictStr, Field(max_length=1000)] | None,
    Field(union_mode="left_to_right"),
]


class ParamIn(BaseModel):
    """A search-space dimension of a Tune experiment: its kind, range (``log``: a log scale) or choices."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["float", "int", "categorical"]
    low: float | None = Field(default=None, allow_inf_nan=False)
    high: float | None = Field(default=None, allow_inf_nan=False)
    log: bool = False
    choices: list[ConfigValue] | None = Field(default=None, max_length=1000)


class TrialTagIn(BaseModel):
    """Which Tune experiment a job is a trial of (Tune's trials set it; the Experiments pages group by it):
    the experiment's directory (its identity), name, searcher, scheduler, metric, mode and search space
    (keys as in the job's ``config``), and the trial's id."""

    model_config = ConfigDict(extra="forbid")
    path: str = Field(min_length=1, max_length=4096, description="the experiment directory")
    name: str = Field(min_length=1, max_length=200)
    trial_id: str = Field(min_length=1, max_length=200)
    tune_id: str | None = Field(default=None, max_length=64)
    searcher: str | None = Field(default=None, max_length=200)
    scheduler: str | None = Field(default=None, max_length=200)
    metric: str | None = Field(default=None, max_length=200)
    mode: Literal["min", "max"] | None = None
    space: dict[ConfigKey, ParamIn] = Field(default_factory=dict, max_length=500)


class JobSpecIn(BaseModel):
    """A job to queue. ``kind``: ``trainer`` (``trainer_b64``: the cloudpickled trainer, as
    ``trainer.submit()`` sends it), ``script`` (``path`` run as ``__main__`` with ``args``) or
    ``function`` (``target`` ``"pkg.module:function"`` returning a trainer). The request is
    ``num_workers`` (the minimum, all started at once; Ray's name, ``ScalingConfig(num_workers=...)``;
    ``workers``, as older clients send it, is read as the same) up to ``max_workers``, ``per_worker``
    resources each, plus the job's ``driver``."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["trainer", "script", "function"]
    name: str | None = Field(default=None, max_length=200)
    trainer_b64: str | None = Field(default=None, max_length=512 * 1024 * 1024)
    path: str | None = Field(default=None, min_length=1, max_length=4096)
    target: str | None = Field(default=None, max_length=512, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    args: list[Annotated[str, Field(max_length=65536)]] = Field(default_factory=list, max_length=1000)
    cwd: str | None = Field(default=None, min_length=1, max_length=4096)
    sys_path: list[Annotated[str, Field(max_length=4096)]] = Field(default_factory=list, max_length=100)
    storage: list[Annotated[str, Field(min_length=1, max_length=4096)]] = Field(
        default_factory=list, max_length=16, description=(
            "directories the job writes its runs to (trainer.submit() sends RunConfig.storage_path): on a "
            "server with users they are writable in the job's sandbox, as far as its user may write them"))
    env: dict[Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")],
              Annotated[str, Field(max_length=65536)]] = Field(default_factory=dict)  # fmt: skip
    num_workers: int = Field(default=1, ge=1, le=100_000, validation_alias=AliasChoices(NUM_WORKERS, "workers"))
    max_workers: int | None = Field(default=None, ge=1, le=100_000)
    per_worker: dict[KindName, Amount] = Field(default_factory=lambda: {"CPU": 1.0})
    driver: dict[KindName, Amount] = Field(default_factory=dict)
    priority: int = Field(default=0, ge=-1_000_000, le=1_000_000)
    hold: bool = False
    max_retries: int = Field(default=1, ge=0, le=100)
    submission_id: str | None = Field(default=None, min_length=1, max_length=200)
    config: dict[ConfigKey, ConfigValue] = Field(default_factory=dict, max_length=500, description=(
        "the job's configuration as flat scalars (nested keys joined by '/'), e.g. the trainer's "
        "train_loop_config: shown on the job page, and what the compare page groups jobs by"))
    experiment: TrialTagIn | None = Field(default=None, description="the Tune experiment this job is a trial of")
    preemptible: bool = Field(default=False, description=(
        "may be asked to give its resources back to a higher-priority job: it stops as after Ctrl-C, is "
        "requeued and resumes from its latest committed checkpoint"))

    @model_validator(mode="after")
    def _kind_fields(self) -> JobSpecIn:
        need = {"trainer": "trainer_b64", "script": "path", "function": "target"}[self.kind]
        if getattr(self, need) is None:
            raise ValueError(f"kind={self.kind!r} needs the field {need!r}")
        if self.max_workers is not None and self.max_workers < self.num_workers:
            raise ValueError(f"max_workers={self.max_workers} is less than num_workers={self.num_workers}")
        return self

    @field_validator("path", "cwd")
    @classmethod
    def _no_nul(cls, v: str | None) -> str | None:
        if v is not None and "\0" in v:
            raise ValueError("must not contain NUL characters")
        return v

    @field_validator("storage", "sys_path")
    @classmethod
    def _no_nul_in_paths(cls, v: list[str]) -> list[str]:
        if any("\0" in p for p in v):
            raise ValueError("paths must not contain NUL characters")
        return v


class PendingOut(BaseModel):
    reason: str = Field(description="held, resources, reserved, quota, or the name of the scheduling policy that "
                                    "holds the job back (max_running: its user runs as many jobs as they may)")
    position: int | None
    text: str
    need: dict[str, float] = Field(default_factory=dict)
    free: dict[str, float] = Field(default_factory=dict)
    behind: int | None = None
    limit: dict[str, float] = Field(default_factory=dict, description="reason quota: its user's quota, by kind")


class JobOut(BaseModel):
    id: int
    name: str
    kind: str
    state: JobState
    priority: int
    pending: PendingOut | None
    submitted_at: float
    started_at: float | None
    ended_at: float | None
    attempt: int
    max_retries: int
    request: dict[str, Any]
    grant: dict[str, float] | None
    workers: int | None
    gpu_ids: list[str] | None
    pid: int | None
    run_path: str | None
    exit_code: int | None
    failure_class: FailureClass | None = Field(description=(
        "why it ended without success: user_error (its code or spec), infra (the server's side), stopped, lost"))
    error: str | None = Field(description=(
        "what went wrong, whole: the one-line reason first, then the failed ranks' tracebacks"))
    reason: str | None = Field(None, description=(
        "why it failed in one line: the exception type and message and the user's file and line, e.g. "
        "'ValueError: bad lr (train.py:8, in loop)' (the first line of error)"))
    reports: int
    last_metrics: dict[str, Any] | None
    config: dict[str, Any]
    owner: str = Field(default="admin", description="the user who submitted it")
    preemptible: bool = False
    preemptions: int = Field(default=0, description="times it gave its resources back to a higher-priority job")


class JobListOut(BaseModel):
    jobs: list[JobOut]
    next_before: int | None = Field(description="pass as ?before= for the next (older) page; null at the end")
    total: int | None = Field(None, description="with ?total=true: the jobs the filters match, this page and older")


class SubmitOut(BaseModel):
    id: int
    created: bool
    job: JobOut


class PatchIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    priority: int | None = Field(default=None, ge=-1_000_000, le=1_000_000)
    hold: bool | None = None


class RetryIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    checkpoint: str | None = Field(default=None, min_length=1, max_length=4096, description=(
        "start the new attempt from this checkpoint (a path or URL, e.g. one of GET /jobs/{id}/checkpoints) "
        "instead of continuing the last run from its latest one"))


class StopIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    grace_s: float | None = Field(default=None, ge=0, le=3600, allow_inf_nan=False)
    force: bool = False
    complete: bool = Field(default=False, description=(
        "the run is complete (a tuner's stop criteria met, a trial's max_t reached): once stopped, the job "
        "ends SUCCEEDED rather than STOPPED"))


class LogsOut(BaseModel):
    text: str
    offset: int = Field(description="byte offset of the first byte of text")
    next_offset: int = Field(description="byte offset after text: pass as ?offset= to read on")
    size: int
    path: str | None


class EventOut(BaseModel):
    seq: int
    job_id: int
    ts: float
    type: str = Field(description="the event's type (the server-sent event's name): " + ", ".join(JobEvent))
    payload: dict[str, Any]


class QueueEntryOut(BaseModel):
    job_id: int
    name: str
    priority: int
    pending: PendingOut


class QueueListOut(BaseModel):
    entries: list[QueueEntryOut] = Field(description="the waiting jobs from ?offset= on, in start order")
    next_offset: int | None = Field(description="pass as ?offset= for the next page; null at the end")
    total: int = Field(description="how many jobs wait")


class ResourcesOut(BaseModel):
    capacity: dict[str, float]
    granted: dict[str, float]
    free: dict[str, float]
    jobs: dict[str, dict[str, Any]] = Field(description="job id -> its grant and GPU ids")
    gpus: dict[str, int] = Field(description="GPU id -> the job holding it")
    decision_ms: float
    policies: list[dict[str, str]] = Field(
        default_factory=list, description="the scheduling policies, in order: name and what each does"
    )


class HealthOut(BaseModel):
    status: Literal["ok"]
    version: str
    pid: int
    uptime_s: float
    jobs: dict[str, int]
    warm_pool: dict[str, Any] = Field(
        default_factory=dict, description="the warm fork server jobs' processes start from: enabled, ready, pid"
    )


# -- the model registry and serving (/models, /serve) -----------------------------------------------
ModelName = Annotated[str, Path(min_length=1, max_length=100, pattern=NAME_PATTERN, description="the model's name")]
AliasName = Annotated[str, Path(min_length=1, max_length=100, description="the alias (production, staging, ...)")]
VersionNo = Annotated[int, Path(ge=1, le=2**31, description="the version's number")]


class JobLinkOut(BaseModel):
    id: int
    name: str
    state: JobState
    url: str = Field(description="the job's dashboard page")


class ModelOut(BaseModel):
    name: str
    latest_version: int | None
    num_versions: int
    aliases: dict[str, int] = Field(description="alias -> the version it points at")
    updated_at: float | None
    tags: dict[str, Any]


class VersionOut(BaseModel):
    name: str
    version: int
    uri: str = Field(description="models:/name/version")
    size: int = Field(description="bytes of its files")
    num_files: int
    files: dict[str, dict[str, Any]] | None = Field(
        default=None, description="path -> {sha256, size} (only when one version is asked for)"
    )
    metrics: dict[str, Any]
    tags: dict[str, Any]
    description: str | None
    model_class: str | None
    loader: str | None
    lineage: dict[str, Any]
    created_at: float | None
    created_by: str | None
    aliases: list[str] = Field(description="the aliases pointing at this version now")
    job: JobLinkOut | None = Field(description="the job on this server that produced it (by its run directory)")


class RegisterIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    job: int | None = Field(default=None, ge=1, le=2**62, description="register this job's latest checkpoint (its run's Result)")
    source: str | None = Field(default=None, min_length=1, max_length=4096,
                               description="or a checkpoint directory or URL, as the server's machine sees it")  # fmt: skip
    model_class: str | None = Field(default=None, max_length=400, description="module:Class of its trainforge.model.Model")
    loader: str | None = Field(default=None, max_length=400, description="or module:function that loads it")
    metrics: Annotated[dict[str, Any] | None, AfterValidator(shallow)] = Field(default=None, description="default: the run's last numeric metrics")
    tags: Annotated[dict[str, Any] | None, AfterValidator(shallow)] = None
    description: str | None = Field(default=None, max_length=10_000)
    alias: str | None = Field(default=None, min_length=1, max_length=100, description="point this alias at it")
    by: str | None = Field(default=None, min_length=1, max_length=200,
                           description="who registers it (its created_by): default the caller; only an admin may "
                           "name someone else, recorded as '<by> (recorded by <admin>)'")  # fmt: skip


class AliasIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int = Field(ge=1, le=2**31, description="the version the alias should point at")
    by: str | None = Field(default=None, min_length=1, max_length=200,
                           description="who moves it (for the history): default the caller; only an admin may name "
                           "someone else, recorded as '<by> (recorded by <admin>)'")  # fmt: skip


class AliasMoveOut(BaseModel):
    alias: str
    from_version: int | None
    to_version: int | None = Field(description="null when the alias was removed")
    at: float
    by: str | None


class GcOut(BaseModel):
    blobs_removed: int
    bytes_freed: int


class ServedOut(BaseModel):
    ref: str
    model: dict[str, Any]
    stats: dict[str, Any]


# -- a server a team shares: users, the audit log, fair share (/users, /whoami, /audit, /shares) ------
UserName = Annotated[str, Field(min_length=1, max_length=64, pattern=USER_NAME_PATTERN)]
UserPath = Annotated[str, Path(min_length=1, max_length=64, pattern=USER_NAME_PATTERN, description="the user's name")]
Quota = dict[KindName, Amount]


OsUser = Annotated[str, Field(min_length=1, max_length=32, pattern=r"^[a-z_][a-z0-9_.-]*[$]?$")]


class UserIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: UserName
    role: Literal["admin", "member", "viewer"]
    shares: float = Field(default=1.0, gt=0, le=1e6, allow_inf_nan=False, description="weight in fair share")
    quota: Quota | None = Field(default=None, description="what the user's jobs may hold at once, by kind")
    os_user: OsUser | None = Field(default=None, description=(
        "an account of the server's machine the user's jobs run as (a server running as root; default: a "
        "uid of the user's own)"))


class UserPatchIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["admin", "member", "viewer"] | None = None
    shares: float | None = Field(default=None, gt=0, le=1e6, allow_inf_nan=False)
    quota: Quota | None = Field(default=None, description="the new quota ({} removes it)")
    os_user: OsUser | Literal[""] | None = Field(default=None, description="the account their jobs run as ('' : none)")


class UserOut(BaseModel):
    name: str
    role: str
    shares: float
    quota: dict[str, float] | None
    created_at: float
    rotated_at: float | None
    os_user: str | None = None


class UserTokenOut(BaseModel):
    user: UserOut
    token: str = Field(description="the user's token: shown once (only its hash is kept)")


class UserRemovedOut(BaseModel):
    name: str = Field(description="the user removed: their token no longer works")
    jobs_owner: str = Field(description=(
        "the name their jobs and fair-share usage are kept under, e.g. 'bob (removed 2026-11-28 14:03:12 UTC)': "
        "no user can have it, so a user added later as 'bob' owns none of them"))
    jobs: int = Field(description="how many jobs it owns")


class WhoamiOut(BaseModel):
    name: str
    role: str
    quota: dict[str, float] | None = None
    holds: dict[str, float] = Field(default_factory=dict, description="what the user's running jobs hold")


class AuditOut(BaseModel):
    seq: int
    ts: float
    user: str
    role: str
    action: str = Field(description="the rule that governed the request, e.g. job.change")
    method: str
    path: str
    job_id: int | None
    status: int
    client: str | None
    detail: str | None


class ShareOut(BaseModel):
    user: str
    shares: float
    usage: float = Field(description="decayed usage, dominant-share seconds")
    usage_fraction: float
    share_fraction: float
    factor: float = Field(description="fair-share factor F = 2^(-U/S)")
    holds: dict[str, float]
    quota: dict[str, float] | None


def pending_out(p: Pending | None) -> PendingOut | None:
    if p is None:
        return None
    return PendingOut(reason=p.reason, position=p.position, text=p.describe(), need=p.need, free=p.free, behind=p.behind,
                      limit=p.limit)  # fmt: skip


def job_out(job: JobRow, pending: Pending | None) -> JobOut:
    """A job as the API answers it (``pending``: why it waits, for a waiting job)."""
    spec = job.spec
    request = {
        NUM_WORKERS: num_workers_of(spec),
        "max_workers": spec.get("max_workers"),
        "per_worker": spec.get("per_worker", {}),
        "driver": spec.get("driver", {}),
    }
    return JobOut(
        id=job.id, name=job.name, kind=job.kind, state=job.state, priority=job.priority,
        pending=pending_out(pending) if job.state.waiting else None,
        submitted_at=job.submitted_at, started_at=job.started_at, ended_at=job.ended_at, attempt=job.attempt,
        max_retries=job.max_retries, request=request, grant=job.grant, workers=job.workers, gpu_ids=job.gpu_ids,
        pid=job.pid, run_path=job.run_path, exit_code=job.exit_code,
        failure_class=FailureClass(job.failure_class) if job.failure_class else None,
        error=job.error, reason=reason_of(job.error), reports=job.reports, last_metrics=json_safe(job.last_metrics),
        config=json_safe(spec.get("config") or {}), owner=job.owner, preemptible=job.preemptible,
        preemptions=job.preemptions,
    )  # fmt: skip


def invalid(loc: tuple[str, ...], msg: str) -> RequestValidationError:
    """A 422 in the same shape as the schema's own (``detail``: a list of ``{loc, msg, type}``), for
    what a route checks beyond the schema."""
    return RequestValidationError([{"type": "value_error", "loc": loc, "msg": msg}])
