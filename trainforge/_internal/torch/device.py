"""The device a worker trains on (its GPU when it has one, else the CPU)."""

from __future__ import annotations

import os

import torch

from trainforge._internal import session
from trainforge._internal.constants import ENV_LOCAL_RANK


def get_device() -> torch.device:
    """The device this worker should train on: its GPU when it has one, else the CPU.

    Each GPU worker normally sees only its own GPU (``cuda:0``); when several workers see the same
    GPUs, worker ``LOCAL_RANK`` takes GPU ``LOCAL_RANK % device_count``.
    """
    if not torch.cuda.is_available():
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if session.in_session():
        local_rank = session.get_context().get_local_rank()
    else:
        local_rank = int(os.environ.get(ENV_LOCAL_RANK, "0"))
    return torch.device("cuda", local_rank % count)
