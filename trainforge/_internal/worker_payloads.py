"""What each worker of an attempt is sent: a pickled :class:`TrainPayload` (its context, the train
loop and its config, the checkpoint to start from, its dataset shards); and which datasets are
split across the workers (``dataset_config``) rather than given whole to each."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from trainforge._internal.checkpoint import Checkpoint
from trainforge._internal.config import RunConfig
from trainforge._internal.session import TrainContext
from trainforge._internal.storage import StorageContext
from trainforge._internal.train_fn import TrainPayload
from trainforge._internal.worker_group.api import WorkerSpec
from trainforge._internal.worker_group.executor import Executor

MakePayloads = Callable[[int, Checkpoint | None, list[WorkerSpec]], list[bytes]]


def payload_maker(
    *,
    storage: StorageContext,
    executor: Executor,
    train_fn: Callable[..., Any],
    takes_config: bool,
    config: dict[str, Any] | None,
    metadata: dict[str, Any],
    datasets: dict[str, Any] | None,
    to_split: list[str] | str,
    backend_config: Any,
    run_config: RunConfig,
) -> MakePayloads:
    """The controller's ``make_payloads(attempt, checkpoint, specs)``: one pickled payload per spec."""
    from trainforge._internal import code_pickle
    from trainforge._internal.datasets import is_ray_dataset, shard_datasets

    shards_by_size: dict[int, list[dict[str, Any]]] = {}
    # Ray Data splits are made anew for every attempt (a split serves one group of consumers).
    per_attempt = any(is_ray_dataset(v) for v in (datasets or {}).values())

    # The context each worker runs the loop in (BackendConfig.train_func_context); none by default.
    train_func_context = getattr(backend_config, "train_func_context", None)
    if train_func_context is contextlib.nullcontext:
        train_func_context = None

    def make(attempt: int, checkpoint: Checkpoint | None, specs: list[WorkerSpec]) -> list[bytes]:
        n = len(specs)
        if n not in shards_by_size or per_attempt:  # an elastic resize re-shards for the new size
            shards_by_size[n] = split_datasets(shard_datasets, datasets, n, to_split, executor.split_ray_dataset)
        shards = shards_by_size[n]
        payloads = []
        for spec in specs:
            context = TrainContext(
                world_size=spec.world_size,
                world_rank=spec.rank,
                local_rank=spec.local_rank,
                local_world_size=spec.local_world_size,
                node_rank=spec.node_rank,
                experiment_name=storage.name,
                metadata=dict(metadata),
                trial_dir=storage.run_path,
                attempt=attempt,
                verbose=run_config.verbose,
            )
            payload = TrainPayload(
                train_fn=train_fn,
                takes_config=takes_config,
                config=config,
                context=context,
                storage=storage,
                checkpoint=checkpoint,
                shards=shards[spec.rank],
                upload_mode=run_config.checkpoint_config.checkpoint_upload_mode.value,  # type: ignore[union-attr]
                train_func_context=train_func_context,
            )
            payloads.append(code_pickle.dumps(payload))
        return payloads

    return make


def datasets_to_split(dataset_config: Any) -> list[str] | str:
    """``dataset_config``: None (split "train"), or anything with ``datasets_to_split`` ("all" or a list
    of names), as Ray Train's DataConfig."""
    if dataset_config is None:
        return ["train"]
    value = dataset_config.get("datasets_to_split") if isinstance(dataset_config, dict) else getattr(
        dataset_config, "datasets_to_split", None
    )
    if value == "all" or (isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)):
        return value if value == "all" else list(value)
    raise ValueError(
        f"dataset_config={dataset_config!r}: datasets_to_split={value!r} is not valid; use 'all' or a list of "
        "dataset names."
    )


def split_datasets(
    shard_fn: Callable[[dict[str, Any] | None, int], list[dict[str, Any]]],
    datasets: dict[str, Any] | None,
    n: int,
    to_split: list[str] | str,
    ray_split: Callable[[str, Any, int, bool], list[Any]] | None = None,
) -> list[dict[str, Any]]:
    """Shard each dataset: names in ``to_split`` are split across workers, others given whole.
    ``ray.data.Dataset`` values go to ``ray_split(name, dataset, n, split)`` (the executor's)."""
    from trainforge._internal.datasets import is_ray_dataset

    out: list[dict[str, Any]] = [{} for _ in range(n)]
    for key, value in (datasets or {}).items():
        split = to_split == "all" or key in to_split
        if ray_split is not None and is_ray_dataset(value):
            shards = ray_split(key, value, n, split)
        else:
            per_rank = shard_fn({"train" if split else "whole": value}, n)
            shards = [next(iter(per_rank[rank].values())) for rank in range(n)]
        for rank in range(n):
            out[rank][key] = shards[rank]
    return out
