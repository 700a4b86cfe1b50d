"""Import lightgbm or say which extra to install."""

from __future__ import annotations

from typing import Any

EXTRA = "pip install 'trainforge[lightgbm]'"


def import_lightgbm() -> Any:
    try:
        import lightgbm
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] == "lightgbm":
            raise ImportError(f"trainforge.lightgbm needs lightgbm, which is not installed: {EXTRA}.") from exc
        raise
    return lightgbm
