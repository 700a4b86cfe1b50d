"""The train server's HTTP API: FastAPI under ``/api/v1`` (OpenAPI at ``/api/v1/openapi.json``),
assembled by :func:`make_app` from one router per resource (:mod:`trainforge.server.routes`), the
schemas they share (:mod:`trainforge.server._schemas`) and the dashboard's pages.

Every request needs the server's token (``Authorization: Bearer <token>``, or the server's own
``trainforge_token_<server id>`` cookie the dashboard sets); the ``Host`` header must name this server
(no DNS rebinding); a state-changing request must come from this server's own origin (scheme, host
and port) and send JSON (or, with a Bearer token, nothing); no body may pass ``max_body``
(:mod:`trainforge._internal.http.guard`). What the caller's role may do is decided before the body is
read (:class:`trainforge.server.routes.access.Access`). Bad input is answered by the schema (422
naming the field), an unknown job by 404, a change that the job's state does not allow by 409;
never a 500.

Live data is server-sent events: ``GET /events`` (every job's lifecycle, ``id`` = the event's
sequence number), ``GET /jobs/{id}/stream`` (one job's runs, reports and restarts from its events
file, ``id`` = byte offset, ending with an ``end`` event once the job has ended) and
``GET /jobs/{id}/logs/stream`` (``id`` = byte offset). Each resumes where ``Last-Event-ID`` says.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

import trainforge
from trainforge._internal.constants import API_PREFIX
from trainforge._internal.http import DEFAULT_MAX_BODY, Guard, GuardPolicy
from trainforge._internal.json_depth import too_deep_detail
from trainforge.server._models import Models
from trainforge.server.experiments.book import Experiments
from trainforge.server.jobs.service import ConflictError, JobService, NotFoundError
from trainforge.server.pages import dashboard as _dashboard
from trainforge.server.pages import experiments as _experiments_page
from trainforge.server.pages import models as _models_page
from trainforge.server.routes import (
    access,
    experiments,
    jobs,
    logs,
    metrics,
    models,
    operator,
    queue,
    serve,
    team,
)
from trainforge.server.routes.common import ApiState
from trainforge.server.team.audit import AuditMiddleware
from trainforge.server.team.users import authenticator


def cookie_name(server_id: str) -> str:
    """The dashboard's token cookie of the server with ``server_id``: a name of its own, so two servers
    on one host (cookies ignore the port) never overwrite each other's."""
    return f"trainforge_token_{server_id}"


def make_app(service: JobService, *, token: str, allowed_hosts: set[str], registry: str | None = None,
             tls: bool = False, scrape_token: str | None = None, max_body: int = DEFAULT_MAX_BODY) -> Any:  # fmt: skip
    """The guarded ASGI app and the FastAPI app inside it; ``registry``: the model registry's URI
    (None: ``Registry()``'s default), see :mod:`trainforge.server._models`. The guard is
    :mod:`trainforge._internal.http.guard` (token, Host, whole Origin, JSON-only changes, bodies of at
    most ``max_body`` bytes): ``token`` signs in as the built-in admin, each user's own token as that
    user, ``scrape_token`` as the scraper (``/metrics`` only); what each may do is
    :mod:`trainforge.server.routes.access`, decided before a body is read. State-changing requests of
    known callers, refusals included, go to the audit log (:mod:`trainforge.server.team.audit`), which
    wraps the guard: audit(guard(access(app)))."""
    app = FastAPI(
        title="trainforge train server",
        version=trainforge.__version__,
        openapi_url=f"{API_PREFIX}/openapi.json",
        docs_url=f"{API_PREFIX}/docs",
        redoc_url=None,
        responses={400: {"description": "a body that cannot be parsed (not JSON, or not UTF-8)"},
                   403: {"description": "the caller's role does not allow this (the detail names the rule), or the "
                                        "request came from another site"},
                   413: {"description": "a body over the server's limit (--max-body)"},
                   415: {"description": "a state-changing request whose body is not JSON (Content-Type: "
                                        "application/json)"}},  # fmt: skip
        description="Queues training jobs and runs them by the resources they ask for. Submitting a job runs "
        "code as the server's user.",
    )

    @app.exception_handler(RequestValidationError)
    async def _unprocessable(request: Request, exc: RequestValidationError) -> Response:
        # FastAPI's own handler echoes each bad value back ("input"), which fails to render for NaN or a
        # lone surrogate (a 500): name the field and the problem, without the value.
        errors = [{"type": e.get("type", "value_error"), "loc": list(e.get("loc", ())), "msg": str(e.get("msg", ""))}
                  for e in exc.errors()]  # fmt: skip
        body = json.dumps({"detail": errors}, ensure_ascii=True, default=str)
        return Response(body, status_code=422, media_type="application/json")

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        # FastAPI answers a body it cannot decode with 400 "There was an error parsing the body"; one
        # that nests past what Python's decoder can recurse into (RecursionError) is told why.
        if isinstance(exc.__cause__, RecursionError):
            return JSONResponse({"detail": too_deep_detail()}, status_code=400)
        return await http_exception_handler(request, exc)

    @app.exception_handler(NotFoundError)
    async def _not_found(request: Request, exc: NotFoundError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=404)

    @app.exception_handler(ConflictError)
    async def _conflict(request: Request, exc: ConflictError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=409)

    # What the routes take their collaborators from (their dependencies read app.state).
    app.state.api = ApiState(service)
    app.state.models = Models(service, registry)
    app.state.engines = engines = serve.Engines(app.state.models)
    app.router.lifespan_context = engines.lifespan  # the serving engines stop with the server
    app.state.experiments = Experiments(service)  # Tune experiments: their trials are jobs
    routes = access.RouteTable()  # what the access layer resolves a request by, before the app reads it
    for resource in (queue, jobs, logs, metrics, models, serve, experiments, team):
        routes.include(app, resource.router, prefix=API_PREFIX)
    routes.include(app, operator.router)  # /metrics, for Prometheus
    routes.include(app, _models_page.router)
    routes.include(app, _experiments_page.router)
    app.mount("/static", StaticFiles(directory=_dashboard.STATIC_DIR), name="static")
    routes.include(app, _dashboard.router)
    app.state.routes = routes
    policy = GuardPolicy(
        token=token, allowed_hosts=frozenset(allowed_hosts), api_prefix=API_PREFIX + "/", tls=tls,
        cookie_name=cookie_name(service.server_id) if service is not None else None,
        token_hint="the token from the server's state directory (<state-dir>/token; the CLI and Python client "
        "read it themselves), or your own ($TRAINFORGE_TOKEN)",
        authenticate=authenticator(service.users if service is not None else None, token, scrape_token,
                                   jobs=service.job_tokens.verify if service is not None else None),
        max_body=max_body,
    )  # fmt: skip
    guarded = Guard(access.Access(app, routes), policy)
    audited = AuditMiddleware(guarded, lambda: service.audit if service is not None else None, skip=access.UNAUDITED,
                              describe=lambda scope: access.describe(routes, scope))  # fmt: skip
    return audited, app
