"""``CheckpointStrategy`` and the driver's checkpoint bookkeeping in Ray Train 1.x's layout.

Every ``train.save_checkpoint(**state)`` of a run becomes, in order, checkpoint 1, 2, ... of that
run: kept in memory as the trainer's ``latest_checkpoint`` and, as the strategy says, written as one
cloudpickle file ``{run_dir}/checkpoints/checkpoint_{id:06d}`` (1.x's format:
``Trainer.load_checkpoint(path)`` or ``run(checkpoint=path)`` reads it back).
"""

from __future__ import annotations

import numbers
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle

from trainforge.v1._constants import CHECKPOINT_FILE_FORMAT, TIMESTAMP, TRAIN_CHECKPOINT_SUBDIR

MAX, MIN = "max", "min"


@dataclass
class CheckpointStrategy:
    """Which checkpoints of a run are written to disk.

    Example::

        CheckpointStrategy(num_to_keep=2, checkpoint_score_attribute="loss", checkpoint_score_order="min")

    ``num_to_keep``: None keeps every checkpoint, 0 writes none (the latest is still in memory:
    ``trainer.latest_checkpoint``), k keeps the k best. ``checkpoint_score_attribute``: a numeric key
    of the dicts passed to ``train.save_checkpoint`` ("_timestamp", filled in automatically, by
    default: the newest are the best). ``checkpoint_score_order``: "max" or "min".
    """

    num_to_keep: int | None = None
    checkpoint_score_attribute: str = TIMESTAMP
    checkpoint_score_order: str = MAX

    def __post_init__(self) -> None:
        k = self.num_to_keep
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
            raise ValueError(
                f"CheckpointStrategy.num_to_keep={k!r} is not valid: use None (keep all), 0 (write none) or an "
                "integer >= 1."
            )
        if not isinstance(self.checkpoint_score_attribute, str) or not self.checkpoint_score_attribute:
            raise ValueError(
                f"CheckpointStrategy.checkpoint_score_attribute={self.checkpoint_score_attribute!r} is not valid: use "
                f"a key of the checkpoint dicts (default {TIMESTAMP!r})."
            )
        if self.checkpoint_score_order not in (MAX, MIN):
            raise ValueError(
                f"CheckpointStrategy.checkpoint_score_order={self.checkpoint_score_order!r} is not valid: use "
                f"{MAX!r} or {MIN!r}."
            )


def load_checkpoint_from_path(path: str | os.PathLike) -> dict[str, Any]:
    """The dict in a checkpoint file (``{run_dir}/checkpoints/checkpoint_NNNNNN``)."""
    checkpoint_path = Path(path).expanduser()
    if not checkpoint_path.exists():
        raise ValueError(f"Checkpoint path {checkpoint_path} does not exist.")
    with checkpoint_path.open("rb") as f:
        data = cloudpickle.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{checkpoint_path} holds a {type(data).__name__}, not a checkpoint dict")
    return data


class CheckpointManager:
    """The checkpoints of one trainer: the latest in memory, the kept ones on disk, the best."""

    def __init__(self) -> None:
        self.latest_checkpoint: dict[str, Any] | None = None
        self.run_dir: Path | None = None
        self.latest_checkpoint_id = 0
        self._strategy = CheckpointStrategy()
        self._kept: list[tuple[tuple[float, int], Path]] = []  # ((priority, id), path) on disk
        self._best: tuple[tuple[float, int], Path] | None = None

    def start_run(self, run_dir: Path, strategy: CheckpointStrategy | None) -> None:
        self.run_dir = run_dir
        self._strategy = strategy or CheckpointStrategy()
        self.latest_checkpoint_id = 0
        self._kept, self._best = [], None

    @property
    def latest_checkpoint_dir(self) -> Path | None:
        return None if self.run_dir is None else self.run_dir / TRAIN_CHECKPOINT_SUBDIR

    @property
    def latest_checkpoint_path(self) -> Path | None:
        """The file of the run's latest checkpoint (it may not have been written: see the strategy)."""
        if self.latest_checkpoint_dir is None or self.latest_checkpoint_id == 0:
            return None
        return self.latest_checkpoint_dir / CHECKPOINT_FILE_FORMAT.format(self.latest_checkpoint_id)

    @property
    def best_checkpoint_path(self) -> Path | None:
        return None if self._best is None else self._best[1]

    def process(self, data: dict[str, Any]) -> None:
        """A checkpoint saved by the run's workers (rank 0's dict)."""
        strategy = self._strategy
        attr = strategy.checkpoint_score_attribute
        if strategy.num_to_keep != 0:
            if attr not in data:
                raise ValueError(
                    f"Unable to persist checkpoint for checkpoint_score_attribute: {attr}. Include this attribute in "
                    "the call to train.save_checkpoint."
                )
            if isinstance(data[attr], bool) or not isinstance(data[attr], numbers.Real):
                raise ValueError(
                    f"checkpoint_score_attribute {attr!r} of the saved checkpoint is {data[attr]!r}: it must be a number."
                )
        self.latest_checkpoint = data
        self.latest_checkpoint_id += 1
        if strategy.num_to_keep == 0:
            return
        score = float(data[attr]) if strategy.checkpoint_score_order == MAX else -float(data[attr])
        key = (score, self.latest_checkpoint_id)  # on a tie the newer one is better
        assert self.latest_checkpoint_path is not None
        path = self.latest_checkpoint_path
        if strategy.num_to_keep is not None and len(self._kept) >= strategy.num_to_keep:
            worst = min(self._kept)
            if key < worst[0]:
                return  # worse than every kept one: not written
            self._kept.remove(worst)
            worst[1].unlink(missing_ok=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("wb") as f:
            cloudpickle.dump(data, f)
        os.replace(tmp, path)
        self._kept.append((key, path))
        self._best = max(self._kept)
