"""The early-stopping tracker of ``fit()``: the best value so far and the evaluations since."""

from __future__ import annotations

import math
from typing import Any

from trainforge.model._config import EarlyStopping


class EarlyStoppingTracker:
    def __init__(self, config: EarlyStopping, state: dict[str, Any] | None = None):
        self.config = config
        self.best: float | None = None
        self.wait = 0
        if state:
            self.best, self.wait = state.get("best"), int(state.get("wait", 0))

    def state(self) -> dict[str, Any]:
        return {"best": self.best, "wait": self.wait}

    def update(self, metrics: dict[str, Any]) -> bool:
        """Record this evaluation; True when training should stop."""
        c = self.config
        if c.metric not in metrics:
            raise ValueError(
                f"EarlyStopping(metric={c.metric!r}): no such metric this epoch; the epoch reported "
                f"{sorted(metrics)}. Name one of them (validation metrics need a validation_loader)."
            )
        value = float(metrics[c.metric])
        if math.isnan(value):
            improved = False
        elif self.best is None:
            improved = True
        elif c.mode == "min":
            improved = value < self.best - c.min_delta
        else:
            improved = value > self.best + c.min_delta
        if improved:
            self.best, self.wait = value, 0
            return False
        self.wait += 1
        return self.wait >= c.patience  # Keras's and Lightning's rule: patience evaluations without improvement
