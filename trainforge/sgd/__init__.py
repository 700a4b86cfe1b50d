"""RaySGD v1 (Ray <= 1.12) on trainforge: a RaySGD program runs with its imports changed from
RaySGD's package to ``trainforge.sgd`` (``TorchTrainer``), ``trainforge.sgd.torch`` (``TorchTrainer``,
``TrainingOperator``) and ``trainforge.sgd.utils`` (``BATCH_SIZE``, ``AverageMeterCollection``).

A ``TrainingOperator`` is a :class:`trainforge.model.Model` with RaySGD's hook names, and the
driver's ``TorchTrainer`` drives a ``trainforge.model.ModelTrainer`` one epoch per ``train()``: the
same managed loop inside an ordinary ``trainforge.torch.TorchTrainer`` run. Importing it does not
import torch.
"""

from trainforge.sgd._operator import TrainingOperator
from trainforge.sgd._trainer import TorchTrainer

__all__ = ["TorchTrainer", "TrainingOperator"]
