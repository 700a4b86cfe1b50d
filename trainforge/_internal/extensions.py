"""The tables through which the core reaches the platform without naming it (the layers point down
only: the core never imports a platform package). An upper package fills a table, by a Python entry
point in its distribution's metadata (``pyproject.toml``'s ``[project.entry-points]``) or, where no
metadata is installed (a checkout on ``PYTHONPATH``), by :func:`register` when it is imported; the
core looks a name up when it needs it.

Tables:

- ``trainforge.checkpoint_schemes``: ``scheme -> function(uri) -> Checkpoint`` for
  :meth:`Checkpoint.from_uri` (``models`` -> the model registry: ``models:/name@alias``).
- ``trainforge.submitters``: ``"server" -> function(trainer, **options) -> job handle`` for
  ``trainer.submit()`` (the train server's client).
- ``trainforge.model_definitions``: ``"models" -> function(uri) -> ModelDefinition`` for a model by
  reference (``ModelTrainer("models:/digits-net")``: the model registry's definitions).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from typing import Any

CHECKPOINT_SCHEMES = "trainforge.checkpoint_schemes"
SUBMITTERS = "trainforge.submitters"
MODEL_DEFINITIONS = "trainforge.model_definitions"

_registered: dict[str, dict[str, Callable[..., Any]]] = {}


def register(table: str, name: str, fn: Callable[..., Any]) -> None:
    """Fill ``table[name]`` in this process (what an entry point does for an installed distribution)."""
    _registered.setdefault(table, {})[name] = fn


def lookup(table: str, name: str) -> Callable[..., Any] | None:
    """``table[name]``: registered in this process, else the entry point of that name; None if neither."""
    fn = _registered.get(table, {}).get(name)
    if fn is not None:
        return fn
    for entry in importlib.metadata.entry_points(group=table):
        if entry.name == name:
            loaded = entry.load()
            register(table, name, loaded)
            return loaded  # type: ignore[no-any-return]
    return None
