"""The train server's model registry: REST under ``/api/v1/models``, predictions under
``/api/v1/serve``, and the dashboard's Models pages (``/models``, ``/models/{name}``).

The registry is ``ServerConfig.registry`` (``trainforge server start --registry URI``; default: that
of ``Registry()``, ``$TRAINFORGE_REGISTRY`` or ``~/trainforge/registry``). Registry calls read and
write storage, so every route that makes one is a plain ``def`` (FastAPI runs it in its thread pool).

REST::

    GET    /models                              the models (name, latest version, aliases, tags)
    GET    /models/{name}                       one model
    GET    /models/{name}/versions              its versions, oldest first (without their file lists)
    POST   /models/{name}/versions              register the next version: {"job": id} (its latest
                                                checkpoint) or {"source": path/URL}, + model_class/loader,
                                                metrics, tags, description, alias, by
    GET    /models/{name}/versions/{v}          one version, with its files
    DELETE /models/{name}/versions/{v}?force=   delete it (409 while an alias points at it, unless force)
    PUT    /models/{name}/aliases/{alias}       {"version": n, "by": "..."}: set or move the alias
    DELETE /models/{name}/aliases/{alias}       remove it
    GET    /models/{name}/aliases/history       every move of every alias (?alias= for one), oldest first
    POST   /models/gc                           remove files no version refers to any more

A version's ``job`` is the job on this server that produced it: the one whose run directory is the
version's ``lineage.run_path`` (or holds its ``lineage.checkpoint_path``); None when no job here had
that run directory. Errors: 404 an unknown model, version or alias; 409 deleting an aliased version
without ``force``; 422 a malformed name, alias or body (naming it). Never a 500.

Serving: ``POST /serve/{name}@{alias}/predict`` (the alias is followed: a move is picked up within a
second, with no request failing) and ``POST /serve/{name}/{version}/predict`` take ``{"inputs":
[instance, ...]}`` and answer ``{"outputs": [...], "model": {"name", "version", "uri"}}``, batched by
:class:`trainforge.serve._engine.ServeEngine` (one per reference, loaded on its first request, stopped
when the server stops); ``GET /serve`` lists them with their statistics.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Body, HTTPException, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from trainforge._internal.json_depth import shallow
from trainforge.registry._uri import NAME_PATTERN

if TYPE_CHECKING:
    from fastapi import FastAPI

    from trainforge.server import _store as st
    from trainforge.server._service import JobService

_NAME_RE = re.compile(NAME_PATTERN)
MAX_PREDICT_BODY = 32 * 2**20

ModelName = Annotated[str, Path(min_length=1, max_length=100, pattern=NAME_PATTERN, description="the model's name")]
AliasName = Annotated[str, Path(min_length=1, max_length=100, description="the alias (production, staging, ...)")]
VersionNo = Annotated[int, Path(ge=1, le=2**31, description="the version's number")]


class JobLinkOut(BaseModel):
    id: int
    name: str
    state: str
    url: str = Field(description="the job's dashboard page")


class ModelOut(BaseModel):
    name: str
    latest_version: int | None
    num_versions: int
    aliases: dict[str, int] = Field(description="alias -> the version it points at")
    updated_at: float | None
    tags: dict[str, Any]


class VersionOut(BaseModel):
    name: str
    version: int
    uri: str = Field(description="models:/name/version")
    size: int = Field(description="bytes of its files")
    num_files: int
    files: dict[str, dict[str, Any]] | None = Field(
        default=None, description="path -> {sha256, size} (only when one version is asked for)"
    )
    metrics: dict[str, Any]
    tags: dict[str, Any]
    description: str | None
    model_class: str | None
    loader: str | None
    lineage: dict[str, Any]
    created_at: float | None
    created_by: str | None
    aliases: list[str] = Field(description="the aliases pointing at this version now")
    job: JobLinkOut | None = Field(description="the job on this server that produced it (by its run directory)")


class RegisterIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    job: int | None = Field(default=None, ge=1, le=2**62, description="register this job's latest checkpoint (its run's Result)")
    source: str | None = Field(default=None, min_length=1, max_length=4096,
                               description="or a checkpoint directory or URL, as the server's machine sees it")  # fmt: skip
    model_class: str | None = Field(default=None, max_length=400, description="module:Class of its trainforge.model.Model")
    loader: str | None = Field(default=None, max_length=400, description="or module:function that loads it")
    metrics: Annotated[dict[str, Any] | None, AfterValidator(shallow)] = Field(default=None, description="default: the run's last numeric metrics")
    tags: Annotated[dict[str, Any] | None, AfterValidator(shallow)] = None
    description: str | None = Field(default=None, max_length=10_000)
    alias: str | None = Field(default=None, min_length=1, max_length=100, description="point this alias at it")
    by: str | None = Field(default=None, min_length=1, max_length=200, description="who registers it")


class AliasIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int = Field(ge=1, le=2**31, description="the version the alias should point at")
    by: str | None = Field(default=None, min_length=1, max_length=200, description="who moves it (for the history)")


class AliasMoveOut(BaseModel):
    alias: str
    from_version: int | None
    to_version: int | None = Field(description="null when the alias was removed")
    at: float
    by: str | None


class GcOut(BaseModel):
    blobs_removed: int
    bytes_freed: int


class ServedOut(BaseModel):
    ref: str
    model: dict[str, Any]
    stats: dict[str, Any]


ERRORS: dict[int | str, dict[str, Any]] = {
    404: {"description": "no such model, version or alias"},
    409: {"description": "not allowed while an alias points at the version"},
    503: {"description": "the registry's storage cannot be reached"},
}


def _invalid(loc: tuple[str, ...], msg: str) -> Exception:
    from trainforge.server._app import _invalid as invalid

    return invalid(loc, msg)


def check_alias(alias: str) -> None:
    """422 unless ``alias`` is a name an alias may have."""
    if not _NAME_RE.match(alias):
        raise _invalid(("path", "alias"), f"alias {alias!r}: use letters, digits, '.', '_' and '-', starting with a "
                                          "letter or digit, at most 100 characters")  # fmt: skip
    if alias.isdigit() or alias == "latest":
        raise _invalid(("path", "alias"), f"alias {alias!r} would read as a version: all digits and 'latest' are not "
                                          "allowed (e.g. 'production', 'staging', 'v3')")  # fmt: skip


def _registry_errors(fn: Callable[[], Any]) -> Any:
    """Call the registry, its errors as HTTP ones: unknown things 404, refusals 409, bad values 422,
    storage that fails (or a corrupted file) 503."""
    from trainforge._internal.exceptions import StorageError
    from trainforge.registry import ConflictError

    try:
        return fn()
    except (KeyError, LookupError, FileNotFoundError) as exc:
        raise HTTPException(404, _text(exc)) from None
    except ConflictError as exc:
        raise HTTPException(409, _text(exc)) from None
    except ValueError as exc:
        raise _invalid(("path",), _text(exc)) from None
    except (OSError, StorageError) as exc:
        raise HTTPException(503, f"the model registry's storage failed: {type(exc).__name__}: {exc}") from None


def _text(exc: BaseException) -> str:
    if isinstance(exc, KeyError) and exc.args:
        return str(exc.args[0])
    return str(exc)


def _finite(value: Any) -> Any:
    from trainforge.server._app import _finite as finite

    return finite(value)


def run_key(path: str) -> str:
    """A run directory as the store keeps it: local paths absolute and normalized, URLs without a
    trailing slash."""
    if path.startswith("file://"):
        path = path[len("file://") :]
    if "://" in path:
        return path.rstrip("/")
    return os.path.normpath(os.path.abspath(os.path.expanduser(path)))


def _lineage_candidates(lineage: dict[str, Any]) -> list[str]:
    """Run directories that the version may have come from: its ``run_path``, else the directories
    above its ``checkpoint_path`` (a checkpoint lives in its run's directory)."""
    out: list[str] = []
    run_path = lineage.get("run_path")
    if isinstance(run_path, str) and run_path:
        out.append(run_key(run_path))
    ckpt = lineage.get("checkpoint_path")
    if isinstance(ckpt, str) and ckpt:
        parent = run_key(ckpt)
        for _ in range(3):
            parent = parent.rsplit("/", 1)[0] if "/" in parent.split("://", 1)[-1] else parent
            out.append(parent)
    return list(dict.fromkeys(out))


def jobs_for(service: JobService | None, lineages: list[dict[str, Any]]) -> list[st.JobRow | None]:
    """The job on this server that produced each version (see the module docstring), or None."""
    if service is None:
        return [None] * len(lineages)
    candidates = [_lineage_candidates(lin) for lin in lineages]
    keys = {c for cs in candidates for c in cs}
    variants = keys | {k + "/" for k in keys}
    found = {run_key(p): job for p, job in service.store.jobs_by_run_path(sorted(variants)).items()}
    return [next((found[c] for c in cs if c in found), None) for cs in candidates]


def _job_result(service: JobService | None, job_id: int) -> Any:
    """The Result of job ``job_id``'s run: 404 no such job, 409 no run or no checkpoint yet."""
    from trainforge._internal.result import Result

    job = service.store.get(job_id) if service is not None else None
    if job is None:
        raise HTTPException(404, f"no job {job_id} on this server")
    if not job.run_path:
        raise HTTPException(409, f"job {job_id} ({job.state}) has not started a run yet: nothing to register")
    try:
        result = Result.from_path(job.run_path)
    except (ValueError, OSError) as exc:
        raise HTTPException(409, f"job {job_id}'s run at {job.run_path} cannot be read: {exc}") from None
    if result.checkpoint is None:
        raise HTTPException(409, f"job {job_id} ({job.state}) has reported no checkpoint yet: report one with "
                                 "trainforge.report(metrics, checkpoint=...)")  # fmt: skip
    return result


def _model_out(m: Any) -> ModelOut:
    return ModelOut(name=m.name, latest_version=m.latest_version, num_versions=m.num_versions,
                    aliases=dict(m.aliases or {}), updated_at=m.updated_at, tags=_finite(dict(m.tags or {})))  # fmt: skip


def _version_out(mv: Any, aliases: dict[str, int], job: st.JobRow | None, *, files: bool) -> VersionOut:
    link = JobLinkOut(id=job.id, name=job.name, state=job.state, url=f"/jobs/{job.id}") if job is not None else None
    return VersionOut(
        name=mv.name, version=mv.version, uri=mv.uri, size=mv.size, num_files=len(mv.files),
        files=dict(mv.files) if files else None, metrics=_finite(dict(mv.metrics or {})),
        tags=_finite(dict(mv.tags or {})), description=mv.description, model_class=mv.model_class, loader=mv.loader,
        lineage=_finite(dict(mv.lineage or {})), created_at=mv.created_at, created_by=mv.created_by,
        aliases=sorted(a for a, v in aliases.items() if v == mv.version), job=link,
    )  # fmt: skip


def _move_out(move: Any) -> AliasMoveOut:
    return AliasMoveOut(alias=move.alias, from_version=move.from_version, to_version=move.to_version, at=move.at,
                        by=move.by)  # fmt: skip


class Models:
    """The server's registry (opened on first use, so a server whose registry is never asked for
    never touches it) and the model views the routes and pages share."""

    def __init__(self, service: JobService | None, uri: str | None):
        self.service = service
        self.uri = uri
        self._registry: Any = None

    @property
    def registry(self) -> Any:
        if self._registry is None:
            from trainforge.registry import Registry

            self._registry = Registry(self.uri)
        return self._registry

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``registry.<method>(*args, **kwargs)``, its errors as HTTP ones (see ``_registry_errors``)."""
        return _registry_errors(lambda: getattr(self.registry, method)(*args, **kwargs))

    def versions(self, name: str) -> tuple[Any, list[VersionOut]]:
        model = self.call("get_model", name)
        versions = self.call("versions", name)
        jobs = jobs_for(self.service, [dict(v.lineage or {}) for v in versions])
        aliases = dict(model.aliases or {})
        return model, [_version_out(v, aliases, j, files=False) for v, j in zip(versions, jobs, strict=True)]

    def version(self, name: str, version: int) -> VersionOut:
        model = self.call("get_model", name)
        mv = self.call("get", f"{name}/{version}")
        (job,) = jobs_for(self.service, [dict(mv.lineage or {})])
        return _version_out(mv, dict(model.aliases or {}), job, files=True)


class Engines:
    """One serving engine per model reference (``name@alias`` or ``name/3``), started on its first
    request and stopped with the server (:meth:`lifespan`). All on the server's event loop."""

    def __init__(self, models: Models):
        self.models = models
        self._engines: dict[str, Any] = {}
        self._starting: dict[str, asyncio.Future[Any]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    async def get(self, ref: str) -> Any:
        from trainforge.serve._engine import ServeEngine
        from trainforge.serve._source import RegistrySource

        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new loop (in-process tests run each request on its own): start afresh
            self._engines, self._starting, self._loop = {}, {}, loop
        if ref in self._engines:
            return self._engines[ref]
        if ref in self._starting:
            return await asyncio.shield(self._starting[ref])
        future: asyncio.Future[Any] = loop.create_future()
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
        return [ServedOut(ref=ref, model=_finite(e.model_info()), stats=_finite(e.stats()))
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


def _predict_doc() -> dict[str, Any]:
    from trainforge.serve._app import predict_doc

    return predict_doc(**{"404": "no such model, version or alias",
                          "503": "the model cannot be loaded, or the server is stopping"})  # fmt: skip


def router(models: Models, engines: Engines, prefix: str) -> APIRouter:
    r = APIRouter(prefix=prefix)

    @r.get("/models", response_model=list[ModelOut], responses={503: ERRORS[503]})
    def list_models() -> list[ModelOut]:
        return [_model_out(m) for m in models.call("list_models")]

    @r.post("/models/gc", response_model=GcOut, responses={503: ERRORS[503]})
    def gc() -> GcOut:
        """Remove the stored files that no version refers to any more."""
        out = models.call("gc")
        return GcOut(blobs_removed=int(out.get("blobs_removed", 0)), bytes_freed=int(out.get("bytes_freed", 0)))

    @r.get("/models/{name}", response_model=ModelOut, responses=ERRORS)
    def get_model(name: ModelName) -> ModelOut:
        return _model_out(models.call("get_model", name))

    @r.post("/models/{name}/versions", response_model=VersionOut, status_code=201, responses=ERRORS)
    def register(name: ModelName, body: Annotated[RegisterIn, Body()]) -> VersionOut:
        """Register the next version of ``name`` from a job of this server (its latest checkpoint, with
        the job's run as lineage) or from a checkpoint path or URL the server can read."""
        if (body.job is None) == (body.source is None):
            raise _invalid(("body",), "give either 'job' (a job id of this server) or 'source' (a checkpoint path or "
                                      "URL), not both or neither")  # fmt: skip
        if body.model_class is not None and body.loader is not None:
            raise _invalid(("body", "loader"), "give 'model_class' or 'loader', not both")
        if body.alias is not None:
            check_alias(body.alias)
        source: Any = body.source
        if body.job is not None:
            source = _job_result(models.service, body.job)
        mv = models.call("register", name, source, model_cls=body.model_class, loader=body.loader,
                         metrics=body.metrics, tags=body.tags, description=body.description, alias=body.alias,
                         by=body.by)  # fmt: skip
        return models.version(name, mv.version)

    @r.get("/models/{name}/versions", response_model=list[VersionOut], responses=ERRORS)
    def list_versions(name: ModelName) -> list[VersionOut]:
        return models.versions(name)[1]

    @r.get("/models/{name}/versions/{version}", response_model=VersionOut, responses=ERRORS)
    def get_version(name: ModelName, version: VersionNo) -> VersionOut:
        return models.version(name, version)

    @r.delete("/models/{name}/versions/{version}", status_code=204, responses=ERRORS)
    def delete_version(
        name: ModelName, version: VersionNo,
        force: Annotated[bool, Query(description="delete it even while aliases point at it (they go too)")] = False,
    ) -> Response:  # fmt: skip
        model = models.call("get_model", name)
        aliased = sorted(a for a, v in (model.aliases or {}).items() if v == version)
        if aliased and not force:
            raise HTTPException(409, f"{name}/{version} is what alias(es) {', '.join(aliased)} point at: move or "
                                     "remove them first, or pass ?force=true")  # fmt: skip
        models.call("get", f"{name}/{version}")  # 404 for an unknown version
        models.call("delete_version", name, version, force=force)
        return Response(status_code=204)

    @r.get("/models/{name}/aliases/history", response_model=list[AliasMoveOut], responses=ERRORS)
    def alias_history(
        name: ModelName,
        alias: Annotated[str | None, Query(min_length=1, max_length=100, description="only this alias's moves")] = None,
    ) -> list[AliasMoveOut]:
        if alias is not None:
            check_alias(alias)
        models.call("get_model", name)
        return [_move_out(m) for m in models.call("alias_history", name, alias)]

    @r.put("/models/{name}/aliases/{alias}", response_model=AliasMoveOut, responses=ERRORS)
    def set_alias(name: ModelName, alias: AliasName, body: Annotated[AliasIn, Body()]) -> AliasMoveOut:
        """Point ``alias`` at ``version`` (set it, or move it): the move goes into its history."""
        check_alias(alias)
        models.call("get", f"{name}/{body.version}")  # 404 for an unknown model or version
        return _move_out(models.call("set_alias", name, alias, body.version, by=body.by))

    @r.delete("/models/{name}/aliases/{alias}", response_model=AliasMoveOut, responses=ERRORS)
    def delete_alias(
        name: ModelName, alias: AliasName,
        by: Annotated[str | None, Query(min_length=1, max_length=200, description="who removes it")] = None,
    ) -> AliasMoveOut:  # fmt: skip
        check_alias(alias)
        model = models.call("get_model", name)
        if alias not in (model.aliases or {}):
            raise HTTPException(404, f"model {name!r} has no alias {alias!r} (its aliases: {sorted(model.aliases or {})})")
        return _move_out(models.call("delete_alias", name, alias, by=by))

    @r.get("/serve", response_model=list[ServedOut])
    async def served() -> list[ServedOut]:
        """The models this server serves now (loaded by a first request), with their statistics."""
        return engines.served()

    async def predict(request: Request, ref: str) -> Response:
        from trainforge.serve._app import read_body
        from trainforge.serve._engine import ServeError, _detail

        try:
            engine = await engines.get(ref)
        except ServeError as exc:
            return Response(_detail(exc.detail), status_code=exc.status, media_type="application/json")
        body = await read_body(request, MAX_PREDICT_BODY)
        if body is None:
            engine.refuse(413)
            return Response(_detail(f"the body is larger than this server takes ({MAX_PREDICT_BODY} bytes): split "
                                    "the request"), status_code=413, media_type="application/json")  # fmt: skip
        status, payload = await engine.handle(body)
        return Response(payload, status_code=status, media_type="application/json")

    @r.post("/serve/{name}@{alias}/predict", openapi_extra=_predict_doc(), response_class=Response)
    async def predict_alias(request: Request, name: ModelName, alias: AliasName) -> Response:
        """Predictions of the version ``alias`` points at (followed as it moves)."""
        check_alias(alias)
        return await predict(request, f"{name}@{alias}")

    @r.post("/serve/{name}/{version}/predict", openapi_extra=_predict_doc(), response_class=Response)
    async def predict_version(request: Request, name: ModelName, version: VersionNo) -> Response:
        """Predictions of one version."""
        return await predict(request, f"{name}/{version}")

    return r


def mount(app: FastAPI, service: JobService | None, registry: str | None, prefix: str) -> Models:
    """Add the registry's routes and pages to the train server's app; its lifespan stops the engines."""
    models = Models(service, registry)
    engines = Engines(models)
    app.include_router(router(models, engines, prefix))
    app.router.lifespan_context = engines.lifespan
    from trainforge.server import _models_page

    _models_page.mount(app, models)
    return models

