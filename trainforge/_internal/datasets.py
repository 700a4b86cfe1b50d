"""Datasets passed to a trainer, on the driver: which values are accepted, and their split per rank.

Accepted values in ``datasets={name: value}``:

- a list of items (scalars, arrays, anything): one column named ``"item"``, as Ray Data's ``from_items``;
- a list of dicts (rows): one column per key; every row has the same keys;
- a dict of numpy arrays: one column per key; arrays share their first-dimension length (the rows) and
  keep their other dimensions (images of shape ``(N, 8, 8)`` give numpy batches of shape ``(B, 8, 8)``);
- a pandas DataFrame or a pyarrow Table;
- a torch map-style ``Dataset`` (``__getitem__`` and ``__len__``): sample ``i`` is ``dataset[i]``.
  A dict sample gives one column per key; a tuple or list sample of length k gives columns
  ``"0"`` .. ``"k-1"`` (so for ``(x, y)`` samples ``batch["0"]`` are the inputs and ``batch["1"]`` the
  labels); any other sample gives the column ``"item"``. Tensors are turned into numpy arrays for
  ``iter_batches`` and stacked with ``torch.stack`` for ``iter_torch_batches``. A torch
  ``IterableDataset`` is refused: the split needs a length.

A ``ray.data.Dataset`` needs the Ray executor (elsewhere it is refused with a ``ValueError``). There
``"train"`` is split with Ray Data's ``streaming_split(world_size, equal=True)`` and other names are
given whole (``ds.iterator()``); each rank's shard is a :class:`RayDataShard` with the same
``iter_batches`` / ``iter_torch_batches`` / ``iter_rows`` methods (see worker_group/ray_data.py).

Split rule: ``datasets["train"]`` is cut into ``world_size`` contiguous parts, rank r taking the r-th;
every row goes to exactly one rank and the parts differ by at most one row (10 rows on 3 workers give
4, 3, 3). The rank's rows are cut out on the driver, so only they are pickled to the worker (a torch
Dataset is sent whole with the rank's index range). Every other key is given whole to every rank.

Each rank's shard is a :class:`~trainforge._internal.dataset_shard.DataShard` (batch formats there)
over a block of rows (:mod:`trainforge._internal.dataset_blocks`).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from trainforge._internal.dataset_blocks import (
    ArrowBlock,
    Block,
    NumpyBlock,
    PandasBlock,
    TorchBlock,
    stack_values,
)
from trainforge._internal.dataset_shard import DataShard

TRAIN_KEY = "train"
ACCEPTED_TYPES = (
    "a list of items, a list of dicts (rows), a dict of numpy arrays, a pandas DataFrame, "
    "a pyarrow Table, a torch map-style Dataset (with __getitem__ and __len__)"
)



def check_datasets(datasets: Any, allow_ray: bool = False) -> None:
    """Raise ``TypeError``/``ValueError`` if ``datasets`` is not ``None`` or a dict of accepted values
    (``ray.data.Dataset`` values only with ``allow_ray``: the run uses the Ray executor)."""
    for name, value in _items(datasets):
        if not (allow_ray and is_ray_dataset(value)):
            _kind(name, value)


def is_ray_dataset(value: Any) -> bool:
    """True for a ``ray.data.Dataset`` (checked without importing ray)."""
    data = sys.modules.get("ray.data")
    return data is not None and isinstance(value, data.Dataset)


def shard_datasets(datasets: Any, world_size: int) -> list[dict[str, DataShard]]:
    """Return one ``{name: DataShard}`` dict per rank: "train" split contiguously, other keys whole."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"shard_datasets: world_size={world_size!r} is not valid: use an int >= 1.")
    shards: list[dict[str, DataShard]] = [{} for _ in range(world_size)]
    for name, value in _items(datasets):
        block = _to_block(name, value)
        if name == TRAIN_KEY:
            for rank, (start, stop) in enumerate(split_ranges(block.num_rows, world_size)):
                shards[rank][name] = DataShard(name, block.slice(start, stop))
        else:
            shard = DataShard(name, block)
            for rank in range(world_size):
                shards[rank][name] = shard
    return shards


def split_ranges(num_rows: int, world_size: int) -> list[tuple[int, int]]:
    """Contiguous ``(start, stop)`` per rank; the first ``num_rows % world_size`` ranks get one more row."""
    base, extra = divmod(num_rows, world_size)
    ranges = []
    for rank in range(world_size):
        start = rank * base + min(rank, extra)
        ranges.append((start, start + base + (1 if rank < extra else 0)))
    return ranges


def _items(datasets: Any) -> list[tuple[str, Any]]:
    if datasets is None:
        return []
    if not isinstance(datasets, dict):
        raise TypeError(
            f"datasets must be a dict of name -> dataset or None, got {type(datasets).__name__}: "
            f"pass datasets={{'train': ...}}."
        )
    for name in datasets:
        if not isinstance(name, str):
            raise TypeError(
                f"datasets keys must be str, got key {name!r} of type {type(name).__name__}: "
                f"name each dataset, e.g. datasets={{'train': ...}}."
            )
    return list(datasets.items())


def _unsupported(name: str, value: Any, hint: str = "") -> TypeError:
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    return TypeError(
        f"datasets[{name!r}] has unsupported type {kind}{hint}. Accepted types: {ACCEPTED_TYPES}."
    )


def _kind(name: str, value: Any) -> str:
    """Validate one dataset and return its kind: items, rows, arrays, pandas, arrow or torch."""
    module = type(value).__module__ or ""
    if module.startswith("ray.data"):
        raise ValueError(
            f"datasets[{name!r}] is a {type(value).__name__} from ray.data, which needs the Ray executor: "
            "pass ScalingConfig(executor='ray') (or call ray.init() first), or convert it (e.g. ds.to_pandas())."
        )
    if isinstance(value, list):
        if value and isinstance(value[0], dict):
            _check_rows(name, value)
            return "rows"
        return "items"
    if isinstance(value, dict):
        _check_arrays(name, value)
        return "arrays"
    if "pandas" in sys.modules and isinstance(value, sys.modules["pandas"].DataFrame):
        return "pandas"
    if "pyarrow" in sys.modules and isinstance(value, sys.modules["pyarrow"].Table):
        return "arrow"
    if "torch" in sys.modules:
        data = sys.modules["torch"].utils.data
        if isinstance(value, data.IterableDataset):
            raise _unsupported(
                name,
                value,
                " (a torch IterableDataset; the split across workers needs a map-style dataset "
                "with __getitem__ and __len__)",
            )
        if isinstance(value, data.Dataset) and not hasattr(value, "__len__"):
            raise _unsupported(name, value, " (a torch Dataset without __len__; define __len__)")
    if isinstance(value, np.ndarray):
        raise _unsupported(name, value, " (a bare numpy array; wrap it in a dict, e.g. {'x': array})")
    if isinstance(value, (str, bytes, bytearray, tuple)) or module.startswith(("pandas", "pyarrow")):
        raise _unsupported(name, value)
    if hasattr(value, "__getitem__") and hasattr(value, "__len__"):
        return "torch"
    raise _unsupported(name, value)


def _check_rows(name: str, rows: list[Any]) -> None:
    keys = list(rows[0])
    for key in keys:
        if not isinstance(key, str):
            raise TypeError(
                f"datasets[{name!r}] row 0 has key {key!r} of type {type(key).__name__}: column names must be str."
            )
    for index, row in enumerate(rows):
        if not isinstance(row, dict) or set(row) != set(keys):
            got = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise ValueError(
                f"datasets[{name!r}] is a list of dicts but row {index} is {got!r}, not a dict with the keys "
                f"of row 0 {sorted(keys)!r}: give every row the same keys."
            )


def _check_arrays(name: str, arrays: dict[Any, Any]) -> None:
    if not arrays:
        raise ValueError(f"datasets[{name!r}] is an empty dict: give it at least one column (a numpy array).")
    lengths: dict[str, int] = {}
    for key, array in arrays.items():
        if not isinstance(key, str):
            raise TypeError(
                f"datasets[{name!r}] has column key {key!r} of type {type(key).__name__}: column names must be str."
            )
        if not isinstance(array, np.ndarray) or array.ndim == 0:
            raise _unsupported(
                name,
                arrays,
                f" (a dict whose column {key!r} is a {type(array).__name__}, not a numpy array "
                "with at least one dimension; convert it with np.asarray)",
            )
        lengths[key] = len(array)
    if len(set(lengths.values())) > 1:
        raise ValueError(
            f"datasets[{name!r}] columns have different lengths {lengths}: every array needs the same first "
            "dimension (one entry per row)."
        )


def _to_block(name: str, value: Any) -> Block:
    kind = _kind(name, value)
    if kind == "items":
        return NumpyBlock({"item": stack_values(value)})
    if kind == "rows":
        return NumpyBlock({key: stack_values([row[key] for row in value]) for key in value[0]})
    if kind == "arrays":
        return NumpyBlock(dict(value))
    if kind == "pandas":
        return PandasBlock(value)
    if kind == "arrow":
        return ArrowBlock(value)
    return TorchBlock(value, 0, len(value))
