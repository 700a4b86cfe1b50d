"""``LoggerCallback``: the base of every sink (Ray Tune's ``LoggerCallback`` hooks, run off the
training path); ``TrialInfo`` (the run a sink logs) is in ``trial.py``.

A sink is a driver-side :class:`~trainforge.Callback`: pass it in ``trainforge.RunConfig(callbacks=[...])``
for a ``fit()``, or in tune's ``RunConfig(callbacks=[...])`` for a ``Tuner`` (every trial
is a run; the same sink object logs them all, one tracker run per trial). Its driver hooks only
queue the event (see ``drain``); its ``log_trial_*`` hooks run on the sink's own thread, in order.

Write a sink by overriding the hooks (Ray's names and arguments)::

    class PrintSink(LoggerCallback):
        def log_trial_result(self, iteration, trial, result):
            print(trial.trial_name, iteration, result["loss"])
"""

from __future__ import annotations

import logging
import math
import threading
from typing import TYPE_CHECKING, Any

from trainforge._internal.callback import Callback
from trainforge._internal.sinks.trial import TrialInfo

if TYPE_CHECKING:
    from trainforge._internal.result import Result, TrainingReport
    from trainforge._internal.sinks.drain import Drain, ResultRecord, SinkStats

_log = logging.getLogger("trainforge.sinks")

DEFAULT_QUEUE_SIZE = 10_000
DEFAULT_FLUSH_TIMEOUT_S = 30.0


def _check_options(owner: str, queue_size: Any, flush_timeout_s: Any) -> None:
    if isinstance(queue_size, bool) or not isinstance(queue_size, int) or queue_size < 1:
        raise ValueError(
            f"{owner}(queue_size={queue_size!r}) is not valid: use an integer >= 1 (results that may wait "
            "to be written before new ones are dropped)."
        )
    if (
        isinstance(flush_timeout_s, bool)
        or not isinstance(flush_timeout_s, (int, float))
        or not math.isfinite(flush_timeout_s)
        or flush_timeout_s < 0
    ):
        raise ValueError(
            f"{owner}(flush_timeout_s={flush_timeout_s!r}) is not valid: use a number of seconds >= 0 "
            "(how long the end of a run waits for the sink to write what is queued)."
        )


_init_lock = threading.Lock()


class LoggerCallback(Callback):
    """Ray Tune's ``LoggerCallback``, for train runs and tuner trials alike.

    Override ``log_trial_start(trial)``, ``log_trial_result(iteration, trial, result)``,
    ``log_trial_save(trial)`` and ``log_trial_end(trial, failed)``; ``trial`` is a
    :class:`TrialInfo`, ``iteration`` counts the run's reports from 1 (Ray's ``training_iteration``;
    after a restart from a checkpoint, redone reports come again with their numbers), ``result`` a
    copy of the metrics rank 0 reported. They run on the sink's thread, one at a time, never on the
    training path; an exception in one is logged once and counted, and never reaches training.
    ``log_trial_results(trial, records)`` (trainforge extension) gets every result queued for the
    run at once; override it to write them in one call (it calls ``log_trial_result`` for each).

    ``queue_size``: results that may wait to be written; beyond it new results are dropped (and
    counted) rather than waited for. ``flush_timeout_s``: how long the end of a run (``fit()``
    returning, a trial ending) waits for the sink to write what is queued. ``stats()`` says what
    the sink logged and dropped.
    """

    transient_attributes: tuple[str, ...] = ()  # live state dropped when the sink is pickled

    def __init__(
        self, *, queue_size: int = DEFAULT_QUEUE_SIZE, flush_timeout_s: float = DEFAULT_FLUSH_TIMEOUT_S
    ):
        _check_options(type(self).__name__, queue_size, flush_timeout_s)
        self.queue_size = queue_size
        self.flush_timeout_s = float(flush_timeout_s)

    # -- the hooks a sink overrides (the sink's thread) --------------------------------------------
    def log_trial_start(self, trial: TrialInfo) -> None:
        """The run started (before its first result)."""

    def log_trial_result(self, iteration: int, trial: TrialInfo, result: dict[str, Any]) -> None:
        """One report of the run."""

    def log_trial_results(self, trial: TrialInfo, records: list[ResultRecord]) -> None:
        """Several reports of the run, oldest first (each a ``ResultRecord(iteration, metrics,
        timestamp)``); calls :meth:`log_trial_result` for each."""
        for record in records:
            self.log_trial_result(record.iteration, trial, record.metrics)

    def log_trial_save(self, trial: TrialInfo) -> None:
        """A report came with a checkpoint, committed as ``trial.checkpoint``."""

    def log_trial_end(self, trial: TrialInfo, failed: bool = False) -> None:
        """The run ended (``failed``: with an error, or interrupted)."""

    def stats(self) -> SinkStats:
        """Results logged, dropped and still queued, and hook failures, over every run so far."""
        return self._sink_drain().stats()

    # -- the driver's hooks (trainforge.Callback): they only queue ----------------------------------
    def on_run_start(self, run_path: str, num_workers: int | tuple[int, int]) -> None:
        from trainforge._internal.sinks.run_info import describe_run

        try:
            trial, upload = describe_run(run_path, num_workers)
            self._sink_drain().start_run(trial, upload)
        except Exception:  # noqa: BLE001 - never fail the run for a sink
            _log.warning("%s could not start logging run %s", type(self).__name__, run_path, exc_info=True)

    def on_report(self, report: TrainingReport) -> None:
        try:
            self._sink_drain().add_result(report.index + 1, report.metrics, report.checkpoint)
        except Exception:  # noqa: BLE001 - never fail the run for a sink
            _log.debug("%s could not queue a result", type(self).__name__, exc_info=True)

    def on_run_end(self, result: Result) -> None:
        try:
            self._sink_drain().end_run(failed=result.error is not None)
        except Exception:  # noqa: BLE001
            _log.warning("%s could not close its run", type(self).__name__, exc_info=True)

    # -- internals -------------------------------------------------------------------------------
    def _sink_drain(self) -> Drain:
        drain = self.__dict__.get("_drain")
        if drain is None:
            from trainforge._internal.sinks.drain import Drain

            with _init_lock:  # trials of a tuner start on their own threads
                drain = self.__dict__.get("_drain")
                if drain is None:
                    drain = Drain(
                        self,
                        getattr(self, "queue_size", DEFAULT_QUEUE_SIZE),
                        getattr(self, "flush_timeout_s", DEFAULT_FLUSH_TIMEOUT_S),
                    )
                    self.__dict__["_drain"] = drain
        return drain

    def __getstate__(self) -> dict[str, Any]:
        # A trainer is pickled with its RunConfig (restore(), a train server's job): the copy starts
        # with no queue, thread or open tracker runs of its own.
        skip = {"_drain", *self.transient_attributes}
        return {k: v for k, v in self.__dict__.items() if k not in skip}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
