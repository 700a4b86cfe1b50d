"""What the model object's hooks take and give: batches of (*features, target), step outputs (a loss
or a dict of metrics, and how many samples they cover), and the loop's reserved names."""

from __future__ import annotations

from typing import Any

from trainforge.model._config import NUM_SAMPLES
from trainforge.model._support import torch_module


def low_precision() -> tuple[Any, ...]:
    torch = torch_module()
    return (torch.float16, torch.bfloat16)


def as_list(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def like(items: list[Any], original: Any) -> Any:
    """``items`` in the shape of ``original``: one object, a tuple or a list."""
    if isinstance(original, tuple):
        return tuple(items)
    if isinstance(original, list):
        return items
    return items[0] if items else None


def supervised(batch: Any, hook: str, hook_args: str = "batch, batch_idx") -> Any:
    """``batch`` when it is ``(*features, target)``, for the default ``hook``; otherwise a ValueError
    that says to write one's own ``hook(hook_args)`` (the RaySGD operator's hooks take ``batch,
    batch_info``)."""
    if not isinstance(batch, (tuple, list)) or len(batch) < 2:
        raise ValueError(
            f"the default {hook} takes (*features, target) batches, got {type(batch).__name__}; write your "
            f"own {hook}({hook_args}) for other batches."
        )
    return batch


def is_classification(torch: Any, output: Any, target: Any) -> bool:
    return (
        isinstance(output, torch.Tensor) and isinstance(target, torch.Tensor) and output.dim() == 2
        and output.size(1) > 1 and target.dim() == 1 and not target.is_floating_point()
    )  # fmt: skip


def batch_size_of(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor (1 if it has none)."""
    torch = torch_module()
    stack = [batch]
    while stack:
        item = stack.pop(0)
        if isinstance(item, torch.Tensor):
            return int(item.shape[0]) if item.dim() > 0 else 1
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return 1


def split_step_output(out: Any, batch: Any, hook: str) -> tuple[Any, dict[str, Any], int]:
    torch = torch_module()
    if isinstance(out, torch.Tensor):
        metrics: dict[str, Any] = {"loss": out}
    elif isinstance(out, dict):
        metrics = dict(out)
    else:
        raise ValueError(f"{hook} returned {out!r}: return a loss tensor or a dict of metrics.")
    n = metrics.pop(NUM_SAMPLES, None)
    if n is None:
        n = batch_size_of(batch)
    loss = metrics.get("loss")
    if not isinstance(loss, torch.Tensor):
        loss = None
    return loss, metrics, int(n)


def prefixed(metrics: dict[str, Any], prefix: str) -> dict[str, Any]:
    return {k if k.startswith(prefix) else prefix + k: v for k, v in metrics.items()}
