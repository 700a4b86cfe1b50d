"""``prepare_trainer``: check a ``transformers.Trainer`` joined the run, let it read trainforge shards."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset

from trainforge import get_context
from trainforge._internal.datasets import DataShard
from trainforge._internal.session import in_session
from trainforge.huggingface.transformers._imports import import_transformers


def prepare_trainer(trainer: Any) -> Any:
    transformers = import_transformers()
    if not isinstance(trainer, transformers.Trainer):
        raise TypeError(
            f"prepare_trainer(trainer=...) takes a transformers.Trainer, got {type(trainer).__name__}."
        )
    if in_session():
        expected = get_context().get_world_size()
        seen = trainer.args.world_size
        if seen != expected:
            raise RuntimeError(
                f"The transformers.Trainer sees world_size={seen}, but this run has {expected} workers: "
                "its TrainingArguments were set up outside the train loop (their device and process "
                "group are fixed on first use). Build the TrainingArguments inside the train loop."
            )
    if not getattr(type(trainer), "_trainforge_prepared", False):
        trainer.__class__ = _prepared_class(type(trainer))
    return trainer


def _prepared_class(base: type) -> type:
    """``base`` with dataloader getters that read trainforge shards and one-shot iterators."""

    def get_train_dataloader(self: Any) -> Any:
        if _is_ours(self.train_dataset):
            args = self.args
            return _loader(self.train_dataset, args.per_device_train_batch_size, args.dataloader_drop_last)
        return base.get_train_dataloader(self)  # type: ignore[attr-defined]

    def get_eval_dataloader(self: Any, eval_dataset: Any = None) -> Any:
        dataset = self.eval_dataset if eval_dataset is None else eval_dataset
        if _is_ours(dataset):
            return _loader(dataset, self.args.per_device_eval_batch_size, self.args.dataloader_drop_last)
        return base.get_eval_dataloader(self, eval_dataset)  # type: ignore[attr-defined]

    namespace = {
        "get_train_dataloader": get_train_dataloader,
        "get_eval_dataloader": get_eval_dataloader,
        "_trainforge_prepared": True,
        "__module__": base.__module__,
        "__qualname__": base.__qualname__,
        "__doc__": base.__doc__,
    }
    return type(base.__name__, (base,), namespace)


def _is_ours(dataset: Any) -> bool:
    """A trainforge shard, or a one-shot iterator of batches (``iter(x) is x``: a generator)."""
    if isinstance(dataset, DataShard):
        return True
    try:
        return (
            dataset is not None and not isinstance(dataset, (list, tuple, dict)) and iter(dataset) is dataset
        )
    except TypeError:
        return False


def _loader(dataset: Any, batch_size: int, drop_last: bool) -> Any:
    if isinstance(dataset, DataShard):
        return DataLoader(_ShardBatches(dataset, batch_size, drop_last), batch_size=None)
    return DataLoader(_Batches(dataset), batch_size=None)


def _common_rows(rows: int) -> int:
    """The fewest rows any rank has (ranks must run the same number of steps, or a collective hangs)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return rows
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    tensor = torch.tensor([rows], dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return int(tensor.item())


class _ShardBatches(IterableDataset):  # type: ignore[type-arg]
    """A trainforge shard as batches of ``batch_size`` rows, re-readable every epoch, of the same
    number of rows on every rank (the fewest any rank has)."""

    def __init__(self, shard: DataShard, batch_size: int, drop_last: bool) -> None:
        super().__init__()
        self.shard = shard
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.rows = _common_rows(shard.count())

    def __len__(self) -> int:
        full, rest = divmod(self.rows, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        left = len(self) * self.batch_size if self.drop_last else self.rows
        for batch in self.shard.iter_torch_batches(batch_size=self.batch_size):
            if left <= 0:
                return
            size = len(next(iter(batch.values()))) if batch else 0
            if size > left:
                batch = {column: values[:left] for column, values in batch.items()}
            left -= size
            yield batch


class _Batches(IterableDataset):  # type: ignore[type-arg]
    """A one-shot iterator of batches, as Ray reads one (a second epoch finds it empty)."""

    def __init__(self, batches: Any) -> None:
        super().__init__()
        self.batches = batches

    def __iter__(self) -> Iterator[Any]:
        return iter(self.batches)
