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

The parts, each over the registry's :class:`~trainforge.registry._backend.Backend`: ``_catalog``
(``models/``: versions and aliases), ``_blobs`` (``blobs/`` and ``uploads/``: store, verify, gc),
``_transfer`` (pull, push), ``_cache`` (this machine's copies and file hashes), ``_manifest`` (what
a version records and how its model is built), ``_source`` (reading what is registered). This
module is the facade that checks arguments, explains misses and puts them together.
"""

from __future__ import annotations

import os
from typing import Any

from trainforge.registry import _definitions as definitions
from trainforge.registry._backend import Backend, open_backend
from trainforge.registry._blobs import BlobStore, Progress
from trainforge.registry._cache import local_copy
from trainforge.registry._catalog import Catalog
from trainforge.registry._manifest import Given, build, who
from trainforge.registry._source import local_source, walk
from trainforge.registry._transfer import pull, push
from trainforge.registry._types import (
    AliasedVersionError,
    AliasMove,
    ModelNotFoundError,
    ModelVersion,
    RegisteredModel,
)
from trainforge.registry._uri import ModelRef, check_alias, check_name, parse_model_uri

ENV_REGISTRY = "TRAINFORGE_REGISTRY"


def default_registry_url() -> str:
    """``$TRAINFORGE_REGISTRY``, else ``~/trainforge/registry``."""
    return os.environ.get(ENV_REGISTRY) or os.path.join(os.path.expanduser("~"), "trainforge", "registry")


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

    Models by reference: ``reg.put(MyModel, "digits-net", config=..., hyperparameter_space=...)``
    registers a *definition* (``kind == "definition"``: the class, its default config and search space,
    no weights); ``ModelTrainer("models:/digits-net")``, ``Tuner("models:/digits-net")`` and
    ``trainforge train models:/digits-net`` train it, and a version registered from such a run records
    it in ``lineage["definition"]`` (:meth:`lineage`).
    """

    def __init__(self, uri: str | os.PathLike[str] | None = None):
        if uri is not None and not isinstance(uri, (str, os.PathLike)):
            raise TypeError(f"Registry(uri={uri!r}): give a directory or a URL such as 's3://bucket/registry'")
        self.uri = os.fspath(uri) if uri is not None else default_registry_url()
        if not self.uri:
            raise ValueError("Registry(uri=''): give a directory or a URL such as 's3://bucket/registry'")
        self._b: Backend = open_backend(self.uri)
        self._catalog = Catalog(self._b, self._b.url)
        self._blobs = BlobStore(self._b, self._b.url)
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
    def _version(self, name: str, version: int, *, listed: bool = False) -> ModelVersion:
        try:
            return ModelVersion.from_manifest(self._catalog.manifest(name, version, listed=listed), self)
        except FileNotFoundError:
            live, _ = self._catalog.numbers(name)
            if not live and not self._catalog.exists(name):
                raise self._no_model(name) from None
            raise ModelNotFoundError(
                f"model {name!r} has no version {version} in registry {self.url} (its versions: {live or 'none'})"
            ) from None

    def _no_model(self, name: str) -> ModelNotFoundError:
        known = self.model_names()
        hint = f"its models: {known}" if known else "it has no models yet: register one with Registry.register()"
        return ModelNotFoundError(f"no model {name!r} in registry {self.url} ({hint})")

    def _check_model(self, name: str) -> None:
        """ModelNotFoundError (saying what exists) unless ``name`` has any record."""
        if not self._catalog.exists(name):
            raise self._no_model(name)

    def model_names(self) -> list[str]:
        return self._catalog.names()

    def list_models(self) -> list[RegisteredModel]:
        """Every model of the registry, by name."""
        return [self.get_model(n) for n in self.model_names()]

    def get_model(self, name: str) -> RegisteredModel:
        """One model: its latest version, number of versions, aliases and the latest version's tags."""
        check_name(name)
        live, highest = self._catalog.numbers(name)
        if not highest:
            self._check_model(name)
        latest = self._version(name, live[-1], listed=True) if live else None
        moves = self._catalog.aliases(name)
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
        live, highest = self._catalog.numbers(name)
        if not highest:
            self._check_model(name)
        return [self._version(name, n, listed=True) for n in live]

    def get(self, ref: str | ModelRef, *, kind: str | None = None) -> ModelVersion:
        """The version ``ref`` names (``name/3``, ``name@alias``, ``name`` for the latest; with or without
        ``models:/``). ``KeyError`` (``ModelNotFoundError``) says what exists when it names nothing.
        ``kind`` (``"trained"`` or ``"definition"``): ``name`` is then the latest version of that kind."""
        r = ref if isinstance(ref, ModelRef) else parse_model_uri(ref)
        if kind not in (None, definitions.TRAINED, definitions.DEFINITION):
            raise ValueError(f"kind={kind!r}: give 'trained', 'definition' or None (any)")
        if r.registry is not None and (other := Registry(r.registry)) != self:
            return other.get(ModelRef(r.name, r.version, r.alias), kind=kind)
        if kind is not None and r.version is None and r.alias is None:
            return definitions.latest_of_kind(self, r.name, kind)
        if r.version is not None:
            return self._version(r.name, r.version)
        if r.alias is not None:
            move = self._catalog.last_move(r.name, r.alias)
            if move is None or move.to_version is None:
                self._check_model(r.name)
                current = self.get_model(r.name).aliases
                raise ModelNotFoundError(
                    f"model {r.name!r} has no alias {r.alias!r} in registry {self.url} (its aliases: "
                    f"{current or 'none'}); set it with Registry.set_alias or `trainforge models alias set`"
                )
            return self._version(r.name, move.to_version)
        live, highest = self._catalog.numbers(r.name)
        if not live:
            if not highest:
                self._check_model(r.name)
            raise ModelNotFoundError(f"model {r.name!r} has no versions left in registry {self.url}")
        return self._version(r.name, live[-1], listed=True)

    def _live(self, ref: str | ModelRef | ModelVersion) -> ModelVersion:
        """The version ``ref`` names; a ``ModelVersion`` in hand is checked too (deleted since?)."""
        if isinstance(ref, ModelVersion):
            self._version(ref.name, ref.version)  # ModelNotFoundError when it was deleted since
            return ref
        return self.get(ref)

    # -- aliases ----------------------------------------------------------------------------------
    def set_alias(self, name: str, alias: str, version: int, *, by: str | None = None) -> AliasMove:
        """Point ``alias`` at ``version`` (set or move it); the move is recorded in its history."""
        check_name(name)
        check_alias(alias)
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ValueError(f"version={version!r}: give a version number (an int from 1)")
        self._version(name, version)  # KeyError when it does not exist
        return self._catalog.append_move(name, alias, version, by or who())

    def delete_alias(self, name: str, alias: str, *, by: str | None = None) -> AliasMove:
        """Remove ``alias`` (its history keeps the removal)."""
        check_name(name)
        check_alias(alias)
        self._check_model(name)
        return self._catalog.append_move(name, alias, None, by or who(), expect_set=True)

    def alias_history(self, name: str, alias: str | None = None) -> list[AliasMove]:
        """Every move of ``alias`` (of every alias when None), oldest first."""
        check_name(name)
        self._check_model(name)
        aliases = [check_alias(alias)] if alias is not None else self._catalog.alias_names(name)
        moves = [self._catalog.move(name, a, s) for a in aliases for s in self._catalog.entries(name, a)]
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
        given = Given.check(metrics=metrics, tags=tags, description=description, lineage=lineage, loader=loader)
        with local_source(source) as (directory, auto_lineage, auto_metrics, link):
            files = walk(directory)
            manifest = given.manifest(name, directory, files, model_cls=model_cls, auto_lineage=auto_lineage,
                                      auto_metrics=auto_metrics, by=by)  # fmt: skip

            def commit(entries: dict[str, dict[str, Any]], counts: dict[str, int]) -> ModelVersion:
                self.last_transfer = counts
                return ModelVersion.from_manifest(self._catalog.commit(name, {**manifest, "files": entries}), self)

            mv = self._blobs.add(files, link=link, progress=progress, commit=commit)
        if alias is not None:
            self.set_alias(name, alias, mv.version, by=by)
        return mv

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
            self._catalog.append_move(name, a, None, by or f"delete_version by {who()}")
        self._catalog.delete(name, version, by or who())
        return self._blobs.collect({f["sha256"] for f in mv.files.values()}, self._catalog.referenced)

    def gc(self) -> dict[str, int]:
        """Remove every stored file that no version refers to (and the records of registers that died
        more than a day ago). Returns ``{"blobs_removed", "bytes_freed"}``."""
        return self._blobs.collect(None, self._catalog.referenced)

    # -- moving files out -------------------------------------------------------------------------
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
        self.last_transfer = pull(self._blobs, mv, dest, progress)
        return dest

    def local_dir(self, ref: str | ModelRef | ModelVersion) -> str:
        """A local directory with the version's files, pulled (and verified) once into the cache
        (``$TRAINFORGE_REGISTRY_CACHE``, else ``~/.cache/trainforge/registry``) and reused after.
        Do not modify it. A local registry's files are hard-linked there, not copied."""
        mv = self._live(ref)

        def fill(tmp: str) -> None:
            if self._blobs.is_local:
                self._blobs.link_into(mv.files, tmp, mv.uri)
            else:
                self.pull(mv, tmp)

        return local_copy(self.url, mv.name, mv.version, fill)

    def checkpoint(self, ref: str | ModelRef | ModelVersion) -> Any:
        """The version as a ``trainforge.Checkpoint`` (its local copy: see :meth:`local_dir`)."""
        from trainforge import Checkpoint

        return Checkpoint.from_directory(self.local_dir(ref))

    def load(self, ref: str | ModelRef | ModelVersion, *, config: dict[str, Any] | None = None) -> Any:
        """The model object of a version, ready for ``model(x)``: its ``loader(directory)``, or its model
        class rebuilt with its trained state (torch: on the CPU, in eval mode). For a definition, an
        untrained model built from its default config updated with ``config`` (refused for a trained
        version). Loading unpickles its files: load only models you trust."""
        mv = self._live(ref)
        return build(mv.uri, self.local_dir(mv), mv.model_class, mv.loader, config)

    # -- models by reference ----------------------------------------------------------------------
    def put(self, model_cls: Any, name: str, *, config: dict[str, Any] | None = None,
            hyperparameter_space: dict[str, Any] | None = None, data: Any = None, by_value: bool = False,
            description: str | None = None, tags: dict[str, Any] | None = None, alias: str | None = None,
            by: str | None = None) -> ModelVersion:  # fmt: skip
        """Register ``model_cls`` as a definition: the next version of ``name``, of ``kind ==
        "definition"`` (its ``uri``, ``models:/name/N``, is what ``ModelTrainer``, ``Tuner``,
        ``load_model`` and ``trainforge train`` take). Stored: the class by import path (and pickled by
        value with ``by_value=True``, or when it has none: a class defined in a notebook), its default
        ``config``, its search space (``hyperparameter_space``, default the class's
        ``hyperparameter_space()``) and a default ``Data`` (``data``); no weights.

        Example::

            ref = Registry().put(DigitsNet, "digits-net", config={"lr": 1e-3, "batch_size": 64})
            ModelTrainer(ref.uri, data=DigitsData).fit()
        """
        return definitions.put(self, model_cls, name, config=config, hyperparameter_space=hyperparameter_space,
                               data=data, by_value=by_value, description=description, tags=tags, alias=alias,
                               by=by)  # fmt: skip

    def definition(self, ref: str | ModelRef) -> Any:
        """The ``trainforge.model.ModelDefinition`` ``ref`` names (``name``: its latest definition)."""
        return definitions.definition(self, ref)

    def lineage(self, name: str) -> list[dict[str, Any]]:
        """``name``'s definitions -> the runs trained from each -> the versions registered from each run
        (under any model name of this registry) -> the aliases pointing at them (what is served)."""
        return definitions.lineage(self, name)

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
        manifests, counts = push(todo, self._blobs, dest._blobs, dest._catalog, by=by, progress=progress,
                                 what=r.name)  # fmt: skip
        out = [ModelVersion.from_manifest(m, dest) for m in manifests]
        if whole:
            mapping = {v.lineage["origin"]["version"]: v.version for v in out}
            current = dest.get_model(r.name).aliases if out else {}
            for a, v in self.get_model(r.name).aliases.items():
                if v in mapping and current.get(a) != mapping[v]:
                    dest.set_alias(r.name, a, mapping[v], by=by)
        dest.last_transfer = self.last_transfer = counts
        return out

    def pull_from(self, other: Registry | str, ref: str | ModelRef, *, by: str | None = None,
                  progress: Progress | None = None) -> list[ModelVersion]:  # fmt: skip
        """Copy a version or a whole model from registry ``other`` into this one (``other.push(ref, self)``)."""
        src = other if isinstance(other, Registry) else Registry(other)
        return src.push(ref, self, by=by, progress=progress)


def load_model(uri: str, registry: str | Registry | None = None, *, config: dict[str, Any] | None = None) -> Any:
    """The model object of ``uri`` (``models:/name@production``...), ready for ``model(x)``, from
    ``registry`` (default: the one the URI names with ``?registry=``, else ``Registry()``). For a
    definition (``Registry.put``), an untrained model built from its default config updated with
    ``config``."""
    ref = parse_model_uri(uri)
    reg = registry if isinstance(registry, Registry) else Registry(registry or ref.registry)
    return reg.load(ModelRef(ref.name, ref.version, ref.alias), config=config)
