"""A reported metric named by its path: ``"a/b"`` is ``metrics["a"]["b"]`` (a top-level key that
itself holds a "/" wins). The one rule for every reader of reported metrics: ``Result``'s best
checkpoints, Tune's schedulers, stoppers and results, the server's trial statistics."""

from __future__ import annotations

from typing import Any


def lookup(metrics: Any, path: str | None) -> Any:
    """``metrics[path]``, or for ``"a/b"`` the nested ``metrics["a"]["b"]``; None when absent (or when
    ``metrics`` is not a dict, or ``path`` is None)."""
    if path is None or not isinstance(metrics, dict):
        return None
    if path in metrics:
        return metrics[path]
    node: Any = metrics
    for part in path.split("/"):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def flat_keys(metrics: dict[str, Any], prefix: str = "") -> list[str]:
    """Every path :func:`lookup` finds: the top-level keys, nested ones as ``"a/b"``."""
    out = []
    for key, value in metrics.items():
        out.append(prefix + str(key))
        if isinstance(value, dict):
            out += flat_keys(value, f"{prefix}{key}/")
    return out
