"""Optional dependencies, checked in one place: a missing one raises ``ImportError`` that names the
extra to install (``pip install 'trainforge[xgboost]'``), as Accelerate's ``is_<pkg>_available``
checks do.

    require("lightgbm", "lightgbm", "LightGBMTrainer")     # installed? (without importing it)
    xgboost = import_extra("xgboost", "xgboost", "trainforge.xgboost", min_version=(2, 1))
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType


def install_hint(extra: str) -> str:
    return f"pip install 'trainforge[{extra}]'"


def require(module: str, extra: str, what: str) -> None:
    """Raise ImportError naming the extra to install if ``module`` is not installed, without importing
    it (a run's driver need not pay for a framework its workers import; a sink imports its library
    on its own thread)."""
    if sys.modules.get(module) is not None:
        return
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ImportError(f"{what} needs {module}: {install_hint(extra)} (it is not installed)")


def import_extra(module: str, extra: str, what: str, *, min_version: tuple[int, ...] | None = None) -> ModuleType:
    """``import module``, or ImportError naming the extra (and the version needed, with
    ``min_version``). An ImportError from inside the module (one of its own dependencies) is raised
    as it is."""
    try:
        imported = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] == module.split(".")[0]:
            raise ImportError(f"{what} needs {module}: {install_hint(extra)} (it is not installed)") from exc
        raise
    if min_version is not None:
        version = getattr(imported, "__version__", "0")
        found = tuple(int(part) for part in version.split(".")[: len(min_version)] if part.isdigit())
        if found < min_version:
            wanted = ".".join(str(v) for v in min_version)
            raise ImportError(f"{what} needs {module} >= {wanted}, found {version}: {install_hint(extra)}.")
    return imported


def import_xgboost() -> ModuleType:
    """xgboost (>= 2.1, for its collective API), or ImportError naming the extra."""
    return import_extra("xgboost", "xgboost", "trainforge.xgboost", min_version=(2, 1))


def import_lightgbm() -> ModuleType:
    """lightgbm, or ImportError naming the extra."""
    return import_extra("lightgbm", "lightgbm", "trainforge.lightgbm")
