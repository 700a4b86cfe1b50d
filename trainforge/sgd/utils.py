"""RaySGD's utilities: ``from trainforge.sgd.utils import BATCH_SIZE`` in place of RaySGD's ``utils``
module. ``config[BATCH_SIZE]`` ("batch_size") is the global batch size, divided among the workers."""

from trainforge.model import BATCH_COUNT, BATCH_SIZE, NUM_SAMPLES
from trainforge.sgd._meters import AverageMeter, AverageMeterCollection

__all__ = ["AverageMeter", "AverageMeterCollection", "BATCH_COUNT", "BATCH_SIZE", "NUM_SAMPLES"]
