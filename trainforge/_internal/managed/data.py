"""The managed loop's data: each worker's share, a deterministic order per epoch, resuming mid-epoch.

A ``DataLoader`` gets a ``DistributedSampler`` (also with one worker), so that the order of epoch
``e`` depends only on ``e`` (``sampler.set_epoch(e)``, seed 0): after a restart the epoch is
replayed in the same order and the batches already done are skipped. Batches are moved to the
worker's device.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

from trainforge._internal.torch.train_loop_utils import _DeviceDataLoader, _with_distributed_sampler


def prepare_loader(loader: Any, world_size: int, rank: int, add_dist_sampler: bool, device: torch.device) -> Any:
    """``loader`` sharded for this worker and moving batches to ``device``; other iterables as they are."""
    if loader is None or not isinstance(loader, DataLoader):
        return loader
    if add_dist_sampler and not isinstance(loader.dataset, IterableDataset) and not isinstance(
        loader.sampler, DistributedSampler
    ):
        try:
            loader = _with_distributed_sampler(loader, world_size, rank)
        except ValueError:
            if world_size > 1:
                raise
            # One worker and a custom batch sampler: its order is the loader's own.
    if device.type == "cpu":
        return loader
    return _DeviceDataLoader(loader, device)


def epoch_batches(loader: Iterable[Any], epoch: int, skip: int = 0, num_steps: int | None = None) -> Iterator[Any]:
    """The batches of ``epoch`` from number ``skip`` on (those before it were done before a restart),
    stopping after batch ``num_steps`` (counted from the epoch's start)."""
    sampler = getattr(loader, "sampler", None)
    if sampler is not None and hasattr(sampler, "set_epoch"):
        sampler.set_epoch(epoch)
    if skip == 0 and num_steps is None:
        return iter(loader)
    return itertools.islice(iter(loader), skip, num_steps)


def with_last(iterator: Iterable[Any]) -> Iterator[tuple[Any, bool]]:
    """``(item, is_last)`` pairs, one item ahead: the loop must know a batch is the epoch's last
    before it runs it (gradient accumulation steps the optimizer on it)."""
    it = iter(iterator)
    try:
        prev = next(it)
    except StopIteration:
        return
    for item in it:
        yield prev, False
        prev = item
    yield prev, True
