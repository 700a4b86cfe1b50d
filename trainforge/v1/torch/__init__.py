"""Ray Train 1.x's PyTorch helpers (``ray.train.torch`` -> ``trainforge.v1.torch``), on
``trainforge.torch``'s. ``import trainforge.v1.torch`` does not import torch.

    1.x                                                      here
    prepare_model(model, move_to_device, wrap_ddp, ddp_kwargs)  trainforge.torch.prepare_model(model,
                                                             move_to_device, "ddp" or None, ddp_kwargs)
    prepare_data_loader(loader, add_dist_sampler, move_to_device, auto_transfer)   the same
    get_device(), accelerate(amp), prepare_optimizer(opt), backward(loss)          the same
    enable_reproducibility(seed)                             seeds and deterministic algorithms, as 1.x
    TorchConfig(backend, init_method, timeout_s)             trainforge.torch.TorchConfig
"""

from __future__ import annotations

import os
import random
from typing import TYPE_CHECKING, Any

import trainforge.torch as _torch
from trainforge.torch import TorchConfig

if TYPE_CHECKING:
    import torch

__all__ = [
    "TorchConfig", "accelerate", "backward", "enable_reproducibility", "get_device", "prepare_data_loader",
    "prepare_model", "prepare_optimizer",
]  # fmt: skip


def prepare_model(
    model: torch.nn.Module,
    move_to_device: bool = True,
    wrap_ddp: bool = True,
    ddp_kwargs: dict[str, Any] | None = None,
) -> torch.nn.Module:
    """Move ``model`` to this worker's device and, with more than one worker, wrap it in
    ``DistributedDataParallel`` (``ddp_kwargs`` are its arguments); ``wrap_ddp=False`` does not wrap."""
    return _torch.prepare_model(model, move_to_device, "ddp" if wrap_ddp else None, ddp_kwargs)


def prepare_data_loader(
    data_loader: Any, add_dist_sampler: bool = True, move_to_device: bool = True, auto_transfer: bool = True
) -> Any:
    """Give each worker its share of ``data_loader`` (a ``DistributedSampler``) and move its batches
    to the worker's device."""
    return _torch.prepare_data_loader(data_loader, add_dist_sampler, move_to_device, auto_transfer)


def get_device() -> torch.device:
    """This worker's device: its GPU when it has one, else the CPU."""
    return _torch.get_device()


def accelerate(amp: bool = False) -> None:
    """Mixed precision for this worker (call before ``prepare_model``); see ``trainforge.torch.accelerate``."""
    _torch.accelerate(amp=amp)


def prepare_optimizer(optimizer: torch.optim.Optimizer) -> Any:
    """``optimizer`` for mixed precision (see :func:`accelerate`)."""
    return _torch.prepare_optimizer(optimizer)


def backward(tensor: torch.Tensor) -> None:
    """``tensor.backward()``, scaled when mixed precision uses a gradient scaler."""
    _torch.backward(tensor)


def enable_reproducibility(seed: int = 0) -> None:
    """Seed Python, numpy and torch with ``seed`` and make torch use deterministic algorithms (call it
    first in the train function, on every worker). Training may get slower; data loading is only
    reproducible with ``num_workers=0`` loaders or seeded worker functions."""
    import numpy as np
    import torch

    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    # CUDA >= 10.2 needs this for deterministic cuBLAS (torch's reproducibility notes).
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
