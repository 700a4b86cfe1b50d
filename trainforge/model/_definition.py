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
    (``models:/digits-net/1``), recorded in the lineage of what is trained from it."""

    model_cls: type
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    hyperparameter_space: dict[str, Any] | None = None
    data: Any = None
    uri: str | None = None

    def build(self, config: dict[str, Any] | None = None) -> Any:
        """An untrained model from the default config updated with ``config``."""
        return self.model_cls({**self.config, **(config or {})})
