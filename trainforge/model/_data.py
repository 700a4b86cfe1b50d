"""The managed loop's data: each worker's share, a deterministic order per epoch, resuming mid-epoch.

A ``DataLoader`` gets a ``DistributedSampler`` (also with one worker), so that the order of epoch
``e`` depends only on ``e`` (``sampler.set_epoch(e)``, seed 0): after a restart the epoch is
replayed in the same order and the batches already done are skipped. Batches are moved to the
worker's device.

With ``ModelTrainer(MyModel, data=MyData)``, the Data object's splits become the loaders
(:func:`setup_worker_data`): a torch ``Dataset`` as a ``DataLoader``, the core's shard of a table
(this worker's rows) in memory with a sampler of its own, a Ray Data shard streamed.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

from trainforge._internal.torch.train_loop_utils import DeviceDataLoader, with_distributed_sampler


def prepare_loader(loader: Any, world_size: int, rank: int, add_dist_sampler: bool, device: torch.device) -> Any:
    """``loader`` sharded for this worker and moving batches to ``device``; other iterables as they are."""
    if loader is None or not isinstance(loader, DataLoader):
        return loader
    if add_dist_sampler and not isinstance(loader.dataset, IterableDataset) and not isinstance(
        loader.sampler, DistributedSampler
    ):
        try:
            loader = with_distributed_sampler(loader, world_size, rank)
        except ValueError:
            if world_size > 1:
                raise
            # One worker and a custom batch sampler: its order is the loader's own.
    if device.type == "cpu":
        return loader
    return DeviceDataLoader(loader, device)


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


# -- a Data object's splits on a worker (ModelTrainer(MyModel, data=MyData)) ----------------------------
DEFAULT_BATCH_SIZE = 64  # the global batch when the config has no "batch_size"


def setup_worker_data(model: Any, config: dict[str, Any], options: dict[str, Any], world_size: int) -> None:
    """``model.setup_data(config)``, then, for a run with a ``Data`` object, its splits as the model's
    loaders: a torch ``Dataset`` as a ``DataLoader`` (the loop adds the ``DistributedSampler``), a
    core shard (this worker's rows already) as a loader shuffled per epoch by its own sampler, a Ray
    Data shard streamed in order."""
    model.setup_data(config)
    data = options.get("data")
    if not data:
        return
    if model.train_loader is not None or model.validation_loader is not None:
        raise ValueError(f"{type(model).__name__}.setup_data() registered loaders and the trainer has data=: "
                         "give the data one way")  # fmt: skip
    from trainforge import get_dataset_shard

    batch = int(config.get("batch_size") or max(1, DEFAULT_BATCH_SIZE // world_size))
    loaders: dict[str, Any] = {}
    for name, dataset in data["torch"].items():
        loaders[name] = DataLoader(dataset, batch_size=batch, shuffle=name == "train")
    for name in data["shards"]:
        loaders[name] = shard_loader(get_dataset_shard(name), batch, name == "train", data.get("label_column"))
    model.register_data(train_loader=loaders.get("train"), validation_loader=loaders.get("valid"))


def shard_loader(shard: Any, batch_size: int, shuffle: bool, label: str | None) -> Any:
    """A loader over this worker's shard: in memory, with a sampler of its own (one replica: the rows
    are this worker's already; reshuffled per epoch by ``set_epoch``, the same way on a restart)."""
    from trainforge._internal.datasets import DataShard

    if not isinstance(shard, DataShard):
        return _StreamedShard(shard, batch_size, label)  # Ray Data: streamed, in its own order
    columns = next(iter(shard.iter_torch_batches(batch_size=None)), {})
    dataset = _Columns(columns, label)
    sampler: DistributedSampler[Any] = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=shuffle, seed=0)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler)


def as_sample(columns: dict[str, torch.Tensor], label: str | None) -> Any:
    """Columns (a whole shard or one batch) as the model's batches: ``(features, label)`` with
    ``label``; else ``(x0, x1, ...)`` for a torch Dataset's tuple samples (columns "0".."k-1"), or the dict."""
    names = list(columns)
    if label is None:
        if names and names == [str(i) for i in range(len(names))]:
            return tuple(columns[n] for n in names)
        return columns
    if label not in columns:
        raise ValueError(f"Data.label_column={label!r} is not a column of the split; its columns are {names}")
    rest = [n for n in names if n != label]
    features = columns[rest[0]] if len(rest) == 1 else torch.stack([columns[n].float() for n in rest], dim=1)
    return _float32(features), _float32(columns[label])


def _float32(t: torch.Tensor) -> torch.Tensor:
    return t.float() if t.is_floating_point() and t.dtype != torch.float32 else t


class _Columns(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, columns: dict[str, torch.Tensor], label: str | None):
        self.sample = as_sample(columns, label)
        first = self.sample[0] if isinstance(self.sample, tuple) else next(iter(self.sample.values()), None)
        self.n = len(first) if first is not None else 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if isinstance(self.sample, tuple):
            return tuple(c[i] for c in self.sample)
        return {k: c[i] for k, c in self.sample.items()}


class _StreamedShard:
    """A Ray Data shard's batches, every epoch in the shard's own order (re-iterable)."""

    def __init__(self, shard: Any, batch_size: int, label: str | None):
        self.shard, self.batch_size, self.label = shard, batch_size, label

    def __iter__(self) -> Iterator[Any]:
        from trainforge.torch import get_device

        for batch in self.shard.iter_torch_batches(batch_size=self.batch_size, device=get_device()):
            yield as_sample(batch, self.label)
