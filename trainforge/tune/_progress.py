"""The live console table of trials (status, config, latest metrics, best so far), like Ray Tune's;
drawn with rich when output is a terminal, nothing otherwise (a one-line summary at the end)."""

from __future__ import annotations

import sys
import time
from typing import Any

from trainforge.tune._variants import flatten_config

REFRESH_S = 0.5


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    text = str(v)
    return text if len(text) <= 24 else text[:21] + "..."


class ProgressTable:
    def __init__(self, experiment_path: str, metric: str | None, mode: str | None, out: Any = None):
        self.out = out or sys.stdout
        self.path = experiment_path
        self.metric = metric
        self.mode = mode
        self.live: Any = None
        self.last = 0.0
        self.tty = bool(getattr(self.out, "isatty", lambda: False)())
        if self.tty:
            try:
                from rich.console import Console
                from rich.live import Live

                self.live = Live(console=Console(file=self.out), refresh_per_second=4, transient=False)
                self.live.start()
            except ImportError:  # no rich: plain lines, at most one every few seconds
                self.live = None

    def _best(self, trials: list[Any]) -> Any:
        if not self.metric or not self.mode:
            return None
        scored = [(t.last_result[self.metric], t) for t in trials
                  if t.last_result and isinstance(t.last_result.get(self.metric), (int, float))]  # fmt: skip
        if not scored:
            return None
        return (max if self.mode == "max" else min)(scored, key=lambda s: s[0])

    def _table(self, trials: list[Any]) -> Any:
        from rich.table import Table

        counts: dict[str, int] = {}
        for t in trials:
            counts[t.status] = counts.get(t.status, 0) + 1
        best = self._best(trials)
        caption = " · ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        if best is not None:
            caption += f" · best {self.metric}={_fmt(best[0])} ({best[1].name})"
        table = Table(title=f"trials of {self.path}", caption=caption)
        keys = sorted({k for t in trials for k in flatten_config(t.config)})[:6]
        metrics = [self.metric] if self.metric else []
        for col in ["trial", "status", *keys, "iter", *metrics]:
            table.add_column(col)
        for t in trials[-30:]:
            flat = flatten_config(t.config)
            last = t.last_result or {}
            table.add_row(t.name, t.status, *[_fmt(flat.get(k, "")) for k in keys],
                          _fmt(last.get("training_iteration", "")), *[_fmt(last.get(m, "")) for m in metrics])  # fmt: skip
        return table

    def update(self, trials: list[Any]) -> None:
        now = time.monotonic()
        if not self.tty or now - self.last < REFRESH_S:
            return
        self.last = now
        if self.live is not None:
            self.live.update(self._table(trials))
        else:
            counts = {s: sum(1 for t in trials if t.status == s) for s in {t.status for t in trials}}
            print("tune: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())), file=self.out, flush=True)

    def close(self, trials: list[Any]) -> None:
        if self.live is not None:
            self.live.update(self._table(trials))
            self.live.stop()
            self.live = None
