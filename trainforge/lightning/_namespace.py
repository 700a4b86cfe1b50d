"""Which Lightning a user's code runs on: the unified ``lightning`` package (``lightning.pytorch``) or
the standalone ``pytorch_lightning``. They hold separate copies of every class, and a ``Trainer`` of one
rejects a strategy of the other (Ray's #47089), so trainforge builds its classes from the namespace the
user's code uses."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import FrameType, ModuleType
from typing import Any

NAMESPACES = ("lightning.pytorch", "pytorch_lightning")
EXTRA = "pip install 'trainforge[lightning]'"
# Top-level package -> the namespace it belongs to (pytorch_lightning runs on lightning_fabric).
_ROOTS = {
    "lightning": "lightning.pytorch",
    "pytorch_lightning": "pytorch_lightning",
    "lightning_fabric": "pytorch_lightning",
}


def namespace_of(obj: Any) -> str | None:
    """The Lightning namespace of a module, a class, a function or an instance; None if none."""
    if isinstance(obj, ModuleType):
        name = obj.__name__
    elif isinstance(obj, type) or callable(obj):
        name = getattr(obj, "__module__", None) or ""
    else:
        name = getattr(type(obj), "__module__", None) or ""
    return _ROOTS.get(name.split(".", 1)[0]) if isinstance(name, str) else None


def namespaces_in_frame(frame: FrameType | None) -> set[str]:
    """The namespaces the code of ``frame`` refers to: its local and global names bound to Lightning
    modules, classes or functions (``import lightning.pytorch as pl``, ``from pytorch_lightning import
    Trainer``)."""
    found: set[str] = set()
    if frame is None:
        return found
    for scope in (frame.f_locals, frame.f_globals):
        for value in list(scope.values()):
            if isinstance(value, (ModuleType, type)) or callable(value):
                ns = namespace_of(value)
                if ns is not None:
                    found.add(ns)
    return found


def resolve(frame: FrameType | None) -> str:
    """The namespace for a class the code of ``frame`` constructs: the one that code refers to; else
    the only one imported in this process; else the first installed (``lightning`` first, as Ray)."""
    found = namespaces_in_frame(frame)
    if len(found) == 1:
        return found.pop()
    imported = [ns for ns in NAMESPACES if ns in sys.modules and (not found or ns in found)]
    if len(imported) == 1:
        return imported[0]
    for ns in NAMESPACES:
        if ns in imported or _installed(ns):
            return ns
    raise ImportError(
        f"trainforge.lightning needs PyTorch Lightning, which is not installed: {EXTRA} "
        "(or pip install pytorch-lightning)."
    )


def _installed(ns: str) -> bool:
    try:
        return importlib.util.find_spec(ns) is not None
    except ModuleNotFoundError:  # "lightning.pytorch" when "lightning" itself is missing
        return False


def import_namespace(ns: str) -> ModuleType:
    """``lightning.pytorch`` or ``pytorch_lightning``, or ``ImportError`` naming the extra."""
    try:
        return importlib.import_module(ns)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing in ("lightning", "pytorch_lightning", "lightning_fabric"):
            raise ImportError(
                f"trainforge.lightning needs {ns}, which is not installed: {EXTRA} (or pip install "
                f"{'lightning' if ns == 'lightning.pytorch' else 'pytorch-lightning'})."
            ) from exc
        raise


def caller_frame(depth: int) -> FrameType | None:
    try:
        return sys._getframe(depth + 1)
    except ValueError:
        return None
