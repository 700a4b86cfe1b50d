"""What the registry returns: ``ModelVersion`` (one immutable version), ``RegisteredModel`` (a name, its
latest version and aliases), ``AliasMove`` (one entry of an alias's history), and its errors.

The registry's errors, one tree (``except RegistryError`` catches each; the second base, when there is
one, lets code that catches the builtin go on working)::

    RegistryError
    ├── ModelNotFoundError (KeyError)    no such model, version or alias (a deleted version included)
    ├── ConflictError                    a change refused: it would break what the registry promises
    │   └── AliasedVersionError          deleting a version that aliases point at
    ├── IntegrityError (OSError)         a stored file does not match its checksum
    └── SymlinkError (ValueError)        a source to register holds a symbolic link

Arguments of the wrong type or value raise ``TypeError`` / ``ValueError`` as everywhere in trainforge;
storage that fails raises ``trainforge``'s ``StorageError`` (remote) or ``OSError`` (local disk).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from trainforge import Checkpoint


class VersionHome(Protocol):
    """What a :class:`ModelVersion` asks of the registry it came from (a ``Registry``)."""

    def checkpoint(self, ref: ModelVersion) -> Checkpoint: ...


class RegistryError(Exception):
    """Base of the registry's own errors."""


class ModelNotFoundError(RegistryError, KeyError):
    """No such model, version or alias (a ``KeyError`` too; its message says what exists)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ConflictError(RegistryError):
    """The registry refused a change that would break what it promises (e.g. a version's number is
    taken by another writer too many times in a row)."""


class AliasedVersionError(ConflictError):
    """``delete_version`` of a version that aliases point at (move or remove them, or pass ``force=True``)."""


class IntegrityError(RegistryError, OSError):
    """A stored file does not match its checksum (a corrupted or truncated blob)."""


class SymlinkError(RegistryError, ValueError):
    """A source to register holds a symbolic link (to a file or a directory, inside the source or out):
    the registry stores regular files only and never follows a link; the message names the link and
    where it points."""


@dataclasses.dataclass(frozen=True)
class ModelVersion:
    """One registered version. Immutable: its files (``{path: {"sha256", "size"}}``) never change.

    ``lineage``: where it came from (``run_path``, ``checkpoint_path``, ``trial_config``,
    ``trainforge_version``, ``git_commit``, and ``origin`` for a pushed copy). ``model_class``
    (``"module:Class"`` of a ``trainforge.model.Model``) or ``loader`` (``"module:function"``, called
    with the version's local directory) say how :meth:`Registry.load` builds it. ``uri`` is
    ``models:/name/<version>`` (also its ``str()``). ``checkpoint`` is the version as a
    ``trainforge.Checkpoint`` (a local copy, pulled and verified on first use), accepted wherever a
    checkpoint is. ``kind``: ``"trained"`` (a trained model's files) or ``"definition"`` (a model
    class with its default config and search space, no weights: ``Registry.put``); a version trained
    from a definition names it in ``lineage["definition"]``. ``framework``: the model's (``torch``,
    ``xgboost``, ``lightgbm``, ``keras``) when its files are a model directory.
    """

    name: str
    version: int
    files: dict[str, dict[str, Any]]
    size: int
    metrics: dict[str, Any]
    tags: dict[str, Any]
    description: str | None
    model_class: str | None
    loader: str | None
    lineage: dict[str, Any]
    created_at: float
    created_by: str | None
    kind: str = "trained"
    framework: str | None = None
    registry: VersionHome | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def uri(self) -> str:
        return f"models:/{self.name}/{self.version}"

    def __str__(self) -> str:
        return self.uri

    @property
    def checkpoint(self) -> Checkpoint:
        if self.registry is None:
            raise RuntimeError(f"{self.uri} is not attached to a registry: get it with Registry(...).get(...)")
        return self.registry.checkpoint(self)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "registry"}
        out["uri"] = self.uri
        return out

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any], registry: VersionHome | None) -> ModelVersion:
        files: dict[str, dict[str, Any]] = {
            str(k): {"sha256": str(v["sha256"]), "size": int(v["size"])} for k, v in manifest["files"].items()
        }
        return cls(
            name=str(manifest["name"]), version=int(manifest["version"]), files=files,
            size=sum(f["size"] for f in files.values()), metrics=dict(manifest.get("metrics") or {}),
            tags=dict(manifest.get("tags") or {}), description=manifest.get("description"),
            model_class=manifest.get("model_class"), loader=manifest.get("loader"),
            lineage=dict(manifest.get("lineage") or {}), created_at=float(manifest.get("created_at") or 0.0),
            created_by=manifest.get("created_by"), kind=str(manifest.get("kind") or "trained"),
            framework=manifest.get("framework"), registry=registry,
        )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class RegisteredModel:
    """A model name: ``latest_version`` (None when every version was deleted), ``num_versions``, its
    ``aliases`` ``{alias: version}``, ``updated_at`` (the newest version or alias move) and the
    ``tags`` and ``description`` of its latest version."""

    name: str
    latest_version: int | None
    num_versions: int
    aliases: dict[str, int]
    updated_at: float
    tags: dict[str, Any]
    description: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class AliasMove:
    """One move of an alias: ``from_version`` None when it was set for the first time, ``to_version``
    None when it was removed; ``at`` (epoch seconds) and ``by`` (who)."""

    alias: str
    from_version: int | None
    to_version: int | None
    at: float
    by: str | None
    seq: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
