"""Import lightgbm or say which extra to install."""

from __future__ import annotations

from types import ModuleType

from trainforge._internal.extras import import_extra


def import_lightgbm() -> ModuleType:
    return import_extra("lightgbm", "lightgbm", "trainforge.lightgbm")
