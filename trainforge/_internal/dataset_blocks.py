"""Blocks: the rows under a :class:`~trainforge._internal.dataset_shard.DataShard`, one implementation
per source type (numpy columns, a pandas DataFrame, a pyarrow Table, a torch map-style Dataset and an
index range of it), each converting a row range to every batch format; and the column conversions
between numpy, pandas, pyarrow and torch they share.

A torch sample gives its columns by the tuple-sample rule: a dict sample one column per key, a tuple
or list sample of length k the columns ``"0"`` .. ``"k-1"``, any other sample the column ``"item"``.
"""

from __future__ import annotations

import abc
import sys
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa
    import torch



class Block(abc.ABC):
    """Rows ``[0, num_rows)`` of one source; converts a row range to each batch format."""

    source: str

    @property
    @abc.abstractmethod
    def num_rows(self) -> int: ...

    @abc.abstractmethod
    def slice(self, start: int, stop: int) -> Block:
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


class NumpyBlock(Block):
    source = "numpy"

    def __init__(self, columns: dict[str, np.ndarray]) -> None:
        self.columns = columns

    @property
    def num_rows(self) -> int:
        return len(next(iter(self.columns.values())))

    def slice(self, start: int, stop: int) -> NumpyBlock:
        return NumpyBlock({key: array[start:stop].copy() for key, array in self.columns.items()})

    def to_numpy(self, start: int, stop: int) -> dict[str, np.ndarray]:
        return {key: array[start:stop].copy() for key, array in self.columns.items()}


class PandasBlock(Block):
    source = "pandas"

    def __init__(self, frame: pd.DataFrame) -> None:
        self.frame = frame

    @property
    def num_rows(self) -> int:
        return len(self.frame)

    def slice(self, start: int, stop: int) -> PandasBlock:
        return PandasBlock(self.frame.iloc[start:stop].copy())

    def to_numpy(self, start: int, stop: int) -> dict[str, np.ndarray]:
        part = self.frame.iloc[start:stop]
        return {str(key): _stack_objects(part[key].to_numpy(copy=True)) for key in part.columns}

    def to_pandas(self, start: int, stop: int) -> pd.DataFrame:
        return self.frame.iloc[start:stop].reset_index(drop=True)

    def to_arrow(self, start: int, stop: int) -> pa.Table:
        import pyarrow as pa

        return pa.Table.from_pandas(self.frame.iloc[start:stop], preserve_index=False)


class ArrowBlock(Block):
    source = "pyarrow"

    def __init__(self, table: pa.Table) -> None:
        self.table = table

    @property
    def num_rows(self) -> int:
        return self.table.num_rows

    def slice(self, start: int, stop: int) -> ArrowBlock:
        # Table.slice shares the parent's buffers and would pickle all of them: take() copies the rows.
        return ArrowBlock(self.table.take(np.arange(start, stop)))

    def to_numpy(self, start: int, stop: int) -> dict[str, np.ndarray]:
        part = self.table.slice(start, stop - start)
        return {name: _arrow_to_numpy(part.column(name)) for name in part.column_names}

    def to_pandas(self, start: int, stop: int) -> pd.DataFrame:
        return self.table.slice(start, stop - start).to_pandas()

    def to_arrow(self, start: int, stop: int) -> pa.Table:
        return self.table.slice(start, stop - start)


class TorchBlock(Block):
    """A torch map-style dataset and the index range ``[start, stop)`` of it that this block covers."""

    source = "torch"

    def __init__(self, dataset: Any, start: int, stop: int) -> None:
        self.dataset = dataset
        self.start = start
        self.stop = stop

    @property
    def num_rows(self) -> int:
        return self.stop - self.start

    def slice(self, start: int, stop: int) -> TorchBlock:
        return TorchBlock(self.dataset, self.start + start, self.start + stop)

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
        return {key: stack_values(values) for key, values in self._columns(start, stop).items()}

    def to_torch(self, start: int, stop: int) -> dict[str, torch.Tensor]:
        import torch

        out = {}
        for key, values in self._columns(start, stop).items():
            if all(isinstance(v, torch.Tensor) for v in values) and len({v.shape for v in values}) == 1:
                out[key] = torch.stack(values)
            else:
                out[key] = _numpy_to_torch(key, stack_values(values))
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


def stack_values(values: list[Any]) -> np.ndarray:
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
