"""RaySGD's PyTorch API: ``from trainforge.sgd.torch import TorchTrainer, TrainingOperator`` in place
of RaySGD's ``torch`` module (see :mod:`trainforge.sgd`)."""

from trainforge.sgd._operator import TrainingOperator
from trainforge.sgd._trainer import TorchTrainer

__all__ = ["TorchTrainer", "TrainingOperator"]
