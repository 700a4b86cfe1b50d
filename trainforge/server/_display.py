"""How the train server's CLI and dashboard show values to people, one rule each, used by both
(numbers, bytes and resources: :mod:`trainforge._internal.amounts`, every server's one formatter):

- :func:`cut_middle` and :func:`column_width`: a name in a table column, whole where it fits, else cut
  in the middle (Tune's trials differ at their ends: ``asha-demo/objective_ab01_00049``);
- :func:`ordered_metrics`: a job's or a model's metrics, the ones people look for first (validation,
  then the other measures), bookkeeping (``epoch``, ``batch_count``, ``time_total_s`` ...) last.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

ELLIPSIS = "..."  # ASCII: a terminal or pipe in any locale can show it


def cut_middle(text: str, width: int) -> str:
    """``text`` whole if it fits in ``width`` characters, else its start and end around ``...``."""
    if len(text) <= width:
        return text
    keep = max(2, width - len(ELLIPSIS))
    head = (keep + 1) // 2
    return text[:head] + ELLIPSIS + text[len(text) - (keep - head):]


def column_width(values: Iterable[str], header: str, maximum: int) -> int:
    """The width of a column: its widest value (or header), at most ``maximum``."""
    return min(maximum, max([len(header), *(len(v) for v in values)]))


# Keys that count or time the training rather than measure the model.
BOOKKEEPING = frozenset({
    "epoch", "step", "global_step", "iteration", "training_iteration", "iterations_since_restore", "batch_count",
    "batches_done", "timestamp", "time_this_iter_s", "time_total_s", "time_since_restore", "done", "trial_id",
    "pid", "hostname", "node_ip", "date", "attempt", "resumed_at",
})  # fmt: skip
VALIDATION_PREFIXES = ("val_", "valid_", "validation_", "eval_", "test_", "val/", "valid/", "eval/", "test/")
VALIDATION_SUFFIXES = ("_val", "_valid", "_eval", "_test")


def metric_rank(key: str) -> int:
    """0: validation measures, 1: other measures, 2: ``last_*`` (one batch's), 3: bookkeeping."""
    k = key.lower()
    if k in BOOKKEEPING or k.endswith("_count") or k.startswith(("num_", "time_")):
        return 3
    if k.startswith("last_"):
        return 2
    if k.startswith(VALIDATION_PREFIXES) or k.endswith(VALIDATION_SUFFIXES):
        return 0
    return 1


def ordered_metrics(metrics: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """``metrics``' items, the ones people look for first; in their own order within each rank."""
    return sorted(metrics.items(), key=lambda kv: metric_rank(kv[0]))
