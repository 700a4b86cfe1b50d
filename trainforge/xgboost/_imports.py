"""Import xgboost or say which extra to install."""

from __future__ import annotations

from typing import Any

EXTRA = "pip install 'trainforge[xgboost]'"


def import_xgboost() -> Any:
    try:
        import xgboost
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] == "xgboost":
            raise ImportError(f"trainforge.xgboost needs xgboost, which is not installed: {EXTRA}.") from exc
        raise
    version = tuple(int(part) for part in xgboost.__version__.split(".")[:2] if part.isdigit())
    if version < (2, 1):
        raise ImportError(
            f"trainforge.xgboost needs xgboost >= 2.1 (its collective API), found {xgboost.__version__}: {EXTRA}."
        )
    return xgboost
