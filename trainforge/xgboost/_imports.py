"""Import xgboost (>= 2.1, for its collective API) or say which extra to install."""

from __future__ import annotations

from types import ModuleType

from trainforge._internal.extras import import_extra


def import_xgboost() -> ModuleType:
    return import_extra("xgboost", "xgboost", "trainforge.xgboost", min_version=(2, 1))
