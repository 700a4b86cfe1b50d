"""The live console table of trials (status, config, latest metrics, best so far), like Ray Tune's;
drawn with rich when output is a terminal; otherwise quiet until a one-line summary at the end."""

from __future__ import annotations

import sys
import time
from typing import Any

from trainforge._internal.amounts import fmt_metric
from trainforge.tune._variants import flatten_config

REFRESH_S = 0.5
# What the tuner adds to every result: not worth a column.
_BOOKKEEPING = {"training_iteration", "time_total_s", "timestamp", "done", "trial_id"}


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return fmt_metric(v)
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
        metrics = self._metric_columns(trials)
        table.add_column("trial", no_wrap=True)  # the one column that must stay readable
        for col in ["status", *keys, "iter", "total time (s)", *metrics]:
            table.add_column(col)
        for t in trials[-30:]:
            flat = flatten_config(t.config)
            last = t.last_result or {}
            table.add_row(t.name, t.status, *[_fmt(flat.get(k, "")) for k in keys],
                          _fmt(last.get("training_iteration", "")), _fmt(last.get("time_total_s", "")),
                          *[_fmt(last.get(m, "")) for m in metrics])  # fmt: skip
        if len(trials) > 30:
            table.add_row(f"... and {len(trials) - 30} earlier", *[""] * (len(keys) + 3 + len(metrics)))
        return table

    def _metric_columns(self, trials: list[Any]) -> list[str]:
        """The tuned metric, then the first few other numbers the trials report."""
        cols = [self.metric] if self.metric else []
        for t in trials:
            for k, v in (t.last_result or {}).items():
                if len(cols) >= 4:
                    return cols
                if k not in cols and k not in _BOOKKEEPING and isinstance(v, (int, float)) and not isinstance(v, bool):
                    cols.append(k)
        return cols

    def summary(self, trials: list[Any]) -> str:
        counts: dict[str, int] = {}
        for t in trials:
            counts[t.status] = counts.get(t.status, 0) + 1
        line = f"tune: {len(trials)} trial(s) ({', '.join(f'{n} {s}' for s, n in sorted(counts.items()))})"
        best = self._best(trials)
        if best is not None:
            line += f"; best {self.metric}={_fmt(best[0])} ({best[1].name})"
        return line + f"; results in {self.path}"

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
        else:
            print(self.summary(trials), file=self.out, flush=True)
