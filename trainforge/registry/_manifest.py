"""A version's manifest: what a register records besides the files (metrics, tags, description,
lineage, who and when) and how the version's model object is built back (``model_class`` or
``loader``, by import path).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import getpass
import json
import os
import socket
import subprocess
import time
from typing import Any


def who() -> str:
    """``user@host``: who makes a change, when the caller does not say."""
    try:
        user = getpass.getuser()
    except Exception:
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def git_commit() -> str | None:
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


def json_dict(value: Any, field: str) -> dict[str, Any]:
    """``value`` (a dict, or None for {}) as plain JSON data; ValueError naming ``field`` otherwise."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{field}={value!r}: give a dict (or None)")
    try:
        out: dict[str, Any] = json.loads(json.dumps(value))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{field}={value!r} must be JSON (strings, numbers, lists and dicts of them): {exc}") from None
    return out


def _loader_path(loader: Any) -> str | None:
    if loader is None:
        return None
    from trainforge.model import class_path, import_path

    if isinstance(loader, str):
        if ":" not in loader:
            raise ValueError(f"loader={loader!r}: give 'module:function' (or the function itself)")
        try:
            fn = import_path(loader)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"loader={loader!r} cannot be imported here: {exc}") from None
        if not callable(fn):
            raise ValueError(f"loader={loader!r} is not a function")
        return loader
    if not callable(loader):
        raise ValueError(f"loader={loader!r}: give a function taking the model's directory (or 'module:function')")
    path = class_path(loader)
    if path is None:
        raise ValueError(
            f"loader={getattr(loader, '__qualname__', loader)!r} has no import path (it is defined in __main__, "
            "inside a function, or is a lambda): define it in a module, or pass 'module:function'"
        )
    return path


def _model_class(model_cls: Any, directory: str, files: dict[str, str]) -> str | None:
    if model_cls is None:
        return None
    from trainforge.model import class_path, import_path, is_model_class

    cls: Any = (import_path(model_cls) if ":" in model_cls else None) if isinstance(model_cls, str) else model_cls
    if not is_model_class(cls):
        raise ValueError(f"model_cls={model_cls!r}: give a model class (a subclass of trainforge.model.Model, "
                         "XGBoostModel, LightGBMModel or KerasModel), or use loader=")  # fmt: skip
    if "model.json" not in files:
        raise ValueError(
            f"model_cls={cls.__qualname__}: {directory} holds no model.json, so it was not written by "
            "Model.save() or ModelTrainer; save the model with model.save(directory), or use loader="
        )
    return class_path(cls) or cls.__qualname__


@dataclasses.dataclass(frozen=True)
class Given:
    """What a register is given besides its source, checked (:meth:`check`) before the source is read."""

    metrics: dict[str, Any] | None
    tags: dict[str, Any]
    description: str | None
    lineage: dict[str, Any]
    loader: str | None

    @classmethod
    def check(cls, *, metrics: Any, tags: Any, description: Any, lineage: Any, loader: Any) -> Given:
        """ValueError naming the argument that is not what a manifest can hold."""
        if description is not None and not isinstance(description, str):
            raise ValueError(f"description={description!r}: give a string (or None)")
        return cls(metrics=json_dict(metrics, "metrics") if metrics is not None else None,
                   tags=json_dict(tags, "tags"), description=description, lineage=json_dict(lineage, "lineage"),
                   loader=_loader_path(loader))  # fmt: skip

    def manifest(self, name: str, directory: str, files: dict[str, str], *, model_cls: Any,
                 auto_lineage: dict[str, Any], auto_metrics: dict[str, Any], by: str | None) -> dict[str, Any]:  # fmt: skip
        """The manifest of a new version of ``name`` from the source's ``directory`` (its ``files``),
        without its files and number (the blob store and the catalog add them)."""
        class_name = _model_class(model_cls, directory, files)
        saved: dict[str, Any] = {}
        if "model.json" in files:
            with contextlib.suppress(Exception):
                from trainforge.model import read_manifest

                saved = read_manifest(directory)
        if class_name is None and self.loader is None:
            class_name = saved.get("class") or saved.get("class_name")
        from trainforge import __version__

        lineage = {**auto_lineage, "trainforge_version": __version__, "git_commit": git_commit(), **self.lineage}
        return {
            "name": name, "version": None,
            "metrics": self.metrics if self.metrics is not None else auto_metrics,
            "tags": self.tags, "description": self.description, "model_class": class_name, "loader": self.loader,
            "lineage": lineage, "created_at": time.time(), "created_by": by or who(),
            "kind": saved.get("kind") or "trained", "framework": saved.get("framework"),
        }  # fmt: skip


def build(uri: str, directory: str, model_class: str | None, loader: str | None,
          config: dict[str, Any] | None = None) -> Any:  # fmt: skip
    """The model object of version ``uri`` from its files in ``directory``: its ``loader(directory)``,
    or its model class rebuilt with its trained state (torch: on the CPU, in eval mode); for a
    definition, an untrained model from its config updated with ``config``."""
    from trainforge.model import import_path

    if loader:
        if config is not None:
            raise ValueError(f"config={config!r}: {uri} is loaded by its loader {loader}, which takes no config")
        try:
            fn = import_path(loader)
        except (ImportError, AttributeError) as exc:
            raise ImportError(f"{uri}: its loader {loader} cannot be imported here ({exc}): install or "
                              "add to sys.path the module that defines it") from exc  # fmt: skip
        return fn(directory)
    if model_class or os.path.exists(os.path.join(directory, "model.json")):
        from trainforge.model import load_model

        try:
            return load_model(directory, config=config)
        except ValueError as exc:
            raise ValueError(f"{uri}: {exc}") from None
    raise ValueError(
        f"{uri} records no way to load it (no model class, no loader): register it with "
        "model_cls=<a trainforge.model model class> or loader='module:function', or read its files with "
        "Registry.pull / .checkpoint"
    )
