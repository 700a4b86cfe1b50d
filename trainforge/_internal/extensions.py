"""The tables through which the core reaches the platform without naming it (the layers point down
only: the core never imports a platform package). An upper package fills a table, by a Python entry
point in its distribution's metadata (``pyproject.toml``'s ``[project.entry-points]``) or by
:func:`register` when it is imported; the core looks a name up when it needs it. Where no metadata
is installed (a checkout on ``PYTHONPATH``, as on the lent GPU machine), the checkout's own
``pyproject.toml`` is read for the same entry points, so one declaration serves both.

Tables:

- ``trainforge.checkpoint_schemes``: ``scheme -> function(uri) -> Checkpoint`` for
  :meth:`Checkpoint.from_uri` (``models`` -> the model registry: ``models:/name@alias``).
- ``trainforge.submitters``: ``"server" -> function(trainer, **options) -> job handle`` for
  ``trainer.submit()`` (the train server's client).
- ``trainforge.model_definitions``: ``"models" -> function(uri) -> ModelDefinition`` for a model by
  reference (``ModelTrainer("models:/digits-net")``: the model registry's definitions).
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: an installed trainforge reads its metadata alone
    tomllib = None  # type: ignore[assignment]

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
    for entry in (*importlib.metadata.entry_points(group=table), *_checkout_entry_points(table)):
        if entry.name == name:
            loaded = entry.load()
            register(table, name, loaded)
            return loaded  # type: ignore[no-any-return]
    return None


@functools.cache
def _checkout_entry_points(table: str) -> tuple[importlib.metadata.EntryPoint, ...]:
    """``table``'s entry points declared in the checkout's ``pyproject.toml`` when trainforge runs
    from a checkout without installed metadata; empty when it is installed (its metadata answers)."""
    try:
        importlib.metadata.distribution("trainforge")
        return ()
    except importlib.metadata.PackageNotFoundError:
        pass
    if tomllib is None:
        return ()
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        project = tomllib.loads(pyproject.read_text()).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        return ()
    if project.get("name") != "trainforge":
        return ()
    declared = project.get("entry-points", {}).get(table, {})
    return tuple(importlib.metadata.EntryPoint(n, v, table) for n, v in declared.items())
