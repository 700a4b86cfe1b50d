"""``Registry``: versioned models on plain storage (a directory or any fsspec URL), no database.

Layout under the registry's root::

    blobs/sha256/<hh>/<sha256>                       file contents, stored once, never modified
    models/<name>/versions/<n>.json                  version n's manifest: immutable, written last
    models/<name>/versions/<n>.deleted               a deleted version (its number is never reused)
    models/<name>/aliases/<alias>/<seq>.json         the alias's moves, one file each; the last is current
    uploads/<id>.json                                the blobs a register in flight is writing (gc keeps them)

A version becomes visible in one step: its manifest is created exclusively (a hard link on local
disk, a conditional put on S3) after all its blobs are stored, so a half-written version is never
seen and two writers never get one number. An alias move is the exclusive create of the next entry
of its history, so racing moves are all recorded, in one order, and the last one wins.

What a register stores is exactly its source's regular files: a symbolic link in a source is refused
(``SymlinkError``, never followed), and a source file is never modified, its mode included (a file is
hard-linked into the blobs only when it is a committed checkpoint's and read-only already; otherwise
it is copied): see :mod:`trainforge.registry._source`.

A deleted version is not found at once, by every ``Registry`` object: a manifest's content is kept
(it never changes), but whether it still exists is checked on each lookup (one ``exists``).
"""

from __future__ import annotations

import contextlib
import functools
import getpass
import hashlib
import importlib
import json
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from trainforge.registry._backend import Backend, LocalBackend, open_backend
from trainforge.registry._source import local_source, place, walk
from trainforge.registry._types import (
    AliasedVersionError,
    AliasMove,
    ConflictError,
    IntegrityError,
    ModelNotFoundError,
    ModelVersion,
    RegisteredModel,
)
from trainforge.registry._uri import ModelRef, check_alias, check_name, parse_model_uri

logger = logging.getLogger("trainforge.registry")

ENV_REGISTRY = "TRAINFORGE_REGISTRY"
ENV_CACHE = "TRAINFORGE_REGISTRY_CACHE"
STALE_UPLOAD_S = 24 * 3600.0
_CHUNK = 1 << 20

Progress = Callable[[int, int, str], None]
"""``progress(bytes_done, bytes_total, what)``, called as files are copied."""


def default_registry_url() -> str:
    """``$TRAINFORGE_REGISTRY``, else ``~/trainforge/registry``."""
    return os.environ.get(ENV_REGISTRY) or os.path.join(os.path.expanduser("~"), "trainforge", "registry")


def cache_dir() -> str:
    """Where versions are pulled for loading: ``$TRAINFORGE_REGISTRY_CACHE``, else
    ``~/.cache/trainforge/registry``."""
    return os.environ.get(ENV_CACHE) or os.path.join(os.path.expanduser("~"), ".cache", "trainforge", "registry")


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def _blob(sha: str) -> str:
    return f"blobs/sha256/{sha[:2]}/{sha}"


def _versions_dir(name: str) -> str:
    return f"models/{name}/versions"


def _alias_dir(name: str, alias: str) -> str:
    return f"models/{name}/aliases/{alias}"


def _who() -> str:
    try:
        user = getpass.getuser()
    except Exception:
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def _git_commit() -> str | None:
    """The commit of the git checkout this process runs in (its working directory), if any."""
    return _git_commit_of(os.getcwd())


@functools.lru_cache(maxsize=8)
def _git_commit_of(cwd: str) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=False,
                             cwd=cwd)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and len(commit) == 40 else None


def _json_dict(value: Any, field: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{field}={value!r}: give a dict (or None)")
    try:
        out: dict[str, Any] = json.loads(json.dumps(value))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{field}={value!r} must be JSON (strings, numbers, lists and dicts of them): {exc}") from None
    return out


def _import_path(obj: Any) -> str | None:
    """``"module:QualName"`` when importing it gives ``obj`` back; None otherwise."""
    from trainforge._internal.managed.artifact import class_path

    return class_path(obj)


def import_object(path: str) -> Any:
    module, _, qualname = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


class _HashCache:
    """This machine's sha256 of local files by ``(device, inode, size, mtime, ctime)``, so registering
    files that did not change does not read them again (``<cache_dir>/file-hashes.json``; a cache:
    concurrent writers may drop each other's entries, never corrupt them)."""

    MAX_ENTRIES = 100_000

    def __init__(self, path: str, entries: dict[str, str]):
        self.path, self.entries, self.changed = path, entries, False

    @classmethod
    def load(cls) -> _HashCache:
        path = os.path.join(cache_dir(), "file-hashes.json")
        try:
            with open(path) as f:
                entries = json.load(f)
        except (OSError, ValueError):
            entries = {}
        return cls(path, entries if isinstance(entries, dict) else {})

    @staticmethod
    def key(path: str) -> str:
        st = os.stat(path)
        return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"

    def get(self, path: str) -> str | None:
        return self.entries.get(self.key(path))

    def update(self, hashes: dict[str, str]) -> None:
        for path, sha in hashes.items():
            with contextlib.suppress(OSError):
                key = self.key(path)
                if self.entries.get(key) != sha:
                    self.entries[key] = sha
                    self.changed = True

    def save(self) -> None:
        if not self.changed:
            return
        entries = dict(list(self.entries.items())[-self.MAX_ENTRIES :])
        with contextlib.suppress(OSError):
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            tmp = f"{self.path}.tmp-{uuid.uuid4().hex[:8]}"
            with open(tmp, "w") as f:
                json.dump(entries, f)
            os.replace(tmp, self.path)


class Registry:
    """A model registry on plain storage: ``Registry()`` (``$TRAINFORGE_REGISTRY``, else
    ``~/trainforge/registry``), ``Registry("/shared/registry")`` or ``Registry("s3://bucket/registry")``.

    Example::

        reg = Registry()
        mv = reg.register("digits", result, model_cls=DigitsNet, alias="staging")
        reg.set_alias("digits", "production", mv.version)
        model = reg.load("models:/digits@production")        # ready for model(x)
        trainer = TorchTrainer(..., resume_from_checkpoint=reg.get("digits@production").checkpoint)
        reg.push("digits@production", "s3://team-bucket/registry")

    References are ``models:/name/3``, ``models:/name@alias``, ``models:/name`` (the latest version),
    or the same without ``models:/``. Every method is safe to call from several processes and machines
    at once (see the module docstring); the registry keeps no state but its files.
    """

    def __init__(self, uri: str | os.PathLike[str] | None = None):
        if uri is not None and not isinstance(uri, (str, os.PathLike)):
            raise TypeError(f"Registry(uri={uri!r}): give a directory or a URL such as 's3://bucket/registry'")
        self.uri = os.fspath(uri) if uri is not None else default_registry_url()
        if not self.uri:
            raise ValueError("Registry(uri=''): give a directory or a URL such as 's3://bucket/registry'")
        self._b: Backend = open_backend(self.uri)
        self._manifests: dict[tuple[str, int], dict[str, Any]] = {}
        self.last_transfer: dict[str, int] = {}
        """What the last register/pull/push copied: ``files_copied``, ``bytes_copied``, ``files_skipped``."""

    @property
    def url(self) -> str:
        """The registry's location as a user writes it (an absolute directory, or ``s3://...``)."""
        return self._b.url

    def __repr__(self) -> str:
        return f"Registry({self.url!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Registry) and other.url == self.url

    def __hash__(self) -> int:
        return hash(self.url)

    # -- reading ----------------------------------------------------------------------------------
    def _numbers(self, name: str) -> tuple[list[int], int]:
        """(live version numbers, ascending; the highest number ever used)."""
        live: list[int] = []
        highest = 0
        for entry in self._b.ls(_versions_dir(name)):
            stem, _, ext = entry.partition(".")
            if not stem.isdigit() or ext not in ("json", "deleted"):
                continue
            n = int(stem)
            highest = max(highest, n)
            if ext == "json":
                live.append(n)
        return sorted(set(live)), highest

    def _manifest(self, name: str, version: int, *, listed: bool = False) -> dict[str, Any]:
        """Version ``version``'s manifest; FileNotFoundError when it does not exist (any more). Its
        content never changes, so it is kept; whether it exists is not kept (another process may
        delete it): a kept one costs one ``exists``, skipped when ``listed`` (the caller has just seen
        it in a listing)."""
        path = f"{_versions_dir(name)}/{version}.json"
        manifest = self._manifests.get((name, version))
        if manifest is None:
            manifest = self._manifests[(name, version)] = json.loads(self._b.read(path))
        elif not listed and not self._b.exists(path):
            self._manifests.pop((name, version), None)
            raise FileNotFoundError(path)
        return manifest

    def _version(self, name: str, version: int, *, listed: bool = False) -> ModelVersion:
        try:
            return ModelVersion.from_manifest(self._manifest(name, version, listed=listed), self)
        except FileNotFoundError:
            live, _ = self._numbers(name)
            if not live and not self._exists(name):
                raise self._no_model(name) from None
            raise ModelNotFoundError(
                f"model {name!r} has no version {version} in registry {self.url} (its versions: {live or 'none'})"
            ) from None

    def _exists(self, name: str) -> bool:
        return bool(self._b.ls(f"models/{name}"))

    def _no_model(self, name: str) -> ModelNotFoundError:
        known = self.model_names()
        hint = f"its models: {known}" if known else "it has no models yet: register one with Registry.register()"
        return ModelNotFoundError(f"no model {name!r} in registry {self.url} ({hint})")

    def model_names(self) -> list[str]:
        return sorted(n for n in self._b.ls("models") if not n.startswith("."))

    def list_models(self) -> list[RegisteredModel]:
        """Every model of the registry, by name."""
        return [self.get_model(n) for n in self.model_names()]

    def get_model(self, name: str) -> RegisteredModel:
        """One model: its latest version, number of versions, aliases and the latest version's tags."""
        check_name(name)
        live, highest = self._numbers(name)
        if not highest and not self._exists(name):
            raise self._no_model(name)
        latest = self._version(name, live[-1], listed=True) if live else None
        moves = [m for m in (self._last_move(name, a) for a in self._alias_names(name)) if m is not None]
        aliases = {m.alias: m.to_version for m in moves if m.to_version is not None}
        updated = max([latest.created_at if latest else 0.0] + [m.at for m in moves])
        return RegisteredModel(
            name=name, latest_version=live[-1] if live else None, num_versions=len(live),
            aliases=dict(sorted(aliases.items())), updated_at=updated,
            tags=dict(latest.tags) if latest else {}, description=latest.description if latest else None,
        )  # fmt: skip

    def versions(self, name: str) -> list[ModelVersion]:
        """The live versions of ``name``, oldest first."""
        check_name(name)
        live, highest = self._numbers(name)
        if not highest and not self._exists(name):
            raise self._no_model(name)
        return [self._version(name, n, listed=True) for n in live]

    def get(self, ref: str | ModelRef) -> ModelVersion:
        """The version ``ref`` names (``name/3``, ``name@alias``, ``name`` for the latest; with or without
        ``models:/``). ``KeyError`` (``ModelNotFoundError``) says what exists when it names nothing."""
        r = ref if isinstance(ref, ModelRef) else parse_model_uri(ref)
        if r.registry is not None and (other := Registry(r.registry)) != self:
            return other.get(ModelRef(r.name, r.version, r.alias))
        if r.version is not None:
            return self._version(r.name, r.version)
        if r.alias is not None:
            move = self._last_move(r.name, r.alias)
            if move is None or move.to_version is None:
                if not self._exists(r.name):
                    raise self._no_model(r.name)
                current = self.get_model(r.name).aliases
                raise ModelNotFoundError(
                    f"model {r.name!r} has no alias {r.alias!r} in registry {self.url} (its aliases: "
                    f"{current or 'none'}); set it with Registry.set_alias or `trainforge models alias set`"
                )
            return self._version(r.name, move.to_version)
        live, highest = self._numbers(r.name)
        if not live:
            if not highest and not self._exists(r.name):
                raise self._no_model(r.name)
            raise ModelNotFoundError(f"model {r.name!r} has no versions left in registry {self.url}")
        return self._version(r.name, live[-1], listed=True)

    def _live(self, ref: str | ModelRef | ModelVersion) -> ModelVersion:
        """The version ``ref`` names; a ``ModelVersion`` in hand is checked too (deleted since?)."""
        if isinstance(ref, ModelVersion):
            self._version(ref.name, ref.version)  # ModelNotFoundError when it was deleted since
            return ref
        return self.get(ref)

    # -- aliases ----------------------------------------------------------------------------------
    def _alias_names(self, name: str) -> list[str]:
        return sorted(self._b.ls(f"models/{name}/aliases"))

    def _entries(self, name: str, alias: str) -> list[int]:
        return sorted(int(e[:-5]) for e in self._b.ls(_alias_dir(name, alias)) if e.endswith(".json") and e[:-5].isdigit())

    def _move(self, name: str, alias: str, seq: int) -> AliasMove:
        d = json.loads(self._b.read(f"{_alias_dir(name, alias)}/{seq:010d}.json"))
        return AliasMove(alias=alias, from_version=d.get("from_version"), to_version=d.get("to_version"),
                         at=float(d.get("at") or 0.0), by=d.get("by"), seq=seq)  # fmt: skip

    def _last_move(self, name: str, alias: str) -> AliasMove | None:
        entries = self._entries(name, alias)
        return self._move(name, alias, entries[-1]) if entries else None

    def _append_move(self, name: str, alias: str, to_version: int | None, by: str | None,
                     expect_set: bool = False) -> AliasMove:  # fmt: skip
        for _ in range(1000):
            entries = self._entries(name, alias)
            seq = entries[-1] + 1 if entries else 1
            current = self._move(name, alias, entries[-1]).to_version if entries else None
            if expect_set and current is None:
                raise ModelNotFoundError(f"model {name!r} has no alias {alias!r} in registry {self.url}")
            move = AliasMove(alias=alias, from_version=current, to_version=to_version, at=time.time(),
                             by=by or _who(), seq=seq)  # fmt: skip
            body = {k: v for k, v in move.to_dict().items() if k != "seq"}
            if self._b.create(f"{_alias_dir(name, alias)}/{seq:010d}.json", json.dumps(body).encode()):
                return move
        raise ConflictError(f"alias {name}@{alias}: 1000 concurrent moves in a row won the race; try again")

    def set_alias(self, name: str, alias: str, version: int, *, by: str | None = None) -> AliasMove:
        """Point ``alias`` at ``version`` (set or move it); the move is recorded in its history."""
        check_name(name)
        check_alias(alias)
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ValueError(f"version={version!r}: give a version number (an int from 1)")
        self._version(name, version)  # KeyError when it does not exist
        return self._append_move(name, alias, version, by)

    def delete_alias(self, name: str, alias: str, *, by: str | None = None) -> AliasMove:
        """Remove ``alias`` (its history keeps the removal)."""
        check_name(name)
        check_alias(alias)
        if not self._exists(name):
            raise self._no_model(name)
        return self._append_move(name, alias, None, by, expect_set=True)

    def alias_history(self, name: str, alias: str | None = None) -> list[AliasMove]:
        """Every move of ``alias`` (of every alias when None), oldest first."""
        check_name(name)
        if not self._exists(name):
            raise self._no_model(name)
        aliases = [check_alias(alias)] if alias is not None else self._alias_names(name)
        moves = [self._move(name, a, s) for a in aliases for s in self._entries(name, a)]
        return sorted(moves, key=lambda m: (m.at, m.alias, m.seq))

    # -- writing ----------------------------------------------------------------------------------
    def register(
        self,
        name: str,
        source: Any,
        *,
        model_cls: Any = None,
        loader: Any = None,
        metrics: dict[str, Any] | None = None,
        tags: dict[str, Any] | None = None,
        description: str | None = None,
        alias: str | None = None,
        lineage: dict[str, Any] | None = None,
        by: str | None = None,
        progress: Progress | None = None,
    ) -> ModelVersion:
        """Store ``source`` (a ``Result``, a ``Checkpoint`` or a directory) as the next version of ``name``.

        ``model_cls``: the ``trainforge.model.Model`` class it holds (found in the files when they were
        written by ``Model.save`` or ``ModelTrainer``); or ``loader``: a function (or
        ``"module:function"``) that takes the version's directory and returns the model object.
        ``metrics`` default to a ``Result``'s last numeric metrics. ``lineage`` adds to what is
        recorded (run path, checkpoint path, trial config, trainforge version, git commit). ``alias``
        points that alias at the new version. Files already stored (by any version) are not copied again.
        """
        check_name(name)
        if alias is not None:
            check_alias(alias)
        if description is not None and not isinstance(description, str):
            raise ValueError(f"description={description!r}: give a string (or None)")
        metrics = _json_dict(metrics, "metrics") if metrics is not None else None
        tags = _json_dict(tags, "tags")
        extra_lineage = _json_dict(lineage, "lineage")
        loader_path = self._loader_path(loader)
        with local_source(source) as (directory, auto_lineage, auto_metrics, link):
            files = walk(directory)
            class_name = self._model_class(model_cls, directory, files)
            if class_name is None and loader_path is None and "model.json" in files:
                with contextlib.suppress(Exception):
                    from trainforge._internal.managed.artifact import read_manifest

                    m = read_manifest(directory)
                    class_name = m.get("class") or m.get("class_name")
            from trainforge import __version__

            full_lineage = {**auto_lineage, "trainforge_version": __version__, "git_commit": _git_commit(),
                            **extra_lineage}  # fmt: skip
            manifest = {
                "name": name, "version": None,
                "metrics": metrics if metrics is not None else auto_metrics,
                "tags": tags, "description": description, "model_class": class_name, "loader": loader_path,
                "lineage": full_lineage, "created_at": time.time(), "created_by": by or _who(),
            }  # fmt: skip
            mv = self._store(name, directory, files, manifest, progress, link)
        if alias is not None:
            self.set_alias(name, alias, mv.version, by=by)
        return mv

    @staticmethod
    def _loader_path(loader: Any) -> str | None:
        if loader is None:
            return None
        if isinstance(loader, str):
            if ":" not in loader:
                raise ValueError(f"loader={loader!r}: give 'module:function' (or the function itself)")
            try:
                fn = import_object(loader)
            except (ImportError, AttributeError) as exc:
                raise ValueError(f"loader={loader!r} cannot be imported here: {exc}") from None
            if not callable(fn):
                raise ValueError(f"loader={loader!r} is not a function")
            return loader
        if not callable(loader):
            raise ValueError(f"loader={loader!r}: give a function taking the model's directory (or 'module:function')")
        path = _import_path(loader)
        if path is None:
            raise ValueError(
                f"loader={getattr(loader, '__qualname__', loader)!r} has no import path (it is defined in __main__, "
                "inside a function, or is a lambda): define it in a module, or pass 'module:function'"
            )
        return path

    @staticmethod
    def _model_class(model_cls: Any, directory: str, files: dict[str, str]) -> str | None:
        if model_cls is None:
            return None
        from trainforge._internal.managed.model import is_model_class

        cls: Any = (import_object(model_cls) if ":" in model_cls else None) if isinstance(model_cls, str) else model_cls
        if not is_model_class(cls):
            raise ValueError(f"model_cls={model_cls!r}: give a trainforge.model.Model subclass (or use loader=)")
        if "model.json" not in files:
            raise ValueError(
                f"model_cls={cls.__qualname__}: {directory} holds no model.json, so it was not written by "
                "Model.save() or ModelTrainer; save the model with model.save(directory), or use loader="
            )
        return _import_path(cls) or cls.__qualname__

    def _store(self, name: str, directory: str, files: dict[str, str], manifest: dict[str, Any],
               progress: Progress | None, link: bool = False) -> ModelVersion:  # fmt: skip
        sizes = {rel: os.path.getsize(p) for rel, p in files.items()}
        known = _HashCache.load()
        hashes = {rel: h for rel, p in files.items() if (h := known.get(p)) is not None}
        staged: dict[str, str] = {}  # sha -> a copy (or link) of the file beside the blobs, not yet in place
        try:
            unknown = {rel: p for rel, p in files.items() if rel not in hashes}
            if isinstance(self._b, LocalBackend):
                # Hash and copy each new file at once (on separate threads): the copy is put in place, or
                # dropped when the blob exists, once the hash is known.
                hashes.update(self._hash_and_stage(unknown, staged, link))
            else:
                with _pool(len(unknown)) as pool:
                    hashes.update(zip(unknown, pool.map(sha256_file, unknown.values()), strict=True))
            known.update({files[rel]: h for rel, h in hashes.items()})
            known.save()
            manifest["files"] = {rel: {"sha256": hashes[rel], "size": sizes[rel]} for rel in sorted(files)}
            by_sha = {hashes[rel]: files[rel] for rel in files}
            with self._upload_marker(by_sha):
                present = self._present(by_sha)
                missing = {s: p for s, p in by_sha.items() if s not in present}
                self._put_blobs(missing, progress, staged, link)
                self.last_transfer = {"files_copied": len(missing), "files_skipped": len(by_sha) - len(missing),
                                      "bytes_copied": sum(os.path.getsize(p) for p in missing.values())}  # fmt: skip
                mv = self._commit(name, manifest)
                # A blob this version reuses may have been removed by a gc that ran meanwhile: store it again.
                gone = {s: p for s, p in by_sha.items() if s in present and not self._b.exists(_blob(s))}
                self._put_blobs(gone, None, {}, link)
        finally:
            for tmp in staged.values():
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        return mv

    def _hash_and_stage(self, files: dict[str, str], staged: dict[str, str], link: bool) -> dict[str, str]:
        """The sha256 of each file, each hashed while it is placed beside the blobs (``staged``: sha ->
        that copy, or link: see :func:`~trainforge.registry._source.place`)."""
        if not files:
            return {}
        tmp_dir = self._b.local_path("blobs/sha256")
        assert tmp_dir is not None
        os.makedirs(tmp_dir, exist_ok=True)
        tmps = {rel: os.path.join(tmp_dir, f".tmp-{uuid.uuid4().hex[:12]}") for rel in files}

        def stage(rel: str) -> None:
            place(files[rel], tmps[rel], link=link)

        with _pool(2 * len(files)) as pool:
            copies = {rel: pool.submit(stage, rel) for rel in files}
            digests = {rel: pool.submit(sha256_file, p) for rel, p in files.items()}
            out = {rel: f.result() for rel, f in digests.items()}
            for rel, c in copies.items():
                c.result()
                staged.setdefault(out[rel], tmps[rel])
        for rel, tmp in tmps.items():  # duplicates of one content: one copy is enough
            if staged.get(out[rel]) != tmp:
                os.unlink(tmp)
        return out

    def _present(self, shas: Iterable[str]) -> set[str]:
        shas = list(shas)
        with _pool(len(shas)) as pool:
            return {s for s, ok in zip(shas, pool.map(lambda s: self._b.exists(_blob(s)), shas), strict=True) if ok}

    def _put_blobs(self, blobs: dict[str, str], progress: Progress | None, staged: dict[str, str],
                   link: bool) -> None:  # fmt: skip
        """Store each ``{sha: local file}``: a staged copy is renamed into place; others are placed
        (:func:`~trainforge.registry._source.place`) or uploaded."""
        if not blobs:
            return
        total = sum(os.path.getsize(p) for p in blobs.values())
        done = 0

        def put(item: tuple[str, str]) -> int:
            sha, path = item
            size = os.path.getsize(path)
            target = self._b.local_path(_blob(sha))
            if target is None:
                self._b.put_local(path, _blob(sha))
                return size
            os.makedirs(os.path.dirname(target), exist_ok=True)
            tmp = staged.pop(sha, None)
            if tmp is None:
                tmp = os.path.join(os.path.dirname(target), f".tmp-{uuid.uuid4().hex[:12]}")
                place(path, tmp, link=link)
            os.replace(tmp, target)
            return size

        with _pool(len(blobs)) as pool:
            for n in pool.map(put, blobs.items()):
                done += n
                if progress is not None:
                    progress(done, total, "files")

    @contextlib.contextmanager
    def _upload_marker(self, by_sha: dict[str, str]) -> Iterator[None]:
        marker = f"uploads/{uuid.uuid4().hex}.json"
        self._b.replace(marker, json.dumps({"blobs": sorted(by_sha), "at": time.time()}).encode())
        try:
            yield
        finally:
            self._b.rm(marker)

    def _commit(self, name: str, manifest: dict[str, Any], prefer: int | None = None) -> ModelVersion:
        """Create the manifest under the next free number (``prefer`` when it is free and above every
        number used): the one step that makes the version visible."""
        for _ in range(1000):
            _, highest = self._numbers(name)
            n = prefer if prefer is not None and prefer > highest else highest + 1
            manifest = {**manifest, "version": n}
            if self._b.create(f"{_versions_dir(name)}/{n}.json", json.dumps(manifest, indent=1).encode()):
                self._manifests[(name, n)] = manifest
                return ModelVersion.from_manifest(manifest, self)
            prefer = None
        raise ConflictError(f"model {name!r}: 1000 concurrent registers in a row took the next number; try again")

    def delete_version(self, name: str, version: int, *, force: bool = False, by: str | None = None) -> dict[str, int]:
        """Delete a version: its number is never reused, and its files go unless another version has them.
        A version that aliases point at is refused (``AliasedVersionError``) unless ``force``, which
        removes those aliases too. Returns ``{"blobs_removed", "bytes_freed"}``."""
        mv = self._version(check_name(name), version)
        aliased = sorted(a for a, v in self.get_model(name).aliases.items() if v == version)
        if aliased and not force:
            raise AliasedVersionError(
                f"{mv.uri} is what alias(es) {', '.join(aliased)} point at: move or remove them first, or pass "
                "force=True (--force) to remove them with it"
            )
        for a in aliased:
            self._append_move(name, a, None, by or f"delete_version by {_who()}")
        self._b.replace(f"{_versions_dir(name)}/{version}.deleted",
                        json.dumps({"deleted_at": time.time(), "by": by or _who()}).encode())  # fmt: skip
        self._b.rm(f"{_versions_dir(name)}/{version}.json")
        self._manifests.pop((name, version), None)
        return self._collect({f["sha256"] for f in mv.files.values()})

    def gc(self) -> dict[str, int]:
        """Remove every stored file that no version refers to (and the records of registers that died
        more than a day ago). Returns ``{"blobs_removed", "bytes_freed"}``."""
        return self._collect(None)

    def _collect(self, candidates: set[str] | None) -> dict[str, int]:
        # Blobs are listed before the references: a register that starts later writes its upload
        # marker before it stores (or reuses) a blob, so its blobs are either unlisted or referenced.
        stored = {rel.rsplit("/", 1)[-1]: (rel, size) for rel, size in self._b.find("blobs/sha256").items()}
        if candidates is not None:
            stored = {s: v for s, v in stored.items() if s in candidates}
        if not stored:
            return {"blobs_removed": 0, "bytes_freed": 0}
        referenced = self._referenced()
        removed = freed = 0
        for sha, (rel, size) in sorted(stored.items()):
            if sha not in referenced:
                self._b.rm(f"blobs/sha256/{rel}")
                removed += 1
                freed += size
        return {"blobs_removed": removed, "bytes_freed": freed}

    def _referenced(self) -> set[str]:
        refs: set[str] = set()
        now = time.time()
        for entry in self._b.ls("uploads"):
            try:
                marker = json.loads(self._b.read(f"uploads/{entry}"))
            except (FileNotFoundError, ValueError):
                continue
            if now - float(marker.get("at") or 0) > STALE_UPLOAD_S:
                self._b.rm(f"uploads/{entry}")  # a register that died long ago
                continue
            refs.update(marker.get("blobs") or [])
        for name in self.model_names():
            for n in self._numbers(name)[0]:
                try:
                    refs.update(f["sha256"] for f in self._manifest(name, n, listed=True)["files"].values())
                except FileNotFoundError:  # deleted meanwhile
                    continue
        return refs

    # -- moving files out -------------------------------------------------------------------------
    def _fetch_blob(self, sha: str, dest: str) -> int:
        """Copy the blob to ``dest`` (a local path) whole and verified: IntegrityError when its bytes do
        not hash to ``sha`` (``dest`` is then not created). Returns its size."""
        os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
        part = f"{dest}.part-{uuid.uuid4().hex[:8]}"
        try:
            src = self._b.local_path(_blob(sha))
            if src is not None:
                shutil.copyfile(src, part)  # in the kernel; then what was written is verified
            else:
                self._b.get_local(_blob(sha), part)
            got = sha256_file(part)
            if got != sha:
                raise IntegrityError(
                    f"blob {sha} in registry {self.url} is corrupted (its bytes hash to {got}): restore it from "
                    "another registry (pull_from) or delete the versions that use it"
                )
            os.replace(part, dest)
            return os.path.getsize(dest)
        finally:
            if os.path.exists(part):
                os.unlink(part)

    def pull(self, ref: str | ModelRef | ModelVersion, dest: str | os.PathLike[str] | None = None, *,
             progress: Progress | None = None) -> str:  # fmt: skip
        """Copy a version's files into ``dest`` (a local directory), each verified by its checksum.
        Files already there with the right checksum are kept, so a repeat (or an interrupted) pull
        copies only what is missing. Returns ``dest``; without one, the version's read-only copy in
        the local cache (:meth:`local_dir`)."""
        mv = self._live(ref)
        if dest is None:
            return self.local_dir(mv)
        dest = os.path.abspath(os.fspath(dest))
        os.makedirs(dest, exist_ok=True)
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
        with _pool(len(todo)) as pool:
            for n in pool.map(lambda t: self._fetch_blob(t[1]["sha256"], t[0]), todo):
                done += n
                if progress is not None:
                    progress(done, total, mv.uri)
        self.last_transfer = {"files_copied": len(todo), "bytes_copied": total, "files_skipped": skipped}
        return dest

    def local_dir(self, ref: str | ModelRef | ModelVersion) -> str:
        """A local directory with the version's files, pulled (and verified) once into the cache
        (``$TRAINFORGE_REGISTRY_CACHE``, else ``~/.cache/trainforge/registry``) and reused after.
        Do not modify it. A local registry's files are hard-linked there, not copied."""
        mv = self._live(ref)
        key = hashlib.sha256(self.url.encode()).hexdigest()[:16]
        final = os.path.join(cache_dir(), key, mv.name, str(mv.version))
        if os.path.isdir(final):
            return final
        tmp = f"{final}.tmp-{uuid.uuid4().hex[:8]}"
        try:
            if isinstance(self._b, LocalBackend):
                self._link_version(mv, tmp)
            else:
                self.pull(mv, tmp)
            try:
                os.rename(tmp, final)
            except OSError:
                if not os.path.isdir(final):  # not a concurrent materialization of the same version
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return final

    def _link_version(self, mv: ModelVersion, tmp: str) -> None:
        """Hard-link a local registry's blobs into ``tmp`` (copies across filesystems), verified."""

        def link(item: tuple[str, dict[str, Any]]) -> None:
            rel, f = item
            target = os.path.join(tmp, *rel.split("/"))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            blob = self._b.local_path(_blob(f["sha256"]))
            assert blob is not None
            try:
                os.link(blob, target)
            except FileNotFoundError:
                raise IntegrityError(f"{mv.uri}: its file {rel} (blob {f['sha256']}) is missing from registry "
                                     f"{self.url}; restore it with pull_from another registry") from None  # fmt: skip
            except OSError:
                self._fetch_blob(f["sha256"], target)
                return
            got = sha256_file(target)
            if got != f["sha256"]:
                raise IntegrityError(
                    f"{mv.uri}: its file {rel} (blob {f['sha256']}) in registry {self.url} is corrupted (it hashes "
                    f"to {got}): restore it from another registry (pull_from) or delete the version"
                )

        with _pool(len(mv.files)) as pool:
            list(pool.map(link, mv.files.items()))

    def checkpoint(self, ref: str | ModelRef | ModelVersion) -> Any:
        """The version as a ``trainforge.Checkpoint`` (its local copy: see :meth:`local_dir`)."""
        from trainforge._internal.checkpoint import Checkpoint

        return Checkpoint.from_directory(self.local_dir(ref))

    def load(self, ref: str | ModelRef | ModelVersion) -> Any:
        """The model object of a version, ready for ``model(x)``: its ``loader(directory)``, or its
        ``trainforge.model.Model`` rebuilt with its weights (on the CPU, in eval mode). Loading
        unpickles its files: load only models you trust."""
        mv = self._live(ref)
        directory = self.local_dir(mv)
        if mv.loader:
            try:
                fn = import_object(mv.loader)
            except (ImportError, AttributeError) as exc:
                raise ImportError(f"{mv.uri}: its loader {mv.loader} cannot be imported here ({exc}): install or "
                                  "add to sys.path the module that defines it") from exc  # fmt: skip
            return fn(directory)
        if mv.model_class or os.path.exists(os.path.join(directory, "model.json")):
            from trainforge._internal.managed.artifact import load_model
            from trainforge._internal.managed.model import Model

            return load_model(directory, Model)
        raise ValueError(
            f"{mv.uri} records no way to load it (no model class, no loader): register it with "
            "model_cls=<a trainforge.model.Model class> or loader='module:function', or read its files with "
            "Registry.pull / .checkpoint"
        )

    # -- between registries -----------------------------------------------------------------------
    def push(self, ref: str | ModelRef, to: Registry | str, *, by: str | None = None,
             progress: Progress | None = None) -> list[ModelVersion]:  # fmt: skip
        """Copy a version (``name/3``, ``name@alias``) or a whole model (``name``: every version and
        its aliases) to registry ``to``. Only the files ``to`` lacks are copied, each verified by its
        checksum before it is stored; a version already pushed is not pushed again, so an interrupted
        push resumes. A pushed version keeps its number when ``to`` has not used it. Returns the
        versions in ``to``."""
        dest = to if isinstance(to, Registry) else Registry(to)
        if dest == self:
            raise ValueError(f"push to {dest.url}: that is this registry; give another one")
        r = ref if isinstance(ref, ModelRef) else parse_model_uri(ref)
        whole = r.version is None and r.alias is None
        todo = self.versions(r.name) if whole else [self.get(r)]
        total = sum(mv.size for mv in todo)
        state = {"done": 0}

        def step(n: int) -> None:
            state["done"] += n
            if progress is not None:
                progress(state["done"], total, r.name)

        copied = skipped = nbytes = 0
        out = []
        for mv in todo:
            origin = {"registry": self.url, "name": mv.name, "version": mv.version}
            existing = next((v for v in dest._versions_or_none(mv.name) if v.lineage.get("origin") == origin), None)
            if existing is not None:
                out.append(existing)
                step(mv.size)
                continue
            c, s, b = self._copy_blobs(mv, dest, step)
            copied, skipped, nbytes = copied + c, skipped + s, nbytes + b
            manifest = {k: v for k, v in mv.to_dict().items() if k not in ("uri", "size", "version")}
            manifest["lineage"] = {**mv.lineage, "origin": origin}
            manifest["created_by"] = by or mv.created_by
            out.append(dest._commit(mv.name, manifest, prefer=mv.version))
        if whole:
            mapping = {v.lineage["origin"]["version"]: v.version for v in out}
            current = dest.get_model(r.name).aliases if out else {}
            for a, v in self.get_model(r.name).aliases.items():
                if v in mapping and current.get(a) != mapping[v]:
                    dest.set_alias(r.name, a, mapping[v], by=by)
        dest.last_transfer = self.last_transfer = {"files_copied": copied, "bytes_copied": nbytes,
                                                   "files_skipped": skipped}  # fmt: skip
        return out

    def _versions_or_none(self, name: str) -> list[ModelVersion]:
        try:
            return self.versions(name)
        except KeyError:
            return []

    def _copy_blobs(self, mv: ModelVersion, dest: Registry, step: Callable[[int], None]) -> tuple[int, int, int]:
        shas = {f["sha256"]: f["size"] for f in mv.files.values()}
        with dest._upload_marker({s: "" for s in shas}):
            present = dest._present(shas)
            for s in present:
                step(shas[s])
            missing = [s for s in shas if s not in present]

            def copy(sha: str) -> int:
                local = self._b.local_path(_blob(sha))
                if local is not None:  # verify in place, then upload
                    got = sha256_file(local)
                    if got != sha:
                        raise IntegrityError(f"blob {sha} in registry {self.url} is corrupted (it hashes to {got}); "
                                             "nothing was pushed for it")  # fmt: skip
                    dest._b.put_local(local, _blob(sha))
                    return shas[sha]
                with tempfile.TemporaryDirectory(prefix="trainforge_push_") as tmp:
                    path = os.path.join(tmp, sha)
                    self._fetch_blob(sha, path)
                    dest._b.put_local(path, _blob(sha))
                return shas[sha]

            with _pool(len(missing)) as pool:
                for n in pool.map(copy, missing):
                    step(n)
        return len(missing), len(present), sum(shas[s] for s in missing)

    def pull_from(self, other: Registry | str, ref: str | ModelRef, *, by: str | None = None,
                  progress: Progress | None = None) -> list[ModelVersion]:  # fmt: skip
        """Copy a version or a whole model from registry ``other`` into this one (``other.push(ref, self)``)."""
        src = other if isinstance(other, Registry) else Registry(other)
        return src.push(ref, self, by=by, progress=progress)


@contextlib.contextmanager
def _pool(n: int) -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=max(1, min(8, n, 2 * (os.cpu_count() or 1)))) as pool:
        yield pool


def load_model(uri: str, registry: str | Registry | None = None) -> Any:
    """The model object of ``uri`` (``models:/name@production``...), ready for ``model(x)``, from
    ``registry`` (default: the one the URI names with ``?registry=``, else ``Registry()``)."""
    ref = parse_model_uri(uri)
    reg = registry if isinstance(registry, Registry) else Registry(registry or ref.registry)
    return reg.load(ModelRef(ref.name, ref.version, ref.alias))
