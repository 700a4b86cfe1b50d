"""How the CLIs (server, registry, experiments) and the dashboard show values to people, one rule
each, used by all (numbers, bytes and resources: :mod:`trainforge._internal.amounts`, every server's
one formatter):

- :func:`cut_middle` and :func:`column_width`: a name in a table column, whole where it fits, else cut
  in the middle (Tune's trials differ at their ends: ``asha-demo/objective_ab01_00049``);
- :func:`table`: rows as columns sized to their content; on a terminal narrower than that, the
  name column is cut in the middle and then the last column at its end (keep what is first in it:
  the metrics people look for first); a pipe or a file gets every value whole;
- :func:`ordered_metrics`: a job's or a model's metrics, the ones people look for first (validation,
  then the other measures), bookkeeping (``epoch``, ``batch_count``, ``time_total_s`` ...) last.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterable, Mapping, Sequence
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


MIN_CUT_WIDTH = 16  # a cut name keeps at least this much (start and end), however narrow the terminal
GAP = "  "  # between columns


def terminal_width() -> int | None:
    """The columns of the terminal the output goes to (``$COLUMNS`` when set); None for a pipe or a
    file, where nothing is cut (``grep`` and ``awk`` want every value whole)."""
    if os.environ.get("COLUMNS", "").isdigit():
        return int(os.environ["COLUMNS"])
    if sys.stdout is not None and sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return None


def table(header: Sequence[str], rows: Sequence[Sequence[str]], *, right: Iterable[int] = (), cut: int | None = None,
          width: int | None = None) -> str:  # fmt: skip
    """``rows`` under ``header`` as columns two spaces apart, each as wide as its widest value (or
    header), right-aligned where its index is in ``right`` (header too, so a number sits under its
    name); the last column is not padded. Wider than ``width`` (None: never cut), column ``cut``
    shrinks (down to :data:`MIN_CUT_WIDTH`, values cut in the middle), then the last column's values
    are cut at their end."""
    right = set(right)
    widths = [column_width((r[i] for r in rows), h, 10**9) for i, h in enumerate(header)]
    last = len(header) - 1
    cells = [list(header), *[list(r) for r in rows]]
    if width is not None:
        over = sum(widths) + len(GAP) * last - width
        if over > 0 and cut is not None and cut != last:
            narrower = max(min(widths[cut], MIN_CUT_WIDTH), widths[cut] - over)
            over -= widths[cut] - narrower
            widths[cut] = narrower
            for row in cells[1:]:
                row[cut] = cut_middle(row[cut], narrower)
        if over > 0:
            room = max(len(header[last]), widths[last] - over)
            for row in cells[1:]:
                if len(row[last]) > room:
                    row[last] = row[last][: max(0, room - len(ELLIPSIS))] + ELLIPSIS
    lines = []
    for row in cells:
        parts = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        parts[last] = row[last].rjust(widths[last]) if last in right else row[last]
        lines.append(GAP.join(parts).rstrip())
    return "\n".join(lines)


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
