"""What a run directory keeps of its trainer: ``run_state.json`` (the run's status, size, checkpoint
settings, error and the failures it recovered from, rewritten as the run goes) and ``trainer.pkl``
(the trainer's constructor arguments, cloudpickled), from which ``DataParallelTrainer.restore()``
rebuilds the trainer of an interrupted run."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from trainforge._internal.config import CheckpointConfig
from trainforge._internal.exceptions import WorkerFailure
from trainforge._internal.failure_log import failures_to_json
from trainforge._internal.storage import RUN_STATE_FILE, StorageContext, dumps

logger = logging.getLogger("trainforge")

TRAINER_STATE_FILE = "trainer.pkl"


def write_run_state(
    storage: StorageContext,
    trainer: str,
    num_workers: Any,
    checkpoint_config: CheckpointConfig,
    status: str,
    error: BaseException | None = None,
    failures: list[list[WorkerFailure]] | None = None,
) -> None:
    """(Re)write the run's ``run_state.json``; ``trainer`` is the trainer's class name."""
    cc = checkpoint_config
    state = {
        "trainer": trainer,
        "status": status,
        "num_workers": num_workers,
        "checkpoint_config": {
            "num_to_keep": cc.num_to_keep,
            "checkpoint_score_attribute": cc.checkpoint_score_attribute,
            "checkpoint_score_order": cc.checkpoint_score_order,
        },
        "error": str(error) if error is not None else None,
        "failures": failures_to_json(failures or []),  # those the run recovered from too
        "time": time.time(),
    }
    storage.write_text(RUN_STATE_FILE, dumps(state))


def save_trainer(storage: StorageContext, constructor_state: Callable[[], dict[str, Any]]) -> bool:
    """Save the trainer (its ``constructor_state()``) for ``restore()``; False if it cannot be pickled."""
    import cloudpickle

    try:
        blob = cloudpickle.dumps(constructor_state())
    except Exception as exc:  # an unpicklable config: the run still works, restore will not
        logger.warning("the trainer cannot be saved for restore(): %s", exc)
        return False
    storage.write_bytes(TRAINER_STATE_FILE, blob)
    return True


def _run_storage(path: str | os.PathLike, storage_filesystem: Any) -> tuple[str, str, StorageContext]:
    parent, _, name = os.fspath(path).rstrip("/").rpartition("/")
    return parent, name, StorageContext(parent or ".", name, storage_filesystem)


def can_restore(path: str | os.PathLike, storage_filesystem: Any = None) -> bool:
    """True if ``path`` is a run directory that ``restore()`` can resume."""
    _, _, storage = _run_storage(path, storage_filesystem)
    return storage.read_text(RUN_STATE_FILE) is not None and storage._exists(storage.path(TRAINER_STATE_FILE))


def load_trainer(cls: Any, path: str | os.PathLike, storage_filesystem: Any, overrides: dict[str, Any]) -> Any:
    """``cls.restore(path, ...)``: the saved trainer, rebuilt with ``overrides`` and its run config
    pointing at ``path`` (so ``fit()`` continues that run)."""
    import cloudpickle

    parent, name, storage = _run_storage(path, storage_filesystem)
    if not cls.can_restore(path, storage_filesystem):
        raise ValueError(
            f"{cls.__name__}.restore({os.fspath(path)!r}): not a trainforge run directory "
            f"({RUN_STATE_FILE} or {TRAINER_STATE_FILE} missing). Check the path with can_restore()."
        )
    state = cloudpickle.loads(storage.read_bytes(TRAINER_STATE_FILE))
    trainer_cls = state.pop("trainer_cls")
    state.update(overrides)
    run_config = state["run_config"]
    run_config.name = name
    run_config.storage_path = parent or "."
    return trainer_cls(**state)
