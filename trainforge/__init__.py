"""trainforge: run a single-process training loop on N data-parallel workers.

The API mirrors Ray Train 2.x (``from ray import train`` -> ``import trainforge as train``).
Importing trainforge is light: torch, ray, pandas and pyarrow are imported only where used.
"""

import logging as _logging

from trainforge._internal.callback import Callback
from trainforge._internal.checkpoint import Checkpoint
from trainforge._internal.config import (
    CheckpointConfig,
    CheckpointUploadMode,
    FailureConfig,
    RunConfig,
    ScalingConfig,
)
from trainforge._internal.exceptions import StorageError, TrainingFailedError, WorkerFailure
from trainforge._internal.result import Result, TrainingReport
from trainforge._internal.session import (
    TrainContext,
    get_checkpoint,
    get_context,
    get_dataset_shard,
    report,
)
from trainforge._internal.trainer import DataParallelTrainer

__version__ = "0.1.0"

# The one piece of logging set-up a library does (Python's logging HOWTO): without a handler, Python's
# last-resort handler would print trainforge's warnings bare. fit() shows them as "trainforge: ..."
# console lines instead (trainforge._internal.progress); applications may add their own handlers.
_logging.getLogger("trainforge").addHandler(_logging.NullHandler())

__all__ = [
    "Callback",
    "Checkpoint",
    "CheckpointConfig",
    "CheckpointUploadMode",
    "DataParallelTrainer",
    "FailureConfig",
    "Result",
    "RunConfig",
    "ScalingConfig",
    "StorageError",
    "TrainContext",
    "TrainingFailedError",
    "TrainingReport",
    "WorkerFailure",
    "get_checkpoint",
    "get_context",
    "get_dataset_shard",
    "report",
]
