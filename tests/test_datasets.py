"""Unit tests of trainforge._internal.datasets: validation, the split rule, batch formats, pickling."""

from __future__ import annotations

import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch
from torch.utils.data import Dataset, IterableDataset, TensorDataset

from trainforge._internal.dataset_shard import BATCH_FORMATS, DataShard
from trainforge._internal.datasets import check_datasets, shard_datasets, split_ranges

# ----------------------------------------------------------------------------------------------------
# One factory per accepted type. Each builds n rows whose row i carries the id i in column ID[kind].
# ----------------------------------------------------------------------------------------------------


class DictSampleDataset(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return {"id": i, "x": torch.tensor([float(i), float(-i)])}


class PlainSequence:
    """Not a torch Dataset: accepted by duck typing (__getitem__ + __len__)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return i


def _tensor_dataset(n: int) -> TensorDataset:
    return TensorDataset(torch.arange(n * 3, dtype=torch.float32).reshape(n, 3), torch.arange(n))


FACTORIES: dict[str, Callable[[int], Any]] = {
    "items": lambda n: list(range(n)),
    "rows": lambda n: [{"id": i, "x": float(i) / 2} for i in range(n)],
    "arrays": lambda n: {"id": np.arange(n), "img": np.arange(n * 4, dtype=np.float32).reshape(n, 2, 2)},
    "pandas": lambda n: pd.DataFrame({"id": np.arange(n), "x": np.arange(n) * 0.5}),
    "arrow": lambda n: pa.table({"id": np.arange(n), "x": np.arange(n) * 0.5}),
    "torch_dict": DictSampleDataset,
    "torch_tuple": _tensor_dataset,
    "sequence": PlainSequence,
}
ID = {
    "items": "item",
    "rows": "id",
    "arrays": "id",
    "pandas": "id",
    "arrow": "id",
    "torch_dict": "id",
    "torch_tuple": "1",
    "sequence": "item",
}
KINDS = list(FACTORIES)


def ids_of(shard: DataShard, column: str) -> list[int]:
    return [int(v) for batch in shard.iter_batches(batch_size=5) for v in batch[column]]


# ----------------------------------------------------------------------------------------------------
# The split rule
# ----------------------------------------------------------------------------------------------------


def test_split_ranges_example_from_docs() -> None:
    assert split_ranges(10, 3) == [(0, 4), (4, 7), (7, 10)]


@pytest.mark.parametrize("kind", KINDS)
def test_train_split_every_row_exactly_once_and_balanced(kind: str) -> None:
    for world_size in range(1, 6):
        for num_rows in range(13):
            shards = shard_datasets({"train": FACTORIES[kind](num_rows)}, world_size)
            assert len(shards) == world_size
            per_rank = [ids_of(rank["train"], ID[kind]) for rank in shards]
            sizes = [len(ids) for ids in per_rank]
            assert sizes == [rank["train"].count() for rank in shards]
            assert max(sizes) - min(sizes) <= 1, (kind, world_size, num_rows, sizes)
            flat = [i for ids in per_rank for i in ids]
            assert flat == list(range(num_rows)), (kind, world_size, num_rows, per_rank)  # contiguous, once


@pytest.mark.parametrize("kind", KINDS)
def test_non_train_keys_are_whole_on_every_rank(kind: str) -> None:
    shards = shard_datasets({"train": list(range(9)), "val": FACTORIES[kind](7)}, 4)
    for rank in shards:
        assert len(rank["val"]) == 7
        assert ids_of(rank["val"], ID[kind]) == list(range(7))
    assert [len(rank["train"]) for rank in shards] == [3, 2, 2, 2]


def test_no_datasets_gives_empty_dict_per_rank() -> None:
    assert shard_datasets(None, 3) == [{}, {}, {}]
    assert shard_datasets({}, 2) == [{}, {}]


@pytest.mark.parametrize("world_size", [0, -1, 1.5, True, "2"])
def test_bad_world_size(world_size: Any) -> None:
    with pytest.raises(ValueError, match="world_size"):
        shard_datasets({"train": [1, 2]}, world_size)


# ----------------------------------------------------------------------------------------------------
# Batch formats
# ----------------------------------------------------------------------------------------------------


def _shard(kind: str, n: int = 10) -> DataShard:
    return shard_datasets({"train": FACTORIES[kind](n)}, 1)[0]["train"]


@pytest.mark.parametrize("kind", KINDS)
def test_numpy_batches(kind: str) -> None:
    batches = list(_shard(kind).iter_batches(batch_size=4, batch_format="numpy"))
    assert all(isinstance(b, dict) and all(isinstance(v, np.ndarray) for v in b.values()) for b in batches)
    assert [len(b[ID[kind]]) for b in batches] == [4, 4, 2]
    assert np.concatenate([b[ID[kind]] for b in batches]).tolist() == list(range(10))


@pytest.mark.parametrize("kind", KINDS)
def test_pandas_batches(kind: str) -> None:
    batches = list(_shard(kind).iter_batches(batch_size=4, batch_format="pandas"))
    assert all(isinstance(b, pd.DataFrame) for b in batches)
    assert [len(b) for b in batches] == [4, 4, 2]
    assert pd.concat(batches)[ID[kind]].astype(int).tolist() == list(range(10))
    assert batches[1].index.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("kind", KINDS)
def test_pyarrow_batches(kind: str) -> None:
    batches = list(_shard(kind).iter_batches(batch_size=4, batch_format="pyarrow"))
    assert all(isinstance(b, pa.Table) for b in batches)
    assert [b.num_rows for b in batches] == [4, 4, 2]
    assert pa.concat_tables(batches).column(ID[kind]).to_pylist() == list(range(10))


@pytest.mark.parametrize("batch_format", BATCH_FORMATS)
@pytest.mark.parametrize("kind", KINDS)
def test_drop_last_and_whole_shard_batch(kind: str, batch_format: str) -> None:
    shard = _shard(kind)

    def sizes(**kwargs: Any) -> list[int]:
        return [len(b) for b in _as_frames(shard.iter_batches(batch_format=batch_format, **kwargs))]

    assert sizes(batch_size=4, drop_last=True) == [4, 4]
    assert sizes(batch_size=4) == [4, 4, 2]
    assert sizes(batch_size=5, drop_last=True) == [5, 5]
    assert sizes(batch_size=None) == [10]


def _as_frames(batches: Any) -> list[pd.DataFrame]:
    out = []
    for batch in batches:
        if isinstance(batch, dict):
            batch = pd.DataFrame({k: list(v) for k, v in batch.items()})
        elif isinstance(batch, pa.Table):
            batch = batch.to_pandas()
        out.append(batch)
    return out


def test_empty_shard_yields_no_batches() -> None:
    shards = shard_datasets({"train": [1, 2]}, 3)
    assert len(shards[2]["train"]) == 0
    for batch_size in (4, None):
        assert list(shards[2]["train"].iter_batches(batch_size=batch_size)) == []
    assert list(shards[2]["train"].iter_torch_batches()) == []


@pytest.mark.parametrize("bad", ["np", "Numpy", "torch", ""])
def test_batch_format_typo(bad: str) -> None:
    with pytest.raises(ValueError, match=repr(bad)) as info:
        list(_shard("items").iter_batches(batch_format=bad))
    assert "pyarrow" in str(info.value) and "pandas" in str(info.value)


@pytest.mark.parametrize("bad", [0, -3, 2.0, True])
def test_bad_batch_size(bad: Any) -> None:
    with pytest.raises(ValueError, match="batch_size"):
        list(_shard("items").iter_batches(batch_size=bad))


def test_scalar_list_gives_item_column() -> None:
    shard = _shard("items", 5)
    (batch,) = shard.iter_batches(batch_size=None)
    assert list(batch) == ["item"]
    np.testing.assert_array_equal(batch["item"], np.arange(5))
    words = shard_datasets({"train": ["a", "bb", "c"]}, 1)[0]["train"]
    (batch,) = words.iter_batches(batch_size=None)
    assert batch["item"].tolist() == ["a", "bb", "c"]


def test_list_of_dicts_gives_one_column_per_key() -> None:
    shard = _shard("rows", 3)
    (batch,) = shard.iter_batches(batch_size=None)
    assert sorted(batch) == ["id", "x"]
    assert batch["x"].tolist() == [0.0, 0.5, 1.0]


def test_multidimensional_arrays_in_every_format() -> None:
    images = np.random.default_rng(0).random((6, 8, 8)).astype(np.float32)
    shard = shard_datasets({"train": {"image": images, "label": np.arange(6)}}, 2)[1]["train"]
    numpy_batch = next(shard.iter_batches(batch_size=2))
    assert numpy_batch["image"].shape == (2, 8, 8)
    np.testing.assert_array_equal(numpy_batch["image"], images[3:5])

    frame = next(shard.iter_batches(batch_size=2, batch_format="pandas"))
    assert frame["image"].dtype == object and frame["image"].iloc[0].shape == (8, 8)
    np.testing.assert_array_equal(frame["image"].iloc[1], images[4])

    table = next(shard.iter_batches(batch_size=2, batch_format="pyarrow"))
    assert pa.types.is_fixed_size_list(table.schema.field("image").type)
    assert np.asarray(table.column("image").to_pylist(), dtype=np.float32).shape == (2, 8, 8)
    # An arrow table with such a column, passed as a dataset, gives its shape back in numpy batches.
    from_arrow = shard_datasets({"train": table}, 1)[0]["train"]
    np.testing.assert_array_equal(next(from_arrow.iter_batches())["image"], images[3:5])

    tensors = next(shard.iter_torch_batches(batch_size=3))
    assert tensors["image"].shape == (3, 8, 8) and tensors["image"].dtype == torch.float32


def test_torch_tuple_samples_become_numbered_columns() -> None:
    shard = _shard("torch_tuple", 4)
    (batch,) = shard.iter_batches(batch_size=None)
    assert sorted(batch) == ["0", "1"]
    assert isinstance(batch["0"], np.ndarray) and batch["0"].shape == (4, 3)
    np.testing.assert_array_equal(batch["0"], np.arange(12, dtype=np.float32).reshape(4, 3))
    (tensors,) = shard.iter_torch_batches(batch_size=None)
    assert torch.equal(tensors["0"], torch.arange(12, dtype=torch.float32).reshape(4, 3))
    assert torch.equal(tensors["1"], torch.arange(4))


def test_torch_dict_samples_keep_their_keys() -> None:
    (batch,) = _shard("torch_dict", 3).iter_batches(batch_size=None)
    assert sorted(batch) == ["id", "x"]
    np.testing.assert_array_equal(batch["x"], [[0.0, -0.0], [1.0, -1.0], [2.0, -2.0]])


def test_iter_rows_and_count() -> None:
    shard = shard_datasets({"train": FACTORIES["rows"](5)}, 2)[0]["train"]
    assert shard.count() == len(shard) == 3
    rows = list(shard.iter_rows())
    assert [(int(r["id"]), float(r["x"])) for r in rows] == [(0, 0.0), (1, 0.5), (2, 1.0)]
    assert [r["item"] for r in _shard("items", 3).iter_rows()] == [0, 1, 2]


@pytest.mark.parametrize("batch_format", BATCH_FORMATS)
def test_batches_do_not_share_memory_with_the_shard(batch_format: str) -> None:
    shard = _shard("arrays", 4)
    batch = next(shard.iter_batches(batch_size=None))
    batch["id"][:] = 99
    tensors = next(shard.iter_torch_batches(batch_size=None))
    tensors["id"].fill_(-1)
    again = next(shard.iter_batches(batch_size=None, batch_format=batch_format))
    assert list(np.asarray(again["id"])) == [0, 1, 2, 3]


# ----------------------------------------------------------------------------------------------------
# iter_torch_batches
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_torch_batches(kind: str) -> None:
    shard = _shard(kind)
    batches = list(shard.iter_torch_batches(batch_size=4, device="cpu"))
    assert all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for b in batches for t in b.values())
    assert [len(b[ID[kind]]) for b in batches] == [4, 4, 2]
    assert torch.cat([b[ID[kind]] for b in batches]).tolist() == list(range(10))
    dropped = list(shard.iter_torch_batches(batch_size=4, drop_last=True))
    assert [len(b[ID[kind]]) for b in dropped] == [4, 4]


@pytest.mark.parametrize("kind", KINDS)
def test_torch_batches_single_dtype(kind: str) -> None:
    batch = next(
        _shard(kind).iter_torch_batches(batch_size=3, dtypes=torch.float64, device=torch.device("cpu"))
    )
    assert {t.dtype for t in batch.values()} == {torch.float64}
    assert batch[ID[kind]].tolist() == [0.0, 1.0, 2.0]


def test_torch_batches_dtype_per_column() -> None:
    batch = next(_shard("arrays").iter_torch_batches(batch_size=3, dtypes={"id": torch.float16}))
    assert batch["id"].dtype == torch.float16
    assert batch["img"].dtype == torch.float32  # untouched


def test_torch_batches_unknown_dtype_column() -> None:
    with pytest.raises(ValueError, match="nope"):
        next(_shard("arrays").iter_torch_batches(dtypes={"nope": torch.float32}))


def test_torch_batches_reject_bad_dtypes_value() -> None:
    with pytest.raises(TypeError, match="dtypes"):
        next(_shard("arrays").iter_torch_batches(dtypes="float32"))  # type: ignore[arg-type]


def test_torch_batches_string_column_names_it() -> None:
    shard = shard_datasets({"train": [{"text": "hi", "y": 1}]}, 1)[0]["train"]
    with pytest.raises(TypeError, match="'text'"):
        next(shard.iter_torch_batches())


# ----------------------------------------------------------------------------------------------------
# Pickling
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_pickle_round_trip(kind: str) -> None:
    shard = shard_datasets({"train": FACTORIES[kind](9)}, 2)[1]["train"]
    loaded = pickle.loads(pickle.dumps(shard))
    assert isinstance(loaded, DataShard)
    assert ids_of(loaded, ID[kind]) == [5, 6, 7, 8]


@pytest.mark.parametrize("kind", ["items", "rows", "arrays", "pandas", "arrow"])
def test_train_shard_pickles_only_its_rows(kind: str) -> None:
    data = FACTORIES[kind](40_000)
    whole = len(pickle.dumps(shard_datasets({"train": data}, 1)[0]["train"]))
    part = len(pickle.dumps(shard_datasets({"train": data}, 4)[3]["train"]))
    assert part < whole * 0.3, (kind, part, whole)


# ----------------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_accepted_types_pass_check(kind: str) -> None:
    assert check_datasets({"train": FACTORIES[kind](3), "val": FACTORIES[kind](0)}) is None


def test_none_and_empty_pass_check() -> None:
    check_datasets(None)
    check_datasets({})
    check_datasets({"train": []})


class _Stream(IterableDataset):
    def __iter__(self) -> Any:
        return iter(range(3))

    def __len__(self) -> int:  # has a length, and torch's Dataset gives it __getitem__: still refused
        return 3


@pytest.mark.parametrize(
    ("value", "type_name"),
    [
        (42, "int"),
        ("abc", "str"),
        (b"abc", "bytes"),
        ((1, 2), "tuple"),
        ({1, 2}, "set"),
        (np.arange(3), "ndarray"),
        (pd.Series([1, 2]), "Series"),
        (object(), "object"),
    ],
)
def test_unsupported_type_names_key_type_and_accepted(value: Any, type_name: str) -> None:
    with pytest.raises(TypeError) as info:
        check_datasets({"my_key": value})
    message = str(info.value)
    assert "'my_key'" in message and type_name in message
    assert "pandas DataFrame" in message and "torch map-style Dataset" in message
    with pytest.raises(TypeError, match="my_key"):
        shard_datasets({"my_key": value}, 2)


def test_iterable_dataset_needs_map_style() -> None:
    with pytest.raises(TypeError, match="map-style") as info:
        check_datasets({"train": _Stream()})
    assert (
        "'train'" in str(info.value) and "_Stream" in str(info.value) and "IterableDataset" in str(info.value)
    )


def test_dict_with_non_array_column() -> None:
    with pytest.raises(TypeError, match="'x'"):
        check_datasets({"train": {"x": [1, 2, 3]}})


def test_datasets_must_be_a_dict_with_str_keys() -> None:
    with pytest.raises(TypeError, match="list"):
        check_datasets([1, 2, 3])
    with pytest.raises(TypeError, match="key 0"):
        check_datasets({0: [1, 2]})


def test_mismatched_array_lengths() -> None:
    with pytest.raises(ValueError) as info:
        check_datasets({"train": {"x": np.zeros(5), "y": np.zeros(4)}})
    message = str(info.value)
    assert "'train'" in message and "'x': 5" in message and "'y': 4" in message


def test_list_of_dicts_with_different_keys() -> None:
    with pytest.raises(ValueError, match="row 1"):
        check_datasets({"train": [{"a": 1}, {"b": 2}]})
    with pytest.raises(ValueError, match="row 2"):
        check_datasets({"train": [{"a": 1}, {"a": 2}, 3]})


def test_ray_data_dataset_needs_ray_executor() -> None:
    fake = type("Dataset", (), {"__module__": "ray.data.dataset", "__len__": lambda self: 1})()
    with pytest.raises(ValueError, match="Ray executor") as info:
        check_datasets({"train": fake})
    assert "'train'" in str(info.value)


def test_import_is_light() -> None:
    path = Path(__file__).resolve().parents[1] / "trainforge" / "_internal" / "datasets.py"
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('datasets_under_test', {str(path)!r})\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "heavy = [m for m in ('torch', 'pandas', 'pyarrow') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "shard = module.shard_datasets({'train': list(range(5))}, 2)[0]['train']\n"
        "assert [b['item'].tolist() for b in shard.iter_batches(batch_size=2)] == [[0, 1], [2]]\n"
        "assert not [m for m in ('torch', 'pandas', 'pyarrow') if m in sys.modules]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
