"""The dashboard's Experiments pages (Tune experiments: :mod:`trainforge.server.experiments.book`),
rendered on the server like the others, then kept live by ``static/experiments.js``:

- ``/experiments``: every experiment with its searcher, scheduler, metric and mode, trials by state,
  best value so far and duration (rows refresh as its trials' jobs change: ``/experiments/rows``);
- ``/experiments/{id}``: its trial table (the first rows in the HTML, so it paints before any script
  runs; then sortable and filterable in the page), parameter importance, best-so-far, parallel
  coordinates whose axes filter the table, one metric's curves of all trials coloured by a parameter,
  the scheduler's decisions over time, and registering the best trial as a model version.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response

from trainforge._internal.amounts import fmt_metric
from trainforge.client import TrialState
from trainforge.server.experiments import views as views
from trainforge.server.experiments.book import ExperimentNotFound
from trainforge.server.experiments.schemas import TRIAL_STATES, ExperimentOut, TrialOut
from trainforge.server.pages.dashboard import ago, esc, page
from trainforge.server.routes.access import Caller
from trainforge.server.routes.experiments import ExperimentsDep

FIRST_ROWS = 50  # trial rows in the HTML (the script renders them all once it has them)
ASSETS = ("experiments.css", "experiments.js")

router = APIRouter()


def fmt(v: Any) -> str:
    """A number for a cell: 4 significant digits (the API has them all)."""
    if isinstance(v, bool) or v is None:
        return "" if v is None else str(v).lower()
    if isinstance(v, float):
        return fmt_metric(v)
    return str(v)


def span_text(seconds: float | None) -> str:
    if seconds is None:
        return ""
    s = max(0.0, seconds)
    return f"{s:.1f}s" if s < 60 else f"{s / 60:.1f}m" if s < 3600 else f"{s / 3600:.1f}h"


def counts_text(e: ExperimentOut) -> str:
    """The trials by state, the pruned ones among the TERMINATED: ``10 TERMINATED (2 pruned) 1 ERROR``
    (``static/experiments.js`` renders the same)."""
    return " ".join(f'<span class="tstate t-{s}">{e.counts[s]} {s}'
                    f'{f" ({e.pruned} pruned)" if s == TrialState.TERMINATED and e.pruned else ""}</span>'
                    for s in TRIAL_STATES if e.counts.get(s))  # fmt: skip


def experiment_row(e: ExperimentOut, now: float) -> str:
    best = fmt(e.best.value) if e.best is not None else ""
    return (
        f'<tr id="experiment-{e.id}"{" data-live" if e.live else ""}>'
        f'<td class=name><a href="{esc(e.url)}">{esc(e.name)}</a><div class=meta>{esc(e.path)}</div></td>'
        f"<td>{'on this server' if e.source == 'server' else 'imported'}</td>"
        f"<td>{esc(e.searcher or '')}</td><td>{esc(e.scheduler or '')}</td>"
        f"<td>{esc(e.metric or '')} {esc(e.mode or '')}</td><td class=num>{e.trials}</td><td>{counts_text(e)}</td>"
        f"<td class=num>{esc(best)}</td><td>{ago(e.started_at, now)}</td>"
        f"<td>{span_text(((e.ended_at or now) - e.started_at) if e.started_at else None)}</td></tr>"
    )


def experiment_rows(experiments: list[ExperimentOut]) -> str:
    now = time.time()
    return "".join(experiment_row(e, now) for e in experiments) or (
        "<tr class=empty><td colspan=10>No experiments yet. Run a Tuner while this server runs (its trials "
        "become jobs here), or import one: <code>trainforge experiments import PATH</code>.</td></tr>"
    )


def trial_row(t: TrialOut, params: list[str]) -> str:
    """A row of the trial table (the page's script renders the same cells once it has every trial)."""
    reason = (t.reason or {}).get("text", "")
    job = f'<a href="/jobs/{t.job}">{t.job}</a>' if t.job is not None else ""
    return (
        f'<tr id="trial-{esc(t.trial_id)}" data-state="{t.state}"><td class=name>{esc(t.name)}</td>'
        f'<td><span class="tstate t-{t.state}">{t.state}</span></td><td class=reason>{esc(reason)}</td>'
        + "".join(f"<td class=num>{esc(fmt(t.config.get(p)))}</td>" for p in params)
        + f"<td class=num>{esc(fmt(t.last))}</td><td class=num>{esc(fmt(t.best))}</td><td class=num>{t.iterations}</td>"
        f"<td>{job}</td></tr>"
    )


@router.get("/experiments", response_class=HTMLResponse, include_in_schema=False)
def experiments_page(ex: ExperimentsDep, caller: Caller) -> Response:
    body = (
        "<h1>Experiments</h1><p class=meta>Tune experiments: those whose trials ran as this server's jobs, and "
        "those imported from their directory (<code>trainforge experiments import PATH</code>).</p>"
        "<table class=experiments><thead><tr><th>Name</th><th>Where</th><th>Searcher</th><th>Scheduler</th>"
        "<th>Metric</th><th class=num>Trials</th><th>By state</th><th class=num>Best</th><th>Started</th>"
        f"<th>Duration</th></tr></thead><tbody id=experiments>{experiment_rows(views.list_experiments(ex))}</tbody></table>"
    )
    return page("Experiments", body, kind="experiments", assets=ASSETS, caller=caller)


@router.get("/experiments/rows", response_class=HTMLResponse, include_in_schema=False)
def experiments_rows(ex: ExperimentsDep) -> Response:
    """The rows of the experiments table (the page swaps them in when trials change)."""
    return HTMLResponse(experiment_rows(views.list_experiments(ex)), headers={"Cache-Control": "no-store"})


@router.get("/experiments/{experiment_id}", response_class=HTMLResponse, include_in_schema=False)
def experiment_page(ex: ExperimentsDep, caller: Caller, experiment_id: int) -> Response:
    try:
        listed = views.trials(ex, experiment_id)
    except ExperimentNotFound as exc:
        return page("No such experiment", f"<h1>No experiment {experiment_id}</h1><p>{esc(exc)}</p>"
                    "<p><a href='/experiments'>All experiments</a></p>", kind="experiments", caller=caller)  # fmt: skip
    e, params = listed.experiment, listed.params
    now = time.time()
    sign = -1.0 if e.mode == "max" else 1.0
    first = sorted(listed.trials, key=lambda t: (t.last is None, sign * (t.last or 0.0), t.trial_id))[:FIRST_ROWS]
    metric = esc(e.metric or "metric")
    best = (f" · best {esc(e.metric)} <b>{esc(fmt(e.best.value))}</b> (trial {esc(e.best.trial_id)}"
            f"{f', <a href=/jobs/{e.best.job}>job {e.best.job}</a>' if e.best.job is not None else ''})") if e.best else ""  # fmt: skip
    head = (
        f"<h1>Experiment {esc(e.name)}</h1>"
        f"<p class=meta id=summary>{'on this server' if e.source == 'server' else 'imported'} · searcher "
        f"{esc(e.searcher or '?')} · scheduler {esc(e.scheduler or '?')} · {metric} ({esc(e.mode or '?')}) · "
        f"<span id=ntrials>{e.trials}</span> trials <span id=counts>{counts_text(e)}</span><span id=best>{best}</span> · "
        f"started {ago(e.started_at, now)} · <code>{esc(e.path)}</code> · <a href='/experiments'>all experiments</a></p>"
        "<div class=actions><button id=register>Register the best trial as a model version…</button></div>"
    )
    state_boxes = "".join(f'<label><input type=checkbox class=state-filter value="{s}" checked>{s}</label>' for s in TRIAL_STATES)
    columns = "".join(f'<th class=num data-sort="config:{esc(p)}">{esc(p)}</th>' for p in params)
    body = (
        head
        + "<div class=exp-grid><section><h2>Parameter importance</h2><div class=chart-controls><label>evaluator "
        "<select id=evaluator><option value=ped_anova>PED-ANOVA</option><option value=fanova>fANOVA</option>"
        "</select></label></div><p class=imp-warning id=importance-warning hidden></p>"
        "<div id=importance><p class=empty>Computed once trials have finished.</p></div>"
        "<p class=meta id=importance-meta></p></section>"
        "<section><h2>Best so far</h2><div class=chart-controls><label>x <select id=best-x><option value=n>trials"
        "</option><option value=t>time</option></select></label></div><div id=bestchart></div></section></div>"
        "<section><h2>Parallel coordinates</h2><p class=meta>Each line is a trial, from its parameters to its "
        f"{metric}. Drag along an axis to keep only the trials in that range (the table follows); click the axis "
        "to clear it.</p><div id=parcoords class=parcoords></div><p class=meta id=parcoords-constant></p></section>"
        f"<section><h2>Trials</h2><div class=filters><input id=trial-filter placeholder=\"filter: text in a row\">"
        f"{state_boxes}<span class=meta id=shown></span></div>"
        "<table class=trials><thead><tr><th data-sort=name>Trial</th><th data-sort=state>State</th>"
        f"<th data-sort=reason>Why it ended</th>{columns}<th class=num data-sort=last>{metric}</th>"
        f"<th class=num data-sort=best>best</th><th class=num data-sort=iterations>Iterations</th><th>Job</th></tr></thead>"
        f"<tbody id=trials>{''.join(trial_row(t, params) for t in first)}</tbody></table></section>"
        "<section><h2>Curves</h2><div class=chart-controls><label>metric <select id=curve-metric></select></label>"
        "<label>colour by <select id=curve-color></select></label><label>x <select id=curve-x><option value=i>"
        "iteration</option><option value=t>time</option></select></label></div>"
        "<div class=curves><canvas id=curves width=900 height=320></canvas><div id=curve-legend class=legend></div></div>"
        "</section>"
        "<section><h2>Scheduler decisions</h2><div id=decision-chart></div><table class=decisions><thead><tr>"
        "<th>When</th><th>Trial</th><th>Decision</th><th class=num>Iteration</th><th>Detail</th></tr></thead>"
        "<tbody id=decisions></tbody></table></section>"
    )
    data = {"experiment": e.model_dump(), "params": params, "rev": listed.rev,
            "trial_states": TRIAL_STATES, "active_trial_states": [s.value for s in TrialState if s.active],
            "pruned_among": TrialState.TERMINATED.value}  # the script's: no copy
    return page(f"Experiment {e.name}", body, kind="experiment", data=data, assets=ASSETS, caller=caller)
