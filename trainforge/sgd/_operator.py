"""RaySGD's ``TrainingOperator`` (Ray <= 1.12) as a thin adapter over :class:`Model`: its hook names
mapped onto the same managed loop.

    RaySGD                                  the managed loop
    setup(config) + register/register_data  Model.setup + register/register_data (the same methods)
    train_batch(batch, batch_info)          train_step(batch, batch_idx); the batch does its own
                                            optimization (automatic_optimization = False); the
                                            default one calls self.optimize(loss): backward (with
                                            the gradient scaler), clipping, accumulation, step
    validate_batch(batch, batch_info)       validation_step(batch, batch_idx)
    train_epoch(iterator, info)             called instead of the loop's batch iteration when a
    validate(val_iterator, info)            subclass overrides it; its dict is averaged over the
                                            workers (weighted by its "num_samples")
    state_dict() / load_state_dict()        extra state saved with the registered components

Metric names are the batch methods' own (``train_loss``, ``val_loss``, ``val_accuracy``; a batch
without ``num_samples`` weighs 1, as in RaySGD).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from trainforge.model import NUM_SAMPLES, Model, supervised, torch_module

_HOOK_ARGS = "batch, batch_info"  # what a TrainingOperator's batch hooks take, for the error of a default one


class TrainingOperator(Model):
    """Subclass it and override ``setup`` (RaySGD's API, imported from ``trainforge.sgd.torch``
    instead of RaySGD's ``torch`` module).

    Example::

        class MyTrainingOperator(TrainingOperator):
            def setup(self, config):
                model = nn.Linear(1, 1)
                optimizer = torch.optim.SGD(model.parameters(), lr=config.get("lr", 1e-2))
                self.model, self.optimizer, self.criterion = self.register(
                    models=model, optimizers=optimizer, criterion=nn.MSELoss())
                self.register_data(train_loader=DataLoader(LinearDataset(2, 5), batch_size=config[BATCH_SIZE]),
                                   validation_loader=DataLoader(LinearDataset(2, 5), batch_size=config[BATCH_SIZE]))
    """

    automatic_optimization = False

    def train_batch(self, batch: Any, batch_info: dict[str, Any]) -> dict[str, Any]:
        """One training batch: forward, loss, backward and step (``self.optimize(loss)``); returns
        ``{"train_loss": ..., "num_samples": ...}``. Batches are ``(*features, target)``."""
        *features, target = supervised(batch, "train_batch", _HOOK_ARGS)
        output = self.model(*features)
        loss = self._loss(output, target)
        self.optimize(loss)
        return {"train_loss": loss.item(), NUM_SAMPLES: features[0].size(0)}

    def validate_batch(self, batch: Any, batch_info: dict[str, Any]) -> dict[str, Any]:
        """Loss and accuracy of one batch: ``{"val_loss", "val_accuracy", "num_samples"}``."""
        torch = torch_module()
        *features, target = supervised(batch, "validate_batch", _HOOK_ARGS)
        output = self.model(*features)
        loss = self._loss(output, target)
        _, predicted = torch.max(output.data, 1)
        num_samples = target.size(0)
        return {"val_loss": loss.item(), "val_accuracy": (predicted == target).sum().item() / num_samples,
                NUM_SAMPLES: num_samples}  # fmt: skip

    def train_epoch(self, iterator: Any, info: dict[str, Any]) -> dict[str, Any]:
        """One pass over ``iterator`` calling :meth:`train_batch` (and stepping the schedulers per
        ``scheduler_step_freq``); returns this worker's averages (RaySGD's ``AverageMeterCollection``
        summary). Override it for a loop of your own."""
        return self._context("train_epoch").run_train_batches(iterator, info)

    def validate(self, val_iterator: Any, info: dict[str, Any]) -> dict[str, Any]:
        """One pass over ``val_iterator`` calling :meth:`validate_batch` (no grad, eval mode)."""
        return self._context("validate").run_validation_batches(val_iterator, info)

    def state_dict(self) -> Any:
        """Extra state to save (the registered components are saved anyway); None by default."""
        return None

    # -- RaySGD constructors ----------------------------------------------------------------------
    @classmethod
    def from_creators(
        cls,
        model_creator: Callable[[dict[str, Any]], Any],
        optimizer_creator: Callable[[Any, dict[str, Any]], Any],
        data_creator: Callable[[dict[str, Any]], Any] | None = None,
        loss_creator: Any = None,
        scheduler_creator: Callable[[Any, dict[str, Any]], Any] | None = None,
        serialize_data_creation: bool = True,
    ) -> type[TrainingOperator]:
        """A TrainingOperator class whose ``setup`` calls RaySGD's creator functions (RaySGD < 1.0)."""
        if not (callable(model_creator) and callable(optimizer_creator)):
            raise ValueError("from_creators(): model_creator and optimizer_creator must be callables")

        class CustomCreatorOperator(cls):  # type: ignore[valid-type, misc]
            def setup(self, config: dict[str, Any]) -> None:
                torch = torch_module()
                models = model_creator(config)
                optimizers = optimizer_creator(models, config)
                kwargs: dict[str, Any] = {"models": models, "optimizers": optimizers}
                if scheduler_creator is not None:
                    kwargs["schedulers"] = scheduler_creator(optimizers, config)
                if loss_creator is not None:
                    if inspect.isclass(loss_creator) and issubclass(loss_creator, torch.nn.modules.loss._Loss):
                        kwargs["criterion"] = loss_creator()
                    else:
                        kwargs["criterion"] = loss_creator(config)
                self.register(**kwargs)
                if data_creator is not None:
                    train, val = _two_loaders(data_creator(config))
                    self.register_data(train_loader=train, validation_loader=val)

        CustomCreatorOperator.__qualname__ = CustomCreatorOperator.__name__ = "CustomCreatorOperator"
        return CustomCreatorOperator

    # -- the loop's protocol ----------------------------------------------------------------------
    def train_step(self, batch: Any, batch_idx: int) -> Any:
        return self.train_batch(batch, self._batch_info(batch_idx))

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        return self.validate_batch(batch, self._batch_info(batch_idx))

    def _batch_info(self, batch_idx: int) -> dict[str, Any]:
        info = dict(self._tf_ctx.info) if self._tf_ctx is not None else {}
        info.update(batch_idx=batch_idx, global_step=self.global_step)
        return info

    def _train_metrics(self, out: Any, batch: Any) -> tuple[Any, dict[str, Any], int]:
        metrics, n = self._batch_metrics(out, "train_batch")
        return None, metrics, n

    def _val_metrics(self, out: Any, batch: Any) -> tuple[dict[str, Any], int]:
        return self._batch_metrics(out, "validate_batch")

    def _batch_metrics(self, out: Any, hook: str) -> tuple[dict[str, Any], int]:
        if not isinstance(out, dict):
            raise ValueError(f"{type(self).__name__}.{hook} returned {out!r}: return a dict of metrics")
        metrics = dict(out)
        n = metrics.pop(NUM_SAMPLES, 1)  # RaySGD weighs a batch that does not say by 1
        return metrics, int(n)

    def _epoch_override(self, kind: str) -> Callable[[Any, dict[str, Any]], Any] | None:
        name = "train_epoch" if kind == "train" else "validate"
        if getattr(type(self), name) is getattr(TrainingOperator, name):
            return None
        return getattr(self, name)  # type: ignore[no-any-return]

    def _check_scheduler_freq(self) -> None:
        ctx = self._tf_ctx
        if ctx is not None and ctx.options.get("scheduler_step_freq", "") is None:
            raise ValueError(
                "scheduler_step_freq passed into TorchTrainer cannot be None if you are registering schedulers. "
                "Set this to 'manual' if you will be manually stepping the schedulers."
            )

    def _context(self, hook: str) -> Any:
        if self._tf_ctx is None:
            raise RuntimeError(f"{type(self).__name__}.{hook} runs inside a worker of trainforge.sgd.torch.TorchTrainer")
        return self._tf_ctx


def _two_loaders(loaders: Any) -> tuple[Any, Any]:
    """RaySGD's data_creator returns one loader (training) or two (training, validation)."""
    if not isinstance(loaders, (tuple, list)):
        return loaders, None
    if len(loaders) == 1:
        return loaders[0], None
    if len(loaders) == 2:
        return loaders[0], loaders[1]
    raise ValueError(f"data_creator returned {len(loaders)} loaders: return one (training) or two (training, validation)")
