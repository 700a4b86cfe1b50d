"""``run(dataset=...)``: a dataset, or a dict of named datasets, split among the workers.

As in Ray Train 1.x every dataset is split (each worker gets ``1/num_workers`` of it, and
``train.get_dataset_shard(name)`` returns its part). A value is anything trainforge's datasets take
(a list of items or rows, a dict of numpy arrays, a pandas DataFrame, a pyarrow Table, a torch
map-style Dataset: the worker gets a ``DataShard`` with ``iter_batches`` / ``iter_torch_batches`` /
``iter_rows``), or a ``ray.data.Dataset`` when the workers are Ray actors (the worker gets its
``Dataset`` of ``ds.split(num_workers, equal=True)``, as in 1.x).
"""

from __future__ import annotations

import os
from typing import Any

from trainforge._internal.datasets import TRAIN_KEY, check_datasets, is_ray_dataset, shard_datasets


def check_dataset(dataset: Any, on_ray: bool) -> None:
    """Raise ``TypeError`` / ``ValueError`` before anything runs if ``dataset`` is not accepted."""
    for name, value in _named(dataset).items():
        if is_ray_dataset(value):
            if not on_ray:
                raise ValueError(
                    f"run(dataset=...): {name or 'the dataset'} is a ray.data.Dataset, but the workers are local "
                    "processes: call ray.init() before creating the Trainer (its workers are then Ray actors), or "
                    "pass the data as a list, a dict of numpy arrays, a DataFrame or a torch Dataset."
                )
            continue
        check_datasets({name or TRAIN_KEY: value})


def split_dataset(dataset: Any, world_size: int) -> list[Any]:
    """One entry per rank: its shard, a dict of its shards (a dict of datasets), or None."""
    if dataset is None:
        return [None] * world_size
    named = _named(dataset)
    per_rank: list[dict[str | None, Any]] = [{} for _ in range(world_size)]
    for name, value in named.items():
        if is_ray_dataset(value):
            parts = value.split(world_size, equal=True)
        else:
            parts = [shards[TRAIN_KEY] for shards in shard_datasets({TRAIN_KEY: value}, world_size)]
        for rank, part in enumerate(parts):
            per_rank[rank][name] = part
    if None in named:
        return [shards[None] for shards in per_rank]
    return per_rank


def _named(dataset: Any) -> dict[str | None, Any]:
    """``{name: dataset}``; a single dataset under the name None."""
    if dataset is None:
        return {}
    if isinstance(dataset, dict):
        bad = [k for k in dataset if not isinstance(k, str)]
        if bad:
            raise TypeError(f"run(dataset={{...}}): dataset names must be strings, got {bad!r}")
        return dict(dataset)
    return {None: dataset}


def executor_is_ray() -> bool:
    """Whether a new worker group runs on Ray actors (trainforge's "auto" rule: this process is
    connected to Ray, or $RAY_ADDRESS is set)."""
    from trainforge._internal.ray_utils import ENV_RAY_ADDRESS, ray_connected

    return ray_connected() or bool(os.environ.get(ENV_RAY_ADDRESS))
