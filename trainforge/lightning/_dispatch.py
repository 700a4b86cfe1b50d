"""The public Lightning names: classes whose instances come from the namespace of the calling code.

``RayDDPStrategy()`` in code that uses ``pytorch_lightning`` gives an instance of the class built on
``pytorch_lightning``'s ``DDPStrategy``; in code that uses ``lightning.pytorch``, of the one built on
``lightning.pytorch``'s (see ``_namespace.resolve``). ``isinstance(x, RayDDPStrategy)`` is true for
either. These names import no Lightning until one is called.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from trainforge.lightning import _namespace
from trainforge.lightning._classes import MODULES


def classes(ns: str) -> Any:
    """The module holding namespace ``ns``'s classes (imports Lightning)."""
    return importlib.import_module(f"trainforge.lightning.{MODULES[ns]}")


def _built() -> list[Any]:
    """The namespaces whose classes exist in this process (never imports Lightning)."""
    return [
        sys.modules[m] for m in (f"trainforge.lightning.{n}" for n in MODULES.values()) if m in sys.modules
    ]


class _FromCallersNamespace(type):
    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        ns = _namespace.resolve(_namespace.caller_frame(1))
        return getattr(classes(ns), cls.__name__)(*args, **kwargs)

    def __instancecheck__(cls, obj: Any) -> bool:
        return any(isinstance(obj, getattr(module, cls.__name__)) for module in _built())

    def __subclasscheck__(cls, sub: type) -> bool:
        return any(issubclass(sub, getattr(module, cls.__name__)) for module in _built())


class RayDDPStrategy(metaclass=_FromCallersNamespace):
    """Lightning's ``DDPStrategy`` for trainforge's workers (Ray's `RayDDPStrategy`): the model on
    this worker's device, data sharded by the run's world size and rank. Takes ``DDPStrategy``'s
    arguments.

    Example::

        trainer = pl.Trainer(strategy=RayDDPStrategy(), plugins=[RayLightningEnvironment()],
                             callbacks=[RayTrainReportCallback()], devices="auto", accelerator="auto")
        trainer = prepare_trainer(trainer)
    """


class RayFSDPStrategy(metaclass=_FromCallersNamespace):
    """Lightning's ``FSDPStrategy`` for trainforge's workers (Ray's `RayFSDPStrategy`): as
    :class:`RayDDPStrategy`, with FSDP's arguments."""


class RayDeepSpeedStrategy(metaclass=_FromCallersNamespace):
    """Lightning's ``DeepSpeedStrategy`` for trainforge's workers (Ray's `RayDeepSpeedStrategy`): as
    :class:`RayDDPStrategy`, with DeepSpeed's arguments; needs ``deepspeed`` installed."""


class RayLightningEnvironment(metaclass=_FromCallersNamespace):
    """Lightning's cluster environment for a trainforge run (Ray's `RayLightningEnvironment`): world
    size and ranks from ``trainforge.get_context()``. Pass it in ``Trainer(plugins=[...])``."""


class RayTrainReportCallback(metaclass=_FromCallersNamespace):
    """Report Lightning's metrics and a checkpoint at the end of every training epoch (Ray's
    `RayTrainReportCallback`).

    Metrics: ``trainer.callback_metrics`` as numbers, plus ``epoch`` and ``step``. The checkpoint holds
    ``trainer.save_checkpoint()``'s file as ``CHECKPOINT_NAME`` ("checkpoint.ckpt"), written once (by
    rank 0 under DDP). ``RayTrainReportCallback(checkpoint_every_n_epochs=n)`` (trainforge extension)
    checkpoints every n-th epoch only (0: never). Resume::

        checkpoint = trainforge.get_checkpoint()
        if checkpoint:
            with checkpoint.as_directory() as d:
                trainer.fit(model, ckpt_path=os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME))
    """

    CHECKPOINT_NAME = "checkpoint.ckpt"
