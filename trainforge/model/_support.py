"""Small helpers the model object, its artifacts and the loop share (no import of ``Model`` here, so
``_artifact`` and ``_model`` do not import each other)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainforge.model._model import Model


def torch_module() -> Any:
    """``torch``, or an ImportError naming the extra to install."""
    try:
        import torch
    except ImportError as exc:
        raise ImportError(
            "trainforge.model needs PyTorch, which is not installed: pip install 'trainforge[torch]' "
            "(or install the torch build for your platform first)."
        ) from exc
    return torch


def bind_and_init(model_cls: type[Model], config: dict[str, Any], ctx: Any) -> Model:
    """A ``model_cls(config)`` whose ``register`` already sees the loop's context ``ctx``."""
    obj = model_cls.__new__(model_cls)
    obj.__dict__["_tf_ctx"] = ctx
    obj.__init__(config)  # type: ignore[misc]
    obj._tf_ctx = ctx
    return obj


def unwrap(module: Any) -> Any:
    """The network inside a DistributedDataParallel (or similar) wrapper."""
    return getattr(module, "module", module)
