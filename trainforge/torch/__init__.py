"""PyTorch integration (``ray.train.torch`` equivalent).

``import trainforge.torch`` does not import torch: the train-loop helpers load it on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainforge._internal.torch.config import TorchConfig
from trainforge._internal.torch.trainer import TorchTrainer

if TYPE_CHECKING:
    import torch

__all__ = [
    "TorchTrainer", "TorchConfig", "prepare_model", "prepare_data_loader", "get_device", "accelerate",
    "prepare_optimizer", "backward",
]  # fmt: skip


def _utils() -> Any:
    try:
        from trainforge._internal.torch import train_loop_utils
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.split(".")[0] == "torch":
            raise ImportError(
                "trainforge.torch needs PyTorch, which is not installed: pip install 'trainforge[torch]'."
            ) from exc
        raise
    return train_loop_utils


def prepare_model(
    model: torch.nn.Module,
    move_to_device: Any = True,
    parallel_strategy: str | None = "ddp",
    parallel_strategy_kwargs: dict[str, Any] | None = None,
) -> torch.nn.Module:
    """Move ``model`` to this worker's device and wrap it in DistributedDataParallel (or FSDP) when
    there is more than one worker. See ``trainforge._internal.torch.train_loop_utils.prepare_model``."""
    return _utils().prepare_model(model, move_to_device, parallel_strategy, parallel_strategy_kwargs)


def prepare_data_loader(
    data_loader: Any, add_dist_sampler: bool = True, move_to_device: bool = True, auto_transfer: bool = True
) -> Any:
    """Give each worker its share of ``data_loader`` (a DistributedSampler) and move batches to its
    device. Call ``loader.sampler.set_epoch(epoch)`` each epoch to reshuffle."""
    return _utils().prepare_data_loader(data_loader, add_dist_sampler, move_to_device, auto_transfer)


def get_device() -> torch.device:
    """This worker's device: its GPU when it has one (``cuda:0``), else ``cpu``."""
    return _utils().get_device()


def _amp() -> Any:
    _utils()  # the ImportError naming the extra when torch is missing
    from trainforge._internal.torch import amp

    return amp


def accelerate(amp: bool = False, amp_dtype: Any = None) -> None:
    """Mixed precision for this worker's loop (call once, before ``prepare_model``): ``amp=True`` runs
    the model's forward under autocast, float16 with a gradient scaler on a GPU, bfloat16 on the CPU
    (``amp_dtype="float16"|"bfloat16"`` to choose). Use :func:`prepare_optimizer` and :func:`backward`
    so the scaler is applied. See ``trainforge._internal.torch.amp``.

    Example::

        trainforge.torch.accelerate(amp=True)
        model = trainforge.torch.prepare_model(model)
        optimizer = trainforge.torch.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        loss = loss_fn(model(x), y)
        optimizer.zero_grad()
        trainforge.torch.backward(loss)
        optimizer.step()
    """
    _amp().accelerate(amp, amp_dtype)


def prepare_optimizer(optimizer: torch.optim.Optimizer) -> Any:
    """``optimizer`` for mixed precision: its ``step()`` unscales the gradients and skips a step with
    inf/NaN gradients when a gradient scaler is in use; otherwise the optimizer itself."""
    return _amp().prepare_optimizer(optimizer)


def backward(tensor: torch.Tensor) -> None:
    """``tensor.backward()``, scaled by the gradient scaler when mixed precision uses one."""
    _amp().backward(tensor)
