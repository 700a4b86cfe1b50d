"""What the Experiments API and pages show of :class:`~trainforge.server.experiments.book.Experiments`:
an experiment's summary (trials by state, the best trial, when it ran), its trials, decisions,
best-so-far history, the curves of one metric over all its trials, and parameter importance."""

from __future__ import annotations

import json
import math
from typing import Any

from trainforge.client import TrialDecision, TrialState
from trainforge.server.experiments.book import ExperimentNotFound, Experiments
from trainforge.server.experiments.importance import ImportanceCache, compute
from trainforge.server.experiments.schemas import (
    BestOut,
    CurveOut,
    CurvesOut,
    DecisionOut,
    ExperimentOut,
    HistoryOut,
    HistoryPointOut,
    ImportanceOut,
    TrialListOut,
    TrialOut,
)
from trainforge.server.experiments.trial_stats import better, thin


def _experiment_row(ex: Experiments, experiment_id: int) -> Any:
    row = ex.store.experiments.experiment(experiment_id)
    if row is None:
        raise ExperimentNotFound(f"no experiment {experiment_id} on this server: GET /api/v1/experiments lists them")
    return row


def summary(row: Any, trials: list[Any]) -> ExperimentOut:
    """An experiment's row and its trials' summary columns as the API answers it."""
    counts: dict[str, int] = {}
    best: Any = None
    for t in trials:
        counts[t["state"]] = counts.get(t["state"], 0) + 1
        if t["last"] is not None and not _failed(t) and (best is None or better(t["last"], best["last"], row["mode"])):
            best = t
    pruned = sum(t["state"] == TrialState.TERMINATED and t["kind"] == TrialDecision.PRUNED for t in trials)
    live = any(_live(t) for t in trials) and row["source"] == "server"
    starts = [t["started_at"] for t in trials if t["started_at"] is not None]
    ends = [t["ended_at"] for t in trials if t["ended_at"] is not None]
    return ExperimentOut(
        id=row["id"], name=row["name"], path=row["path"], source=row["source"], owner=row["owner"], tune_id=row["tune_id"],
        searcher=row["searcher"], scheduler=row["scheduler"], metric=row["metric"], mode=row["mode"],
        space=json.loads(row["space"] or "{}"), trials=len(trials), counts=counts, pruned=pruned,
        best=BestOut(trial_id=best["trial_id"], value=best["last"], job=best["job_id"], checkpoint=best["checkpoint"],
                     config=json.loads(best["config"])) if best is not None else None,
        started_at=min(starts) if starts else row["created_at"],
        ended_at=None if live else (row["ended_at"] or (max(ends) if ends else None)),
        live=live, url=f"/experiments/{row['id']}",
    )  # fmt: skip


def _failed(t: Any) -> bool:
    """The trial's run failed (or the tuner failed it): its numbers are left out of the best. One
    stopped on the server is ERROR too (Tune reports it so), but what it reported holds."""
    return t["state"] == TrialState.ERROR and t["kind"] != "stopped"


def _live(t: Any) -> bool:
    """The trial runs, or waits for its job or its tuner (not for a ``Tuner.restore``: one the tuner's
    Ctrl-C left pending waits for nobody here)."""
    state = TrialState(t["state"])
    return state.active and not (state == TrialState.PENDING and t["kind"] == TrialDecision.INTERRUPTED)


def list_experiments(ex: Experiments) -> list[ExperimentOut]:
    rows = ex.store.experiments.experiments()
    trials: dict[int, list[Any]] = {}
    for t in ex.store.experiments.trial_summaries():
        trials.setdefault(t["experiment_id"], []).append(t)
    return [summary(r, trials.get(r["id"], [])) for r in rows]


def get_experiment(ex: Experiments, experiment_id: int) -> ExperimentOut:
    row = _experiment_row(ex, experiment_id)
    return summary(row, ex.store.experiments.trial_summaries(experiment_id))


def trial_out(row: Any) -> TrialOut:
    return TrialOut(
        trial_id=row["trial_id"], name=row["name"], state=row["state"],
        reason=json.loads(row["reason"]) if row["reason"] else None, config=json.loads(row["config"]),
        iterations=row["iterations"], last=row["last"], best=row["best"], best_at=row["best_at"],
        metrics=json.loads(row["metrics"]) if row["metrics"] else None, job=row["job_id"],
        jobs=[j["job"] for j in json.loads(row["jobs"])], started_at=row["started_at"], ended_at=row["ended_at"],
        checkpoint=row["checkpoint"], rev=row["rev"],
    )  # fmt: skip


def params_of(space: dict[str, Any], trials: list[TrialOut]) -> list[str]:
    """Configuration keys, the search space's first (in its order), then the others sorted."""
    rest = sorted({k for t in trials for k in t.config} - set(space))
    return [*space, *rest]


def trials(ex: Experiments, experiment_id: int, *, states: list[str] | None = None,
           after_rev: int | None = None) -> TrialListOut:  # fmt: skip
    """The experiment's trials (in ``states``; changed after ``after_rev``), by trial id."""
    rev = ex.rev
    experiment = get_experiment(ex, experiment_id)
    out = [trial_out(r) for r in ex.store.experiments.trials(experiment_id, states=states, after_rev=after_rev)]
    return TrialListOut(experiment=experiment, params=params_of(experiment.space, out), trials=out, rev=rev)


def decisions(ex: Experiments, experiment_id: int, *, after_rev: int | None = None) -> list[DecisionOut]:
    _experiment_row(ex, experiment_id)
    return [DecisionOut(seq=r["seq"], experiment_id=r["experiment_id"], trial_id=r["trial_id"], job_id=r["job_id"],
                        ts=r["ts"], kind=r["kind"], iteration=r["iteration"], detail=json.loads(r["detail"]),
                        rev=r["rev"])
            for r in ex.store.experiments.decisions(experiment_id, after_rev=after_rev)]  # fmt: skip


def history(ex: Experiments, experiment_id: int) -> HistoryOut:
    """The best value so far after each finished trial (errored ones left out), by when each ended."""
    row = _experiment_row(ex, experiment_id)
    rows = ex.store.experiments.trial_summaries(experiment_id)
    starts = [r["started_at"] for r in rows if r["started_at"] is not None]
    t0 = min(starts) if starts else None
    done = [r for r in rows if TrialState(r["state"]).ended and not _failed(r) and r["last"] is not None]
    done.sort(key=lambda r: (r["ended_at"] is None, r["ended_at"] or 0.0, r["trial_id"]))
    points: list[HistoryPointOut] = []
    best: float = math.nan
    for n, r in enumerate(done, 1):
        best = r["last"] if math.isnan(best) or better(r["last"], best, row["mode"]) else best
        t = r["ended_at"] - t0 if r["ended_at"] is not None and t0 is not None else None
        points.append(HistoryPointOut(n=n, trial_id=r["trial_id"], t=t, value=r["last"], best=best))
    return HistoryOut(metric=row["metric"], mode=row["mode"], points=points)


def curves(ex: Experiments, experiment_id: int, metric: str | None, points: int,
           only: list[str] | None = None) -> CurvesOut:  # fmt: skip
    """``metric`` (default: the experiment's) of every trial (or those ``only`` names), report by report,
    each trial thinned to ``points`` points, ending where a stop decision ended it."""
    row = _experiment_row(ex, experiment_id)
    metric = metric or row["metric"]
    keys: set[str] = set()
    out: dict[str, CurveOut] = {}
    for t in ex.store.experiments.trials(experiment_id, columns="curves"):
        if only and t["trial_id"] not in only:
            continue
        its: list[int] = []
        ts: list[float] = []
        vs: list[float] = []
        cut = None
        reason_kind = (json.loads(t["reason"]) if t["reason"] else {}).get("kind")
        if t["history"]:  # an imported trial (its history ends where a decision ended it)
            hist = json.loads(t["history"])
            cut = (json.loads(t["reason"]) if t["reason"] else {}).get("iteration")
            keys.update(hist)
            for i, when, v in hist.get(metric or "", []):
                its.append(i)
                ts.append(math.nan if when is None else when)
                vs.append(math.nan if v is None else v)
        for j in json.loads(t["jobs"]):
            path = ex.events_path(j["job"])
            keys.update(ex.curves.keys(j["job"], path))
            if metric is None:
                continue
            ji, jt, jv = ex.curves.curve(j["job"], path, metric, j["cut"])
            its += [j["base"] + i for i in ji]
            ts += jt
            vs += jv
            cut = j["base"] + j["cut"] if j["cut"] is not None else None
        first = next((x for x in ts if not math.isnan(x)), None)
        keep = thin(len(its), points)
        out[t["trial_id"]] = CurveOut(
            i=[its[k] for k in keep], v=[None if math.isnan(vs[k]) else vs[k] for k in keep],
            t=[None if math.isnan(ts[k]) or first is None else ts[k] - first for k in keep],
            cut=cut, state=t["state"], pruned=t["state"] == TrialState.TERMINATED and reason_kind == TrialDecision.PRUNED,
        )  # fmt: skip
    return CurvesOut(metric=metric, metrics=sorted(keys), trials=out)


def importance(ex: Experiments, cache: ImportanceCache, experiment_id: int, evaluator: str) -> ImportanceOut:
    """Parameter importance over the experiment's completed trials (TERMINATED, not pruned: their
    values are comparable; kept until one more ends)."""
    row = _experiment_row(ex, experiment_id)
    key = ex.store.experiments.ended_version(experiment_id, [s.value for s in TrialState if s.active])

    def make() -> dict[str, Any]:
        done = ex.store.experiments.results(experiment_id, TrialState.TERMINATED, but_kind=TrialDecision.PRUNED)
        rows = [{"config": json.loads(r["config"]), "value": r["last"]} for r in done]
        return compute(rows, json.loads(row["space"] or "{}"), row["mode"], evaluator)

    result, cached = cache.get(experiment_id, evaluator, key, make)
    return ImportanceOut(evaluator=evaluator, metric=row["metric"], cached=cached, **result)  # type: ignore[arg-type]
