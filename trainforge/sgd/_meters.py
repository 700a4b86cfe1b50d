"""RaySGD's ``AverageMeter`` and ``AverageMeterCollection`` (from RaySGD's ``utils`` module), for
``train_epoch`` / ``validate`` overrides that keep their own averages.

Example::

    meters = AverageMeterCollection()
    meters.update({"loss": 0.5, "acc": 0.5}, n=32)
    meters.update({"loss": 0.1, "acc": 0.9}, n=32)
    meters.summary()  # {"batch_count": 2, "num_samples": 64, "loss": 0.3, "last_loss": 0.1, "acc": 0.7, "last_acc": 0.9}
"""

from __future__ import annotations

from typing import Any

from trainforge.model import BATCH_COUNT, NUM_SAMPLES


class AverageMeter:
    """The last value, the sum, the count and the weighted average of a stream of values."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.val: Any = 0
        self.avg: float = 0
        self.sum: Any = 0
        self.count: float = 0

    def update(self, val: Any, n: float = 1) -> None:
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count if self.count else 0


class AverageMeterCollection:
    """One :class:`AverageMeter` per metric name, plus the batch and sample counts."""

    def __init__(self) -> None:
        self._batch_count = 0
        self.n: float = 0
        self._meters: dict[str, AverageMeter] = {}

    def update(self, metrics: dict[str, Any], n: float = 1) -> None:
        """One batch of ``n`` samples."""
        self._batch_count += 1
        self.n += n
        for name, value in metrics.items():
            self._meters.setdefault(name, AverageMeter()).update(value, n=n)

    def summary(self) -> dict[str, Any]:
        """``batch_count``, ``num_samples``, and each metric's average and ``last_`` value."""
        out: dict[str, Any] = {BATCH_COUNT: self._batch_count, NUM_SAMPLES: self.n}
        for name, meter in self._meters.items():
            out[str(name)] = meter.avg
            out["last_" + str(name)] = meter.val
        return out
