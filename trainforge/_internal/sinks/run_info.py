"""Who a run is, for a sink: a plain ``fit()`` or a tuner's trial, its config, where its files go.

``Callback.on_run_start`` is given the run's path and size only. The rest (the trainer's
``train_loop_config``, its ``metadata``, where a tuner puts the trial's identity, and the run's
storage) is read from the trainer whose ``fit()`` calls the hook, which the trainer makes known to
the hooks it calls (``callback.starting_run()``). Outside of a trainer's hooks (a hook called by
hand) the run is described by its path alone.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from trainforge._internal.sinks.trial import TrialInfo
from trainforge._internal.sinks.values import loggable_config

logger = logging.getLogger("trainforge.sinks")

TUNE_METADATA_KEY = "tune"  # the trial identity a tuner puts in the run's metadata (tune's TUNE_KEY)
_MAX_FRAMES = 12


def describe_run(
    run_path: str, num_workers: int | tuple[int, int]
) -> tuple[TrialInfo, Callable[[str], None] | None]:
    """The run starting at ``run_path`` and, for a run on remote storage, the function that copies
    the sink's local files into the run directory once the run has ended (None on local storage:
    the sink writes into the run directory itself)."""
    trainer, storage = _find_trainer()
    name = run_path.rstrip("/").rsplit("/", 1)[-1]
    metadata: dict[str, Any] = dict(getattr(trainer, "metadata", None) or {})
    config = getattr(trainer, "train_loop_config", None) or {}
    tune = metadata.get(TUNE_METADATA_KEY) if isinstance(metadata.get(TUNE_METADATA_KEY), dict) else None
    remote = storage is not None and not storage.is_local
    upload = None
    if remote:
        local_path = tempfile.mkdtemp(prefix=f"trainforge_sinks_{name}_")
        upload = _uploader(storage)
    else:
        local_path = os.path.abspath(run_path)
    trial = TrialInfo(
        trial_id=str(tune["trial_id"]) if tune else name,
        trial_name=str(tune["trial_name"]) if tune else name,
        experiment_name=str(tune["experiment_name"]) if tune else None,
        config=loggable_config(config) if isinstance(config, dict) else {},
        path=run_path,
        local_path=local_path,
        experiment_path=run_path.rstrip("/").rsplit("/", 1)[0] if tune else None,
        num_workers=num_workers,
        run_name=name,
        metadata=metadata,
    )
    return trial, upload


def _find_trainer() -> tuple[Any, Any]:
    """The ``DataParallelTrainer`` whose ``on_run_start`` hooks are running, and its ``StorageContext``."""
    from trainforge._internal.callback import starting_run
    from trainforge._internal.storage import StorageContext
    from trainforge._internal.trainer import DataParallelTrainer

    trainer, storage = starting_run()
    if not isinstance(trainer, DataParallelTrainer):
        logger.debug("sinks: on_run_start outside a trainer's run; the run is described by its path")
        return None, None
    return trainer, storage if isinstance(storage, StorageContext) else None


def _uploader(storage: Any) -> Callable[[str], None]:
    def upload(local_path: str) -> None:
        """Copy the sink's files of a run on remote storage into its run directory, then remove them."""
        if os.path.isdir(local_path) and os.listdir(local_path):
            storage.fs.put(local_path.rstrip("/") + "/", storage.run_path.rstrip("/") + "/", recursive=True)
        shutil.rmtree(local_path, ignore_errors=True)

    return upload
