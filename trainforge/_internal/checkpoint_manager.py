"""Which committed checkpoints to keep (top-k by score), and which is the latest."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from trainforge._internal.checkpoint import Checkpoint
from trainforge._internal.config import CheckpointConfig

logger = logging.getLogger("trainforge")


@dataclass
class TrackedCheckpoint:
    checkpoint: Checkpoint
    metrics: dict[str, Any]
    index: int
    metrics_rows: int | None = None  # length of the metrics history when it was committed


class CheckpointManager:
    """Keeps the ``num_to_keep`` best checkpoints (or the newest, without a score attribute) plus the
    latest one, and deletes the rest through ``delete`` (the storage's delete function)."""

    def __init__(self, config: CheckpointConfig, delete: Any = None):
        self.config = config
        self._delete = delete
        self._kept: list[TrackedCheckpoint] = []
        self._warned_missing = False

    @property
    def next_index(self) -> int:
        return (max(t.index for t in self._kept) + 1) if self._kept else 0

    def load(self, existing: list[tuple[Checkpoint, dict[str, Any]]]) -> None:
        """Adopt checkpoints committed by an earlier run on the same directory (from their markers)."""
        for ckpt, marker in existing:
            self._kept.append(
                TrackedCheckpoint(
                    ckpt, marker.get("metrics", {}), int(marker.get("index", 0)), marker.get("metrics_rows")
                )
            )
        self._kept.sort(key=lambda t: t.index)

    def register(
        self, checkpoint: Checkpoint, metrics: dict[str, Any], index: int, metrics_rows: int | None = None
    ) -> list[Checkpoint]:
        """Track a newly committed checkpoint; delete and return those that fall out of the top k."""
        self._kept.append(TrackedCheckpoint(checkpoint, dict(metrics), index, metrics_rows))
        k = self.config.num_to_keep
        if k is None or len(self._kept) <= k:
            return []
        latest = self._kept[-1]
        ranked = sorted(self._kept, key=self._score, reverse=True)
        keep = {id(t) for t in ranked[:k]} | {id(latest)}
        dropped = [t for t in self._kept if id(t) not in keep]
        self._kept = [t for t in self._kept if id(t) in keep]
        for t in dropped:
            if self._delete is not None:
                self._delete(t.checkpoint)
        return [t.checkpoint for t in dropped]

    def _score(self, t: TrackedCheckpoint) -> tuple[float, int]:
        attr = self.config.checkpoint_score_attribute
        if attr is None:
            return (0.0, t.index)  # newest first
        value = t.metrics.get(attr)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            if not self._warned_missing:
                self._warned_missing = True
                logger.warning(
                    "checkpoint_score_attribute=%r is missing or not a number in the metrics reported with "
                    "checkpoint %s (got %r); such checkpoints are deleted first. Report %r with every checkpoint.",
                    attr, t.checkpoint.path, value, attr,
                )
            return (-math.inf, t.index)
        score = float(value) if self.config.checkpoint_score_order == "max" else -float(value)
        return (score, t.index)

    @property
    def latest(self) -> Checkpoint | None:
        return self._kept[-1].checkpoint if self._kept else None

    @property
    def latest_metrics_rows(self) -> int:
        """How many metrics rows existed when the latest checkpoint was committed (0 without one)."""
        if not self._kept:
            return 0
        rows = self._kept[-1].metrics_rows
        return rows if rows is not None else 0

    @property
    def best_checkpoints(self) -> list[tuple[Checkpoint, dict[str, Any]]]:
        """Kept checkpoints with their metrics, in the order they were reported."""
        return [(t.checkpoint, dict(t.metrics)) for t in self._kept]
