"""One model object for training, tuning, the registry and serving, for PyTorch, XGBoost, LightGBM and
Keras, and a managed training loop.

``Model`` carries a network's set-up, forward pass, training and validation steps and
pre/post-processing; ``ModelTrainer`` trains it with the managed loop (epochs, the global batch
split over the workers, sample-weighted metrics averaged over the workers, mixed precision in one
flag, schedulers, gradient accumulation and clipping, checkpoints every N epochs or batches,
resuming at the right epoch and batch, early stopping) inside an ordinary
``trainforge.torch.TorchTrainer`` run; or drives it one epoch per ``train()`` / ``validate()`` call.

Example::

    from trainforge.model import BATCH_SIZE, LoopConfig, Model, ModelTrainer

    class Regressor(Model):
        def setup(self, config):
            net = torch.nn.Linear(8, 1)
            self.register(models=net, optimizers=torch.optim.SGD(net.parameters(), lr=config["lr"]),
                          criterion=torch.nn.MSELoss())

        def setup_data(self, config):
            self.register_data(train_loader=DataLoader(train_set, batch_size=config[BATCH_SIZE], shuffle=True),
                               validation_loader=DataLoader(val_set, batch_size=256))

    result = ModelTrainer(Regressor, config={"lr": 0.05, BATCH_SIZE: 64},
                          loop_config=LoopConfig(num_epochs=5)).fit()
    model = Regressor.from_checkpoint(result.checkpoint)
    y = model(x)

The same hooks for every framework (``setup``, ``preprocess``, ``forward``, ``postprocess``,
``hyperparameter_space``, save/load): :class:`XGBoostModel`, :class:`LightGBMModel` and
:class:`KerasModel` beside the PyTorch ``Model``; ``ModelTrainer(MyModel, data=MyData)`` trains each
through its framework's integration, with a :class:`Data` object's splits; ``ModelTrainer("models:/name")``
trains a definition registered with ``Registry.put``.

``import trainforge.model`` imports no framework; a missing one raises ImportError naming its extra
(``pip install 'trainforge[torch]'``, ``[xgboost]``, ...) when the model or trainer needs it.
"""

from trainforge.model._artifact import class_path as class_path
from trainforge.model._artifact import import_path as import_path
from trainforge.model._artifact import load_model as load_model
from trainforge.model._artifact import read_definition as read_definition
from trainforge.model._artifact import read_manifest as read_manifest
from trainforge.model._artifact import write_definition as write_definition
from trainforge.model._base import BaseModel
from trainforge.model._base import is_model_class as is_model_class
from trainforge.model._commands import DRIVER_KEY as DRIVER_KEY
from trainforge.model._commands import Command as Command
from trainforge.model._commands import CommandClient as CommandClient
from trainforge.model._commands import CommandServer as CommandServer
from trainforge.model._commands import driver_host as driver_host
from trainforge.model._config import BATCH_COUNT as BATCH_COUNT
from trainforge.model._config import BATCH_SIZE, EarlyStopping, LoopConfig
from trainforge.model._config import NUM_SAMPLES as NUM_SAMPLES
from trainforge.model._dataset import Data
from trainforge.model._dataset import check_data as check_data
from trainforge.model._definition import ModelDefinition as ModelDefinition
from trainforge.model._gbdt import LightGBMModel, XGBoostModel
from trainforge.model._keras import KerasModel
from trainforge.model._managed import DEFINITION_KEY as DEFINITION_KEY
from trainforge.model._managed import is_managed as is_managed
from trainforge.model._model import Model
from trainforge.model._steps import supervised as supervised
from trainforge.model._support import torch_module as torch_module
from trainforge.model._trainer import ModelTrainer

__all__ = ["BATCH_SIZE", "BaseModel", "Data", "EarlyStopping", "KerasModel", "LightGBMModel", "LoopConfig", "Model",
           "ModelTrainer", "XGBoostModel"]  # fmt: skip

# Not user API: what the registry, serving, Tune and the RaySGD and Ray Train 1.x ports use of the
# model object (how a model directory and a definition are named, written, read and loaded; the
# metadata key naming a run's definition; whether a trainer is a managed one; the loop's reserved
# metric names and its (*features, target) batch rule; the driver -> workers command channel of a worker group that stays up).
PLATFORM_INTERFACE = ("BATCH_COUNT", "DEFINITION_KEY", "DRIVER_KEY", "NUM_SAMPLES", "Command", "CommandClient",
                      "CommandServer", "ModelDefinition", "check_data", "class_path", "driver_host", "import_path",
                      "is_managed", "is_model_class", "load_model", "read_definition", "read_manifest", "supervised",
                      "torch_module", "write_definition")  # fmt: skip
