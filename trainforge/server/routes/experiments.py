"""``/experiments``: Tune experiments, whose trials ran as this server's jobs or were imported from
their directory, for the dashboard's Experiments pages and for notebooks:

    GET  /experiments                           every experiment: searcher, scheduler, metric, trials by state, best
    GET  /experiments/{id}                      one of them
    GET  /experiments/{id}/trials               its trials: config, the metric's latest and best, state and why it ended
    GET  /experiments/{id}/decisions            what the tuner decided on which trial, when, at which iteration
    GET  /experiments/{id}/history              the best value so far after each finished trial
    GET  /experiments/{id}/curves?metric=       one metric of every trial, report by report (a pruned one's ends at its rung)
    GET  /experiments/{id}/importance?evaluator=ped_anova|fanova
    GET  /experiments/{id}/stream               its trials and decisions as they change (server-sent events)
    POST /experiments/import                    an experiment read from its directory (`trainforge experiments import`)
    POST /jobs/{id}/decisions                   the tuner's decision on the trial a job runs (Tune sends it)

Errors: 404 an unknown experiment or job; 409 a decision about a job that is no trial here, an
import over an experiment whose trials ran here, or over another user's import (only its owner or an
admin may import a directory again); 503 importance without Optuna on the server.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request
from fastapi.responses import StreamingResponse

from trainforge.server._schemas import JobId
from trainforge.server.experiments import views as views
from trainforge.server.experiments.book import ExperimentNotFound, ExperimentOwned, Experiments, NotATrial
from trainforge.server.experiments.importance import OptunaMissing
from trainforge.server.experiments.schemas import (
    CurvesOut,
    DecisionIn,
    DecisionOut,
    Evaluator,
    ExperimentId,
    ExperimentImportIn,
    ExperimentListOut,
    ExperimentOut,
    HistoryOut,
    ImportanceOut,
    TrialListOut,
    TrialState,
)
from trainforge.server.routes.access import Caller
from trainforge.server.routes.common import (
    SSE,
    Api,
    Event,
    Service,
    SignedIn,
    job_or_404,
    resume_at,
    sse_response,
)

router = APIRouter()
STREAM_POLL_S = 0.2  # how often a stream looks for changes (a report reaches the page within ~0.3 s)
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": "no such experiment"}}
_T = TypeVar("_T")


async def experiments_of(request: Request) -> Experiments:
    return request.app.state.experiments  # type: ignore[no-any-return]


ExperimentsDep = Annotated[Experiments, Depends(experiments_of)]


def _answer(fn: Callable[[], _T]) -> _T:
    """``fn()``, its errors as HTTP ones."""
    try:
        return fn()
    except ExperimentNotFound as exc:
        raise HTTPException(404, str(exc)) from None
    except (NotATrial, ExperimentOwned) as exc:
        raise HTTPException(409, str(exc)) from None
    except OptunaMissing as exc:
        raise HTTPException(503, str(exc)) from None


@router.get("/experiments", response_model=ExperimentListOut)
def list_experiments(ex: ExperimentsDep) -> ExperimentListOut:
    return ExperimentListOut(experiments=views.list_experiments(ex))


def _view_route(path: str, view: Callable[[Experiments, int], Any], response_model: Any, doc: str) -> None:
    """``GET /experiments/{experiment_id}<path>``: ``view(experiments, experiment_id)``, 404 if unknown."""

    def route(ex: ExperimentsDep, experiment_id: ExperimentId) -> Any:
        return _answer(lambda: view(ex, experiment_id))

    route.__doc__ = doc
    router.add_api_route(f"/experiments/{{experiment_id}}{path}", route, methods=["GET"], name=view.__name__,
                         response_model=response_model, responses=NOT_FOUND)  # fmt: skip


_view_route("", views.get_experiment, ExperimentOut, "One experiment: searcher, scheduler, metric, trials by state, best.")


@router.get("/experiments/{experiment_id}/trials", response_model=TrialListOut, responses=NOT_FOUND)
def trials(
    ex: ExperimentsDep, experiment_id: ExperimentId,
    state: Annotated[list[TrialState] | None, Query(max_length=10)] = None,
    after_rev: Annotated[int | None, Query(ge=0, le=2**62, description="only trials changed after this rev")] = None,
) -> TrialListOut:  # fmt: skip
    """The trials (``state``: only those, repeatable), each with its config, the metric's latest and
    best value, iterations, state and ``reason`` (why it ended: the tuner's decision, or its job's end)."""
    return _answer(lambda: views.trials(ex, experiment_id, states=list(state or []) or None, after_rev=after_rev))


_view_route("/decisions", views.decisions, list[DecisionOut],
            "What the tuner decided on which trial, when, at which iteration.")
_view_route("/history", views.history, HistoryOut, "The best value so far after each finished trial.")


@router.get("/experiments/{experiment_id}/curves", response_model=CurvesOut, responses=NOT_FOUND)
def curves(
    ex: ExperimentsDep, experiment_id: ExperimentId,
    metric: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
    points: Annotated[int, Query(ge=2, le=10_000)] = 200,
    trial: Annotated[list[Annotated[str, Query(max_length=200)]] | None, Query(max_length=1000)] = None,
) -> CurvesOut:  # fmt: skip
    """``metric`` (default: the experiment's) of every trial (``trial``: only those), by
    ``training_iteration``, at most ``points`` points each; a trial a stop decision ended stops there."""
    return _answer(lambda: views.curves(ex, experiment_id, metric, points, list(trial or []) or None))


@router.get("/experiments/{experiment_id}/importance", response_model=ImportanceOut,
            responses={**NOT_FOUND, 503: {"description": "Optuna (or, for fANOVA, scikit-learn) is not installed"}})  # fmt: skip
def importance(ex: ExperimentsDep, experiment_id: ExperimentId, evaluator: Evaluator = "ped_anova") -> ImportanceOut:
    """How much each parameter mattered to the metric, over the completed trials, by Optuna's
    ``PedAnovaImportanceEvaluator`` (``ped_anova``) or ``FanovaImportanceEvaluator(n_trees=16,
    max_depth=8)`` (``fanova``); kept until another trial ends."""
    return _answer(lambda: views.importance(ex, ex.importance, experiment_id, evaluator))


def _changes(ex: Experiments, experiment_id: int, rev: int) -> tuple[list[Event], ExperimentOut]:
    listed = views.trials(ex, experiment_id, after_rev=rev)
    events: list[Event] = [("trial", t.rev, t.model_dump()) for t in listed.trials]
    events += [("decision", d.rev, d.model_dump()) for d in views.decisions(ex, experiment_id, after_rev=rev)]
    return sorted(events, key=lambda e: (e[1], e[0] != "decision")), listed.experiment


@router.get("/experiments/{experiment_id}/stream", response_class=StreamingResponse, responses={**NOT_FOUND, **SSE})
def stream(
    api: Api, signed_in: SignedIn, ex: ExperimentsDep, experiment_id: ExperimentId,
    after: Annotated[int | None, Query(ge=0, le=2**62)] = None,
    last_event_id: Annotated[str | None, Header(max_length=32)] = None,
) -> StreamingResponse:  # fmt: skip
    """The experiment's changes as they happen: ``trial`` (a trial that changed: a report, a new
    state; ``data``: as in ``/trials``), ``decision`` and ``experiment`` (its summary after them);
    ``id``: the change counter (``rev``). It starts at the next change (``after``: after that rev) and
    ends with ``idle`` once no trial of it is queued or runs (follow it again when one is)."""
    _answer(lambda: views.get_experiment(ex, experiment_id))
    start = resume_at(last_event_id, after if after is not None else ex.rev)

    async def changes(rev: int) -> AsyncGenerator[Event | None, None]:
        while True:
            batch, experiment = await api.read_off_loop(_changes, ex, experiment_id, rev)
            for event in batch:
                rev = max(rev, event[1])
                yield event
            if batch:
                yield "experiment", rev, experiment.model_dump()
            if not experiment.live:
                yield "idle", rev, experiment.model_dump()
                return
            yield None
            await asyncio.sleep(STREAM_POLL_S)

    return sse_response(changes(start), signed_in)


@router.post("/experiments/import", response_model=ExperimentOut, status_code=201,
             responses={409: {"description": "its trials ran as this server's jobs (it is here already), or "
                                             "another user imported it"}})  # fmt: skip
def import_experiment(ex: ExperimentsDep, caller: Caller, body: ExperimentImportIn) -> ExperimentOut:
    """An experiment as its directory holds it (``trainforge experiments import PATH`` reads and sends
    it), owned by who imports it; importing the same directory again replaces it, for its owner or an
    admin (another member's import is a 409 naming the owner)."""
    return _answer(lambda: views.get_experiment(ex, ex.import_experiment(body, caller)))


@router.post("/jobs/{job_id}/decisions", response_model=DecisionOut, status_code=201,
             responses={404: {"description": "no such job"},
                        409: {"description": "the job is not a trial of a Tune experiment (its latest job)"}})  # fmt: skip
def record_decision(service: Service, ex: ExperimentsDep, job_id: JobId, body: DecisionIn) -> DecisionOut:
    """What the tuner decided on the trial this job runs, at its report ``iteration``: the trial's
    reports end there (also on the job's charts), and the Experiments pages say why it ended."""
    job_or_404(service, job_id)
    return _answer(lambda: ex.record(job_id, body))
