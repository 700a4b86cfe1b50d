"""``prepare_trainer``: check a Lightning ``Trainer`` is set up to run on trainforge's workers."""

from __future__ import annotations

from typing import Any

from trainforge import get_context
from trainforge._internal.session import in_session
from trainforge.lightning import _namespace
from trainforge.lightning._dispatch import classes

_STRATEGIES = ("RayDDPStrategy", "RayFSDPStrategy", "RayDeepSpeedStrategy")
_SETUP = (
    "Trainer(strategy=RayDDPStrategy(), plugins=[RayLightningEnvironment()], "
    "callbacks=[RayTrainReportCallback()], devices='auto', accelerator='auto')"
)


def prepare_trainer(trainer: Any) -> Any:
    ns = _namespace.namespace_of(trainer)
    if ns is None or not any(c.__name__ == "Trainer" for c in type(trainer).__mro__):
        raise TypeError(
            f"prepare_trainer(trainer=...) takes a Lightning Trainer (lightning.pytorch.Trainer or "
            f"pytorch_lightning.Trainer), got {type(trainer).__name__}."
        )
    ours = classes(ns)
    strategy = trainer.strategy
    if not isinstance(strategy, tuple(getattr(ours, name) for name in _STRATEGIES)):
        raise RuntimeError(
            f"The Lightning Trainer's strategy is {type(strategy).__name__}, which does not run on "
            f"trainforge's workers: use one of {', '.join(_STRATEGIES)} from trainforge.lightning, "
            f"e.g. {_SETUP}."
        )
    environment = getattr(strategy, "cluster_environment", None)
    if environment is not None and not isinstance(environment, ours.RayLightningEnvironment):
        raise RuntimeError(
            f"The Lightning Trainer's cluster environment is {type(environment).__name__}: pass "
            f"plugins=[RayLightningEnvironment()] (from trainforge.lightning), e.g. {_SETUP}."
        )
    if in_session() and trainer.world_size != get_context().get_world_size():
        raise RuntimeError(
            f"The Lightning Trainer sees world_size={trainer.world_size}, but this run has "
            f"{get_context().get_world_size()} workers: pass plugins=[RayLightningEnvironment()] and "
            "keep devices='auto' and num_nodes=1 (each worker trains on one device)."
        )
    return trainer
