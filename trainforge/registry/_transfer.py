"""Moving versions: :func:`pull` (a version's files into a local directory) and :func:`push` (versions
into another registry). Both copy only what is missing, each file verified by its checksum before it
is kept, so an interrupted transfer resumes where it stopped.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

from trainforge._internal.state_files import data_modes, make_dirs
from trainforge.registry._blobs import BlobStore, Progress, pool, sha256_file
from trainforge.registry._catalog import Catalog
from trainforge.registry._types import IntegrityError, ModelVersion


def pull(blobs: BlobStore, mv: ModelVersion, dest: str, progress: Progress | None) -> dict[str, int]:
    """Copy ``mv``'s files from ``blobs`` into the local directory ``dest``; files already there with
    the right checksum are kept. Returns ``{"files_copied", "bytes_copied", "files_skipped"}``."""
    make_dirs(dest, data_modes().dir)
    todo: list[tuple[str, dict[str, Any]]] = []
    skipped = 0
    for rel, f in mv.files.items():
        target = os.path.join(dest, *rel.split("/"))
        if os.path.isfile(target) and os.path.getsize(target) == f["size"] and sha256_file(target) == f["sha256"]:
            skipped += 1
        else:
            todo.append((target, f))
    total = sum(f["size"] for _, f in todo)
    done = 0
    with pool(len(todo)) as executor:
        for n in executor.map(lambda t: blobs.fetch(t[1]["sha256"], t[0]), todo):
            done += n
            if progress is not None:
                progress(done, total, mv.uri)
    return {"files_copied": len(todo), "bytes_copied": total, "files_skipped": skipped}


def push(versions: list[ModelVersion], src: BlobStore, dest_blobs: BlobStore, dest: Catalog, *, by: str | None,
         progress: Progress | None, what: str) -> tuple[list[dict[str, Any]], dict[str, int]]:  # fmt: skip
    """Copy ``versions`` (of the registry ``src``) into the registry of ``dest_blobs`` and ``dest``.
    A version pushed before (its copy's ``lineage["origin"]`` names it) is not copied again; a copy
    keeps its number when the destination has not used it. Returns (the copies' manifests, in order;
    ``{"files_copied", "bytes_copied", "files_skipped"}``); ``progress`` is called with ``what``."""
    total = sum(mv.size for mv in versions)
    state = {"done": 0}

    def step(n: int) -> None:
        state["done"] += n
        if progress is not None:
            progress(state["done"], total, what)

    copied = skipped = nbytes = 0
    out = []
    for mv in versions:
        origin = {"registry": src.url, "name": mv.name, "version": mv.version}
        existing = next((m for m in _live_manifests(dest, mv.name) if (m.get("lineage") or {}).get("origin") == origin),
                        None)  # fmt: skip
        if existing is not None:
            out.append(existing)
            step(mv.size)
            continue
        c, s, b = _copy_blobs(mv, src, dest_blobs, step)
        copied, skipped, nbytes = copied + c, skipped + s, nbytes + b
        manifest = {k: v for k, v in mv.to_dict().items() if k not in ("uri", "size", "version")}
        manifest["lineage"] = {**mv.lineage, "origin": origin}
        manifest["created_by"] = by or mv.created_by
        out.append(dest.commit(mv.name, manifest, prefer=mv.version))
    return out, {"files_copied": copied, "bytes_copied": nbytes, "files_skipped": skipped}


def _live_manifests(catalog: Catalog, name: str) -> list[dict[str, Any]]:
    """The manifests of ``name``'s live versions ([] when it has none, or one went while they were read)."""
    try:
        return [catalog.manifest(name, n, listed=True) for n in catalog.numbers(name)[0]]
    except FileNotFoundError:
        return []


def _copy_blobs(mv: ModelVersion, src: BlobStore, dest: BlobStore, step: Callable[[int], None]) -> tuple[int, int, int]:
    """Copy the blobs of ``mv`` that ``dest`` lacks: (files copied, files skipped, bytes copied)."""
    shas = {f["sha256"]: f["size"] for f in mv.files.values()}
    with dest.upload_marker(shas):
        present = dest.present(shas)
        for s in present:
            step(shas[s])
        missing = [s for s in shas if s not in present]

        def copy(sha: str) -> int:
            local = src.local_path(sha)
            if local is not None:  # verify in place, then upload
                got = sha256_file(local)
                if got != sha:
                    raise IntegrityError(f"blob {sha} in registry {src.url} is corrupted (it hashes to {got}); "
                                         "nothing was pushed for it")  # fmt: skip
                dest.upload(local, sha)
                return shas[sha]
            with tempfile.TemporaryDirectory(prefix="trainforge_push_") as tmp:
                path = os.path.join(tmp, sha)
                src.fetch(sha, path)
                dest.upload(path, sha)
            return shas[sha]

        with pool(len(missing)) as executor:
            for n in executor.map(copy, missing):
                step(n)
    return len(missing), len(present), sum(shas[s] for s in missing)
