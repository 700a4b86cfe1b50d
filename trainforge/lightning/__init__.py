"""PyTorch Lightning in a trainforge train loop (Ray Train's `lightning` names).

Build the ``Trainer`` inside the train loop of a :class:`trainforge.torch.TorchTrainer` with
trainforge's strategy, cluster environment and report callback, and pass it through
:func:`prepare_trainer`. Works with both the ``lightning`` package (``lightning.pytorch``) and the
standalone ``pytorch_lightning``: each class below is built from the namespace your code uses, so a
``pytorch_lightning.Trainer`` never gets a ``lightning.pytorch`` strategy (Ray's #47089).

Example::

    import lightning.pytorch as pl        # or: import pytorch_lightning as pl
    from trainforge.lightning import (RayDDPStrategy, RayLightningEnvironment, RayTrainReportCallback,
                                      prepare_trainer)

    def train_loop(config):
        trainer = pl.Trainer(max_epochs=5, devices="auto", accelerator="auto", strategy=RayDDPStrategy(),
                             plugins=[RayLightningEnvironment()], callbacks=[RayTrainReportCallback()],
                             enable_checkpointing=False, logger=False)
        trainer = prepare_trainer(trainer)
        ckpt_path = None
        checkpoint = trainforge.get_checkpoint()
        if checkpoint:
            with checkpoint.as_directory() as d:
                trainer.fit(MyModule(), train_loader, val_loader,
                            ckpt_path=os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME))
        else:
            trainer.fit(MyModule(), train_loader, val_loader)

    TorchTrainer(train_loop, scaling_config=ScalingConfig(num_workers=2)).fit()

``import trainforge.lightning`` does not import Lightning; constructing one of these classes does, and
raises ``ImportError`` naming the extra to install when it is missing.
"""

from __future__ import annotations

from typing import Any

from trainforge.lightning._dispatch import (
    RayDDPStrategy,
    RayDeepSpeedStrategy,
    RayFSDPStrategy,
    RayLightningEnvironment,
    RayTrainReportCallback,
)

__all__ = [
    "RayDDPStrategy", "RayFSDPStrategy", "RayDeepSpeedStrategy", "RayLightningEnvironment",
    "RayTrainReportCallback", "prepare_trainer",
]  # fmt: skip


def prepare_trainer(trainer: Any) -> Any:
    """Check ``trainer`` (a ``lightning.pytorch`` or ``pytorch_lightning`` ``Trainer``) runs on
    trainforge's workers; return it.

    Raises ``RuntimeError`` naming the fix when its strategy is not one of trainforge's
    ``RayDDPStrategy`` / ``RayFSDPStrategy`` / ``RayDeepSpeedStrategy``, its cluster environment is not
    ``RayLightningEnvironment``, or it sees another world size than the run's.
    """
    from trainforge.lightning import _trainer

    return _trainer.prepare_trainer(trainer)
