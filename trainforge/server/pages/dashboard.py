"""The web dashboard the train server serves itself: HTML pages rendered here (the first screen of
data is in the page, so it paints without waiting for a script), plus one small script
(``static/dashboard.js``) that keeps them live over the API's server-sent events, and uPlot
(vendored, MIT) for the charts. No build step, no CDN: it works offline. Every response carries a
Content-Security-Policy of ``'self'``; the pages use nothing inline.

Pages: ``/`` the jobs (filters, keyset paging, row actions), ``/jobs/{id}`` one job (a live chart per
metric, logs per rank, events, checkpoints, spec), ``/queue`` the queue and who holds what,
``/compare`` one metric across jobs, grouped by a configuration key, ``/models`` the model registry's
models, versions, aliases and lineage (:mod:`trainforge.server.pages.models`).

Authentication is the API's: opening ``/?token=...`` (the URL ``trainforge server start`` prints)
sets an HttpOnly, SameSite=Strict cookie that the pages and their requests then carry (see
:mod:`trainforge._internal.http.guard`). The job states the script needs (their names, which are
terminal) come from :class:`~trainforge.client.JobState`, in every page (``data-states``).
"""

from __future__ import annotations

import html
import json
import os
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from fastapi import APIRouter, Query
from fastapi.responses import HTMLResponse, Response

from trainforge._internal.amounts import fmt_amount, fmt_bytes, fmt_metric, fmt_number, fmt_resources
from trainforge._internal.constants import API_PREFIX
from trainforge._internal.display import ordered_metrics
from trainforge._internal.http import json_safe
from trainforge._internal.trainer_job import NUM_WORKERS
from trainforge.client import ACTIVE_STATES, TERMINAL_STATES, WAITING_STATES, JobEvent, JobState
from trainforge.server.pages.team import audit_section, owner_note, shares_section, signed_in
from trainforge.server.routes.access import Caller, can
from trainforge.server.routes.common import Service, job_out_for
from trainforge.server.team.users import Principal

if TYPE_CHECKING:
    from trainforge.server.jobs.service import JobService

STATIC_DIR = os.path.join(os.path.dirname(__file__), "static")
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
)
PAGE_SIZE = 50


def esc(value: Any) -> str:
    """``value`` as HTML text (attribute-safe)."""
    return html.escape("" if value is None else str(value), quote=True)


def ago(t: float | None, now: float) -> str:
    if not t:
        return ""
    d = max(0.0, now - t)
    if d < 60:
        return f"{d:.0f}s ago"
    if d < 3600:
        return f"{d / 60:.0f}m ago"
    if d < 86400:
        return f"{d / 3600:.1f}h ago"
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


def duration(job: dict[str, Any], now: float) -> str:
    start = job.get("started_at")
    if not start:
        return ""
    end = job.get("ended_at") or now
    s = max(0.0, end - start)
    return f"{s:.1f}s" if s < 60 else f"{s / 60:.1f}m" if s < 3600 else f"{s / 3600:.1f}h"


def resources(d: dict[str, float] | None) -> str:
    return fmt_resources(d)


def metrics_text(m: dict[str, Any] | None, limit: int = 4) -> str:
    """The first ``limit`` of ``m`` as ``key=value``, validation measures first, bookkeeping last."""
    if not m:
        return ""
    items = []
    for k, v in ordered_metrics(m)[:limit]:
        items.append(f"{k}={fmt_metric(v)}" if isinstance(v, float) else f"{k}={v}")
    return " ".join(items) + (" …" if len(m) > limit else "")


def actions(job: dict[str, Any], caller: Principal | None = None) -> str:
    """The buttons a job's state allows, if ``caller`` may change it; dashboard.js sends them to the API."""
    state, jid = job["state"], job["id"]
    if caller is not None and not can(caller, "job.change", job.get("owner")):
        return ""
    out = []
    if state in (*WAITING_STATES, JobState.STARTING, JobState.RUNNING):
        out.append(("stop", "Stop"))
    if state == JobState.QUEUED:
        out.append(("hold", "Hold"))
    if state == JobState.HELD:
        out.append(("release", "Release"))
    if state in (JobState.FAILED, JobState.STOPPED):
        out.append(("retry", "Retry"))
    if state in WAITING_STATES:
        out.append(("priority", "Priority…"))
    return "".join(f'<button class="act" data-act="{a}" data-job="{jid}">{label}</button>' for a, label in out)


def usage_text(total: dict[str, Any] | None) -> str:
    """A job's usage in a few words: CPU, and memory (what its cgroup is charged, where it has one;
    else its processes' resident memory)."""
    if not total:
        return ""
    text = f"CPU {total['cpu_percent']:.0f}% · {fmt_bytes(total.get('memory', total['rss']))}"
    if total.get("gpu_memory"):
        text += f" · GPU {fmt_bytes(total['gpu_memory'])}, {total.get('gpu_util', 0):.0f}%"
    return text


def job_row(job: dict[str, Any], now: float, usage: dict[str, float] | None = None,
            caller: Principal | None = None) -> str:  # fmt: skip
    """One row of the jobs table (dashboard.js swaps in a fresh one from ``/rows/{id}`` when the job
    changes; ``data-live``: a running job's, whose metrics and duration move without events)."""
    pending = job.get("pending") or {}
    active = job["state"] in ACTIVE_STATES
    used = resources(job.get("grant")) if job.get("grant") and active else ""
    req = job.get("request") or {}
    asked = f"{req.get(NUM_WORKERS, 1)}" + (f"-{req['max_workers']}" if req.get("max_workers") else "") + " × " + (
        resources(req.get("per_worker")) or "0"
    )
    return (
        f'<tr id="job-{job["id"]}" data-state="{esc(job["state"])}"{" data-live" if job["state"] == JobState.RUNNING else ""}>'
        f'<td><a href="/jobs/{job["id"]}">{job["id"]}</a></td>'
        f'<td class="name"><a href="/jobs/{job["id"]}">{esc(job["name"])}</a></td>'
        f'<td class="owner">{esc(job.get("owner", ""))}</td>'
        f'<td><span class="state s-{esc(job["state"])}">{esc(job["state"])}</span></td>'
        f'<td class="num">{job["priority"]}{" <small>preemptible</small>" if job.get("preemptible") else ""}</td>'
        f"<td>{esc(asked)}</td>"
        f"<td>{esc(used)}{' · GPU ' + esc(','.join(job['gpu_ids'])) if job.get('gpu_ids') and active else ''}</td>"
        f'<td class="uses">{esc(usage_text(usage))}</td>'
        f'<td class="reason">{esc(pending.get("text") or job.get("reason") or "")}</td>'
        f'<td title="{esc(job["submitted_at"])}">{ago(job["submitted_at"], now)}</td>'
        f"<td>{duration(job, now)}</td>"
        f'<td class="metrics">{esc(metrics_text(job.get("last_metrics")))}</td>'
        f'<td class="actions">{actions(job, caller)}</td></tr>'
    )


# The timeline's bar of a job in each state (waiting jobs hold nothing: no bar).
STATE_COLORS = {JobState.RUNNING: "#3b82f6", JobState.STARTING: "#3b82f6", JobState.STOPPING: "#9ca3af",
                JobState.SUCCEEDED: "#22c55e", JobState.FAILED: "#ef4444", JobState.LOST: "#ef4444",
                JobState.STOPPED: "#9ca3af"}  # fmt: skip


def timeline(service: JobService, hours: float, now: float, width: int = 1000) -> str:
    """An SVG Gantt chart (server-rendered, no script): one bar per job that held resources in the
    last ``hours``, from its start to its end (or now), labelled with what it held; GPUs by id."""
    since = now - hours * 3600
    jobs = service.store.jobs_running_since(since, limit=100)
    if not jobs:
        return "<p class=empty>No job ran in this window.</p>"
    left, row = 220, 22
    height = row * len(jobs) + 24
    scale = (width - left - 10) / (now - since)
    parts = [f'<svg class=timeline viewBox="0 0 {width} {height}" width="{width}" height="{height}" role=img>']
    for h in range(int(hours) + 1):  # an hour grid, labelled in hours ago
        x = left + (now - h * 3600 - since) * scale
        if x >= left:
            parts.append(f'<line x1="{x:.1f}" y1="0" x2="{x:.1f}" y2="{height - 18}" stroke="#e5e7eb"/>'
                         f'<text x="{x:.1f}" y="{height - 4}" font-size="11" fill="#6b7280" text-anchor="middle">'
                         f'{"now" if h == 0 else f"-{h}h"}</text>')  # fmt: skip
    for i, job in enumerate(jobs):
        start = max(job.started_at or now, since)
        end = min(job.ended_at or now, now)
        x, w, y = left + (start - since) * scale, max(2.0, (end - start) * scale), i * row + 2
        held = resources(job.grant) + (f" · GPU {','.join(job.gpu_ids)}" if job.gpu_ids else "")
        label = f"job {job.id} {job.name}"[:34]
        parts.append(
            f'<a href="/jobs/{job.id}"><text x="4" y="{y + 14}" font-size="12" fill="#111827">{esc(label)}</text>'
            f'<rect data-job="{job.id}" x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row - 6}" rx="3" '
            f'fill="{STATE_COLORS.get(job.state, "#9ca3af")}"><title>{esc(f"job {job.id} ({job.state}): {held}")}</title></rect>'
            f'<text x="{x + 4:.1f}" y="{y + 12}" font-size="10" fill="#fff">{esc(held if w > 60 else "")}</text></a>'
        )
    parts.append("</svg>")
    return "".join(parts)


COMPARE_MAX_JOBS = 50


def _group_value(job: dict[str, Any], group: str | None) -> str:
    if not group:
        return ""
    value = (job.get("config") or {}).get(group, "—")
    return json.dumps(value) if not isinstance(value, str) else value


def _value_text(job: dict[str, Any], group: str) -> str:
    """The grouping key's value as people read it: a float rounded (``0.1501``), else as grouped."""
    value = (job.get("config") or {}).get(group)
    return fmt_metric(value) if isinstance(value, float) else _group_value(job, group)


def _value_order(job: dict[str, Any], group: str | None) -> tuple[int, float, str]:
    """Numbers first, by value; then the rest by text."""
    value = (job.get("config") or {}).get(group) if group else None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, float(value), "")
    return (1, 0.0, _group_value(job, group))


def compare_summary(jobs: list[dict[str, Any]], metric: str | None, group: str | None) -> str:
    """Per value of the grouping key: its jobs and the mean, best and worst of their last ``metric``."""
    if not jobs or not metric:
        return ""
    groups: dict[str, list[dict[str, Any]]] = {}
    for job in jobs:
        groups.setdefault(_group_value(job, group), []).append(job)
    rows = []
    for members in sorted(groups.values(), key=lambda m: _value_order(m[0], group)):
        value = _value_text(members[0], group) if group else ""
        last = [v for j in members if isinstance(v := (j.get("last_metrics") or {}).get(metric), (int, float))
                and not isinstance(v, bool)]  # fmt: skip
        stats = (f"<td class=num>{fmt_metric(sum(last) / len(last))}</td><td class=num>{fmt_metric(min(last))}</td>"
                 f"<td class=num>{fmt_metric(max(last))}</td>") if last else "<td>—</td><td>—</td><td>—</td>"  # fmt: skip
        links = ", ".join(f'<a href="/jobs/{j["id"]}">{j["id"]}</a>' for j in members)
        rows.append(f"<tr><td>{esc(value) if group else 'all'}</td><td class=num>{len(members)}</td>{stats}<td>{links}</td></tr>")
    return (
        f"<table class=groups><thead><tr><th>{esc(group or '')}</th><th class=num>Jobs</th>"
        f"<th class=num>Mean last {esc(metric)}</th><th class=num>Min</th><th class=num>Max</th><th>Job ids</th>"
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def page(title: str, body: str, *, kind: str, data: dict[str, Any] | None = None,
         assets: tuple[str, ...] = (), caller: Principal | None = None) -> HTMLResponse:  # fmt: skip
    """A page: the shared header, ``body``, the page's data for the script (a JSON attribute), and
    the job states it needs (``data-states``: :func:`states_json`), and
    where the API is (``data-api``: its prefix, which ``static/page.js`` calls under);
    ``assets``: more files of ``/static`` it loads (``.css`` style sheets, ``.js`` module scripts)."""
    payload = esc(json.dumps(data or {}, allow_nan=False, default=str))
    states = esc(json.dumps(states_json()))
    nav = "".join(
        f'<a href="{href}"{" class=here" if kind == k else ""}>{label}</a>'
        for k, href, label in (("jobs", "/", "Jobs"), ("queue", "/queue", "Queue &amp; resources"),
                               ("compare", "/compare", "Compare"), ("experiments", "/experiments", "Experiments"),
                               ("models", "/models", "Models"))
    )
    extra = "".join(f'<link rel=stylesheet href="/static/{esc(a)}">' if a.endswith(".css") else
                    f'<script type=module src="/static/{esc(a)}"></script>' for a in assets)  # fmt: skip
    text = (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name=viewport content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)} · trainforge</title><link rel=icon href=\"data:,\">"
        '<link rel=stylesheet href="/static/vendor/uplot/uPlot.min.css">'
        '<link rel=stylesheet href="/static/dashboard.css">'
        '<script src="/static/vendor/uplot/uPlot.iife.min.js"></script>'
        '<script type=module src="/static/dashboard.js"></script>'
        f"{extra}"
        f'</head><body><header><span class=brand>trainforge</span><nav>{nav}</nav>{signed_in(caller)}<span id=live class=live title="live updates">●</span></header>'
        f'<main id=page data-kind="{kind}" data-page="{payload}" data-states="{states}" data-api="{API_PREFIX}">'
        f"{body}</main></body></html>"
    )
    return HTMLResponse(text, headers={"Content-Security-Policy": CSP, "Cache-Control": "no-store"})


def states_json() -> dict[str, Any]:
    """The job states as the pages' script takes them (each page's ``data-states``): every name in
    order and each grouping, and the event types (``events``: every name the event streams send)."""
    return {
        "events": [e.value for e in JobEvent],
        "all": [s.value for s in JobState],
        "waiting": [s.value for s in WAITING_STATES],
        "active": [s.value for s in ACTIVE_STATES],
        "terminal": [s.value for s in TERMINAL_STATES],
    }


def _job_json(service: JobService, job: Any) -> dict[str, Any]:
    """A job as the API returns it (``JobOut``), NaN and infinities as strings (the page's JSON
    must parse)."""
    return json_safe(job_out_for(service, job).model_dump())  # type: ignore[no-any-return]


# The pages (their static files are mounted at /static by make_app, from STATIC_DIR).
router = APIRouter()


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
def jobs_page(
    service: Service,
    caller: Caller,
    state: list[str] | None = Query(None),  # noqa: B008 - FastAPI's way
    name: str | None = Query(None, max_length=200),
    before: int | None = Query(None, ge=0, le=2**62),
) -> Response:
    states = [s for s in (state or []) if s in tuple(JobState)] or None
    rows = service.store.jobs(states, before=before, limit=PAGE_SIZE + 1, name=name or None)
    more = len(rows) > PAGE_SIZE
    rows = rows[:PAGE_SIZE]
    now = time.time()
    jobs = [_job_json(service, j) for j in rows]
    checks = "".join(
        f'<label><input type=checkbox name=state value="{s}"{" checked" if states and s in states else ""}>'
        f"{s.lower()}</label>"
        for s in tuple(JobState)
    )
    filters = (
        f'<form class=filters method=get action="/"><input name=name placeholder="name contains" '
        f'value="{esc(name or "")}">{checks}<button>Filter</button></form>'
    )
    totals = service.usage.totals()
    table = "".join(job_row(j, now, totals.get(j["id"]), caller) for j in jobs) or '<tr class=empty><td colspan=13>No jobs yet. Submit one with <code>trainforge submit</code> or <code>trainer.submit()</code>.</td></tr>'
    query = "".join(f"&state={s}" for s in states or []) + (f"&name={esc(quote(name))}" if name else "")
    more_link = f'<a class=more href="/?before={rows[-1].id}{query}">Older jobs →</a>' if more else ""
    if name and rows:
        more_link += f' <a class=more href="/compare?name={esc(quote(name))}">Compare these jobs →</a>'

    free = service.free()
    cap = service.capacity
    summary = " · ".join(f"{k}: {fmt_amount(k, cap.get(k, 0) - free.get(k, 0))}/{fmt_amount(k, cap.get(k, 0))} used"
                         for k in sorted(cap))  # fmt: skip
    body = (
        f"<h1>Jobs</h1><p class=summary id=summary>{esc(summary)}</p>{filters}"
        "<table class=jobs><thead><tr><th>ID</th><th>Name</th><th>Owner</th><th>State</th><th>Prio</th><th>Asks</th>"
        "<th>Holds</th><th>Uses</th><th>Reason</th><th>Submitted</th><th>Duration</th><th>Last metrics</th><th></th></tr></thead>"
        f"<tbody id=jobs>{table}</tbody></table>{more_link}"
    )
    return page("Jobs", body, kind="jobs", data={"filtered": bool(states or name or before)}, caller=caller)


@router.get("/jobs/{job_id}", response_class=HTMLResponse, include_in_schema=False)
def job_page(service: Service, caller: Caller, job_id: int) -> Response:
    job = service.store.get(job_id)
    if job is None:
        return page("No such job", f"<h1>No job {job_id}</h1><p><a href='/'>All jobs</a></p>", kind="job", caller=caller)
    data = _job_json(service, job)
    now = time.time()
    pending = (data.get("pending") or {}).get("text")
    head = (
        f'<h1><span class="state s-{esc(data["state"])}" id=state>{esc(data["state"])}</span> '
        f'Job {job_id}: {esc(data["name"])}</h1>'
        f'<p class=meta>{owner_note(data)} · attempt {data["attempt"]} · submitted {ago(data["submitted_at"], now)} · '
        f'<span id=duration>{duration(data, now)}</span> · {"held" if data["state"] in TERMINAL_STATES else "holds"} '
        f'{esc(resources(data.get("grant")) or "nothing")}'
        f'{" · GPU " + esc(",".join(data["gpu_ids"])) if data.get("gpu_ids") else ""}'
        f'{" · " + esc(pending) if pending else ""}</p>'
        f'<div class=actions id=actions>{actions(data, caller)}</div>'
        f'<pre class=error id=error{" hidden" if not data.get("error") else ""}>{esc(data.get("error") or "")}</pre>'
    )
    body = (
        head
        + "<section><h2>Metrics</h2><div class=chart-controls>"
        "<label>x <select id=xaxis><option value=step>step</option><option value=time>time</option></select></label>"
        "<label><input type=checkbox id=logscale> log scale</label>"
        "<label>smoothing <input type=range id=smooth min=0 max=0.99 step=0.01 value=0></label>"
        "</div><div id=charts class=charts><p class=empty id=nometrics>No reports yet.</p></div></section>"
        "<section><h2>System</h2><p class=meta id=gpu></p><table class=usage><thead><tr><th>Process</th><th>PID</th>"
        "<th>CPU</th><th>Memory (RSS)</th><th>Threads</th><th>GPU memory</th><th>GPU util</th></tr></thead>"
        "<tbody id=usage><tr class=empty><td colspan=7>Sampled every second while the job runs.</td></tr></tbody></table></section>"
        "<section><h2>Logs</h2><div class=log-controls><label>rank <select id=rank><option value=''>all (job output)</option>"
        f"{''.join(f'<option value={r}>{r}</option>' for r in range(int(data.get('workers') or 0)))}</select></label>"
        "<label><input type=checkbox id=follow checked> follow</label><button id=older>Older</button></div>"
        "<pre id=log class=log></pre></section>"
        "<section><h2>Events</h2><table class=events><thead><tr><th>#</th><th>When</th><th>Event</th><th>Detail</th></tr></thead>"
        "<tbody id=events></tbody></table></section>"
        "<section><h2>Checkpoints</h2><table class=checkpoints><thead><tr><th>Report</th><th>Metrics</th><th>Size</th><th>Path</th><th>Resume from it</th></tr></thead>"
        "<tbody id=checkpoints></tbody></table></section>"
        f"{audit_section(service, job_id)}"
        f"<section><h2>Spec</h2><pre class=spec>{esc(json.dumps(json_safe(job.spec), indent=2, default=str))}</pre></section>"
    )
    return page(f"Job {job_id}", body, kind="job", data={"job": data}, caller=caller)


@router.get("/rows/{job_id}", response_class=HTMLResponse, include_in_schema=False)
def job_row_fragment(service: Service, caller: Caller, job_id: int) -> Response:
    """One row of the jobs table as HTML (dashboard.js swaps it in when the job changes): one
    renderer for rows, this one."""
    job = service.store.get(job_id)
    if job is None:
        return HTMLResponse("", status_code=404)
    return HTMLResponse(job_row(_job_json(service, job), time.time(),
                                service.usage.totals().get(job_id), caller),
                        headers={"Cache-Control": "no-store"})  # fmt: skip


@router.get("/compare", response_class=HTMLResponse, include_in_schema=False)
def compare_page(
    service: Service,
    caller: Caller,
    job: list[int] | None = Query(None, max_length=COMPARE_MAX_JOBS),  # noqa: B008 - FastAPI's way
    name: str | None = Query(None, max_length=200),
    metric: str | None = Query(None, max_length=200),
    group: str | None = Query(None, max_length=200),
) -> Response:
    """One metric of several jobs on one chart, coloured by the value of a configuration key,
    and per value the mean/min/max of the jobs' last value. Jobs: ``job`` (repeatable) or every
    job whose name contains ``name`` (the newest 50)."""
    rows = [r for i in dict.fromkeys(job or []) if (r := service.store.get(i)) is not None]
    if name:
        rows += service.store.jobs(None, limit=COMPARE_MAX_JOBS, name=name)
    chosen = [_job_json(service, r) for r in {r.id: r for r in rows}.values()][:COMPARE_MAX_JOBS]
    metrics = sorted({k for j in chosen for k in (j.get("last_metrics") or {})})
    keys = sorted({k for j in chosen for k in (j.get("config") or {})})
    metric = metric if metric in metrics else (metrics[0] if metrics else None)
    group = group if group in keys else None
    picked = {j["id"] for j in chosen}
    recent = [_job_json(service, r) for r in service.store.jobs(None, limit=100)]
    choices = "".join(
        f'<label class=pick><input type=checkbox name=job value="{j["id"]}"{" checked" if j["id"] in picked else ""}>'
        f'{j["id"]} {esc(j["name"])} <span class="state s-{esc(j["state"])}">{esc(j["state"])}</span></label>'
        for j in chosen + [r for r in recent if r["id"] not in picked]
    ) or "<p class=empty>No jobs yet.</p>"
    options = "".join(f'<option{" selected" if m == metric else ""}>{esc(m)}</option>' for m in metrics)
    group_options = "<option value=''>(none)</option>" + "".join(
        f'<option{" selected" if k == group else ""}>{esc(k)}</option>' for k in keys
    )
    form = (
        "<form class=compare method=get action=/compare>"
        f"<label>metric <select name=metric>{options}</select></label>"
        f"<label>group by <select name=group>{group_options}</select></label>"
        f'<label>or jobs named <input name=name value="{esc(name or "")}" placeholder="name contains"></label>'
        "<button>Compare</button><details><summary>Pick jobs</summary>"
        f"<div class=picker>{choices}</div></details></form>"
    )
    if not chosen:
        chart = "<p class=empty id=nocompare>Pick jobs to compare (or give a name they share).</p>"
    elif not metric:
        chart = "<p class=empty id=nocompare>These jobs have not reported any metric yet.</p>"
    else:
        chart = ("<div class=chart-controls><label><input type=checkbox id=logscale> log scale</label>"
                 f"<span id=compare-hover></span></div>{'<div id=compare-legend class=legend></div>' if group else ''}"
                 "<div id=compare class=charts></div>")  # fmt: skip
    for j in chosen:
        j["group"] = _group_value(j, group)
    body = (
        f"<h1>Compare</h1>{form}<section><h2>{esc(metric or '')}"
        f"{' by ' + esc(group) if group else ''}</h2>{chart}{compare_summary(chosen, metric, group)}</section>"
    )
    slim = [{**{k: j[k] for k in ("id", "name", "state", "group")},
             "value": (j.get("config") or {}).get(group) if group else None} for j in chosen]  # fmt: skip
    return page("Compare", body, kind="compare", data={"jobs": slim, "metric": metric, "group": group},
                assets=("experiments.css",), caller=caller)  # fmt: skip


QUEUE_PAGE = 500  # waiting jobs a queue page shows (only their reasons are worked out)


def _queue_pages(offset: int, total: int, hours: float) -> str:
    """Where the queue page is in the queue, with links to the pages before and after it."""
    if total <= QUEUE_PAGE and offset == 0:
        return ""
    links = [f'<a href="/queue?offset={o}&amp;hours={fmt_number(hours)}">{label}</a>' for o, label, show in (
        (max(0, offset - QUEUE_PAGE), "previous", offset > 0), (offset + QUEUE_PAGE, "next", offset + QUEUE_PAGE < total)) if show]  # fmt: skip
    shown = f"{offset + 1}-{min(total, offset + QUEUE_PAGE)}" if offset < total else "none"
    return f"<p class=pages>{shown} of {total} waiting jobs {' '.join(links)}</p>"


@router.get("/queue", response_class=HTMLResponse, include_in_schema=False)
def queue_page(service: Service, caller: Caller, hours: float = Query(6.0, gt=0, le=24 * 30),
               offset: int = Query(0, ge=0, le=2**31)) -> Response:  # fmt: skip
    pending, total = service.queue_page(offset, QUEUE_PAGE)
    grants = service.grants()
    free = service.free()
    cap = service.capacity
    rows = "".join(
        f'<tr><td>{p.position if p.position is not None else "—"}</td><td><a href="/jobs/{p.job_id}">{p.job_id}</a></td>'
        f"<td>{esc(p.describe())}</td></tr>"
        for p in pending
    ) or "<tr class=empty><td colspan=3>Nothing waits.</td></tr>"
    res = "".join(
        f"<tr><td>{esc(k)}</td><td class=num>{fmt_amount(k, cap[k])}</td>"
        f"<td class=num>{fmt_amount(k, cap[k] - free.get(k, 0))}</td><td class=num>{fmt_amount(k, free.get(k, 0))}</td></tr>"
        for k in sorted(cap)
    )
    holders = "".join(
        f'<tr><td><a href="/jobs/{j}">{j}</a></td><td>{esc(resources(g["grant"]))}</td><td>{esc(", ".join(g["gpu_ids"]))}</td></tr>'
        for j, g in sorted(grants.items())
    ) or "<tr class=empty><td colspan=3>No job holds anything.</td></tr>"
    body = (
        "<h1>Queue &amp; resources</h1><section><h2>Resources</h2><table><thead><tr><th>Kind</th><th>Capacity</th>"
        f"<th>Granted</th><th>Free</th></tr></thead><tbody>{res}</tbody></table></section>"
        "<section><h2>Who holds what</h2><table><thead><tr><th>Job</th><th>Grant</th><th>GPUs</th></tr></thead>"
        f"<tbody>{holders}</tbody></table></section>"
        f"<section><h2>Who used what, the last {fmt_number(hours)} hours</h2>{timeline(service, hours, time.time())}</section>"
        "<section><h2>Queue, in start order</h2><table><thead><tr><th>#</th><th>Job</th><th>Why it waits</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>{_queue_pages(offset, total, hours)}</section>{shares_section(service)}"
    )
    return page("Queue", body, kind="queue", caller=caller)
