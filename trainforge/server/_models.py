"""The train server's model registry, as its routes and pages see it: :class:`Models` (the registry,
opened on first use, and the views of its models and versions that ``/api/v1/models``
(:mod:`trainforge.server.routes.models`), the predictions under ``/api/v1/serve``
(:mod:`trainforge.server.routes.serve`) and the dashboard's Models pages
(:mod:`trainforge.server.pages.models`) share).

The registry is ``ServerConfig.registry`` (``trainforge server start --registry URI``; default: that
of ``Registry()``, ``$TRAINFORGE_REGISTRY`` or ``~/trainforge/registry``). Registry calls read and
write storage, so every route that makes one is a plain ``def`` (FastAPI runs it in its thread pool).

A version's ``job`` is the job on this server that produced it: the one whose run directory is the
version's ``lineage.run_path`` (or holds its ``lineage.checkpoint_path``); None when no job here had
that run directory. Errors: 404 an unknown model, version or alias; 409 deleting an aliased version
without ``force``; 422 a malformed name, alias or body (naming it); 503 storage that fails. Never a 500.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request

from trainforge._internal.http import json_safe
from trainforge.registry import NAME_PATTERN
from trainforge.server._schemas import AliasMoveOut, JobLinkOut, ModelOut, VersionOut, invalid
from trainforge.server.jobs.service import JobService
from trainforge.server.store.database import JobRow

NAME_RE = re.compile(NAME_PATTERN)
ERRORS: dict[int | str, dict[str, Any]] = {
    404: {"description": "no such model, version or alias"},
    409: {"description": "not allowed while an alias points at the version"},
    503: {"description": "the registry's storage cannot be reached"},
}


def check_alias(alias: str) -> None:
    """422 unless ``alias`` is a name an alias may have."""
    if not NAME_RE.match(alias):
        raise invalid(("path", "alias"), f"alias {alias!r}: use letters, digits, '.', '_' and '-', starting with a "
                                         "letter or digit, at most 100 characters")  # fmt: skip
    if alias.isdigit() or alias == "latest":
        raise invalid(("path", "alias"), f"alias {alias!r} would read as a version: all digits and 'latest' are not "
                                         "allowed (e.g. 'production', 'staging', 'v3')")  # fmt: skip


def _registry_errors(fn: Callable[[], Any]) -> Any:
    """Call the registry, its errors as HTTP ones: unknown things 404, refusals 409, bad values 422,
    storage that fails (or a corrupted file) 503."""
    from trainforge import StorageError
    from trainforge.registry import ConflictError

    try:
        return fn()
    except (KeyError, LookupError, FileNotFoundError) as exc:
        raise HTTPException(404, _text(exc)) from None
    except ConflictError as exc:
        raise HTTPException(409, _text(exc)) from None
    except ValueError as exc:
        raise invalid(("path",), _text(exc)) from None
    except (OSError, StorageError) as exc:
        raise HTTPException(503, f"the model registry's storage failed: {type(exc).__name__}: {exc}") from None


def _text(exc: BaseException) -> str:
    if isinstance(exc, KeyError) and exc.args:
        return str(exc.args[0])
    return str(exc)


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


def jobs_for(service: JobService | None, lineages: list[dict[str, Any]]) -> list[JobRow | None]:
    """The job on this server that produced each version (see the module docstring), or None."""
    if service is None:
        return [None] * len(lineages)
    candidates = [_lineage_candidates(lin) for lin in lineages]
    keys = {c for cs in candidates for c in cs}
    variants = keys | {k + "/" for k in keys}
    found = {run_key(p): job for p, job in service.store.jobs_by_run_path(sorted(variants)).items()}
    return [next((found[c] for c in cs if c in found), None) for cs in candidates]


def job_result(service: JobService | None, job_id: int) -> Any:
    """The Result of job ``job_id``'s run: 404 no such job, 409 no run or no checkpoint yet."""
    from trainforge import Result

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


def model_out(m: Any) -> ModelOut:
    return ModelOut(name=m.name, latest_version=m.latest_version, num_versions=m.num_versions,
                    aliases=dict(m.aliases or {}), updated_at=m.updated_at, tags=json_safe(dict(m.tags or {})))  # fmt: skip


def _version_out(mv: Any, aliases: dict[str, int], job: JobRow | None, *, files: bool) -> VersionOut:
    link = JobLinkOut(id=job.id, name=job.name, state=job.state, url=f"/jobs/{job.id}") if job is not None else None
    return VersionOut(
        name=mv.name, version=mv.version, uri=mv.uri, size=mv.size, num_files=len(mv.files),
        files=dict(mv.files) if files else None, metrics=json_safe(dict(mv.metrics or {})),
        tags=json_safe(dict(mv.tags or {})), description=mv.description, model_class=mv.model_class, loader=mv.loader,
        lineage=json_safe(dict(mv.lineage or {})), created_at=mv.created_at, created_by=mv.created_by,
        aliases=sorted(a for a, v in aliases.items() if v == mv.version), job=link,
    )  # fmt: skip


def move_out(move: Any) -> AliasMoveOut:
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


async def models_of(request: Request) -> Models:
    """The app's :class:`Models` (``app.state.models``), for a route's ``Depends``."""
    return request.app.state.models  # type: ignore[no-any-return]


ModelsDep = Annotated[Models, Depends(models_of)]
