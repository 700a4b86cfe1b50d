"""``ModelDefinition``: a model class with its default config, search space and data, as a registry
stores it (``Registry.put``) and a managed trainer starts from (see ``_managed.resolve``)."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class ModelDefinition:
    """A model class and what a run of it starts from: ``config`` (the default config a run's own
    config updates), ``hyperparameter_space`` (the search space ``Tuner`` uses without a
    ``param_space``), ``data`` (the default ``Data``), and ``uri`` when it is a registered definition
    (``models:/digits-net/1``), recorded in the lineage of what is trained from it. ``by_value``: it was
    stored with its code (``Registry.put(..., by_value=True)``): what is trained from it carries the
    class by value too, so it loads and serves where the class's module cannot be imported."""

    model_cls: type
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    hyperparameter_space: dict[str, Any] | None = None
    data: Any = None
    uri: str | None = None
    by_value: bool = False

    def build(self, config: dict[str, Any] | None = None) -> Any:
        """An untrained model from the default config updated with ``config``."""
        return self.model_cls({**self.config, **(config or {})})
