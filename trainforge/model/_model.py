"""``Model``: one object carrying a network's set-up, forward pass, training and validation steps and
pre/post-processing, so that the same class is trained (``ModelTrainer``), tuned (``Tuner``), saved
for a registry and served.

Hooks a subclass writes (only ``setup`` is required):

    setup(config)                    build the network(s), optimizer(s), loss and scheduler(s) and
                                     register them: self.register(models=..., optimizers=..., ...)
    setup_data(config)               build the data loaders: self.register_data(train_loader=..., ...)
                                     (only the managed loop calls it: loading a model for inference
                                     does not read the training data)
    forward(*inputs)                 default: the registered network's forward
    train_step(batch, batch_idx)     the loss (or a dict with "loss" and more metrics); the loop does
                                     backward, clipping, the optimizer and scheduler steps. Default:
                                     supervised (x, y) batches with the registered criterion. May be
                                     ``async def``.
    validation_step(batch, batch_idx) a dict of metrics; default: "loss", and "accuracy" for a
                                     classifier (integer targets, one logit per class)
    preprocess(data) / postprocess(output)   inference only (``model(data)``)
    hyperparameter_space()           (classmethod) the default ``param_space`` of ``Tuner(MyModel)``
    state_dict() / load_state_dict() extra state of your own, saved with the weights

Metrics returned by ``train_step`` are reported as ``train_<name>`` (``loss`` -> ``train_loss``),
those of ``validation_step`` as ``val_<name>``; each is the sample-weighted mean over the epoch's
batches on every worker, with ``last_<name>`` the last batch's value (mean over workers).

Inside the managed loop (a worker of ``ModelTrainer``), ``register`` moves the networks to the
worker's device, turns on mixed precision and wraps them in DistributedDataParallel; anywhere else
(the driver, a server) it only records them, so ``MyModel(config)`` is a ready object on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainforge.model._base import FRAMEWORK_BASES, BaseModel
from trainforge.model._steps import (
    as_list,
    is_classification,
    like,
    low_precision,
    prefixed,
    split_step_output,
    supervised,
)
from trainforge.model._support import torch_module, unwrap

if TYPE_CHECKING:
    import torch


class Model(BaseModel):
    """Subclass it; see the module docstring for the hooks.

    Example::

        class Digits(Model):
            def setup(self, config):
                net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
                self.register(models=net, optimizers=torch.optim.Adam(net.parameters(), lr=config["lr"]),
                              criterion=torch.nn.CrossEntropyLoss())

            def setup_data(self, config):
                self.register_data(train_loader=DataLoader(train, batch_size=config[BATCH_SIZE], shuffle=True),
                                   validation_loader=DataLoader(val, batch_size=256))

            def preprocess(self, images):          # inference: raw 8x8 images in
                return torch.as_tensor(images, dtype=torch.float32).reshape(-1, 64) / 16.0

            def postprocess(self, logits):         # class ids out
                return logits.argmax(-1)

            @classmethod
            def hyperparameter_space(cls):
                return {"lr": tune.loguniform(1e-4, 1e-2)}

        result = ModelTrainer(Digits, config={"lr": 1e-3, BATCH_SIZE: 64},
                              loop_config=LoopConfig(num_epochs=5)).fit()
        model = Digits.from_checkpoint(result.checkpoint)
        model(images)                              # preprocess -> forward (eval, no grad) -> postprocess
    """

    framework = "torch"
    # True: train_step returns the loss and the loop steps the optimizer. False (TrainingOperator):
    # the step does its own optimization (self.optimize(loss) runs the loop's).
    automatic_optimization = True

    def __init__(self, config: dict[str, Any] | None = None):
        if config is not None and not isinstance(config, dict):
            raise TypeError(f"{type(self).__name__}(config={config!r}): config must be a dict (or None).")
        # The managed loop binds its context before __init__ runs (see bind_and_init).
        self._tf_ctx: Any = self.__dict__.get("_tf_ctx")
        self.config: dict[str, Any] = dict(config) if config is not None else {}
        self._models: list[Any] = []
        self._optimizers: list[Any] = []
        self._schedulers: list[Any] = []
        self._criterion: Any = None
        self._registered = False
        self._train_loader: Any = None
        self._validation_loader: Any = None
        self._add_dist_sampler = True
        self.epoch = 0  # epochs completed (the loop keeps it current)
        self.global_step = 0  # training batches run (the loop keeps it current)
        self.setup(self.config)

    # -- hooks ------------------------------------------------------------------------------------
    def setup(self, config: dict[str, Any]) -> None:
        """Build the network(s), optimizer(s), loss and scheduler(s) and ``register`` them."""
        raise NotImplementedError(
            f"{type(self).__name__}.setup(config) is not implemented: build the network, optimizer and loss "
            "there and call self.register(models=..., optimizers=..., criterion=...)."
        )

    def setup_data(self, config: dict[str, Any]) -> None:
        """Build the data loaders and ``register_data`` them (called by the managed loop only)."""

    def forward(self, *inputs: Any) -> Any:
        """The forward pass: by default the registered network's."""
        return self.model(*inputs)

    def train_step(self, batch: Any, batch_idx: int) -> Any:
        """One training batch: return the loss tensor, or a dict with ``"loss"`` and other metrics
        (and optionally ``"num_samples"``). Default: ``(*features, target)`` batches and the registered
        criterion."""
        *features, target = supervised(batch, "train_step")
        return self._loss(self.forward(*features), target)

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        """One validation batch (no grad, eval mode): a dict of metrics. Default: ``"loss"`` with the
        registered criterion, and ``"accuracy"`` when the output has one logit per class and the
        target holds class indices."""
        torch = torch_module()
        *features, target = supervised(batch, "validation_step")
        output = self.forward(*features)
        metrics = {"loss": self._loss(output, target)}
        if is_classification(torch, output, target):
            metrics["accuracy"] = (output.argmax(-1) == target).float().mean()
        return metrics

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        """Called after backward (and clipping), before each ``optimizer.step()`` of the loop."""

    @classmethod
    def hyperparameter_space(cls) -> dict[str, Any] | None:
        """The search space (config key -> ``tune`` distribution) ``Tuner(ThisModel)`` uses when no
        ``param_space`` is given."""
        return None

    def state_dict(self) -> Any:
        """Extra state of your own to save with the weights (the registered networks, optimizers and
        schedulers are saved anyway)."""
        return {}

    def load_state_dict(self, state: Any) -> None:
        """Load what :meth:`state_dict` returned."""

    # -- registration -----------------------------------------------------------------------------
    def register(
        self,
        *,
        models: Any,
        optimizers: Any = None,
        criterion: Any = None,
        schedulers: Any = None,
        ddp_args: dict[str, Any] | None = None,
    ) -> tuple[Any, ...]:
        """Register the training components (call it in ``setup``). In the managed loop the networks
        are moved to the worker's device, get mixed precision and are wrapped in DDP (``ddp_args``:
        keyword arguments for it). Returns ``(models, optimizers[, criterion][, schedulers])``, each as
        given (one object or a list), the networks as wrapped: RaySGD's
        ``self.model, self.optimizer, self.criterion = self.register(...)`` works."""
        torch = torch_module()
        if ddp_args is not None and not isinstance(ddp_args, dict):
            raise ValueError(f"register(ddp_args={ddp_args!r}) is not valid: use a dict of DistributedDataParallel arguments")
        model_list = as_list(models)
        if not model_list or not all(isinstance(m, torch.nn.Module) for m in model_list):
            raise ValueError(
                f"register(models={models!r}) is not valid: pass a torch.nn.Module or a list of them."
            )
        optimizer_list = as_list(optimizers) if optimizers is not None else []
        for opt in optimizer_list:
            if not isinstance(opt, torch.optim.Optimizer):
                raise ValueError(f"register(optimizers=...): {opt!r} is not a torch.optim.Optimizer")
        ctx = self._tf_ctx
        if ctx is not None:
            model_list = [ctx.prepare_model(m, ddp_args or {}) for m in model_list]
            if criterion is not None and hasattr(criterion, "to"):
                criterion = criterion.to(ctx.device)
        self._models = model_list
        self._optimizers = optimizer_list
        self._criterion = criterion
        self._schedulers = as_list(schedulers) if schedulers is not None else []
        self._registered = True
        out: list[Any] = [like(model_list, models), like(optimizer_list, optimizers)]
        if criterion is not None:
            out.append(criterion)
        if schedulers is not None:
            self._check_scheduler_freq()
            out.append(like(self._schedulers, schedulers))
        return tuple(out)

    def _check_scheduler_freq(self) -> None:
        """Hook for the RaySGD adapter (it requires ``scheduler_step_freq`` with schedulers)."""

    def register_data(self, *, train_loader: Any = None, validation_loader: Any = None, add_dist_sampler: bool = True) -> None:
        """Register the data (call it in ``setup_data`` or ``setup``). A ``DataLoader`` gets a
        ``DistributedSampler`` (each worker its share; a shuffled loader is reshuffled every epoch,
        the same way on a restart), unless ``add_dist_sampler=False`` (the loaders already hold each
        worker's own part) or it already has one; batches are moved to the worker's device."""
        self._train_loader = train_loader
        self._validation_loader = validation_loader
        self._add_dist_sampler = bool(add_dist_sampler)

    # -- the registered components ----------------------------------------------------------------
    @property
    def models(self) -> list[Any]:
        """The registered networks (DDP-wrapped in a worker of the managed loop)."""
        return self._models

    @models.setter
    def models(self, value: Any) -> None:
        self._models = as_list(value)

    @property
    def model(self) -> Any:
        """The first (or only) registered network."""
        if not self._models:
            raise AttributeError(
                f"{type(self).__name__} has no registered network: call self.register(models=...) in setup()."
            )
        return self._models[0]

    @model.setter
    def model(self, value: Any) -> None:
        self._models[:1] = [value]

    @property
    def optimizers(self) -> list[Any]:
        return self._optimizers

    @optimizers.setter
    def optimizers(self, value: Any) -> None:
        self._optimizers = as_list(value)

    @property
    def optimizer(self) -> Any:
        """The first (or only) registered optimizer."""
        return self._optimizers[0] if self._optimizers else None

    @optimizer.setter
    def optimizer(self, value: Any) -> None:
        self._optimizers[:1] = [value]

    @property
    def criterion(self) -> Any:
        return self._criterion

    @criterion.setter
    def criterion(self, value: Any) -> None:
        self._criterion = value

    @property
    def schedulers(self) -> list[Any]:
        return self._schedulers

    @schedulers.setter
    def schedulers(self, value: Any) -> None:
        self._schedulers = as_list(value) if value is not None else []

    @property
    def scheduler(self) -> Any:
        """The first (or only) registered scheduler, or None."""
        return self._schedulers[0] if self._schedulers else None

    @scheduler.setter
    def scheduler(self, value: Any) -> None:
        self._schedulers[:1] = [value] if value is not None else []

    @property
    def train_loader(self) -> Any:
        return self._train_loader

    @property
    def validation_loader(self) -> Any:
        return self._validation_loader

    # -- where it runs ----------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        """This worker's device; outside the managed loop, where the registered network's weights are
        (the CPU after :meth:`load`; ``cuda:0`` once moved there), so ``preprocess`` can put inputs
        beside them."""
        if self._tf_ctx is not None:
            return self._tf_ctx.device
        for module in self._models:
            for param in unwrap(module).parameters():
                return param.device
        return torch_module().device("cpu")

    @property
    def world_rank(self) -> int:
        return self._tf_ctx.world_rank if self._tf_ctx is not None else 0

    @property
    def local_rank(self) -> int:
        return self._tf_ctx.local_rank if self._tf_ctx is not None else 0

    @property
    def world_size(self) -> int:
        return self._tf_ctx.world_size if self._tf_ctx is not None else 1

    @property
    def use_gpu(self) -> bool:
        return self.device.type == "cuda"

    @property
    def device_ids(self) -> list[int] | None:
        """RaySGD's: ``[device index]`` on a GPU, else None."""
        return [self.device.index or 0] if self.use_gpu else None

    @property
    def use_fp16(self) -> bool | str:
        """The loop's ``use_fp16`` (False outside the managed loop)."""
        return self._tf_ctx.loop_config.use_fp16 if self._tf_ctx is not None else False

    @property
    def scheduler_step_freq(self) -> str | None:
        return self._tf_ctx.scheduler_step_freq if self._tf_ctx is not None else None

    # -- optimization helpers for custom steps -----------------------------------------------------
    def backward(self, loss: Any) -> None:
        """``loss.backward()``, through the gradient scaler when mixed precision uses one."""
        if self._tf_ctx is not None:
            self._tf_ctx.backward(loss)
        else:
            loss.backward()

    def optimize(self, loss: Any) -> None:
        """What the loop does with the loss ``train_step`` returns: backward (scaled, accumulated),
        clipping, the optimizer step(s) and ``zero_grad``; for a step that optimizes itself
        (``automatic_optimization = False``, a TrainingOperator's ``train_batch``)."""
        if self._tf_ctx is not None:
            self._tf_ctx.optimize(loss)
            return
        for opt in self._optimizers:
            opt.zero_grad()
        loss.backward()
        for opt in self._optimizers:
            opt.step()

    # -- inference --------------------------------------------------------------------------------
    def __call__(self, data: Any) -> Any:
        """Inference: ``postprocess(forward(preprocess(data)))`` with no gradient and every registered
        network in eval mode (their modes are restored afterwards). A tuple from ``preprocess`` is
        passed to ``forward`` as separate arguments."""
        torch = torch_module()
        inputs = self.preprocess(data)
        modes = [(m, m.training) for m in self._models]
        for m, _ in modes:
            m.eval()
        try:
            with torch.no_grad():
                output = self.forward(*inputs) if isinstance(inputs, tuple) else self.forward(inputs)
        finally:
            for m, training in modes:
                m.train(training)
        return self.postprocess(output)

    def __repr__(self) -> str:
        nets = ", ".join(type(unwrap(m)).__name__ for m in self._models)
        return f"{type(self).__name__}(config={self.config!r}, models=[{nets}])"

    # -- the backend (see trainforge.model._base) -------------------------------------------------
    @classmethod
    def _for_inference(cls, config: dict[str, Any]) -> Model:
        from trainforge.model._support import bind_and_init

        return bind_and_init(cls, config, None)

    def _save_files(self, directory: str) -> None:
        from trainforge.model import _artifact as artifact

        artifact.save_weights(self, directory)

    def _load_files(self, directory: str) -> None:
        from trainforge.model import _artifact as artifact

        artifact.load_weights(self, directory)
        for m in self.models:
            m.eval()

    def _default_input(self, instances: list[Any]) -> Any:
        torch = torch_module()
        try:
            return torch.as_tensor(instances, dtype=torch.float32)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ValueError(
                f"the inputs are not a numeric tensor ({exc}); {type(self).__name__} has no preprocess(), so "
                "send numeric instances of one shape (or write preprocess(data) to take these)"
            ) from None

    @classmethod
    def _framework_versions(cls) -> dict[str, str]:
        return {"torch": str(torch_module().__version__)}

    # -- the loop's protocol (overridden by the TrainingOperator adapter) --------------------------
    def _train_metrics(self, out: Any, batch: Any) -> tuple[Any, dict[str, Any], int]:
        """(loss, metrics, samples) of a ``train_step`` result; metrics named ``train_*``."""
        loss, metrics, n = split_step_output(out, batch, "train_step")
        if self.automatic_optimization and loss is None:
            raise ValueError(
                f"{type(self).__name__}.train_step returned {out!r}: return the loss tensor, or a dict with "
                "'loss' (and other metrics)."
            )
        return loss, prefixed(metrics, "train_"), n

    def _val_metrics(self, out: Any, batch: Any) -> tuple[dict[str, Any], int]:
        _, metrics, n = split_step_output(out, batch, "validation_step")
        return prefixed(metrics, "val_"), n

    def _epoch_override(self, kind: str) -> Callable[[Any, dict[str, Any]], Any] | None:
        """A user-written epoch function (RaySGD's train_epoch / validate) to call instead of the
        loop's own batch iteration; None for a Model."""
        return None

    def _batch_info(self, batch_idx: int) -> dict[str, Any]:
        return {}

    def _loss(self, output: Any, target: Any) -> Any:
        if self._criterion is None:
            raise ValueError(
                f"{type(self).__name__}: the default train_step/validation_step need a criterion: "
                "register(..., criterion=torch.nn.CrossEntropyLoss()) or write your own step."
            )
        if getattr(output, "dtype", None) is not None and output.dtype in low_precision():
            output = output.float()  # the loss in float32, as autocast computes losses
        return self._criterion(output, target)


FRAMEWORK_BASES.add(Model)
