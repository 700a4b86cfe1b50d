"""``TorchTrainer``: a ``DataParallelTrainer`` whose workers share a ``torch.distributed`` process group."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

from trainforge._internal.framework_trainer import FrameworkTrainer
from trainforge._internal.torch.config import TorchConfig


class TorchTrainer(FrameworkTrainer):
    """Run ``train_loop_per_worker`` on N workers joined in a ``torch.distributed`` process group.

    Example::

        def train_loop(config):
            model = trainforge.torch.prepare_model(MyNet())
            loader = trainforge.torch.prepare_data_loader(DataLoader(ds, batch_size=32, shuffle=True))
            for epoch in range(config["epochs"]):
                ...
                trainforge.report({"loss": loss.item()})

        result = TorchTrainer(
            train_loop, train_loop_config={"epochs": 5}, scaling_config=ScalingConfig(num_workers=2)
        ).fit()

    Takes the arguments of :class:`trainforge.DataParallelTrainer`, plus ``torch_config``
    (a :class:`TorchConfig`; default ``TorchConfig()``).
    """

    _framework = "torch"
    _config_cls = TorchConfig
    _preload_modules = ("torch",)  # workers import torch at start-up, in parallel with driver setup

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        train_loop_config: dict[str, Any] | None = None,
        torch_config: TorchConfig | None = None,
        scaling_config: Any = None,
        run_config: Any = None,
        datasets: dict[str, Any] | None = None,
        dataset_config: Any = None,
        metadata: dict[str, Any] | None = None,
        resume_from_checkpoint: Any = None,
        worker_init_fn: Callable[[], Any] | None = None,
    ):
        self._init_framework(
            train_loop_per_worker, torch_config, train_loop_config=train_loop_config, scaling_config=scaling_config,
            run_config=run_config, datasets=datasets, dataset_config=dataset_config, metadata=metadata,
            resume_from_checkpoint=resume_from_checkpoint, worker_init_fn=worker_init_fn,
        )  # fmt: skip

    def _check_installed(self) -> None:
        if importlib.util.find_spec("torch") is None:
            raise ImportError(
                f"{type(self).__name__} needs PyTorch, which is not installed: pip install 'trainforge[torch]' "
                "(or install the torch build for your platform first)."
            )
