"""``BaseModel``: what a model class is, whatever its framework; a backend is one subclass of it.

The hooks a user writes are the same for every framework:

    setup(config)                    build the model from its config and ``register`` it
    preprocess(data)                 inference: raw input -> what ``forward`` takes (default: unchanged)
    forward(inputs)                  the prediction
    postprocess(output)              inference: ``forward``'s output -> the answer (default: unchanged)
    hyperparameter_space()           (classmethod) the default ``param_space`` of ``Tuner(MyModel)``

and so is what trainforge does with them: ``model(data)`` is ``postprocess(forward(preprocess(data)))``;
``save(directory)`` / ``load(directory)`` write and read a model directory (``model.json`` and the
framework's files), which the registry stores and ``trainforge serve`` loads without a ``loader=``;
``ModelTrainer(MyModel)`` trains it through the framework's distributed integration.

What a backend implements (:class:`~trainforge.model.Model` for PyTorch, ``XGBoostModel``,
``LightGBMModel``, ``KerasModel``): ``framework`` (its name), ``_save_files`` / ``_load_files`` (the
trained state in a model directory), its managed trainer in :data:`TRAINERS` (the trainer
``ModelTrainer`` hands it to) and, optionally, ``_default_input`` (what serving passes to a model
without ``preprocess``).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from trainforge import Checkpoint


class BaseModel:
    """The base of every model class (see the module docstring). Subclass a framework's class
    (``Model``, ``XGBoostModel``, ``LightGBMModel``, ``KerasModel``), not this one."""

    framework: ClassVar[str] = ""

    def __init__(self, config: dict[str, Any] | None = None):
        if config is not None and not isinstance(config, dict):
            raise TypeError(f"{type(self).__name__}(config={config!r}): config must be a dict (or None).")
        self.config: dict[str, Any] = dict(config) if config is not None else {}
        self._init_state()
        self.setup(self.config)

    def _init_state(self) -> None:
        """The framework's own attributes, set before ``setup`` runs."""

    # -- hooks ------------------------------------------------------------------------------------
    def setup(self, config: dict[str, Any]) -> None:
        """Build the model from ``config`` and ``register`` it."""
        raise NotImplementedError(f"{type(self).__name__}.setup(config) is not implemented: build the model there.")

    def preprocess(self, data: Any) -> Any:
        """Inference: turn raw input into what ``forward`` takes (default: unchanged)."""
        return data

    def forward(self, inputs: Any) -> Any:
        """The prediction for ``inputs``."""
        raise NotImplementedError(f"{type(self).__name__}.forward(inputs) is not implemented.")

    def postprocess(self, output: Any) -> Any:
        """Inference: turn ``forward``'s output into the answer (default: unchanged)."""
        return output

    @classmethod
    def hyperparameter_space(cls) -> dict[str, Any] | None:
        """The search space (config key -> ``tune`` distribution) ``Tuner(ThisModel)`` uses when no
        ``param_space`` is given."""
        return None

    def __call__(self, data: Any) -> Any:
        """Inference: ``postprocess(forward(preprocess(data)))``."""
        return self.postprocess(self.forward(self.preprocess(data)))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(config={self.config!r})"

    # -- saving and loading -----------------------------------------------------------------------
    def save(self, directory: str) -> str:
        """Write the model (its trained state, its config, and its class by import path, pickled by
        value when it has none) to ``directory``; :meth:`load` rebuilds it. Returns ``directory``."""
        from trainforge.model import _artifact as artifact

        artifact.save_model(self, directory)
        return directory

    @classmethod
    def load(cls, source: str | Checkpoint) -> Any:
        """The model saved in ``source`` (a directory from :meth:`save`, a checkpoint of
        ``ModelTrainer``, or a ``trainforge.Checkpoint`` of either), rebuilt from its config with its
        trained state. Loading unpickles the model's files: load only models you trust."""
        from trainforge.model import _artifact as artifact

        return artifact.load_model(source, cls)

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint | str) -> Any:
        """The model of a ``ModelTrainer`` checkpoint (``Result.checkpoint``): see :meth:`load`."""
        return cls.load(checkpoint)

    # -- what a backend implements ----------------------------------------------------------------
    @classmethod
    def _for_inference(cls, config: dict[str, Any]) -> BaseModel:
        """A new instance to load a trained state into (``cls(config)``)."""
        return cls(config)

    def _save_files(self, directory: str) -> None:
        """Write the trained state into ``directory`` (beside ``model.json``)."""
        raise NotImplementedError(f"{type(self).__name__} ({self.framework}) cannot save its trained state.")

    def _load_files(self, directory: str) -> None:
        """Read what :meth:`_save_files` wrote (ready for inference afterwards)."""
        raise NotImplementedError(f"{type(self).__name__} ({self.framework}) cannot load a trained state.")

    def _default_input(self, instances: list[Any]) -> Any:
        """What serving passes to a model without its own ``preprocess``: the JSON instances."""
        return instances

    @classmethod
    def _trainer_cls(cls) -> type:
        """The managed trainer class for this framework (what ``ModelTrainer(ThisModel)`` builds): the
        one its trainer module put in :data:`TRAINERS`."""
        trainer = TRAINERS.get(cls.framework)
        if trainer is None:
            raise TypeError(f"{cls.__qualname__}: no trainer for framework {cls.framework!r}; trainers exist for "
                            f"{sorted(TRAINERS)}")  # fmt: skip
        return trainer

    @classmethod
    def _framework_versions(cls) -> dict[str, str]:
        """The framework's package versions, recorded in ``model.json``."""
        return {}


FRAMEWORK_BASES: set[type] = {BaseModel}  # the framework classes users subclass (not models themselves)
TRAINERS: dict[str, type] = {}  # framework -> its managed trainer (filled by each trainer's module)


def is_model_class(obj: Any) -> bool:
    """True for a model class: ``Model``, ``XGBoostModel``, ... or a subclass of one."""
    return inspect.isclass(obj) and issubclass(obj, BaseModel) and obj is not BaseModel


def check_model_class(model_cls: Any, who: str) -> None:
    if not is_model_class(model_cls):
        raise TypeError(
            f"{who}: {model_cls!r} is not a trainforge.model.Model subclass (PyTorch) nor an XGBoostModel, "
            "LightGBMModel or KerasModel one; pass the class itself (class MyModel(Model): def setup(self, "
            "config): ...), or a registered definition's URI ('models:/name')."
        )
    for base in inspect.getmro(model_cls):
        if base in FRAMEWORK_BASES:
            if model_cls.setup is base.setup:  # type: ignore[attr-defined]
                raise TypeError(
                    f"{who}: {model_cls.__qualname__} does not implement setup(config): build the model there "
                    "and register it."
                )
            return
