"""PBT's explore step: perturb a config according to ``hyperparam_mutations`` (Ray's rules).

A mutation is, per key:

- a list or tuple of values: with ``resample_probability`` (or when the current value is not in the
  list) a random element, else the left or right neighbour of the current value (clamped at the
  ends, so the value may stay);
- a search domain (any object with a ``.sample(rng)`` method taking a ``random.Random``, e.g.
  ``tune.uniform(0, 1)``): with ``resample_probability`` a new sample, else the current value times
  a random element of ``perturbation_factors`` (an int stays an int), brought back into the domain
  by its ``quantize(value)`` (clipped to its bounds, rounded to its ``q``) or, for a domain without
  one, clipped into its ``[lower, upper]``. ``tune.choice`` (a domain with ``categories``) is
  treated as the list of its categories; ``tune.sample_from`` is refused, as in Ray;
- a callable with no arguments: like a domain, resampling by calling it;
- a dict: the same rules, one level down, for the nested config.
"""

from __future__ import annotations

import copy
import numbers
import random
from collections.abc import Callable
from typing import Any, TypeGuard


def check_mutations(mutations: dict, owner: str, path: str = "") -> None:
    """ValueError naming the key of any mutation that is none of the supported kinds."""
    for key, mutation in mutations.items():
        where = f"{path}{key}"
        if isinstance(mutation, dict):
            check_mutations(mutation, owner, f"{where}/")
        elif isinstance(mutation, (list, tuple)):
            if not mutation:
                raise ValueError(f"{owner}(hyperparam_mutations=...): the list for {where!r} is empty.")
        elif getattr(mutation, "kind", None) == "sample_from":
            raise ValueError(
                f"{owner}(hyperparam_mutations=...): {where!r} is a tune.sample_from(), which PBT cannot "
                "resample (as in Ray): pass the function itself (called with no argument) or a domain."
            )
        elif not (_is_domain(mutation) or callable(mutation)):
            raise ValueError(
                f"{owner}(hyperparam_mutations=...): {where!r} maps to {mutation!r}; expected a list of "
                "values, a search domain (tune.uniform, ...), a function, or a dict of those."
            )


def fill_missing(config: dict, mutations: dict, rng: random.Random) -> None:
    """Sample, in place, the mutated keys that ``config`` lacks (initial values, as Ray does)."""
    for key, mutation in mutations.items():
        if isinstance(mutation, dict):
            if not isinstance(config.get(key), dict):
                config[key] = {}
            fill_missing(config[key], mutation, rng)
        elif key not in config:
            config[key] = _resample(mutation, rng)


def explore(
    config: dict,
    mutations: dict,
    rng: random.Random,
    resample_probability: float,
    perturbation_factors: tuple[float, ...],
) -> tuple[dict, dict]:
    """A perturbed deep copy of ``config`` and, per mutated key, what was done ("resample", ...)."""
    new = copy.deepcopy(config)
    operations: dict[str, Any] = {}
    for key, mutation in mutations.items():
        if isinstance(mutation, dict):
            nested = config[key] if isinstance(config.get(key), dict) else {}
            new[key], operations[key] = explore(
                nested, mutation, rng, resample_probability, perturbation_factors
            )
            continue
        choices = _choices(mutation)
        old = config.get(key)
        if choices is not None:
            if key not in config or old not in choices or rng.random() < resample_probability:
                new[key], operations[key] = copy.deepcopy(rng.choice(choices)), "resample"
            else:
                shift = rng.choice((-1, 1))
                index = choices.index(old)
                moved = min(max(index + shift, 0), len(choices) - 1)
                new[key] = copy.deepcopy(choices[moved])
                operations[key] = (
                    f"shift {'left' if shift < 0 else 'right'}{'' if moved != index else ' (noop)'}"
                )
        elif not _is_number(old) or rng.random() < resample_probability:
            new[key], operations[key] = _resample(mutation, rng), "resample"
        else:
            factor = rng.choice(perturbation_factors)
            value = old * factor
            new[key] = _clip(int(value) if isinstance(old, int) else value, mutation)
            operations[key] = f"* {factor}"
    return new, operations


def _is_domain(mutation: object) -> bool:
    return callable(getattr(mutation, "sample", None))


def _is_number(value: object) -> TypeGuard[float]:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _choices(mutation: object) -> list | None:
    if isinstance(mutation, (list, tuple)):
        return list(mutation)
    categories = getattr(mutation, "categories", None) if _is_domain(mutation) else None
    return list(categories) if isinstance(categories, (list, tuple)) and categories else None


def _resample(mutation: Any, rng: random.Random) -> Any:
    choices = _choices(mutation)
    if choices is not None:
        return copy.deepcopy(rng.choice(choices))
    if _is_domain(mutation):
        return mutation.sample(rng)
    fn: Callable[[], Any] = mutation
    return fn()


def _clip(value: Any, mutation: object) -> Any:
    quantize = getattr(mutation, "quantize", None)
    if callable(quantize):
        return quantize(value)
    lower, upper = getattr(mutation, "lower", None), getattr(mutation, "upper", None)
    if _is_domain(mutation) and _is_number(lower) and _is_number(upper):
        return min(max(value, lower), upper)
    return value
