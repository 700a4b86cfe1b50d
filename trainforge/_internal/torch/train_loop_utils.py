"""Worker-side helpers for torch train loops: ``get_device``, ``prepare_model``, ``prepare_data_loader``.

Imported only when a train loop uses them (``trainforge.torch`` loads this module lazily).
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
)

from trainforge._internal import session
from trainforge._internal.constants import ENV_RANK, ENV_WORLD_SIZE
from trainforge._internal.torch.device import get_device

logger = logging.getLogger(__name__)

PARALLEL_STRATEGIES = ("ddp", "fsdp", None)


def _world_size_and_rank() -> tuple[int, int]:
    """From the trainforge session, else the torchrun variables, else a started process group."""
    if session.in_session():
        ctx = session.get_context()
        return ctx.get_world_size(), ctx.get_world_rank()
    if ENV_WORLD_SIZE in os.environ and ENV_RANK in os.environ:
        return int(os.environ[ENV_WORLD_SIZE]), int(os.environ[ENV_RANK])
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def prepare_model(
    model: torch.nn.Module,
    move_to_device: bool | torch.device | str = True,
    parallel_strategy: str | None = "ddp",
    parallel_strategy_kwargs: dict[str, Any] | None = None,
) -> torch.nn.Module:
    """Move ``model`` to this worker's device and, with more than one worker, wrap it for data parallelism.

    Example::

        model = trainforge.torch.prepare_model(MyNet())      # DDP-wrapped when world size > 1
        state = (model.module if hasattr(model, "module") else model).state_dict()

    ``move_to_device``: ``True`` for :func:`get_device`, ``False`` to leave the model where it is, or a
    device. ``parallel_strategy``: ``"ddp"`` (``DistributedDataParallel``), ``"fsdp"``
    (``FullyShardedDataParallel``) or ``None`` (no wrapping); ``parallel_strategy_kwargs`` are passed
    to the wrapper.
    """
    if parallel_strategy not in PARALLEL_STRATEGIES:
        raise ValueError(
            f"prepare_model(parallel_strategy={parallel_strategy!r}) is not valid: choose one of "
            f"{PARALLEL_STRATEGIES}."
        )
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"prepare_model(model=...) takes a torch.nn.Module, got {type(model).__name__}.")
    kwargs = dict(parallel_strategy_kwargs or {})

    device: torch.device | None = None
    if move_to_device is True:
        device = get_device()
    elif move_to_device is not False and move_to_device is not None:
        device = torch.device(move_to_device)
    if device is not None:
        if device.type == "cuda" and device.index is not None:
            torch.cuda.set_device(device)
        model = model.to(device)

    from trainforge._internal.torch import amp

    model = amp.autocast_forward(model)  # accelerate(amp=True): forward under autocast, inside DDP
    amp.note_model_prepared()
    world_size, _ = _world_size_and_rank()
    if parallel_strategy is None or world_size <= 1:
        return model
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            f"prepare_model: the world size is {world_size} but no torch.distributed process group is "
            "initialized in this process. Run the train loop with trainforge.torch.TorchTrainer (it "
            "sets one up), call torch.distributed.init_process_group first, or pass parallel_strategy=None."
        )
    on_cuda = device is not None and device.type == "cuda"
    if parallel_strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        if on_cuda:
            kwargs.setdefault("device_ids", [device])
            kwargs.setdefault("output_device", device)
        return DistributedDataParallel(model, **kwargs)
    from torch.distributed.fsdp import FullyShardedDataParallel

    if on_cuda:
        kwargs.setdefault("device_id", device)
    return FullyShardedDataParallel(model, **kwargs)


def prepare_data_loader(
    data_loader: DataLoader,
    add_dist_sampler: bool = True,
    move_to_device: bool = True,
    auto_transfer: bool = True,
) -> DataLoader | DeviceDataLoader:
    """Shard ``data_loader`` across workers and move its batches to this worker's device.

    Example::

        loader = trainforge.torch.prepare_data_loader(DataLoader(ds, batch_size=32, shuffle=True))
        for epoch in range(epochs):
            if trainforge.get_context().get_world_size() > 1:
                loader.sampler.set_epoch(epoch)        # a new shuffle every epoch
            for x, y in loader: ...

    With more than one worker and ``add_dist_sampler``, the loader is rebuilt with a
    ``DistributedSampler`` (shuffling iff the original loader shuffled), keeping its other settings.
    Loaders over an ``IterableDataset`` or that already use a ``DistributedSampler`` are left alone.
    With ``move_to_device`` the result yields batches (tensors, or tuples/lists/dicts of them) on
    :func:`get_device`; ``auto_transfer`` makes CUDA copies non-blocking.
    """
    if not isinstance(data_loader, DataLoader):
        raise TypeError(
            f"prepare_data_loader(data_loader=...) takes a torch.utils.data.DataLoader, got "
            f"{type(data_loader).__name__}."
        )
    world_size, rank = _world_size_and_rank()
    if (
        add_dist_sampler
        and world_size > 1
        and not isinstance(data_loader.dataset, IterableDataset)
        and not isinstance(data_loader.sampler, DistributedSampler)
    ):
        data_loader = with_distributed_sampler(data_loader, world_size, rank)
    if not move_to_device:
        return data_loader
    return DeviceDataLoader(data_loader, get_device(), auto_transfer)


def with_distributed_sampler(loader: DataLoader, world_size: int, rank: int) -> DataLoader:
    """A copy of ``loader`` whose sampler gives this rank its share of the dataset."""
    if loader.batch_sampler is not None and type(loader.batch_sampler) is not BatchSampler:
        raise ValueError(
            f"prepare_data_loader cannot shard a DataLoader with a custom batch_sampler "
            f"({type(loader.batch_sampler).__name__}): pass add_dist_sampler=False and give each rank "
            "its share yourself (e.g. build the batch sampler over a DistributedSampler)."
        )
    if not isinstance(loader.sampler, (RandomSampler, SequentialSampler)) and rank == 0:
        logger.warning(
            "prepare_data_loader replaces the custom sampler %s with a DistributedSampler(shuffle=False); "
            "pass add_dist_sampler=False to keep it and shard the data yourself.",
            type(loader.sampler).__name__,
        )
    sampler: DistributedSampler[Any] = DistributedSampler(
        loader.dataset,
        num_replicas=world_size,
        rank=rank,
        shuffle=isinstance(loader.sampler, RandomSampler),
    )
    kwargs: dict[str, Any] = {
        "dataset": loader.dataset,
        "batch_size": loader.batch_size,
        "sampler": sampler,
        "num_workers": loader.num_workers,
        "collate_fn": loader.collate_fn,
        "pin_memory": loader.pin_memory,
        "drop_last": loader.drop_last,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context,
        "generator": loader.generator,
        "prefetch_factor": loader.prefetch_factor,
        "persistent_workers": loader.persistent_workers,
        "pin_memory_device": getattr(loader, "pin_memory_device", ""),
        "in_order": getattr(loader, "in_order", True),
    }
    accepted = inspect.signature(DataLoader.__init__).parameters
    return DataLoader(**{k: v for k, v in kwargs.items() if k in accepted})


def _to_device(batch: Any, device: torch.device, non_blocking: bool) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(_to_device(b, device, non_blocking) for b in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(b, device, non_blocking) for b in batch)
    if isinstance(batch, Mapping):
        moved = {k: _to_device(v, device, non_blocking) for k, v in batch.items()}
        try:
            return type(batch)(moved)  # type: ignore[call-arg]
        except TypeError:
            return moved
    return batch


class DeviceDataLoader:
    """Iterates the wrapped loader's batches moved to ``device``; everything else is the loader's."""

    def __init__(self, loader: DataLoader, device: torch.device, auto_transfer: bool = True):
        self._loader = loader
        self.device = device
        self._non_blocking = auto_transfer and device.type == "cuda"

    def __iter__(self) -> Iterator[Any]:
        for batch in self._loader:
            yield _to_device(batch, self.device, self._non_blocking)

    def __len__(self) -> int:
        return len(self._loader)

    @property
    def dataset(self) -> Any:
        return self._loader.dataset

    @property
    def sampler(self) -> Any:
        return self._loader.sampler

    @property
    def batch_size(self) -> int | None:
        return self._loader.batch_size

    def __getattr__(self, name: str) -> Any:
        if name == "_loader":  # not set yet (unpickling): avoid recursing
            raise AttributeError(name)
        return getattr(self._loader, name)

    def __repr__(self) -> str:
        return f"<prepared {self._loader!r} on {self.device}>"
