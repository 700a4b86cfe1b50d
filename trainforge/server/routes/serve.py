"""``/serve``: predictions of the registry's models, batched by ``trainforge serve``'s engine (one per
model reference, loaded on its first request, stopped when the server stops)::

    POST /serve/{name}@{alias}/predict    the version the alias points at (followed as it moves: a move
                                          is picked up within a second, with no request failing)
    POST /serve/{name}/{version}/predict  one version
    GET  /serve                           the models served now, with their statistics

A predict request takes ``{"inputs": [instance, ...]}`` and answers ``{"outputs": [...], "model":
{"name", "version", "uri"}}``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

from trainforge._internal.http import json_detail, json_safe
from trainforge.serve import RegistrySource, ServeEngine, ServeError, predict_openapi, predict_response
from trainforge.server._models import Models, check_alias
from trainforge.server._schemas import AliasName, ModelName, ServedOut, VersionNo

MAX_PREDICT_BODY = 32 * 2**20


class Engines:
    """One serving engine per model reference (``name@alias`` or ``name/3``), started on its first
    request and stopped with the server (:meth:`lifespan`). All on the server's event loop."""

    def __init__(self, models: Models):
        self.models = models
        self._engines: dict[str, ServeEngine] = {}
        self._starting: dict[str, asyncio.Future[ServeEngine]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    async def get(self, ref: str) -> ServeEngine:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new loop (in-process tests run each request on its own): start afresh
            self._engines, self._starting, self._loop = {}, {}, loop
        if ref in self._engines:
            return self._engines[ref]
        if ref in self._starting:
            return await asyncio.shield(self._starting[ref])
        future: asyncio.Future[ServeEngine] = loop.create_future()
        self._starting[ref] = future
        try:
            await run_in_threadpool(self.models.call, "get", ref)  # 404 for an unknown model, version or alias
            source = RegistrySource(ref, self.models.registry.uri)
            engine = ServeEngine(source)
            await engine.start()
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning when nobody else waited
            raise
        finally:
            self._starting.pop(ref, None)
        self._engines[ref] = engine
        future.set_result(engine)
        return engine

    def served(self) -> list[ServedOut]:
        return [ServedOut(ref=ref, model=json_safe(e.model_info()), stats=json_safe(e.stats()))
                for ref, e in sorted(self._engines.items())]  # fmt: skip

    async def close(self) -> None:
        engines, self._engines = list(self._engines.values()), {}
        for engine in engines:
            await engine.stop(drain_s=2.0)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Any) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await self.close()


async def engines_of(request: Request) -> Engines:
    """The app's :class:`Engines` (``app.state.engines``), for a route's ``Depends``."""
    return request.app.state.engines  # type: ignore[no-any-return]


EnginesDep = Annotated[Engines, Depends(engines_of)]


def _predict_doc() -> dict[str, Any]:
    return predict_openapi(**{"404": "no such model, version or alias",
                              "503": "the model cannot be loaded, or the server is stopping"})  # fmt: skip


router = APIRouter()


@router.get("/serve", response_model=list[ServedOut])
async def served(engines: EnginesDep) -> list[ServedOut]:
    """The models this server serves now (loaded by a first request), with their statistics."""
    return engines.served()


async def _predict(engines: Engines, request: Request, ref: str) -> Response:
    try:
        engine = await engines.get(ref)
    except ServeError as exc:
        return Response(json_detail(exc.detail), status_code=exc.status, media_type="application/json")
    return await predict_response(request, engine, MAX_PREDICT_BODY)


@router.post("/serve/{name}@{alias}/predict", openapi_extra=_predict_doc(), response_class=Response)
async def predict_alias(engines: EnginesDep, request: Request, name: ModelName, alias: AliasName) -> Response:
    """Predictions of the version ``alias`` points at (followed as it moves)."""
    check_alias(alias)
    return await _predict(engines, request, f"{name}@{alias}")


@router.post("/serve/{name}/{version}/predict", openapi_extra=_predict_doc(), response_class=Response)
async def predict_version(engines: EnginesDep, request: Request, name: ModelName, version: VersionNo) -> Response:
    """Predictions of one version."""
    return await _predict(engines, request, f"{name}/{version}")
