"""What a ``sample_from`` function receives (``spec.config``, a read-only view of the config being
resolved) and how a place in a search space is named in messages."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

Path = tuple[Any, ...]


def format_path(path: Path, root: str = "param_space") -> str:
    """``('train_loop_config', 'lr')`` -> ``param_space["train_loop_config"]["lr"]``."""
    parts = (json.dumps(k, ensure_ascii=False) if isinstance(k, str) else repr(k) for k in path)
    return root + "".join(f"[{p}]" for p in parts)


class UnresolvedRead(Exception):
    """A sample_from function read a value that is itself a sample_from not yet resolved."""

    def __init__(self, path: Path):
        super().__init__(path)
        self.path = path


class ConfigView(Mapping[Any, Any]):
    """Read-only view of a config being resolved: ``view.key`` or ``view["key"]``, nested likewise."""

    __slots__ = ("_data", "_path", "_unresolved")

    def __init__(self, data: dict[Any, Any], path: Path, unresolved: Callable[[Any], bool]):
        self._data = data
        self._path = path
        self._unresolved = unresolved

    def __getitem__(self, key: Any) -> Any:
        value = self._data[key]
        if self._unresolved(value):
            raise UnresolvedRead((*self._path, key))
        if isinstance(value, dict):
            return ConfigView(value, (*self._path, key), self._unresolved)
        return value

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError:
            keys = ", ".join(repr(k) for k in self._data)
            raise AttributeError(
                f"{format_path(self._path, 'config')} has no key {name!r} (it has: {keys})"
            ) from None

    def __iter__(self) -> Iterator[Any]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"config view {self._data!r}"


class _Spec(Mapping[str, Any]):
    """What ``sample_from`` functions receive: ``spec.config`` (or ``spec["config"]``) is the trial config."""

    __slots__ = ("config",)

    def __init__(self, config: dict[Any, Any], unresolved: Callable[[Any], bool]):
        self.config = ConfigView(config, (), unresolved)

    def __getitem__(self, key: str) -> Any:
        if key != "config":
            raise KeyError(key)
        return self.config

    def __iter__(self) -> Iterator[str]:
        return iter(("config",))

    def __len__(self) -> int:
        return 1


def spec_view(config: dict[Any, Any], unresolved: Callable[[Any], bool] = lambda value: False) -> Mapping[str, Any]:
    """The ``spec`` a ``sample_from`` function gets for ``config`` (``unresolved(value)``: a value that
    is itself a ``sample_from`` not yet resolved, whose read raises :class:`UnresolvedRead`)."""
    return _Spec(config, unresolved)
