"""RaySGD's PyTorch API: ``from trainforge.sgd.torch import TorchTrainer, TrainingOperator`` in place
of RaySGD's ``torch`` module (see :mod:`trainforge.sgd`)."""

from trainforge._internal.managed.operator import TrainingOperator
from trainforge._internal.managed.sgd import TorchTrainer

__all__ = ["TorchTrainer", "TrainingOperator"]
