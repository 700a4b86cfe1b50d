"""One model object for training, tuning, the registry and serving, and a managed training loop.

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

``import trainforge.model`` does not import torch; a missing torch raises ImportError naming
``pip install 'trainforge[torch]'`` when the model or trainer needs it.
"""

from trainforge._internal.managed.config import BATCH_SIZE, EarlyStopping, LoopConfig
from trainforge._internal.managed.model import Model
from trainforge._internal.managed.trainer import ModelTrainer

__all__ = ["BATCH_SIZE", "EarlyStopping", "LoopConfig", "Model", "ModelTrainer"]
