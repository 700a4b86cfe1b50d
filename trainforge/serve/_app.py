"""The model server's HTTP API (FastAPI; OpenAPI at ``/v1/openapi.json``)::

    POST /v1/predict   {"inputs": [instance, ...]} -> {"outputs": [...], "model": {"name", "version", "uri"}}
    GET  /v1/model     the version answering, what is served, the batching settings
    GET  /v1/stats     requests, errors by status, latency p50/p99 (ms), throughput, batch sizes, swaps
    GET  /healthz      {"status": "ok", "model": {...}} (no token needed)

Statuses: 400 a body that is not JSON (or nests deeper than 100 levels); 413 too many instances or too
large a body; 415 a POST whose ``Content-Type`` is not ``application/json``; 422 no ``"inputs"`` list,
or the model failed on this request's inputs (the exception's text); 401 a missing or wrong token;
403 a ``Host`` header that does not name this server (DNS rebinding), or a POST from another origin;
503 starting or stopping. Never 500. The guard is the train server's (:mod:`trainforge._internal.http.guard`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

import trainforge
from trainforge._internal.http import Guard, GuardPolicy
from trainforge.serve._engine import ServeEngine
from trainforge.serve._predict import predict_openapi, predict_response


def make_app(engine: ServeEngine, *, token: str | None, allowed_hosts: set[str], max_body_bytes: int,
             manage_engine: bool = True, on_ready: Callable[[BaseException | None], None] | None = None) -> Any:  # fmt: skip
    """The ASGI app (guarded) serving ``engine``; with ``manage_engine`` the app's lifespan starts and
    stops it (run uvicorn with ``lifespan="on"``) and then calls ``on_ready(None)``, or
    ``on_ready(error)`` if the engine could not start."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if manage_engine:
            try:
                await engine.start()
            except BaseException as exc:
                if on_ready is not None:
                    on_ready(exc)
                raise
        if on_ready is not None:
            on_ready(None)
        try:
            yield
        finally:
            if manage_engine:
                await engine.stop()

    app = FastAPI(
        title="trainforge model server",
        version=trainforge.__version__,
        openapi_url="/v1/openapi.json",
        docs_url="/v1/docs",
        redoc_url=None,
        lifespan=lifespan,
        description=f"Serves {engine.source.describe()}: requests are batched and run through the model's "
        "preprocess, forward and postprocess.",
    )

    @app.post("/v1/predict", response_class=Response,
              openapi_extra=predict_openapi(**{"503": "the server is starting or stopping"}))  # fmt: skip
    async def predict(request: Request) -> Response:
        return await predict_response(request, engine, max_body_bytes)

    @app.get("/v1/model")
    async def model() -> JSONResponse:
        return JSONResponse(engine.model_info())

    @app.get("/v1/stats")
    async def stats() -> JSONResponse:
        return JSONResponse(engine.stats())

    @app.get("/healthz")
    async def healthz() -> Response:
        info = engine.current
        if info is None or not engine.started:
            return Response(json.dumps({"status": "starting"}), status_code=503, media_type="application/json")
        return JSONResponse({"status": "ok", "model": info.to_dict()})

    def count_refused(who: object, scope: dict, status: int, detail: str) -> None:
        if status == 413 and scope.get("path") == "/v1/predict":  # too large: counted, as the route's own 413s
            engine.refuse(status)

    policy = GuardPolicy(token=token, allowed_hosts=frozenset(allowed_hosts), open_paths=frozenset({"/healthz"}),
                         host_hint="; add yours with --allowed-host", max_body=max_body_bytes,
                         on_refusal=count_refused)  # fmt: skip
    return Guard(app, policy)
