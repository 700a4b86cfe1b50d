"""OptunaSearch's search space: a Ray-style ``param_space`` converted to Optuna distributions (the
table in :mod:`trainforge.tune.search.optuna`'s docstring), and the configs built back from Optuna's
parameter values."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from trainforge.tune._sample import Categorical, Domain, Float, Function, Integer, Normal
from trainforge.tune._variants import Path, format_path, grid_axes, has_unresolved, is_grid, set_path

PRIMITIVES = (str, int, float, type(None))  # the category values Optuna's storages can hold
Converted = tuple[Any, Callable[[Any], Any], Callable[[Any], Any]]  # distribution, decode, encode


@dataclass
class Param:
    """One Optuna parameter: its name, config path, distribution and value mapping."""

    name: str
    path: Path
    distribution: Any
    decode: Callable[[Any], Any]  # Optuna's value -> the config's
    encode: Callable[[Any], Any]  # a config value (a point's, a grid value) -> Optuna's


def categorical(optuna: ModuleType, values: list[Any], where: str) -> Converted:
    plain = all(isinstance(v, PRIMITIVES) for v in values)
    mixed = any(isinstance(v, bool) for v in values) and any(not isinstance(v, bool) for v in values)
    by_index = not plain or mixed
    choices: tuple[Any, ...] = tuple(range(len(values))) if by_index else tuple(values)

    def encode(value: Any) -> Any:
        for i, v in enumerate(values):
            if isinstance(v, bool) == isinstance(value, bool) and v == value:
                return choices[i]
        raise ValueError(f"{where}: {value!r} is not one of {values!r}")

    def decode(choice: Any) -> Any:
        return copy.deepcopy(values[choice]) if by_index else choice

    return optuna.distributions.CategoricalDistribution(choices), decode, encode


def convert(optuna: ModuleType, domain: Domain, where: str) -> Converted:
    dists = optuna.distributions
    if isinstance(domain, Float):
        low, high = domain.bounds()
        step = domain.q if domain.q is not None and not domain.log else None
        return dists.FloatDistribution(low, high, log=domain.log, step=step), domain.quantize, float
    if isinstance(domain, Integer):
        low, high = domain.bounds()
        step = 1 if domain.log else domain.q or 1
        return dists.IntDistribution(low, high, log=domain.log, step=step), domain.quantize, int
    if isinstance(domain, Categorical):
        return categorical(optuna, list(domain.categories), where)
    if isinstance(domain, Normal):
        why = "Optuna has no normal distribution; use tune.uniform or tune.quniform over a range"
    elif isinstance(domain, Function):
        why = (
            "a sample_from value is computed by your function, which an Optuna sampler cannot model; "
            "compute it from config inside the trainable"
        )
    else:
        why = f"it is a {type(domain).__name__}, which has no Optuna distribution"
    raise ValueError(f"OptunaSearch cannot search {where} = {domain!r}: {why} (or use the default searcher)")


class OptunaSpace:
    """A search space converted for Optuna: parameters by name, the constants, the grid axes."""

    def __init__(self, optuna: ModuleType, space: Mapping[str, Any], root: str):
        self.params: dict[str, Param] = {}
        self.axes = grid_axes(space)
        self.template = self._walk(optuna, dict(space), (), root)
        self.distributions = {name: p.distribution for name, p in self.params.items()}
        self.by_path = {p.path: p for p in self.params.values()}

    def _walk(self, optuna: ModuleType, node: Any, path: Path, root: str) -> Any:
        where = format_path(path, root)
        if is_grid(node):
            converted: Converted = categorical(optuna, list(node["grid_search"]), where)
        elif isinstance(node, optuna.distributions.BaseDistribution):
            converted = (node, lambda v: v, lambda v: v)
        elif isinstance(node, Domain):
            converted = convert(optuna, node, where)
        elif isinstance(node, dict):
            return {key: self._walk(optuna, value, (*path, key), root) for key, value in node.items()}
        elif isinstance(node, list) and has_unresolved(node):
            raise ValueError(f"OptunaSearch: {where} holds a search space inside a list; use a dict")
        else:
            return copy.deepcopy(node)
        name = "/".join(str(k) for k in path)
        if name in self.params:
            raise ValueError(
                f"OptunaSearch: {where} and another key both flatten to the parameter name {name!r}"
            )
        self.params[name] = Param(name, path, *converted)
        return None

    def fixed(self, overrides: list[tuple[Path, Any]], where: str) -> dict[str, Any]:
        """The Optuna values a point's overrides fix (checked: a categorical value must be a category)."""
        out = {}
        for path, value in overrides:
            param = self.by_path.get(path)
            if param is not None:
                out[param.name] = param.encode(value)
            elif any(p[: len(path)] == path for p in self.by_path):
                raise ValueError(
                    f"{where} replaces {format_path(path, 'config')}, a dict of search parameters; "
                    "give values for its keys instead"
                )
        return out

    def config(self, params: Mapping[str, Any], overrides: list[tuple[Path, Any]]) -> dict[str, Any]:
        config = copy.deepcopy(self.template)
        for name, param in self.params.items():
            if name in params:
                set_path(config, param.path, param.decode(params[name]))
        for path, value in overrides:
            set_path(config, path, copy.deepcopy(value))
        return config
