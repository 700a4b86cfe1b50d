"""The JSON encoding rule of trainforge's HTTP answers: JSON has no NaN or infinity, so a value
about to be answered goes through :func:`json_safe` first."""

from __future__ import annotations

import math
from typing import Any, Literal


def json_safe(value: Any, *, nonfinite: Literal["text", "null"] = "text") -> Any:
    """``value`` with every NaN and infinite float, however deep in its dicts and lists, replaced:
    by its name as a string (``"nan"``, ``"inf"``, ``"-inf"``: the train server's rule, so a metric
    that went NaN still says so) or, with ``nonfinite="null"``, by None."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value) if nonfinite == "text" else None
    if isinstance(value, dict):
        return {k: json_safe(v, nonfinite=nonfinite) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v, nonfinite=nonfinite) for v in value]
    return value
