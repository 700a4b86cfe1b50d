"""``Result`` (train's, plus the trial's ``config``) and ``ResultGrid`` (Ray Tune's names)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from trainforge import Result as TrainResult
from trainforge._internal.metric_path import lookup
from trainforge.client import TrialState
from trainforge.tune._variants import flatten_config


@dataclass
class Result(TrainResult):
    """A trial's outcome: train's :class:`trainforge.Result` (``metrics``, ``metrics_dataframe``,
    ``checkpoint``, ``best_checkpoints``, ``path``, ``error``) plus ``config``, the trial's
    configuration as it ended (after PBT's explore steps), and ``state``, the trial's
    :class:`~trainforge.client.TrialState` (Ray Tune's names: ``TERMINATED``, ``ERROR``, ...; the
    train server's Experiments API and pages show the same). ``metrics`` carry the tuner's keys too:
    ``training_iteration``, ``trial_id``, ``time_total_s``, ``done``."""

    config: dict[str, Any] = field(default_factory=dict)
    state: TrialState | None = None


def _value(metrics: dict[str, Any] | None, metric: str) -> float | None:
    value = lookup(metrics, metric) if metrics else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return None
    return float(value)


class ResultGrid:
    """The results of every trial, in trial order: ``len``, ``[i]``, iteration; ``errors`` of the
    trials that failed for good; :meth:`get_best_result`; :meth:`get_dataframe`."""

    def __init__(self, results: list[Result], experiment_path: str, metric: str | None = None,
                 mode: str | None = None):  # fmt: skip
        self._results = results
        self.experiment_path = experiment_path
        self._metric = metric
        self._mode = mode

    def __len__(self) -> int:
        return len(self._results)

    def __getitem__(self, i: int) -> Result:
        return self._results[i]

    def __iter__(self) -> Any:
        return iter(self._results)

    def __repr__(self) -> str:
        return f"ResultGrid<{len(self)} trials, {self.num_errors} errors, {self.experiment_path}>"

    @property
    def errors(self) -> list[BaseException]:
        return [r.error for r in self._results if r.error is not None]

    @property
    def num_errors(self) -> int:
        return len(self.errors)

    @property
    def num_terminated(self) -> int:
        return sum(1 for r in self._results if r.error is None)

    def get_best_result(self, metric: str | None = None, mode: str | None = None, scope: str = "last",
                        filter_nan_and_inf: bool = True) -> Result:  # fmt: skip
        """The trial whose ``metric`` is best (``mode`` "min"/"max"; default: TuneConfig's), by its
        last result (``scope="last"``) or its best one over all its results (``"all"``)."""
        metric = metric or self._metric
        mode = mode or self._mode
        if not metric or not mode:
            raise ValueError(
                "get_best_result(): no metric/mode: pass get_best_result(metric=..., mode='min'|'max') or set "
                "them in TuneConfig(metric=..., mode=...)"
            )
        if mode not in ("min", "max"):
            raise ValueError(f"get_best_result(): mode={mode!r} is not valid: use 'min' or 'max'")
        if scope not in ("last", "all", "last-5-avg", "last-10-avg"):
            raise ValueError(f"get_best_result(): scope={scope!r} is not valid: use 'last' or 'all'")
        best: tuple[float, Result] | None = None
        for result in self._results:
            rows = result.metrics_history or ([result.metrics] if result.metrics else [])
            if scope == "last":
                values = [_value(rows[-1], metric)] if rows else []
            elif scope == "all":
                values = [_value(r, metric) for r in rows]
            else:
                n = 5 if scope == "last-5-avg" else 10
                tail = [v for r in rows[-n:] if (v := _value(r, metric)) is not None]
                values = [sum(tail) / len(tail)] if tail else []
            finite = [v for v in values if v is not None and (not filter_nan_and_inf or math.isfinite(v))]
            if not finite:
                continue
            value = max(finite) if mode == "max" else min(finite)
            if best is None or (value > best[0] if mode == "max" else value < best[0]):
                best = (value, result)
        if best is None:
            reported = sorted({k for r in self._results for k in (r.metrics or {})})
            raise RuntimeError(
                f"get_best_result(): no trial reported {metric!r} (a finite number); reported keys: {reported}"
            )
        return best[1]

    def get_dataframe(self, filter_metric: str | None = None, filter_mode: str | None = None) -> Any:
        """A row per trial: its last result (or, with ``filter_metric``/``filter_mode``, its best one),
        its ``config/<key>`` columns and ``logdir``."""
        import pandas as pd

        rows = []
        for result in self._results:
            history = result.metrics_history or ([result.metrics] if result.metrics else [])
            row: dict[str, Any] = dict(history[-1]) if history else {}
            if filter_metric and history:
                scored = [(v, r) for r in history if (v := _value(r, filter_metric)) is not None]
                if scored:
                    pick = max if (filter_mode or self._mode) == "max" else min
                    row = dict(pick(scored, key=lambda item: item[0])[1])
            row.update({f"config/{k}": v for k, v in flatten_config(result.config).items()})
            row["logdir"] = result.path
            rows.append(row)
        return pd.DataFrame(rows)
