"""The model server's HTTP API (FastAPI; OpenAPI at ``/v1/openapi.json``)::

    POST /v1/predict   {"inputs": [instance, ...]} -> {"outputs": [...], "model": {"name", "version", "uri"}}
    GET  /v1/model     the version answering, what is served, the batching settings
    GET  /v1/stats     requests, errors by status, latency p50/p99 (ms), throughput, batch sizes, swaps
    GET  /healthz      {"status": "ok", "model": {...}} (no token needed)

Statuses: 400 a body that is not JSON; 413 too many instances or too large a body; 422 no ``"inputs"``
list, or the model failed on this request's inputs (the exception's text); 401 a missing or wrong token;
403 a ``Host`` header that does not name this server (DNS rebinding); 503 starting or stopping. Never 500.
"""

from __future__ import annotations

import contextlib
import hmac
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

import trainforge
from trainforge.serve._engine import ServeEngine, _detail


def predict_doc(**more: str) -> dict[str, Any]:
    """The OpenAPI description of a predict route (its body and answers; ``more``: other statuses)."""
    responses = {
        "200": {"description": '{"outputs": [one per instance], "model": {"name", "version", "uri"}}',
                "content": {"application/json": {}}},
        "400": {"description": "the body is not JSON"},
        "413": {"description": "too many instances, or too large a body"},
        "422": {"description": 'no "inputs" list, or the model failed on these inputs (the reason)'},
        **{status: {"description": text} for status, text in more.items()},
    }
    body = {"type": "object", "required": ["inputs"],
            "properties": {"inputs": {"type": "array", "minItems": 1, "items": {},
                                      "description": "the instances, one per input of the model"}}}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
            "responses": dict(sorted(responses.items()))}  # fmt: skip


class _Guard:
    """ASGI middleware: the ``Host`` header must name this server; with a token, every request but
    ``/healthz`` must carry ``Authorization: Bearer <token>`` (compared in constant time)."""

    def __init__(self, app: Any, token: str | None, allowed_hosts: set[str]):
        self.app = app
        self.token = token.encode() if token is not None else None
        self.allowed_hosts = {h.lower() for h in allowed_hosts}

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        host = host_name(headers.get("host", ""))
        if host not in self.allowed_hosts:
            await deny(send, 403, f"Host {headers.get('host')!r} is not this server's (allowed: "
                                   f"{sorted(self.allowed_hosts)}; add yours with --allowed-host)")  # fmt: skip
            return
        if self.token is not None and scope.get("path") != "/healthz":
            auth = headers.get("authorization", "")
            supplied = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
            if not hmac.compare_digest(supplied.encode(), self.token):
                await deny(send, 401, "missing or wrong token: send 'Authorization: Bearer <token>' with the "
                                       "token the server was started with")  # fmt: skip
                return
        await self.app(scope, receive, send)


def host_name(hostport: str) -> str:
    """The host of a ``Host`` header (``name:port``, ``[v6]:port``), lower case."""
    hostport = hostport.strip().lower()
    if hostport.startswith("["):
        return hostport[1 : hostport.find("]")] if "]" in hostport else hostport
    return hostport.rsplit(":", 1)[0] if hostport.count(":") == 1 else hostport


async def deny(send: Any, status: int, detail: str) -> None:
    """Answer an ASGI request with ``status`` and ``{"detail": detail}``."""
    body = _detail(detail)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


async def read_body(request: Request, limit: int) -> bytes | None:
    """The request's body, or None once it passes ``limit`` bytes (413)."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


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
              openapi_extra=predict_doc(**{"503": "the server is starting or stopping"}))  # fmt: skip
    async def predict(request: Request) -> Response:
        body = await read_body(request, max_body_bytes)
        if body is None:
            engine.refuse(413)
            return Response(_detail(f"the body is larger than this server takes ({max_body_bytes} bytes): split "
                                    "the request"), status_code=413, media_type="application/json")  # fmt: skip
        status, payload = await engine.handle(body)
        return Response(payload, status_code=status, media_type="application/json")

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

    return _Guard(app, token, allowed_hosts)
