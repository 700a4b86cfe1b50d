"""Resolving a Ray-style ``param_space`` into trial configs, and config-path helpers.

Semantics (Ray Tune's ``variant_generator``):

- Grid axes (``{"grid_search": [...]}`` anywhere in nested dicts or lists) form a cartesian product.
  Axes are ordered by their key path and the *first* axis varies fastest, so
  ``{"a": grid([1, 2]), "b": grid(["x", "y"])}`` runs ``(1,x) (2,x) (1,y) (2,y)``, as Ray does.
- The whole grid is repeated ``num_samples`` times (``-1`` = without end): ``grid size × num_samples``
  variants, started in grid order.
- Every other domain is sampled per variant, in the space's key order, from the ``rng`` given.
- ``sample_from(fn)`` is resolved after the other domains: ``fn(spec)`` reads resolved values as
  ``spec.config.<key>`` (or ``spec["config"]["key"]``). One ``sample_from`` may read another: they are
  resolved in dependency order, and a cycle raises ``ValueError`` naming the keys.
- Constants and nested dicts pass through, deep-copied.

Variant ``k`` is a pure function of ``(param_space, k, rng)``: ``resolve_variant`` computes it
directly (grid point ``k mod grid size``), which is what lets a searcher resume or re-hand a variant.

Search spaces of other libraries (Ray Tune domains, hyperopt ``hp.*``, Optuna distributions) are
rejected by ``validate_param_space`` with the key path, so a half-ported script fails before any trial.
"""

from __future__ import annotations

import copy
import logging
import random
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from trainforge.tune._sample import GRID_SEARCH_KEY, Categorical, Domain, Function
from trainforge.tune._spec import ConfigView, UnresolvedRead, format_path, spec_view

logger = logging.getLogger(__name__)

Path = tuple[Any, ...]

# Search spaces of other libraries, by the leading parts of their classes' module names (as tuples:
# this module names Ray's packages only to recognise them, it never imports them).
_FOREIGN = (
    (("ray", "tune"), "a Ray Tune search space"),
    (("hyperopt",), "a hyperopt search space (hp.*)"),
    (("optuna", "distributions"), "an Optuna distribution"),
)


def is_grid(value: Any) -> bool:
    """Is ``value`` a grid axis (``{"grid_search": [...]}``, the only key, as in Ray)?"""
    return isinstance(value, dict) and len(value) == 1 and GRID_SEARCH_KEY in value


def normalize_num_samples(num_samples: Any) -> int:
    """``num_samples`` as a count: a positive int, ``-1`` (no limit) becomes ``sys.maxsize`` (as in Ray)."""
    if isinstance(num_samples, bool) or not isinstance(num_samples, int):
        raise TypeError(f"num_samples must be an int, got {num_samples!r}")
    if num_samples == -1:
        return sys.maxsize
    if num_samples < 1:
        raise ValueError(f"num_samples must be a positive int, or -1 for no limit; got {num_samples!r}")
    return num_samples


# -- validation --------------------------------------------------------------------------------------


def _foreign_kind(obj: Any) -> str | None:
    for cls in type(obj).__mro__:
        parts = tuple((getattr(cls, "__module__", None) or "").split("."))
        for prefix, what in _FOREIGN:
            if parts[: len(prefix)] == prefix:
                return what
    return None


def validate_param_space(space: Any, root: str = "param_space", *, allow_optuna: bool = False) -> None:
    """Raise ``ValueError`` (with the key path) for what trainforge cannot resolve: another library's
    search-space objects, malformed or nested grid axes, domains inside tuples."""
    if not isinstance(space, Mapping):
        raise TypeError(f"{root} must be a dict, got {type(space).__name__}: {space!r}")
    _validate(space, (), root, allow_optuna, nested=False, in_tuple=False)


def _validate(node: Any, path: Path, root: str, allow_optuna: bool, nested: bool, in_tuple: bool) -> None:
    where = format_path(path, root)
    what = _foreign_kind(node)
    if what is not None and not (allow_optuna and what == "an Optuna distribution"):
        cls = type(node)
        raise ValueError(
            f"{where} is {what} ({cls.__module__}.{cls.__qualname__}: {node!r}), which trainforge cannot "
            "sample. Use trainforge's constructors instead: `from trainforge import tune`, then tune.uniform, "
            "tune.loguniform, tune.randint, tune.qrandint, tune.choice, tune.grid_search, tune.sample_from, ..."
        )
    if isinstance(node, Domain) or is_grid(node):
        if in_tuple:
            raise ValueError(f"{where}: search spaces inside a tuple cannot be resolved; use a list")
    if isinstance(node, Categorical):
        for value in node.categories:
            _validate(value, path, root, allow_optuna, nested=True, in_tuple=False)
    elif is_grid(node):
        values = node[GRID_SEARCH_KEY]
        if nested:
            raise ValueError(
                f"{where}: a grid_search inside a grid_search or choice value is not supported; "
                "put every grid axis directly in param_space"
            )
        if not isinstance(values, (list, tuple)) or not values:
            raise ValueError(f"{where}: grid_search needs a non-empty list of values, got {values!r}")
        for value in values:
            _validate(value, path, root, allow_optuna, nested=True, in_tuple=False)
    elif isinstance(node, dict):
        for key, value in node.items():
            _validate(value, (*path, key), root, allow_optuna, nested, in_tuple)
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            _validate(value, (*path, i), root, allow_optuna, nested, in_tuple or isinstance(node, tuple))


def has_unresolved(space: Any) -> bool:
    """Does ``space`` still hold a domain or a grid axis (in nested dicts or lists)?"""
    if isinstance(space, Domain) or is_grid(space):
        return True
    if isinstance(space, dict):
        return any(has_unresolved(v) for v in space.values())
    if isinstance(space, list):
        return any(has_unresolved(v) for v in space)
    return False


# -- grid ----------------------------------------------------------------------------------------------


def _path_key(path: Path) -> tuple[tuple[int, Any], ...]:
    return tuple(
        (1, k) if isinstance(k, str) else (0, k) if isinstance(k, int) else (2, repr(k)) for k in path
    )


def grid_axes(space: Mapping[str, Any]) -> list[tuple[Path, list[Any]]]:
    """The grid axes of ``space`` as ``(path, values)``, sorted by path (Ray's order)."""
    axes: list[tuple[Path, list[Any]]] = []

    def walk(node: Any, path: Path) -> None:
        if is_grid(node):
            axes.append((path, list(node[GRID_SEARCH_KEY])))
        elif isinstance(node, dict):
            for key, value in node.items():
                walk(value, (*path, key))
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, (*path, i))

    walk(space, ())
    axes.sort(key=lambda axis: _path_key(axis[0]))
    return axes


def grid_size(space: Mapping[str, Any]) -> int:
    size = 1
    for _, values in grid_axes(space):
        size *= len(values)
    return size


def grid_point(axes: list[tuple[Path, list[Any]]], index: int) -> dict[Path, Any]:
    """Grid point ``index mod size``: the first axis varies fastest (Ray's ``_grid_search_generator``)."""
    point = {}
    for path, values in axes:
        index, i = divmod(index, len(values))
        point[path] = values[i]
    return point


def count_variants(param_space: Mapping[str, Any], num_samples: int) -> int:
    """How many variants ``generate_variants`` yields: grid size × num_samples."""
    return grid_size(param_space) * normalize_num_samples(num_samples)


# -- resolution ------------------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    if isinstance(value, ConfigView):
        return {k: _plain(value._data[k]) for k in value}
    return value


def get_path(config: Any, path: Path) -> Any:
    for key in path:
        config = config[key]
    return config


def set_path(config: Any, path: Path, value: Any) -> None:
    get_path(config, path[:-1])[path[-1]] = value


def _build(node: Any, path: Path, assign: dict[Path, Any], rng: random.Random, pending: list[Path]) -> Any:
    if is_grid(node):
        if path not in assign:
            raise ValueError(f"{format_path(path)}: grid_search is only allowed directly in param_space")
        return _build(assign[path], path, {}, rng, pending)
    if isinstance(node, Function):
        pending.append(path)
        return node
    if isinstance(node, Domain):
        return _build(node.sample(rng), path, {}, rng, pending)
    if isinstance(node, dict):
        return {key: _build(value, (*path, key), assign, rng, pending) for key, value in node.items()}
    if isinstance(node, list):
        return [_build(value, (*path, i), assign, rng, pending) for i, value in enumerate(node)]
    return copy.deepcopy(node)


def _resolve_functions(config: dict[Any, Any], pending: list[Path], root: str) -> None:
    remaining = list(pending)
    while remaining:
        blocked: dict[Path, Path] = {}
        for path in remaining:
            function = get_path(config, path)
            try:
                value = function.call(spec_view(config, unresolved=lambda v: isinstance(v, Function)))
            except UnresolvedRead as exc:
                blocked[path] = exc.path
                continue
            except Exception as exc:
                raise ValueError(
                    f"sample_from at {format_path(path, root)} raised {type(exc).__name__}: {exc}"
                ) from exc
            set_path(config, path, _plain(value))
        if len(blocked) == len(remaining):
            reads = "; ".join(
                f"{format_path(p, root)} reads {format_path(d, root)}" for p, d in blocked.items()
            )
            raise ValueError(f"sample_from values depend on each other in a cycle: {reads}")
        remaining = list(blocked)


def resolve_variant(
    param_space: Mapping[str, Any], index: int, rng: random.Random, root: str = "param_space"
) -> dict[Any, Any]:
    """Variant ``index``: grid point ``index mod grid size``, every other domain sampled from ``rng``."""
    axes = grid_axes(param_space)
    pending: list[Path] = []
    config = _build(dict(param_space), (), grid_point(axes, index), rng, pending)
    _resolve_functions(config, pending, root)
    return config


def generate_variants(
    param_space: Mapping[str, Any], num_samples: int, rng: random.Random
) -> Iterator[dict[Any, Any]]:
    """Resolve ``param_space`` into ``grid size × num_samples`` configs, in Ray's order."""
    validate_param_space(param_space)
    total = count_variants(param_space, num_samples)
    for index in range(total):
        yield resolve_variant(param_space, index, rng)


# -- points and merging ------------------------------------------------------------------------------------


def merge_config(base: Mapping[Any, Any], override: Mapping[Any, Any]) -> dict[Any, Any]:
    """``override`` deep-merged over ``base`` (a new dict; a grid axis or domain in ``base`` is replaced,
    not merged into). The tuner builds a trial's config as ``merge_config(param_space, suggestion)``."""
    out = {key: copy.deepcopy(value) for key, value in base.items()}
    for key, value in override.items():
        current = out.get(key)
        if isinstance(value, Mapping) and isinstance(current, dict) and not is_grid(current):
            out[key] = merge_config(current, value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def point_overrides(space: Mapping[Any, Any], point: Mapping[Any, Any], where: str) -> list[tuple[Path, Any]]:
    """The ``(path, value)`` pairs a point sets, checked against ``space``: a nested dict descends into a
    plain dict of ``space``; an ``"a/b"`` key (Ray's OptunaSearch form) is read as ``{"a": {"b": ...}}``.
    A key ``space`` does not have raises ``ValueError``."""
    if not isinstance(point, Mapping):
        raise TypeError(f"{where} must be a dict, got {type(point).__name__}: {point!r}")
    out: list[tuple[Path, Any]] = []

    def walk(node: Mapping[Any, Any], values: Mapping[Any, Any], path: Path) -> None:
        for key, value in values.items():
            if key not in node and isinstance(key, str) and "/" in key:
                head, rest = key.split("/", 1)
                walk(node, {head: {rest: value}}, path)
                continue
            if key not in node:
                keys = ", ".join(repr(k) for k in node)
                raise ValueError(
                    f"{where} sets {format_path((*path, key), 'config')}, which param_space does not have "
                    f"(keys there: {keys}); add it to param_space or remove it from the point"
                )
            target = node[key]
            if isinstance(value, Mapping) and isinstance(target, dict) and not is_grid(target):
                walk(target, value, (*path, key))
            else:
                out.append(((*path, key), value))

    walk(space, point, ())
    return out


def merge_point(space: Mapping[Any, Any], point: Mapping[Any, Any], where: str) -> dict[Any, Any]:
    """``space`` with the values of ``point`` (``points_to_evaluate[i]``) in place of its domains, grid
    axes or constants; what the point leaves out stays to be sampled. A value outside its domain is
    used anyway, with a warning (as in Ray)."""
    merged = copy.deepcopy(dict(space))
    for path, value in point_overrides(space, point, where):
        target = get_path(merged, path)
        domain = Categorical(tuple(target[GRID_SEARCH_KEY])) if is_grid(target) else target
        if isinstance(domain, Domain) and not domain.is_valid(value):
            logger.warning("%s: %r is outside %s of %s", where, value, domain, format_path(path))
        set_path(merged, path, copy.deepcopy(value))
    return merged


# -- flat keys ------------------------------------------------------------------------------------------------


def flatten_config(config: Mapping[Any, Any], sep: str = "/") -> dict[str, Any]:
    """``{"a": {"b": 1}, "c": 2}`` -> ``{"a/b": 1, "c": 2}`` (nested dicts only; an empty dict stays)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping) and value:
            for sub, leaf in flatten_config(value, sep).items():
                out[f"{key}{sep}{sub}"] = leaf
        else:
            out[str(key)] = value
    return out


def unflatten_config(flat: Mapping[str, Any], sep: str = "/") -> dict[str, Any]:
    """``{"a/b": 1, "c": 2}`` -> ``{"a": {"b": 1}, "c": 2}``."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, last = key.split(sep)
        node = out
        for i, part in enumerate(parents):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ValueError(
                    f"unflatten_config: {sep.join(parents[: i + 1])!r} is both a value and a prefix"
                )
            node = child
        if last in node and isinstance(node[last], dict) and not isinstance(value, dict):
            raise ValueError(f"unflatten_config: {key!r} is both a value and a prefix")
        node[last] = value
    return out
