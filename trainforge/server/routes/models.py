"""``/models``: the server's model registry over REST (see :mod:`trainforge.server._models`)::

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

Who registered a version (``created_by``) and who moved an alias (``by`` in its history) is the
authenticated caller; an admin's ``by`` naming someone else is recorded as ``"<by> (recorded by
<admin>)"``, and anyone else's is 403 (rule ``record.on_behalf``: :func:`~trainforge.server.routes.access.recorded_by`).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, HTTPException, Query
from fastapi.responses import Response

from trainforge.server._models import ERRORS, ModelsDep, check_alias, job_result, model_out, move_out
from trainforge.server._schemas import (
    AliasIn,
    AliasMoveOut,
    AliasName,
    GcOut,
    ModelName,
    ModelOut,
    RegisterIn,
    VersionNo,
    VersionOut,
    invalid,
)
from trainforge.server.routes.access import Caller, recorded_by

router = APIRouter()


@router.get("/models", response_model=list[ModelOut], responses={503: ERRORS[503]})
def list_models(models: ModelsDep) -> list[ModelOut]:
    return [model_out(m) for m in models.call("list_models")]


@router.post("/models/gc", response_model=GcOut, responses={503: ERRORS[503]})
def gc(models: ModelsDep) -> GcOut:
    """Remove the stored files that no version refers to any more."""
    out = models.call("gc")
    return GcOut(blobs_removed=int(out.get("blobs_removed", 0)), bytes_freed=int(out.get("bytes_freed", 0)))


@router.get("/models/{name}", response_model=ModelOut, responses=ERRORS)
def get_model(models: ModelsDep, name: ModelName) -> ModelOut:
    return model_out(models.call("get_model", name))


@router.post("/models/{name}/versions", response_model=VersionOut, status_code=201, responses=ERRORS)
def register(models: ModelsDep, caller: Caller, name: ModelName, body: Annotated[RegisterIn, Body()]) -> VersionOut:
    """Register the next version of ``name`` from a job of this server (its latest checkpoint, with
    the job's run as lineage) or from a checkpoint path or URL the server can read."""
    if (body.job is None) == (body.source is None):
        raise invalid(("body",), "give either 'job' (a job id of this server) or 'source' (a checkpoint path or "
                                  "URL), not both or neither")  # fmt: skip
    if body.model_class is not None and body.loader is not None:
        raise invalid(("body", "loader"), "give 'model_class' or 'loader', not both")
    if body.alias is not None:
        check_alias(body.alias)
    by = recorded_by(caller, body.by)
    source: Any = body.source
    if body.job is not None:
        source = job_result(models.service, body.job)
    mv = models.call("register", name, source, model_cls=body.model_class, loader=body.loader,
                     metrics=body.metrics, tags=body.tags, description=body.description, alias=body.alias,
                     by=by)  # fmt: skip
    return models.version(name, mv.version)


@router.get("/models/{name}/versions", response_model=list[VersionOut], responses=ERRORS)
def list_versions(models: ModelsDep, name: ModelName) -> list[VersionOut]:
    return models.versions(name)[1]


@router.get("/models/{name}/versions/{version}", response_model=VersionOut, responses=ERRORS)
def get_version(models: ModelsDep, name: ModelName, version: VersionNo) -> VersionOut:
    return models.version(name, version)


@router.delete("/models/{name}/versions/{version}", status_code=204, responses=ERRORS)
def delete_version(
    models: ModelsDep, name: ModelName, version: VersionNo,
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


@router.get("/models/{name}/aliases/history", response_model=list[AliasMoveOut], responses=ERRORS)
def alias_history(
    models: ModelsDep,
    name: ModelName,
    alias: Annotated[str | None, Query(min_length=1, max_length=100, description="only this alias's moves")] = None,
) -> list[AliasMoveOut]:
    if alias is not None:
        check_alias(alias)
    models.call("get_model", name)
    return [move_out(m) for m in models.call("alias_history", name, alias)]


@router.put("/models/{name}/aliases/{alias}", response_model=AliasMoveOut, responses=ERRORS)
def set_alias(models: ModelsDep, caller: Caller, name: ModelName, alias: AliasName,
              body: Annotated[AliasIn, Body()]) -> AliasMoveOut:  # fmt: skip
    """Point ``alias`` at ``version`` (set it, or move it): the move goes into its history."""
    check_alias(alias)
    by = recorded_by(caller, body.by)
    models.call("get", f"{name}/{body.version}")  # 404 for an unknown model or version
    return move_out(models.call("set_alias", name, alias, body.version, by=by))


@router.delete("/models/{name}/aliases/{alias}", response_model=AliasMoveOut, responses=ERRORS)
def delete_alias(
    models: ModelsDep, caller: Caller, name: ModelName, alias: AliasName,
    by: Annotated[str | None, Query(min_length=1, max_length=200,
                                    description="who removes it: default the caller (only an admin may name "
                                    "someone else)")] = None,
) -> AliasMoveOut:  # fmt: skip
    check_alias(alias)
    by = recorded_by(caller, by)
    model = models.call("get_model", name)
    if alias not in (model.aliases or {}):
        raise HTTPException(404, f"model {name!r} has no alias {alias!r} (its aliases: {sorted(model.aliases or {})})")
    return move_out(models.call("delete_alias", name, alias, by=by))
