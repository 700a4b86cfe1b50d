"""``TrainingIterator``: what ``DataParallelTrainer.fit_iter()`` returns, a run's reports as they arrive."""

from __future__ import annotations

import threading
from collections.abc import Generator
from typing import Any

from trainforge._internal.result import Result, TrainingReport


class TrainingIterator:
    """What ``fit_iter()`` returns: iterate it for each :class:`TrainingReport` as it arrives (a
    report every rank has made); afterwards ``.result`` holds the final :class:`Result`. Leaving the
    loop early (``break``) or ``close()`` stops the workers.

    Example::

        run = trainer.fit_iter()
        for report in run:
            print(report.index, report.metrics, report.checkpoint)
        result = run.result
    """

    def __init__(self, gen: Generator[TrainingReport, None, Result], stop_event: threading.Event | None = None):
        self._gen = gen
        self._stop_event = stop_event
        self.result: Result | None = None

    def stop(self, grace_s: float | None = None) -> None:
        """Ask the run to end now; callable from any thread (``close()`` is not: it must run in the
        thread iterating); returns at once. Each worker's train loop ends at its next ``report()``
        (which raises ``SystemExit(0)`` after sending the report, so ``finally`` blocks
        run and ``except Exception`` does not catch it); workers still in their loop ``grace_s`` seconds later
        (default 1) get SIGTERM, then SIGKILL a second later (``grace_s=0``: at once). Reports not
        every rank made are discarded and the iteration ends; ``.result`` is then the run so far
        (its latest committed checkpoint, ``error`` None), and its run directory says "stopped" (a
        later ``fit()`` or ``restore()`` of it continues from there)."""
        if grace_s is not None and (isinstance(grace_s, bool) or not isinstance(grace_s, (int, float)) or grace_s < 0):
            raise ValueError(f"stop(grace_s={grace_s!r}) is not valid: use a number of seconds >= 0")
        if self._stop_event is not None:
            self._stop_event.grace_s = grace_s  # type: ignore[attr-defined]
            self._stop_event.set()

    def __iter__(self) -> TrainingIterator:
        return self

    def __next__(self) -> TrainingReport:
        try:
            return next(self._gen)
        except StopIteration as stop:
            self.result = stop.value
            raise StopIteration from None

    def close(self) -> None:
        self._gen.close()

    def __enter__(self) -> TrainingIterator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
