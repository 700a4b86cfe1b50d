"""A rank's dataset shard on the worker (:class:`DataShard`, what ``get_dataset_shard(name)``
returns): its rows, batched.

Batch formats of :meth:`DataShard.iter_batches`:

- ``"numpy"``: ``dict[str, np.ndarray]``; multi-dimensional columns keep their shape;
- ``"pandas"``: ``pd.DataFrame``; a multi-dimensional column becomes an object column holding one
  numpy array per row;
- ``"pyarrow"``: ``pa.Table``; a multi-dimensional column becomes a fixed-size list column (nested for
  more than two dimensions), which turns back into the original shape in numpy batches.

Batches never share memory with the shard, so changing a batch in place does not change the next epoch.
The rows themselves are a block (:mod:`trainforge._internal.dataset_blocks`), one implementation per
source type.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    import pyarrow as pa
    import torch

    from trainforge._internal.dataset_blocks import Block

BATCH_FORMATS = ("numpy", "pandas", "pyarrow")

TorchDtypes = Union["torch.dtype", Mapping[str, "torch.dtype"], None]


class DataShard:
    """One rank's part of a dataset, returned by ``get_dataset_shard(name)``. Picklable."""

    def __init__(self, name: str, block: Block) -> None:
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
