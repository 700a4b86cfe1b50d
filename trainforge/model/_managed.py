"""What every framework's managed trainer shares (``ModelTrainer`` for PyTorch, and the XGBoost,
LightGBM and Keras ones it hands a model of theirs to): the model class or reference it trains, the
config (the definition's default config updated with the run's), the ``Data`` whose splits are made
when the run starts (:meth:`ManagedTrainer._make_payloads`), the definition recorded in every
checkpoint's metadata (``model_definition``: the registry's lineage of a version trained from it), and
the trained model (``get_model()``).

Models by reference: the model package sits below the registry, so it never imports it; a
``models:/`` reference is resolved (:func:`resolve`) through the core's extension table
``trainforge.model_definitions`` (``_internal/extensions.py``), which the registry fills (its entry
point, or ``import trainforge.registry`` in a checkout without installed metadata).

Each framework's trainer is its integration's trainer (``XGBoostTrainer``, ``LightGBMTrainer``,
``TensorflowTrainer``, ``TorchTrainer``) with this mixin first: the same controller, backend, restarts,
checkpoints, ``submit()`` and Tune trials as a run written by hand.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from trainforge._internal.extensions import MODEL_DEFINITIONS, lookup
from trainforge.model._artifact import pickle_by_value
from trainforge.model._base import check_model_class
from trainforge.model._commands import DRIVER_KEY
from trainforge.model._dataset import check_data, data_splits
from trainforge.model._definition import ModelDefinition

DEFINITION_KEY = "model_definition"  # the trainer metadata key naming the definition it trains
SCHEME = "models:/"


class ManagedTrainer:
    """The mixin (see the module docstring). A framework's trainer sets ``_allowed_splits`` (None:
    any split names) and implements :meth:`_use_splits`."""

    model_cls: type
    definition: ModelDefinition
    data: Any
    _allowed_splits: tuple[str, ...] | None = None
    _result: Any = None

    # set by the trainer base classes
    train_loop_config: dict[str, Any] | None
    datasets: dict[str, Any] | None
    scaling_config: Any
    metadata: dict[str, Any]

    def _init_managed(self, model: Any, config: Any, data: Any, metadata: Any, datasets: Any,
                      who: str) -> tuple[dict[str, Any], dict[str, Any] | None]:  # fmt: skip
        """Resolve ``model`` and check the arguments; returns (the run's config, the metadata)."""
        definition = model if isinstance(model, ModelDefinition) else resolve(model, who)
        if config is not None and not isinstance(config, dict):
            raise TypeError(f"{who}(config={config!r}) must be a dict (or None).")
        if config and DRIVER_KEY in config:
            raise ValueError(f"config key {DRIVER_KEY!r} is reserved for trainforge")
        check_data(data, who)
        data = data if data is not None else definition.data
        check_data(data, who)
        if data is not None and datasets:
            raise ValueError(f"{who}: give data= (a Data object) or datasets=, not both")
        self.definition = definition
        self.model_cls = definition.model_cls
        if definition.by_value:  # its workers, and what they save, carry the class (and data) by value
            pickle_by_value(definition.model_cls, data)
        self.data = data
        if metadata is not None and not isinstance(metadata, dict):
            raise TypeError(f"metadata={metadata!r} must be a dict (or None).")
        if definition.uri is not None:
            metadata = {DEFINITION_KEY: definition.uri, **(metadata or {})}
        return {**definition.config, **(config or {})}, metadata

    @property
    def config(self) -> dict[str, Any]:
        """The model's config (what ``setup(config)`` gets, before a batch size is divided)."""
        return {k: v for k, v in (self.train_loop_config or {}).items() if k != DRIVER_KEY}

    def hyperparameter_space(self) -> dict[str, Any] | None:
        """The search space ``Tuner`` uses when given no ``param_space``: the definition's (a registered
        one's stored space, else the class's ``hyperparameter_space()``)."""
        space = self.definition.hyperparameter_space
        if space is not None and not isinstance(space, dict):
            raise ValueError(
                f"{self.model_cls.__qualname__}.hyperparameter_space() returned {space!r}: return a dict of config "
                "keys to search spaces (e.g. {'lr': tune.loguniform(1e-4, 1e-1)}) or None."
            )
        return space

    # -- the data, made when the run starts ------------------------------------------------------
    def _make_payloads(self, storage: Any, executor: Any) -> Any:
        if self.data is not None:
            from trainforge._internal.datasets import check_datasets
            from trainforge._internal.worker_group.executor import executor_kind

            splits = data_splits(self.data, self.config, self._allowed_splits)
            datasets = self._use_splits(splits)
            check_datasets(datasets, allow_ray=executor_kind(self.scaling_config) == "ray")
            self.datasets = datasets
        return super()._make_payloads(storage, executor)  # type: ignore[misc]

    def _use_splits(self, splits: dict[str, Any]) -> dict[str, Any]:
        """Take the run's splits (the train loop learns their names and the label column); returns
        the ``datasets`` the core shards over the workers."""
        raise NotImplementedError

    # -- the trained model ------------------------------------------------------------------------
    def fit(self) -> Any:
        self._result = super().fit()  # type: ignore[misc]
        return self._result

    def current_checkpoint(self) -> Any:
        """The checkpoint of the last ``fit()`` (its latest)."""
        checkpoint = self._result.checkpoint if self._result is not None else None
        if checkpoint is None:
            raise RuntimeError("no trained model yet: call fit() first (the model is read from the run's latest "
                               "checkpoint)")  # fmt: skip
        return checkpoint

    def get_model(self) -> Any:
        """The trained model of the last ``fit()``, ready for ``model(x)``."""
        return self.model_cls.load(self.current_checkpoint())  # type: ignore[attr-defined]

    def _managed_state(self) -> dict[str, Any]:
        """The constructor arguments ``restore()`` passes back (the definition, the config, the data)."""
        return {"model_cls": self.definition, "config": self.config, "data": self.data}


def is_managed(trainer: Any) -> bool:
    """True for a managed trainer (``ModelTrainer`` of any framework)."""
    return isinstance(trainer, ManagedTrainer)


def reference_uri(model: Any) -> str | None:
    """The ``models:/`` URI that ``model`` is (a str, or an object with such a ``uri``: a registry's
    ``ModelVersion``, whose registry is named with ``?registry=``), or None."""
    uri = model if isinstance(model, str) else getattr(model, "uri", None)
    if not isinstance(uri, str) or not uri.startswith(SCHEME):
        return None
    where = getattr(getattr(model, "registry", None), "url", None)  # a ModelVersion: the registry it is in
    return f"{uri}?registry={quote(where, safe='')}" if isinstance(where, str) and "?" not in uri else uri


def resolve(model: Any, who: str) -> ModelDefinition:
    """The definition that ``model`` names: a model class (its own search space, no defaults), a
    ``ModelDefinition``, or a reference (``"models:/digits-net"``: the latest definition of that
    name; ``"models:/digits-net/1"``; ``"models:/digits-net@alias"``)."""
    if isinstance(model, ModelDefinition):
        check_model_class(model.model_cls, who)
        return model
    uri = reference_uri(model)
    if uri is None:
        if isinstance(model, str):
            raise ValueError(f"{who}({model!r}): a model reference starts with {SCHEME!r} ('models:/digits-net', "
                             "'models:/digits-net/1'); or pass the model class itself")  # fmt: skip
        check_model_class(model, who)
        return ModelDefinition(model_cls=model, hyperparameter_space=model.hyperparameter_space())
    definition_of = lookup(MODEL_DEFINITIONS, "models")
    if definition_of is None:
        raise ImportError(
            f"{who}({uri!r}): model references are resolved by the model registry, which is not installed here: "
            "pip install trainforge (from a checkout on PYTHONPATH, import trainforge.registry first)"
        )
    definition = definition_of(uri)
    if not isinstance(definition, ModelDefinition):
        raise TypeError(f"{who}({uri!r}): the registry returned {definition!r}, not a ModelDefinition")
    check_model_class(definition.model_cls, who)
    return definition
