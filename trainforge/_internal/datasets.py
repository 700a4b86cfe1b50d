"""Datasets passed to a trainer: validation on the driver, splitting per rank, batching on the worker.

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

Batch formats of :meth:`DataShard.iter_batches`:

- ``"numpy"``: ``dict[str, np.ndarray]``; multi-dimensional columns keep their shape;
- ``"pandas"``: ``pd.DataFrame``; a multi-dimensional column becomes an object column holding one
  numpy array per row;
- ``"pyarrow"``: ``pa.Table``; a multi-dimensional column becomes a fixed-size list column (nested for
  more than two dimensions), which turns back into the original shape in numpy batches.

Batches never share memory with the shard, so changing a batch in place does not change the next epoch.
"""

from __future__ import annotations

import abc
import sys
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Union

import numpy as np

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa
    import torch

TRAIN_KEY = "train"
BATCH_FORMATS = ("numpy", "pandas", "pyarrow")
ACCEPTED_TYPES = (
    "a list of items, a list of dicts (rows), a dict of numpy arrays, a pandas DataFrame, "
    "a pyarrow Table, a torch map-style Dataset (with __getitem__ and __len__)"
)

TorchDtypes = Union["torch.dtype", Mapping[str, "torch.dtype"], None]


# ----------------------------------------------------------------------------------------------------
# Driver side: validation and splitting
# ----------------------------------------------------------------------------------------------------


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


def _to_block(name: str, value: Any) -> _Block:
    kind = _kind(name, value)
    if kind == "items":
        return _NumpyBlock({"item": _stack_values(value)})
    if kind == "rows":
        return _NumpyBlock({key: _stack_values([row[key] for row in value]) for key in value[0]})
    if kind == "arrays":
        return _NumpyBlock(dict(value))
    if kind == "pandas":
        return _PandasBlock(value)
    if kind == "arrow":
        return _ArrowBlock(value)
    return _TorchBlock(value, 0, len(value))


# ----------------------------------------------------------------------------------------------------
# Worker side: the shard
# ----------------------------------------------------------------------------------------------------


class DataShard:
    """One rank's part of a dataset, returned by ``get_dataset_shard(name)``. Picklable."""

    def __init__(self, name: str, block: _Block) -> None:
        self.name = name
        self._block = block

    def count(self) -> int:
        """Rows in this shard."""
        return self._block.num_rows

    def __len__(self) -> int:
        return self._block.num_rows

    def __repr__(self) -> str:
        return f"DataShard(name={self.name!r}, rows={self.count()}, source={self._block.source})"

    def iter_batches(
        self, *, batch_size: int | None = 256, batch_format: str = "numpy", drop_last: bool = False
    ) -> Iterator[dict[str, np.ndarray] | pd.DataFrame | pa.Table]:
        """Yield batches of ``batch_size`` rows (``None``: the whole shard as one batch).

        ``batch_format``: "numpy" (dict of arrays), "pandas" (DataFrame) or "pyarrow" (Table).
        ``drop_last=True`` leaves out a last batch shorter than ``batch_size``.
        """
        if batch_format not in BATCH_FORMATS:
            raise ValueError(f"batch_format={batch_format!r} is not valid: use one of {list(BATCH_FORMATS)}.")
        convert = {
            "numpy": self._block.to_numpy,
            "pandas": self._block.to_pandas,
            "pyarrow": self._block.to_arrow,
        }[batch_format]
        for start, stop in _batch_ranges(self.count(), batch_size, drop_last):
            yield convert(start, stop)

    def iter_torch_batches(
        self,
        *,
        batch_size: int | None = 256,
        dtypes: TorchDtypes = None,
        device: str | torch.device | None = None,
        drop_last: bool = False,
    ) -> Iterator[dict[str, torch.Tensor]]:
        """Yield batches as ``dict[str, torch.Tensor]``.

        ``dtypes`` is one torch dtype for every column or a dict column -> dtype (other columns keep
        theirs); ``device`` ("cpu", "cuda:0", a ``torch.device``) is where the tensors are moved.
        """
        import torch

        if dtypes is not None and not isinstance(dtypes, (torch.dtype, Mapping)):
            raise TypeError(
                f"iter_torch_batches: dtypes={dtypes!r} is not valid: use a torch.dtype or a dict "
                "column -> torch.dtype."
            )
        for start, stop in _batch_ranges(self.count(), batch_size, drop_last):
            batch = self._block.to_torch(start, stop)
            if isinstance(dtypes, Mapping):
                unknown = sorted(set(dtypes) - set(batch))
                if unknown:
                    raise ValueError(
                        f"iter_torch_batches: dtypes names columns {unknown} that the dataset "
                        f"{self.name!r} does not have; its columns are {list(batch)}."
                    )
            for column, tensor in batch.items():
                dtype = dtypes.get(column) if isinstance(dtypes, Mapping) else dtypes
                if dtype is not None or device is not None:
                    batch[column] = tensor.to(device=device, dtype=dtype)
            yield batch

    def iter_rows(self) -> Iterator[dict[str, Any]]:
        """Yield rows as dicts ``{column: value}``."""
        for batch in self.iter_batches(batch_size=256, batch_format="numpy"):
            columns = list(batch.items())  # type: ignore[union-attr]
            for index in range(len(columns[0][1]) if columns else 0):
                yield {column: values[index] for column, values in columns}


def _batch_ranges(num_rows: int, batch_size: int | None, drop_last: bool) -> Iterator[tuple[int, int]]:
    if batch_size is None:
        if num_rows:
            yield 0, num_rows
        return
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} is not valid: use an int >= 1, or None for one batch.")
    for start in range(0, num_rows, batch_size):
        stop = min(start + batch_size, num_rows)
        if drop_last and stop - start < batch_size:
            return
        yield start, stop


# ----------------------------------------------------------------------------------------------------
# Blocks: the data under a shard, one implementation per source type
# ----------------------------------------------------------------------------------------------------


class _Block(abc.ABC):
    """Rows ``[0, num_rows)`` of one source; converts a row range to each batch format."""

    source: str

    @property
    @abc.abstractmethod
    def num_rows(self) -> int: ...

    @abc.abstractmethod
    def slice(self, start: int, stop: int) -> _Block:
        """A block of rows ``[start, stop)`` holding only those rows (used on the driver)."""

    @abc.abstractmethod
    def to_numpy(self, start: int, stop: int) -> dict[str, np.ndarray]: ...

    def to_pandas(self, start: int, stop: int) -> pd.DataFrame:
        import pandas as pd

        columns = self.to_numpy(start, stop)
        return pd.DataFrame({key: _per_row(array) for key, array in columns.items()})

    def to_arrow(self, start: int, stop: int) -> pa.Table:
        import pyarrow as pa

        columns = self.to_numpy(start, stop)
        return pa.table({key: _numpy_to_arrow(key, array) for key, array in columns.items()})

    def to_torch(self, start: int, stop: int) -> dict[str, torch.Tensor]:
        return {key: _numpy_to_torch(key, array) for key, array in self.to_numpy(start, stop).items()}


class _NumpyBlock(_Block):
    source = "numpy"

    def __init__(self, columns: dict[str, np.ndarray]) -> None:
        self.columns = columns

    @property
    def num_rows(self) -> int:
        return len(next(iter(self.columns.values())))

    def slice(self, start: int, stop: int) -> _NumpyBlock:
        return _NumpyBlock({key: array[start:stop].copy() for key, array in self.columns.items()})

    def to_numpy(self, start: int, stop: int) -> dict[str, np.ndarray]:
        return {key: array[start:stop].copy() for key, array in self.columns.items()}


class _PandasBlock(_Block):
    source = "pandas"

    def __init__(self, frame: pd.DataFrame) -> None:
        self.frame = frame

    @property
    def num_rows(self) -> int:
        return len(self.frame)

    def slice(self, start: int, stop: int) -> _PandasBlock:
        return _PandasBlock(self.frame.iloc[start:stop].copy())

    def to_numpy(self, start: int, stop: int) -> dict[str, np.ndarray]:
        part = self.frame.iloc[start:stop]
        return {str(key): _stack_objects(part[key].to_numpy(copy=True)) for key in part.columns}

    def to_pandas(self, start: int, stop: int) -> pd.DataFrame:
        return self.frame.iloc[start:stop].reset_index(drop=True)

    def to_arrow(self, start: int, stop: int) -> pa.Table:
        import pyarrow as pa

        return pa.Table.from_pandas(self.frame.iloc[start:stop], preserve_index=False)


class _ArrowBlock(_Block):
    source = "pyarrow"

    def __init__(self, table: pa.Table) -> None:
        self.table = table

    @property
    def num_rows(self) -> int:
        return self.table.num_rows

    def slice(self, start: int, stop: int) -> _ArrowBlock:
        # Table.slice shares the parent's buffers and would pickle all of them: take() copies the rows.
        return _ArrowBlock(self.table.take(np.arange(start, stop)))

    def to_numpy(self, start: int, stop: int) -> dict[str, np.ndarray]:
        part = self.table.slice(start, stop - start)
        return {name: _arrow_to_numpy(part.column(name)) for name in part.column_names}

    def to_pandas(self, start: int, stop: int) -> pd.DataFrame:
        return self.table.slice(start, stop - start).to_pandas()

    def to_arrow(self, start: int, stop: int) -> pa.Table:
        return self.table.slice(start, stop - start)


class _TorchBlock(_Block):
    """A torch map-style dataset and the index range ``[start, stop)`` of it that this block covers."""

    source = "torch"

    def __init__(self, dataset: Any, start: int, stop: int) -> None:
        self.dataset = dataset
        self.start = start
        self.stop = stop

    @property
    def num_rows(self) -> int:
        return self.stop - self.start

    def slice(self, start: int, stop: int) -> _TorchBlock:
        return _TorchBlock(self.dataset, self.start + start, self.start + stop)

    def _columns(self, start: int, stop: int) -> dict[str, list[Any]]:
        columns: dict[str, list[Any]] = {}
        for index in range(self.start + start, self.start + stop):
            sample = _sample_columns(self.dataset[index])
            if not columns:
                columns = {key: [] for key in sample}
            elif sample.keys() != columns.keys():
                raise ValueError(
                    f"torch dataset sample {index} has columns {list(sample)} but earlier samples have "
                    f"{list(columns)}: every sample needs the same structure."
                )
            for key, value in sample.items():
                columns[key].append(value)
        return columns

    def to_numpy(self, start: int, stop: int) -> dict[str, np.ndarray]:
        return {key: _stack_values(values) for key, values in self._columns(start, stop).items()}

    def to_torch(self, start: int, stop: int) -> dict[str, torch.Tensor]:
        import torch

        out = {}
        for key, values in self._columns(start, stop).items():
            if all(isinstance(v, torch.Tensor) for v in values) and len({v.shape for v in values}) == 1:
                out[key] = torch.stack(values)
            else:
                out[key] = _numpy_to_torch(key, _stack_values(values))
        return out


def _sample_columns(sample: Any) -> dict[str, Any]:
    """The tuple-sample rule: dict -> its keys; tuple/list of length k -> "0".."k-1"; else "item"."""
    if isinstance(sample, dict):
        return {str(key): value for key, value in sample.items()}
    if isinstance(sample, (tuple, list)):
        return {str(position): value for position, value in enumerate(sample)}
    return {"item": sample}


# ----------------------------------------------------------------------------------------------------
# Column conversions
# ----------------------------------------------------------------------------------------------------


def _stack_values(values: list[Any]) -> np.ndarray:
    """One numpy column from per-row values: tensors become arrays, equal shapes are stacked."""
    if "torch" in sys.modules:
        tensor = sys.modules["torch"].Tensor
        values = [v.detach().cpu().numpy() if isinstance(v, tensor) else v for v in values]
    if values and all(isinstance(v, np.ndarray) for v in values) and len({v.shape for v in values}) == 1:
        return np.stack(values)
    try:
        return np.asarray(values)
    except ValueError:  # ragged: keep one object per row
        out = np.empty(len(values), dtype=object)
        for index, value in enumerate(values):
            out[index] = value
        return out


def _stack_objects(array: np.ndarray) -> np.ndarray:
    """An object column whose rows are equal-shaped arrays becomes one multi-dimensional array."""
    if array.dtype == object and len(array) and all(isinstance(v, np.ndarray) for v in array):
        if len({v.shape for v in array}) == 1:
            return np.stack(list(array))
    return array


def _per_row(array: np.ndarray) -> np.ndarray:
    """A column for pandas: 1-D as is, multi-dimensional as an object array of per-row arrays."""
    if array.ndim <= 1:
        return array
    out = np.empty(len(array), dtype=object)
    for index in range(len(array)):
        out[index] = array[index]
    return out


def _numpy_to_arrow(name: str, array: np.ndarray) -> pa.Array:
    import pyarrow as pa

    try:
        if array.ndim <= 1:
            return pa.array(list(array) if array.dtype == object else array)
        result = pa.array(np.ascontiguousarray(array).reshape(-1))
        for size in reversed(array.shape[1:]):
            result = pa.FixedSizeListArray.from_arrays(result, size)
        return result
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise TypeError(
            f"column {name!r} (dtype {array.dtype}, shape {array.shape}) cannot become a pyarrow column: {exc}. "
            "Use batch_format='numpy' or 'pandas'."
        ) from exc


def _arrow_to_numpy(column: pa.ChunkedArray) -> np.ndarray:
    """A numpy column from an arrow column; fixed-size list columns get their shape back."""
    import pyarrow as pa

    values = column.combine_chunks()
    shape: list[int] = []
    while pa.types.is_fixed_size_list(values.type) and values.null_count == 0:
        shape.append(values.type.list_size)
        values = values.flatten()
    if shape and values.null_count == 0:
        array = values.to_numpy(zero_copy_only=False).reshape(len(column), *shape)
    else:
        array = _stack_objects(column.to_numpy())
    return array if array.flags.writeable and array.flags.owndata else array.copy()


def _numpy_to_torch(name: str, array: np.ndarray) -> torch.Tensor:
    import torch

    array = _stack_objects(array)
    if array.dtype.kind in "OUSV":
        raise TypeError(
            f"column {name!r} holds {array.dtype} values, which torch tensors cannot hold: use "
            "iter_batches() for it, or drop the column."
        )
    try:
        return torch.from_numpy(np.ascontiguousarray(array))
    except TypeError as exc:
        raise TypeError(
            f"column {name!r} of dtype {array.dtype} cannot become a torch tensor: {exc}. Use iter_batches()."
        ) from exc
