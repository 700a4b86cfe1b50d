"""The catalog: a registry's records of models, versions and aliases over a :class:`Backend`.

    models/<name>/versions/<n>.json                  version n's manifest: immutable, written last
    models/<name>/versions/<n>.deleted               a deleted version (its number is never reused)
    models/<name>/aliases/<alias>/<seq>.json         the alias's moves, one file each; the last is current

A version becomes visible in one step, the exclusive create of its manifest (:meth:`Catalog.commit`),
so two writers never get one number; an alias move is the exclusive create of the next entry of its
history (:meth:`Catalog.append_move`), so racing moves are all recorded, in one order, and the last
one wins. A manifest's content never changes, so it is kept once read; whether it still exists is
not (another process may delete it).
"""

from __future__ import annotations

import json
import time
from typing import Any

from trainforge.registry._backend import Backend
from trainforge.registry._types import AliasMove, ConflictError, ModelNotFoundError

_RACES = 1000  # exclusive creates lost in a row before giving up


def _versions_dir(name: str) -> str:
    return f"models/{name}/versions"


def _alias_dir(name: str, alias: str) -> str:
    return f"models/{name}/aliases/{alias}"


class Catalog:
    """The model, version and alias records of the registry at ``url`` (for messages)."""

    def __init__(self, backend: Backend, url: str):
        self._b = backend
        self.url = url
        self._manifests: dict[tuple[str, int], dict[str, Any]] = {}

    # -- models and versions --------------------------------------------------------------------
    def names(self) -> list[str]:
        """Every model's name, sorted."""
        return sorted(n for n in self._b.ls("models") if not n.startswith("."))

    def exists(self, name: str) -> bool:
        """Whether ``name`` has any record (a version, a deleted one, an alias)."""
        return bool(self._b.ls(f"models/{name}"))

    def numbers(self, name: str) -> tuple[list[int], int]:
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

    def manifest(self, name: str, version: int, *, listed: bool = False) -> dict[str, Any]:
        """Version ``version``'s manifest; FileNotFoundError when it does not exist (any more). A kept
        one costs one ``exists``, skipped when ``listed`` (the caller has just seen it in a listing)."""
        path = f"{_versions_dir(name)}/{version}.json"
        manifest = self._manifests.get((name, version))
        if manifest is None:
            manifest = self._manifests[(name, version)] = json.loads(self._b.read(path))
        elif not listed and not self._b.exists(path):
            self._manifests.pop((name, version), None)
            raise FileNotFoundError(path)
        return manifest

    def commit(self, name: str, manifest: dict[str, Any], prefer: int | None = None) -> dict[str, Any]:
        """Create the manifest under the next free number (``prefer`` when it is free and above every
        number used): the one step that makes the version visible. Returns it, numbered."""
        for _ in range(_RACES):
            _, highest = self.numbers(name)
            n = prefer if prefer is not None and prefer > highest else highest + 1
            manifest = {**manifest, "version": n}
            if self._b.create(f"{_versions_dir(name)}/{n}.json", json.dumps(manifest, indent=1).encode()):
                self._manifests[(name, n)] = manifest
                return manifest
            prefer = None
        raise ConflictError(f"model {name!r}: {_RACES} concurrent registers in a row took the next number; try again")

    def delete(self, name: str, version: int, by: str) -> None:
        """Mark the version deleted (its number stays used), then remove its manifest."""
        self._b.replace(f"{_versions_dir(name)}/{version}.deleted",
                        json.dumps({"deleted_at": time.time(), "by": by}).encode())  # fmt: skip
        self._b.rm(f"{_versions_dir(name)}/{version}.json")
        self._manifests.pop((name, version), None)

    def referenced(self) -> set[str]:
        """The sha256 of every file of every live version."""
        refs: set[str] = set()
        for name in self.names():
            for n in self.numbers(name)[0]:
                try:
                    refs.update(f["sha256"] for f in self.manifest(name, n, listed=True)["files"].values())
                except FileNotFoundError:  # deleted meanwhile
                    continue
        return refs

    # -- aliases --------------------------------------------------------------------------------
    def alias_names(self, name: str) -> list[str]:
        return sorted(self._b.ls(f"models/{name}/aliases"))

    def entries(self, name: str, alias: str) -> list[int]:
        """The sequence numbers of the alias's moves, oldest first."""
        return sorted(int(e[:-5]) for e in self._b.ls(_alias_dir(name, alias)) if e.endswith(".json") and e[:-5].isdigit())

    def move(self, name: str, alias: str, seq: int) -> AliasMove:
        d = json.loads(self._b.read(f"{_alias_dir(name, alias)}/{seq:010d}.json"))
        return AliasMove(alias=alias, from_version=d.get("from_version"), to_version=d.get("to_version"),
                         at=float(d.get("at") or 0.0), by=d.get("by"), seq=seq)  # fmt: skip

    def last_move(self, name: str, alias: str) -> AliasMove | None:
        entries = self.entries(name, alias)
        return self.move(name, alias, entries[-1]) if entries else None

    def append_move(self, name: str, alias: str, to_version: int | None, by: str,
                    expect_set: bool = False) -> AliasMove:  # fmt: skip
        """Record the alias's next move (``to_version`` None: removed); ``expect_set``: only if it is
        set now (ModelNotFoundError otherwise)."""
        for _ in range(_RACES):
            entries = self.entries(name, alias)
            seq = entries[-1] + 1 if entries else 1
            current = self.move(name, alias, entries[-1]).to_version if entries else None
            if expect_set and current is None:
                raise ModelNotFoundError(f"model {name!r} has no alias {alias!r} in registry {self.url}")
            move = AliasMove(alias=alias, from_version=current, to_version=to_version, at=time.time(), by=by, seq=seq)
            body = {k: v for k, v in move.to_dict().items() if k != "seq"}
            if self._b.create(f"{_alias_dir(name, alias)}/{seq:010d}.json", json.dumps(body).encode()):
                return move
        raise ConflictError(f"alias {name}@{alias}: {_RACES} concurrent moves in a row won the race; try again")

    def aliases(self, name: str) -> list[AliasMove]:
        """The last move of each alias of ``name`` (removed ones included: ``to_version`` None)."""
        return [m for m in (self.last_move(name, a) for a in self.alias_names(name)) if m is not None]
