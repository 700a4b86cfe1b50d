"""Ray Train 1.x (the ``Trainer`` API of Ray 1.7 - 1.13) on trainforge: a Ray Train 1.x program runs
with its imports changed from ``ray.train`` to ``trainforge.v1``:

=====================================================  ==========================================================
Ray Train 1.x                                          trainforge
=====================================================  ==========================================================
``import ray.train as train``                          ``import trainforge.v1 as train``
``from ray import train``                              ``from trainforge import v1 as train``
``from ray.train import Trainer, CheckpointStrategy``  ``from trainforge.v1 import Trainer, CheckpointStrategy``
``from ray.train.callbacks import JsonLoggerCallback`` ``from trainforge.v1.callbacks import JsonLoggerCallback``
``from ray.train.torch import prepare_model``          ``from trainforge.v1.torch import prepare_model``
=====================================================  ==========================================================

A started ``Trainer`` keeps its workers up between ``run()`` calls (one core run driven one command
at a time); ``train.report()`` results, ``train.save_checkpoint()`` checkpoints (kept in 1.x's layout,
``{logdir}/run_NNN/checkpoints/checkpoint_NNNNNN``) and the workers' return values come back as the
run goes; ``max_retries`` restarts failed workers from the latest checkpoint. Ray Train 2.x's API
(``trainforge.report`` ...) stays as it is: calling one API's function inside the other's run raises
an error naming the function to call. ``import trainforge.v1`` imports neither torch nor TensorFlow.
"""

from trainforge.backend import BackendConfig
from trainforge.tensorflow import TensorflowConfig
from trainforge.torch import TorchConfig
from trainforge.v1 import callbacks as callbacks
from trainforge.v1 import tensorflow as tensorflow
from trainforge.v1 import torch as torch
from trainforge.v1._checkpoint import CheckpointStrategy
from trainforge.v1._iterator import TrainingIterator
from trainforge.v1._session import (
    get_dataset_shard,
    load_checkpoint,
    local_rank,
    report,
    save_checkpoint,
    world_rank,
    world_size,
)
from trainforge.v1._trainer import Trainer
from trainforge.v1.callbacks import TrainingCallback

__all__ = [
    "BackendConfig",
    "CheckpointStrategy",
    "TensorflowConfig",
    "TorchConfig",
    "Trainer",
    "TrainingCallback",
    "TrainingIterator",
    "get_dataset_shard",
    "load_checkpoint",
    "local_rank",
    "report",
    "save_checkpoint",
    "world_rank",
    "world_size",
]
