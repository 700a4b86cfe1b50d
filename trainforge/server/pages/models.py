"""The dashboard's Models pages, rendered on the server like the others (no script needed):

- ``/models``: every model of the server's registry: its versions, latest, aliases, last change, tags;
- ``/models/{name}``: its aliases (who set them, when), every move of every alias (from which
  version to which, who, when), and its versions with their metrics, size, creation, tags, aliases
  and lineage, linked to the job on this server that produced each (by the version's run
  directory), or saying that none here did.
"""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, HTTPException
from fastapi.responses import HTMLResponse, Response

from trainforge._internal.amounts import fmt_bytes
from trainforge._internal.constants import API_PREFIX
from trainforge.server._models import NAME_RE, ModelsDep
from trainforge.server._schemas import AliasMoveOut, VersionOut
from trainforge.server.pages.dashboard import ago, esc, metrics_text, page
from trainforge.server.routes.access import Caller


def size_cell(n: int | None) -> str:
    return "" if n is None else fmt_bytes(n)


def _when(t: float | None, now: float) -> str:
    if not t:
        return ""
    return f'<span title="{esc(time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)))}">{esc(ago(t, now))}</span>'


def _tags(tags: dict[str, Any] | None) -> str:
    return " ".join(f'<span class=tag>{esc(k)}={esc(v)}</span>' for k, v in (tags or {}).items())


def _alias_chips(aliases: dict[str, int] | list[str]) -> str:
    if isinstance(aliases, dict):
        return " ".join(f'<span class=alias data-alias="{esc(a)}">{esc(a)} → v{v}</span>' for a, v in sorted(aliases.items()))
    return " ".join(f'<span class=alias data-alias="{esc(a)}">{esc(a)}</span>' for a in aliases)


def lineage_cell(v: VersionOut) -> str:
    """Who produced the version: a link to its job on this server, else a plain note, and the run
    directory, trial config, commit and trainforge version it recorded."""
    lin = v.lineage or {}
    if v.job is not None:
        head = (f'<a class=job-link href="{esc(v.job.url)}">job {v.job.id}: {esc(v.job.name)}</a> '
                f'<span class="state s-{esc(v.job.state)}">{esc(v.job.state)}</span>')  # fmt: skip
    else:
        head = "<span class=no-job>not from a job on this server</span>"
    facts = []
    if lin.get("run_path"):
        facts.append(f"run <code>{esc(lin['run_path'])}</code>")
    if lin.get("git_commit"):
        facts.append(f"commit <code>{esc(str(lin['git_commit'])[:12])}</code>")
    if lin.get("trainforge_version"):
        facts.append(f"trainforge {esc(lin['trainforge_version'])}")
    config = lin.get("trial_config")
    if config:
        text = json.dumps(config, default=str)
        facts.append(f'config <code title="{esc(text)}">{esc(text if len(text) <= 80 else text[:77] + "...")}</code>')
    return head + (f'<div class=lineage>{" · ".join(facts)}</div>' if facts else "")


def version_row(v: VersionOut, now: float) -> str:
    kind = v.model_class or (f"loader {v.loader}" if v.loader else "")
    return (
        f'<tr id="v-{v.version}" data-version="{v.version}">'
        f'<td class=num><a href="{API_PREFIX}/models/{quote(v.name)}/versions/{v.version}">v{v.version}</a></td>'
        f"<td>{_when(v.created_at, now)}{' by ' + esc(v.created_by) if v.created_by else ''}</td>"
        f'<td class=num title="{v.num_files} file(s)">{esc(size_cell(v.size))}</td>'
        f'<td class=metrics title="{esc(json.dumps(v.metrics, default=str))}">{esc(metrics_text(v.metrics, limit=6))}</td>'
        f"<td>{_tags(v.tags)}{'<div class=meta>' + esc(v.description) + '</div>' if v.description else ''}</td>"
        f"<td class=aliases>{_alias_chips(v.aliases)}</td>"
        f"<td class=produced>{lineage_cell(v)}</td>"
        f"<td><code>{esc(kind)}</code></td></tr>"
    )


def history_rows(moves: list[AliasMoveOut], now: float) -> str:
    rows = "".join(
        f'<tr data-alias="{esc(m.alias)}"><td>{_when(m.at, now)}</td><td><span class=alias>{esc(m.alias)}</span></td>'
        f'<td class=num>{"v" + str(m.from_version) if m.from_version is not None else "—"}</td>'
        f'<td class=num>{"v" + str(m.to_version) if m.to_version is not None else "removed"}</td>'
        f"<td>{esc(m.by or '')}</td></tr>"
        for m in reversed(moves)
    )
    return rows or "<tr class=empty><td colspan=5>No alias was ever set.</td></tr>"


def _problem(title: str, text: str) -> Response:
    return page(title, f"<h1>{esc(title)}</h1><p class=error-text>{esc(text)}</p><p><a href='/models'>All models</a></p>",
                kind="models")  # fmt: skip


router = APIRouter()


@router.get("/models", response_class=HTMLResponse, include_in_schema=False)
def models_page(models: ModelsDep, caller: Caller) -> Response:
    try:
        rows = models.call("list_models")
    except HTTPException as exc:
        return _problem("Models", f"the registry cannot be read: {exc.detail}")
    now = time.time()
    body_rows = "".join(
        f'<tr id="model-{esc(m.name)}"><td class=name><a href="/models/{quote(m.name)}">{esc(m.name)}</a></td>'
        f"<td class=num>{m.num_versions}</td>"
        f"<td class=num>{'v' + str(m.latest_version) if m.latest_version is not None else ''}</td>"
        f"<td>{_alias_chips(dict(m.aliases or {}))}</td><td>{_when(m.updated_at, now)}</td>"
        f"<td>{_tags(m.tags)}</td></tr>"
        for m in sorted(rows, key=lambda m: m.name)
    ) or ("<tr class=empty><td colspan=6>No models yet. Register one with <code>trainforge models register NAME "
          "SOURCE</code> or <code>Registry().register(name, result)</code>.</td></tr>")  # fmt: skip
    body = (
        f"<h1>Models</h1><p class=meta>registry <code>{esc(models.registry.uri)}</code></p>"
        "<table class=models><thead><tr><th>Name</th><th class=num>Versions</th><th class=num>Latest</th>"
        f"<th>Aliases</th><th>Updated</th><th>Tags</th></tr></thead><tbody id=models>{body_rows}</tbody></table>"
    )
    return page("Models", body, kind="models", caller=caller)


@router.get("/models/{name}", response_class=HTMLResponse, include_in_schema=False)
def model_page(models: ModelsDep, caller: Caller, name: str) -> Response:
    if not NAME_RE.match(name):
        return _problem("No such model", f"{name!r} is not a model name")
    try:
        model, versions = models.versions(name)
        moves = [AliasMoveOut(alias=m.alias, from_version=m.from_version, to_version=m.to_version, at=m.at, by=m.by)
                 for m in models.call("alias_history", name, None)]  # fmt: skip
    except HTTPException as exc:
        title = "No such model" if exc.status_code == 404 else "Models"
        return _problem(title, str(exc.detail))
    now = time.time()
    last_move = {m.alias: m for m in moves if m.to_version is not None}
    aliases = dict(model.aliases or {})
    alias_rows = "".join(
        f'<tr data-alias="{esc(a)}"><td><span class=alias>{esc(a)}</span></td>'
        f'<td class=num><a href="#v-{v}">v{v}</a></td>'
        f"<td>{_when(last_move[a].at, now) if a in last_move else ''}</td>"
        f"<td>{esc(last_move[a].by or '') if a in last_move else ''}</td>"
        f"<td><code>models:/{esc(name)}@{esc(a)}</code></td>"
        f"<td><code>POST {API_PREFIX}/serve/{esc(name)}@{esc(a)}/predict</code></td></tr>"
        for a, v in sorted(aliases.items())
    ) or "<tr class=empty><td colspan=6>No aliases.</td></tr>"
    version_rows = "".join(version_row(v, now) for v in reversed(versions)) or (
        "<tr class=empty><td colspan=8>No versions.</td></tr>"
    )
    body = (
        f"<h1>Model {esc(name)}</h1><p class=meta>{model.num_versions} version(s)"
        f"{f' · latest v{model.latest_version}' if model.latest_version is not None else ''} · updated {_when(model.updated_at, now)} {_tags(model.tags)} · "
        f"registry <code>{esc(models.registry.uri)}</code> · <a href='/models'>all models</a></p>"
        "<section><h2>Aliases</h2><table class=aliases><thead><tr><th>Alias</th><th class=num>Version</th>"
        f"<th>Set</th><th>By</th><th>URI</th><th>Predictions</th></tr></thead><tbody id=aliases>{alias_rows}</tbody></table></section>"
        "<section><h2>Versions</h2><table class=versions><thead><tr><th class=num>Version</th><th>Created</th>"
        "<th class=num>Size</th><th>Metrics</th><th>Tags</th><th>Aliases</th><th>Produced by</th><th>Model</th>"
        f"</tr></thead><tbody id=versions>{version_rows}</tbody></table></section>"
        "<section><h2>Alias history</h2><table class=history><thead><tr><th>When</th><th>Alias</th>"
        "<th class=num>From</th><th class=num>To</th><th>By</th></tr></thead>"
        f"<tbody id=history>{history_rows(moves, now)}</tbody></table></section>"
    )
    return page(f"Model {name}", body, kind="models", data={"model": name}, caller=caller)
