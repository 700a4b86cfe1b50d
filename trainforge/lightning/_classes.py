"""The Lightning classes, built once per namespace (``lightning.pytorch`` or ``pytorch_lightning``).

``_lightning_pytorch`` and ``_pytorch_lightning`` hold each namespace's classes, so they pickle by
reference. What they do:

- ``RayDDPStrategy`` / ``RayFSDPStrategy`` / ``RayDeepSpeedStrategy``: Lightning's strategies with two
  overrides. ``root_device`` is this worker's device (``trainforge.torch.get_device()``; the stock one
  indexes the devices Lightning sees by ``LOCAL_RANK``, which fails on the CPU or with one visible
  GPU per worker), and ``distributed_sampler_kwargs`` shards by the run's world size and rank.
- ``RayLightningEnvironment``: the ranks and world size of the trainforge run; Lightning's setters
  are no-ops (it would overwrite them from ``devices=``), and so is ``teardown`` (the stock one
  deletes ``WORLD_SIZE``).
- ``RayTrainReportCallback``: at the end of every training epoch, reports ``trainer.callback_metrics``
  (as numbers) with ``epoch`` and ``step`` and a checkpoint: ``trainer.save_checkpoint()``, called on
  every rank (it is a collective), into a new directory per rank; a rank hands over its directory
  only if files were written in it, so with DDP the checkpoint is saved once (by rank 0) and with a
  sharded strategy each rank hands over its shard.
"""

from __future__ import annotations

import importlib
import os
import shutil
import tempfile
from typing import Any

from trainforge import Checkpoint, get_context, report
from trainforge._internal.session import in_session
from trainforge.lightning._namespace import import_namespace

CLASS_NAMES = (
    "RayDDPStrategy", "RayFSDPStrategy", "RayDeepSpeedStrategy", "RayLightningEnvironment", "RayTrainReportCallback",
)  # fmt: skip
MODULES = {"lightning.pytorch": "_lightning_pytorch", "pytorch_lightning": "_pytorch_lightning"}


def _root_device(self: Any) -> Any:
    from trainforge.torch import get_device

    return get_device()


def _distributed_sampler_kwargs(self: Any) -> dict[str, Any]:
    return {"num_replicas": self.world_size, "rank": self.global_rank}


def build(ns: str) -> dict[str, type]:
    """The classes of namespace ``ns``, named as Ray names them, in module ``trainforge.lightning.<MODULES[ns]>``."""
    pl = import_namespace(ns)
    strategies = importlib.import_module(f"{ns}.strategies")
    environments = importlib.import_module(f"{ns}.plugins.environments")
    overrides = {
        "root_device": property(_root_device),
        "distributed_sampler_kwargs": property(_distributed_sampler_kwargs),
    }
    classes: dict[str, type] = {}
    for name, base in (
        ("RayDDPStrategy", strategies.DDPStrategy),
        ("RayFSDPStrategy", strategies.FSDPStrategy),
        ("RayDeepSpeedStrategy", strategies.DeepSpeedStrategy),
    ):
        doc = (
            f"Lightning's ``{base.__name__}`` on trainforge's workers: this worker's device, the run's ranks."
        )
        classes[name] = type(name, (base,), {**overrides, "__doc__": doc})
    classes["RayLightningEnvironment"] = type(
        "RayLightningEnvironment", (_EnvironmentMixin, environments.LightningEnvironment), {}
    )
    classes["RayTrainReportCallback"] = type("RayTrainReportCallback", (_ReportMixin, pl.Callback), {})
    module = f"trainforge.lightning.{MODULES[ns]}"
    for cls in classes.values():
        cls.__module__ = module
        cls.__qualname__ = cls.__name__
    return classes


class _EnvironmentMixin:
    """Lightning's cluster environment for a trainforge run: ranks from ``trainforge.get_context()``
    (outside a run, Lightning's own ``LightningEnvironment``: one process)."""

    def world_size(self) -> int:
        return get_context().get_world_size() if in_session() else super().world_size()  # type: ignore[misc]

    def global_rank(self) -> int:
        return get_context().get_world_rank() if in_session() else super().global_rank()  # type: ignore[misc]

    def local_rank(self) -> int:
        return get_context().get_local_rank() if in_session() else super().local_rank()  # type: ignore[misc]

    def node_rank(self) -> int:
        return get_context().get_node_rank() if in_session() else super().node_rank()  # type: ignore[misc]

    def set_world_size(self, size: int) -> None:
        if not in_session():  # in a run: the run's, not Lightning's devices x nodes
            super().set_world_size(size)  # type: ignore[misc]

    def set_global_rank(self, rank: int) -> None:
        if not in_session():
            super().set_global_rank(rank)  # type: ignore[misc]

    def teardown(self) -> None:
        pass


class _ReportMixin:
    """Report ``callback_metrics`` and a checkpoint to trainforge at the end of every training epoch.

    ``checkpoint_every_n_epochs`` (trainforge extension; default 1): a checkpoint every n-th epoch,
    metrics only in between; 0 never checkpoints. Resume with
    ``trainer.fit(model, ckpt_path=os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME))``.
    """

    CHECKPOINT_NAME = "checkpoint.ckpt"

    def __init__(self, checkpoint_every_n_epochs: int = 1) -> None:
        n = checkpoint_every_n_epochs
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(
                f"RayTrainReportCallback(checkpoint_every_n_epochs={n!r}) is not valid: use an int >= 1 "
                "(a checkpoint every n-th epoch) or 0 (metrics only, no checkpoints)."
            )
        super().__init__()
        self.checkpoint_every_n_epochs = n

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        metrics = {name: _number(value) for name, value in trainer.callback_metrics.items()}
        metrics["epoch"] = trainer.current_epoch
        metrics["step"] = trainer.global_step
        n = self.checkpoint_every_n_epochs
        if not n or (trainer.current_epoch + 1) % n:
            report(metrics)
            return
        directory = tempfile.mkdtemp(prefix="trainforge_lightning_")
        try:
            trainer.save_checkpoint(os.path.join(directory, self.CHECKPOINT_NAME), weights_only=False)
            checkpoint = Checkpoint.from_directory(directory) if os.listdir(directory) else None
            report(metrics, checkpoint=checkpoint)
        finally:
            shutil.rmtree(directory, ignore_errors=True)


def _number(value: Any) -> Any:
    """A logged tensor as a Python number (a list when it has several elements)."""
    if hasattr(value, "numel"):
        return value.item() if value.numel() == 1 else value.tolist()
    return value
