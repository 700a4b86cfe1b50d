"""``ray.data.Dataset`` values in ``datasets=`` (Ray executor only).

``"train"`` (or every name in ``datasets_to_split``) is split with Ray Data's
``streaming_split(world_size, equal=True)``: the ranks consume one streaming execution together,
each getting an equal share (up to ``world_size - 1`` rows of an epoch are left out so that shares
are equal, as in Ray Train). Other names are given whole: every rank iterates ``ds.iterator()``.
A rank's shard is a :class:`RayDataShard`: the shard API of local datasets over Ray's DataIterator.

Shards travel to the workers inside the cloudpickled train payload. Ray resolves the ObjectRefs and
actor handles inside a DataIterator only if Ray's own pickler wrote them (it registers them with
their owner, the driver), so a shard pickles its iterator with ``ray.cloudpickle``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from trainforge._internal.dataset_shard import BATCH_FORMATS


class RayDataShard:
    """What ``get_dataset_shard(name)`` returns for a Ray dataset: ``iter_batches`` (numpy batches
    by default, like every trainforge shard), ``iter_torch_batches`` and ``iter_rows``; other
    attributes are the underlying ``ray.data.DataIterator``'s."""

    def __init__(self, name: str, iterator: Any):
        self.name = name
        self._iterator = iterator

    def __repr__(self) -> str:
        return f"RayDataShard(name={self.name!r}, iterator={self._iterator!r})"

    def iter_batches(self, *, batch_size: int | None = 256, batch_format: str = "numpy", drop_last: bool = False,
                     **kwargs: Any) -> Iterator[Any]:  # fmt: skip
        if batch_format not in BATCH_FORMATS:
            raise ValueError(f"batch_format={batch_format!r} is not valid: use one of {list(BATCH_FORMATS)}.")
        return self._iterator.iter_batches(batch_size=batch_size, batch_format=batch_format, drop_last=drop_last,
                                           **kwargs)  # fmt: skip

    def iter_torch_batches(self, *, batch_size: int | None = 256, dtypes: Any = None, device: Any = None,
                           drop_last: bool = False, **kwargs: Any) -> Iterator[Any]:  # fmt: skip
        if device is not None:
            kwargs["device"] = device
        return self._iterator.iter_torch_batches(batch_size=batch_size, dtypes=dtypes, drop_last=drop_last, **kwargs)

    def iter_rows(self) -> Iterator[dict[str, Any]]:
        return self._iterator.iter_rows()

    def count(self) -> int:
        raise TypeError(
            f"get_dataset_shard({self.name!r}).count(): a Ray Data shard is streamed, its size is known only once "
            "it has been read; count the rows while iterating."
        )

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._iterator, name)

    def __reduce__(self) -> tuple[Any, tuple[str, bytes]]:
        import ray.cloudpickle

        return _load_shard, (self.name, ray.cloudpickle.dumps(self._iterator))


def _load_shard(name: str, blob: bytes) -> RayDataShard:
    import ray.cloudpickle

    return RayDataShard(name, ray.cloudpickle.loads(blob))


def split_dataset(name: str, dataset: Any, n: int, split: bool) -> tuple[list[RayDataShard], list[Any]]:
    """One shard per rank, and the Ray actors serving them (killed once the attempt is over)."""
    if not split:
        # Each rank runs this dataset itself: no progress bars from n workers (Ray's would print
        # their control lines into the worker's output).
        dataset = dataset.copy(dataset)
        dataset.context.enable_progress_bars = False
        shard = RayDataShard(name, dataset.iterator())
        return [shard] * n, []
    iterators = dataset.streaming_split(n, equal=True)
    coordinators = list({id(a): a for a in (getattr(it, "_coord_actor", None) for it in iterators) if a is not None}.values())
    return [RayDataShard(name, it) for it in iterators], coordinators
