"""Import transformers (and Accelerate, which its ``Trainer`` runs on) or say which extra to install."""

from __future__ import annotations

from typing import Any

EXTRA = "pip install 'trainforge[transformers]'"


def import_transformers() -> Any:
    try:
        import accelerate  # noqa: F401  (transformers' Trainer needs it; fail here, naming the extra)
        import transformers
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing in ("transformers", "accelerate"):
            raise ImportError(
                f"trainforge.huggingface.transformers needs transformers and accelerate, and {missing} is "
                f"not installed: {EXTRA}."
            ) from exc
        raise
    return transformers
