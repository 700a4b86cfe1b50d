"""The schemas of the Experiments API (:mod:`trainforge.server.routes.experiments`): Tune experiments,
their trials, the decisions a tuner's scheduler took, parameter importance, curves, and what
``trainforge experiments import`` sends. A job says which experiment it is a trial of with the job
spec's ``experiment`` (:class:`~trainforge.server._schemas.TrialTagIn`, beside the job's schemas)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Path
from pydantic import BaseModel, ConfigDict, Field, field_validator

from trainforge.client import TrialDecision, TrialState
from trainforge.server._schemas import ConfigKey, ConfigValue, ParamIn

ExperimentId = Annotated[int, Path(ge=0, le=2**62, description="the experiment's id")]
TRIAL_STATES: tuple[str, ...] = tuple(s.value for s in TrialState)  # in the order the pages list them
Evaluator = Literal["ped_anova", "fanova"]
Name = Annotated[str, Field(max_length=200)]
Number = Annotated[float, Field(allow_inf_nan=False)]


class DecisionIn(BaseModel):
    """A decision the tuner took on a trial at one of its reports (``iteration``: its
    ``training_iteration``; the trial's reports end there): its scheduler stopped it (``pruned``: at a
    rung; ``max_t``: its budget is used up), continued it from another trial's checkpoint
    (``exploit``, PBT: ``source_trial``), the stop criteria or the time budget stopped it, Ctrl-C, or
    the tuner failed it (``error``). ``rule``: who decided (the scheduler's class); ``rung`` and
    ``rung_at`` (in ``time_attr`` units) where a successive-halving scheduler stopped it; ``text``: why,
    in words."""

    model_config = ConfigDict(extra="forbid")
    kind: TrialDecision
    iteration: int | None = Field(default=None, ge=0, le=2**62)
    rule: Name | None = None
    time_attr: Name | None = None
    at: Number | None = Field(default=None, description="the trial's time_attr value at the decision")
    rung: int | None = Field(default=None, ge=0, le=1000)
    rung_at: Number | None = None
    value: Number | None = Field(default=None, description="the metric's value at the decision")
    source_trial: Name | None = None
    text: str | None = Field(default=None, max_length=2000)


class DecisionOut(BaseModel):
    seq: int
    experiment_id: int
    trial_id: str
    job_id: int | None
    ts: float
    kind: str
    iteration: int | None
    detail: dict[str, Any]
    rev: int = Field(description="the change counter when it was recorded")


class TrialOut(BaseModel):
    trial_id: str
    name: str
    state: TrialState = Field(description="Ray Tune's trial state, as the tuner shows it (trainforge.client.trial_state)")
    reason: dict[str, Any] | None = Field(description=(
        "why it ended: kind (a decision's: pruned, max_t, ...; else its job's end: completed, failed, stopped), "
        "text, and the decision's iteration, rung, ..."))
    config: dict[str, Any]
    iterations: int
    last: float | None = Field(description="the metric's latest value (within the trial's reports)")
    best: float | None = Field(description="its best value over the trial's reports")
    best_at: int | None
    metrics: dict[str, Any] | None = Field(description="the latest report's metrics")
    job: int | None = Field(description="the latest job that ran it (None: an imported trial)")
    jobs: list[int]
    started_at: float | None
    ended_at: float | None
    checkpoint: str | None = Field(description="an imported trial's latest checkpoint (a job's: its Result's)")
    rev: int


class BestOut(BaseModel):
    trial_id: str
    value: float
    job: int | None
    checkpoint: str | None
    config: dict[str, Any]


class ExperimentOut(BaseModel):
    id: int
    name: str
    path: str
    source: Literal["server", "import"]
    owner: str = Field(default="admin", description=(
        "who imported it (or whose trial job made it): only they or an admin may import its directory again"))
    tune_id: str | None
    searcher: str | None
    scheduler: str | None
    metric: str | None
    mode: Literal["min", "max"] | None
    space: dict[str, dict[str, Any]]
    trials: int
    counts: dict[str, int] = Field(description="trials by state (TrialState)")
    pruned: int = Field(default=0, description="of the TERMINATED trials, those the tuner's scheduler stopped early")
    best: BestOut | None = Field(description="the trial with the best latest value of the metric (errored ones left out)")
    started_at: float | None
    ended_at: float | None = Field(description="when its last trial ended; None while one is queued or runs")
    live: bool = Field(description="a trial is queued or runs")
    url: str = Field(description="the experiment's dashboard page")


class ExperimentListOut(BaseModel):
    experiments: list[ExperimentOut]


class TrialListOut(BaseModel):
    experiment: ExperimentOut
    params: list[str] = Field(description="the configuration keys, search-space ones first")
    trials: list[TrialOut]
    rev: int = Field(description="the change counter: the stream's Last-Event-ID to follow from here")


class ImportanceOut(BaseModel):
    evaluator: Evaluator
    metric: str | None
    importances: dict[str, float] = Field(description="param -> importance (summing to 1), most important first")
    trials: int = Field(description="the finished trials it rests on")
    skipped: dict[str, str] = Field(description="params left out, and why")
    constant: list[str] = Field(description="params with one value in every trial (left out: in `skipped` too)")
    warning: str | None = Field(description="under 20 completed trials: the ranking may be chance")
    stability: float | None = Field(description="the share of bootstrap resamples whose top param is the top one "
                                    "(under 20 trials; None above)")  # fmt: skip
    intervals: dict[str, list[float]] = Field(description="param -> [10%, 90%] of its importance over the resamples")
    resamples: int = Field(description="bootstrap resamples behind `stability` and `intervals` (seed 0)")
    notes: list[str]
    cached: bool
    computed_ms: float


class HistoryPointOut(BaseModel):
    n: int = Field(description="trials finished so far")
    trial_id: str
    t: float | None = Field(description="seconds since the experiment's first trial started")
    value: float
    best: float


class HistoryOut(BaseModel):
    metric: str | None
    mode: Literal["min", "max"] | None
    points: list[HistoryPointOut]


class CurveOut(BaseModel):
    i: list[int] = Field(description="training_iteration of each point")
    v: list[float | None]
    t: list[float | None] = Field(description="seconds since the trial's first report")
    cut: int | None = Field(description="where a tuner's stop decision ended it (its last point)")
    state: TrialState
    pruned: bool = Field(default=False, description="the tuner's scheduler stopped it early (at cut)")


class CurvesOut(BaseModel):
    metric: str | None
    metrics: list[str] = Field(description="the numeric metrics the trials reported")
    trials: dict[str, CurveOut]


class ImportTrialIn(BaseModel):
    """A trial as the experiment directory holds it (``experiment_state.json`` and its run directory)."""

    model_config = ConfigDict(extra="forbid")
    trial_id: str = Field(min_length=1, max_length=200)
    name: str = Field(min_length=1, max_length=1000)
    config: dict[ConfigKey, ConfigValue] = Field(default_factory=dict, max_length=500)
    status: TrialState
    error: str | None = Field(default=None, max_length=100_000)
    pruned: bool = False
    stop_reason: str | None = Field(default=None, max_length=200)
    metrics: dict[ConfigKey, ConfigValue] = Field(default_factory=dict, max_length=1000)
    history: dict[ConfigKey, list[tuple[int, Number | None, Number | None]]] = Field(
        default_factory=dict, max_length=50, description="key -> [[training_iteration, t, value]]")
    decisions: list[DecisionIn] = Field(default_factory=list, max_length=1000)
    checkpoint: str | None = Field(default=None, max_length=4096)
    started_at: Number | None = None
    ended_at: Number | None = None


class ExperimentImportIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = Field(min_length=1, max_length=4096, description="the experiment directory")
    name: str = Field(min_length=1, max_length=200)
    tune_id: str | None = Field(default=None, max_length=64)
    searcher: Name | None = None
    scheduler: Name | None = None
    metric: Name | None = None
    mode: Literal["min", "max"] | None = None
    space: dict[ConfigKey, ParamIn] = Field(default_factory=dict, max_length=500)
    saved_at: Number | None = None
    trials: list[ImportTrialIn] = Field(default_factory=list, max_length=100_000)

    @field_validator("trials")
    @classmethod
    def _one_trial_per_id(cls, trials: list[ImportTrialIn]) -> list[ImportTrialIn]:
        seen: set[str] = set()
        for trial in trials:
            if trial.trial_id in seen:
                raise ValueError(f"trial_id {trial.trial_id!r} is given twice: each trial once, by its own id")
            seen.add(trial.trial_id)
        return trials
