"""What the sinks do to reported values: flatten nested dicts, keep numbers, truncate parameters."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

SEP = "/"  # {"a": {"b": 1}} -> {"a/b": 1}, as Ray's flatten_dict


def flatten(values: Mapping[Any, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings flattened to ``"outer/inner"`` keys (a new dict; the input is not touched)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{SEP}{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, name))
        else:
            out[name] = value
    return out


def as_number(value: Any) -> float | None:
    """``value`` as a float if it is a real number (int, float, numpy or 0-d tensor scalars); None for
    anything else, booleans included (a flag is not a curve)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    if getattr(value, "shape", None) == () and hasattr(value, "item"):  # numpy 0-d array, torch scalar
        try:
            item = value.item()
        except Exception:  # noqa: BLE001 - not a scalar after all
            return None
        return None if isinstance(item, bool) or not isinstance(item, numbers.Real) else float(item)
    return None


def numeric_metrics(metrics: Mapping[str, Any], *, finite_only: bool = False) -> dict[str, float]:
    """The real-number entries of ``metrics`` after flattening (NaN/Inf dropped if ``finite_only``)."""
    out = {}
    for key, value in flatten(metrics).items():
        number = as_number(value)
        if number is None or (finite_only and not math.isfinite(number)):
            continue
        out[key] = number
    return out


MAX_CONFIG_SEQUENCE = 16  # longer lists in a config are data, not a setting
MAX_CONFIG_STRING = 1000


def loggable_config(config: Mapping[Any, Any]) -> dict[str, Any]:
    """The settings of a config, as trackers log them: scalars (numbers, strings, booleans, None),
    short lists of them, and nested dicts of them. Arrays, data sets, long lists and other objects
    (a ``train_loop_config`` often carries the data) are left out."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            out[str(key)] = loggable_config(value)
            continue
        kept = _setting(value)
        if kept is not _SKIP:
            out[str(key)] = kept
        elif isinstance(value, (list, tuple)) and len(value) <= MAX_CONFIG_SEQUENCE:
            items = [_setting(v) for v in value]
            if all(v is not _SKIP for v in items):
                out[str(key)] = items
    return out


_SKIP = object()


def _setting(value: Any) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return value if len(value) <= MAX_CONFIG_STRING else _SKIP
    if isinstance(value, numbers.Integral):
        return int(value)
    number = as_number(value)
    return number if number is not None else _SKIP


def truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit]


