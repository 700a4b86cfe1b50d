"""What a trial scheduler and a searcher share: the metric they optimize and its mode."""

from __future__ import annotations


class MetricMode:
    """Base of ``TrialScheduler`` and ``Searcher``: ``metric`` (a reported key, ``"a/b"`` for a nested
    one) and ``mode`` ("min" or "max"), each None until the constructor or ``set_search_properties``
    (from ``TuneConfig``) sets it. Subclasses check ``mode`` before passing it here."""

    def __init__(self, metric: str | None, mode: str | None) -> None:
        self._metric = metric
        self._mode = mode

    @property
    def metric(self) -> str | None:
        return self._metric

    @property
    def mode(self) -> str | None:
        return self._mode


def check_mode(mode: object, where: str) -> None:
    """ValueError unless ``mode`` is "min" or "max" (a scheduler's or a stopper's: it needs one)."""
    if mode not in ("min", "max"):
        raise ValueError(f'{where} must be "min" or "max", got {mode!r}.')
