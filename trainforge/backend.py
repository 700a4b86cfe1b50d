"""Backends: plug a framework into the worker group's lifecycle (``ray.train.backend`` equivalent)."""

from trainforge._internal.backend import Backend, BackendConfig

__all__ = ["Backend", "BackendConfig"]
