"""Search-space domains and their constructors, with Ray Tune's semantics.

``uniform(l, u)`` is ``Float(l, u)``; ``randint(l, u)`` is ``Integer(l, u)``; ``choice(cs)`` is
``Categorical(cs)``; ``randn(m, s)`` is ``Normal(m, s)``; ``sample_from(fn)`` is ``Function(fn)``;
``grid_search(vs)`` is the plain dict ``{"grid_search": [...]}`` (as in Ray, so JSON/YAML specs work).

Ranges, as in Ray: ``uniform``/``loguniform`` are ``[l, u]``; ``randint``/``lograndint`` are ``[l, u)``;
every quantized domain (``q...``) gives multiples of ``q`` within ``[l, u]`` (both ends inclusive).
Quantized floats are sampled on ``[ceil(l/q)·q, floor(u/q)·q]`` and rounded to the nearest multiple
(Ray's rule); quantized integers are uniform over the multiples (Ray's rounding gives the two ends
half weight, and ``qrandint(l, u, 1)`` left ``u`` out). Unlike Ray, ``l`` and ``u`` need not be
multiples of ``q``: there must just be at least one multiple between them.

``base`` of the log domains is kept for Ray compatibility only: a log-uniform distribution is the
same whatever the base (Ray 2.x deprecated the argument for that reason).

Every domain samples from a ``random.Random`` passed in, so a seeded generator gives reproducible
trials. ``Function`` is resolved by the variant generator (it needs the other resolved values).
"""

from __future__ import annotations

import copy
import inspect
import math
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

GRID_SEARCH_KEY = "grid_search"


class Domain:
    """A search-space dimension: ``sample(rng)`` draws one value, ``is_valid(v)`` checks one."""

    @property
    def kind(self) -> str:
        """The name of the constructor that builds this domain (``"quniform"``, ``"choice"``, ...)."""
        raise NotImplementedError

    def sample(self, rng: random.Random) -> Any:
        raise NotImplementedError

    def is_valid(self, value: Any) -> bool:
        raise NotImplementedError


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_number(kind: str, what: str, value: Any, *, finite: bool = True) -> float:
    if not _is_number(value):
        raise TypeError(f"{kind}(): {what} must be a number, got {value!r} ({type(value).__name__})")
    if finite and not math.isfinite(value):
        raise ValueError(f"{kind}(): {what} must be finite, got {value!r}")
    return value


def _check_int(kind: str, what: str, value: Any) -> int:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{kind}(): {what} must be an int, got {value!r} ({type(value).__name__})")
    return value


def round_to_multiple(value: float, q: float) -> float:
    """The multiple of ``q`` nearest ``value``, without float noise: ``k * q`` rounded to as many
    decimals as ``q`` has (``3 * 0.1`` is ``0.30000000000000004``; this gives ``0.3``)."""
    exponent = Decimal(repr(float(q))).as_tuple().exponent
    decimals = max(0, -exponent) if isinstance(exponent, int) else 0
    return round(round(value / q) * q, decimals)


def _multiples(kind: str, lower: float, upper: float, q: float) -> tuple[int, int]:
    """The first and last k with ``k * q`` in ``[lower, upper]`` (a relative tolerance of 1e-9)."""
    k_low = math.ceil(lower / q - 1e-9)
    k_high = math.floor(upper / q + 1e-9)
    if k_low > k_high:
        raise ValueError(
            f"{kind}(lower={lower!r}, upper={upper!r}, q={q!r}): no multiple of q lies in [lower, upper]; "
            "use a smaller q or a wider range"
        )
    return k_low, k_high


def _log_uniform(rng: random.Random, lower: float, upper: float) -> float:
    return math.exp(rng.uniform(math.log(lower), math.log(upper)))


def _check_base(kind: str, base: Any) -> None:
    _check_number(kind, "base", base)
    if base <= 0 or base == 1:
        raise ValueError(f"{kind}(): base must be > 0 and != 1, got {base!r}")


@dataclass(frozen=True, repr=False)
class Float(Domain):
    """A float in ``[lower, upper]``, uniform or log-uniform, optionally quantized to multiples of ``q``."""

    lower: float
    upper: float
    q: float | None = None
    log: bool = False
    base: float = 10

    def __post_init__(self) -> None:
        kind = self.kind
        _check_number(kind, "lower", self.lower)
        _check_number(kind, "upper", self.upper)
        if not self.lower < self.upper:
            raise ValueError(f"{kind}(lower={self.lower!r}, upper={self.upper!r}): lower must be < upper")
        if self.log:
            _check_base(kind, self.base)
            if self.lower <= 0:
                raise ValueError(
                    f"{kind}(lower={self.lower!r}, upper={self.upper!r}): log sampling needs 0 < lower < upper; "
                    "pass the untransformed bounds (e.g. 1e-4, not -4)"
                )
        if self.q is not None:
            _check_number(kind, "q", self.q)
            if self.q <= 0:
                raise ValueError(f"{kind}(q={self.q!r}): q must be > 0")
            _multiples(kind, self.lower, self.upper, self.q)

    @property
    def kind(self) -> str:
        return ("q" if self.q is not None else "") + ("loguniform" if self.log else "uniform")

    def bounds(self) -> tuple[float, float]:
        """The inclusive range values come from: ``[lower, upper]``, shrunk to multiples of ``q``."""
        if self.q is None:
            return self.lower, self.upper
        k_low, k_high = _multiples(self.kind, self.lower, self.upper, self.q)
        return self.quantize(k_low * self.q), self.quantize(k_high * self.q)

    def quantize(self, value: float) -> float:
        """``value`` rounded to the nearest multiple of ``q`` and clipped to ``[lower, upper]``."""
        if self.q is not None:
            value = round_to_multiple(value, self.q)
        return min(max(float(value), float(self.lower)), float(self.upper))

    def sample(self, rng: random.Random) -> float:
        low, high = self.bounds()
        if low == high:
            return low
        value = _log_uniform(rng, low, high) if self.log else rng.uniform(low, high)
        return self.quantize(value)

    def is_valid(self, value: Any) -> bool:
        return _is_number(value) and self.lower <= value <= self.upper

    def __repr__(self) -> str:
        args = [repr(self.lower), repr(self.upper)] + ([repr(self.q)] if self.q is not None else [])
        return f"{self.kind}({', '.join(args)})"


@dataclass(frozen=True, repr=False)
class Integer(Domain):
    """An int: ``[lower, upper)`` when ``q`` is None (``randint``); else the multiples of ``q`` in
    ``[lower, upper]`` (``qrandint``, both ends inclusive as in Ray). ``log`` samples log-uniformly."""

    lower: int
    upper: int
    q: int | None = None
    log: bool = False
    base: float = 10

    def __post_init__(self) -> None:
        kind = self.kind
        object.__setattr__(self, "lower", _check_int(kind, "lower", self.lower))
        object.__setattr__(self, "upper", _check_int(kind, "upper", self.upper))
        if not self.lower < self.upper:
            allowed = "[lower, upper]" if self.q is not None else "[lower, upper)"
            raise ValueError(
                f"{kind}(lower={self.lower!r}, upper={self.upper!r}): lower must be < upper (values come "
                f"from {allowed})"
            )
        if self.log:
            _check_base(kind, self.base)
            if self.lower <= 0:
                raise ValueError(
                    f"{kind}(lower={self.lower!r}, upper={self.upper!r}): log sampling needs 0 < lower < upper"
                )
        if self.q is not None:
            object.__setattr__(self, "q", _check_int(kind, "q", self.q))
            if self.q <= 0:
                raise ValueError(f"{kind}(q={self.q!r}): q must be a positive int")
            _multiples(kind, self.lower, self.upper, self.q)

    @property
    def kind(self) -> str:
        return ("q" if self.q is not None else "") + ("lograndint" if self.log else "randint")

    def bounds(self) -> tuple[int, int]:
        """The inclusive range values come from (``upper - 1`` without ``q``; multiples of ``q`` with)."""
        if self.q is None:
            return self.lower, self.upper - 1
        k_low, k_high = _multiples(self.kind, self.lower, self.upper, self.q)
        return k_low * self.q, k_high * self.q

    def quantize(self, value: float) -> int:
        """``value`` rounded to a multiple of ``q`` (floored to an int without ``q``), within bounds."""
        low, high = self.bounds()
        rounded = round(value / self.q) * self.q if self.q is not None else math.floor(value)
        return int(min(max(rounded, low), high))

    def sample(self, rng: random.Random) -> int:
        low, high = self.bounds()
        if self.log:
            # Ray: floor(exp(uniform(log l, log u))) for [l, u); rounded to q when quantized.
            return self.quantize(_log_uniform(rng, low, high if self.q is not None else self.upper))
        step = self.q or 1
        return low + step * rng.randrange((high - low) // step + 1)

    def is_valid(self, value: Any) -> bool:
        if not isinstance(value, int) or isinstance(value, bool):
            return False
        low, high = self.bounds()
        return low <= value <= high and (self.q is None or value % self.q == 0)

    def __repr__(self) -> str:
        args = [repr(self.lower), repr(self.upper)] + ([repr(self.q)] if self.q is not None else [])
        return f"{self.kind}({', '.join(args)})"


@dataclass(frozen=True, repr=False)
class Normal(Domain):
    """A float from a normal distribution ``N(mean, sd)``, optionally rounded to multiples of ``q``."""

    mean: float = 0.0
    sd: float = 1.0
    q: float | None = None

    def __post_init__(self) -> None:
        kind = self.kind
        _check_number(kind, "mean", self.mean)
        _check_number(kind, "sd", self.sd)
        if self.sd <= 0:
            raise ValueError(f"{kind}(mean={self.mean!r}, sd={self.sd!r}): sd must be > 0")
        if self.q is not None:
            _check_number(kind, "q", self.q)
            if self.q <= 0:
                raise ValueError(f"{kind}(q={self.q!r}): q must be > 0")

    @property
    def kind(self) -> str:
        return "qrandn" if self.q is not None else "randn"

    def sample(self, rng: random.Random) -> float:
        value = rng.gauss(self.mean, self.sd)
        return round_to_multiple(value, self.q) if self.q is not None else value

    def is_valid(self, value: Any) -> bool:
        return _is_number(value)

    def __repr__(self) -> str:
        args = [repr(self.mean), repr(self.sd)] + ([repr(self.q)] if self.q is not None else [])
        return f"{self.kind}({', '.join(args)})"


@dataclass(frozen=True, repr=False)
class Categorical(Domain):
    """One of ``categories``, uniformly (``choice``). A sampled category is a deep copy."""

    categories: tuple[Any, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "categories", tuple(self.categories))
        if not self.categories:
            raise ValueError("choice([]): categories must hold at least one value")

    @property
    def kind(self) -> str:
        return "choice"

    def sample(self, rng: random.Random) -> Any:
        return copy.deepcopy(self.categories[rng.randrange(len(self.categories))])

    def is_valid(self, value: Any) -> bool:
        return any(value == c for c in self.categories)

    def __repr__(self) -> str:
        return f"choice({list(self.categories)!r})"


@dataclass(frozen=True, repr=False)
class Function(Domain):
    """``sample_from(func)``: ``func(spec)`` computes the value, where ``spec.config.<key>`` reads the
    trial's other (already resolved) values; a ``func`` that takes no argument is called as ``func()``."""

    func: Callable[..., Any]
    pass_spec: bool = field(init=False, default=True)

    def __post_init__(self) -> None:
        if not callable(self.func):
            raise TypeError(f"sample_from(): expected a callable, got {self.func!r}")
        try:
            sig = inspect.signature(self.func)
        except (TypeError, ValueError):  # builtins without a signature: assume they take the spec
            return
        try:
            sig.bind(None)
        except TypeError:
            try:
                sig.bind()
            except TypeError:
                raise ValueError(
                    f"sample_from({self.func!r}): the function must take one argument (spec) or none"
                ) from None
            object.__setattr__(self, "pass_spec", False)

    @property
    def kind(self) -> str:
        return "sample_from"

    def call(self, spec: Any) -> Any:
        return self.func(spec) if self.pass_spec else self.func()

    def sample(self, rng: random.Random, spec: Any = None) -> Any:
        """Call the function (``spec`` defaults to one with an empty config); ``rng`` is unused."""
        if spec is None:
            from trainforge.tune._spec import spec_view

            spec = spec_view({}, unresolved=lambda value: isinstance(value, Function))
        return self.call(spec)

    def is_valid(self, value: Any) -> bool:
        return True

    def __repr__(self) -> str:
        return f"sample_from({getattr(self.func, '__qualname__', self.func)!s})"


def uniform(lower: float, upper: float) -> Float:
    """A float uniformly in ``[lower, upper]``."""
    return Float(lower, upper)


def quniform(lower: float, upper: float, q: float) -> Float:
    """A float uniformly in ``[lower, upper]``, rounded to a multiple of ``q`` (ends inclusive)."""
    return Float(lower, upper, q=q)


def loguniform(lower: float, upper: float, base: float = 10) -> Float:
    """A float log-uniformly in ``[lower, upper]`` (``0 < lower``); ``base`` does not change it."""
    return Float(lower, upper, log=True, base=base)


def qloguniform(lower: float, upper: float, q: float, base: float = 10) -> Float:
    """A float log-uniformly in ``[lower, upper]``, rounded to a multiple of ``q``."""
    return Float(lower, upper, q=q, log=True, base=base)


def randn(mean: float = 0.0, sd: float = 1.0) -> Normal:
    """A float from ``N(mean, sd)``."""
    return Normal(mean, sd)


def qrandn(mean: float, sd: float, q: float) -> Normal:
    """A float from ``N(mean, sd)``, rounded to a multiple of ``q``."""
    return Normal(mean, sd, q=q)


def randint(lower: int, upper: int) -> Integer:
    """An int uniformly in ``[lower, upper)``."""
    return Integer(lower, upper)


def qrandint(lower: int, upper: int, q: int = 1) -> Integer:
    """An int uniformly among the multiples of ``q`` in ``[lower, upper]`` (upper inclusive, as in Ray)."""
    return Integer(lower, upper, q=q)


def lograndint(lower: int, upper: int, base: float = 10) -> Integer:
    """An int log-uniformly in ``[lower, upper)`` (``0 < lower``)."""
    return Integer(lower, upper, log=True, base=base)


def qlograndint(lower: int, upper: int, q: int, base: float = 10) -> Integer:
    """An int log-uniformly in ``[lower, upper]``, rounded to a multiple of ``q``."""
    return Integer(lower, upper, q=q, log=True, base=base)


def choice(categories: Iterable[Any]) -> Categorical:
    """One of ``categories``, uniformly."""
    if isinstance(categories, (str, bytes, Mapping)) or not isinstance(categories, Iterable):
        raise TypeError(
            f"choice({categories!r}): categories must be a list of values, e.g. choice(['relu', 'tanh'])"
        )
    return Categorical(tuple(categories))


def sample_from(func: Callable[..., Any]) -> Function:
    """A value computed per trial by ``func(spec)``; ``spec.config.<key>`` reads resolved values."""
    return Function(func)


def grid_search(values: Iterable[Any]) -> dict[str, list[Any]]:
    """Every value in ``values`` is run: grid axes form a product, repeated ``num_samples`` times."""
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        raise TypeError(f"grid_search({values!r}): values must be a list, e.g. grid_search([1, 2, 3])")
    listed = list(values)
    if not listed:
        raise ValueError("grid_search([]): values must hold at least one value")
    return {GRID_SEARCH_KEY: listed}
