"""The queue and thread behind every sink: the driver's hooks only append to a bounded queue; one
thread per sink runs the sink's hooks, in order, for every run it logs.

Why: a tracker call can take a network round trip (Lightning#3393: a synchronous MLflow call per step
slowed training "dramatically"). Here ``on_report`` costs a lock and an append; what the sink does
with the result happens on its own thread. Rules:

- Results beyond ``queue_size`` waiting are dropped (counted), never waited for; run starts and ends
  always go in, so every run the sink opened is closed.
- A hook that raises is logged once per sink (each failure at debug level) and its results are
  counted as dropped; training and the ``Result`` never see it.
- ``end_run`` waits up to ``flush_timeout_s`` for the run's results to be written: on a clean finish
  the sink has logged every report when ``fit()`` returns. Past the timeout the run's results still
  queued are dropped (counted, one warning) and its end is handled as soon as the call in progress
  returns; ``fit()`` does not wait for that.
- The thread starts with the first event and ends when no run is open and nothing is queued.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from trainforge._internal.checkpoint import Checkpoint
    from trainforge._internal.sinks.api import LoggerCallback, TrialInfo

logger = logging.getLogger("trainforge.sinks")

MAX_BATCH = 1000  # events taken off the queue at once (consecutive results of a run go as one batch)
EXIT_FLUSH_S = 10.0  # at interpreter exit, how long runs left open (Ctrl-C) get to close


class ResultRecord(NamedTuple):
    """One report as a sink gets it: ``iteration`` is 1 for the run's first report (Ray's
    ``training_iteration``), ``metrics`` a copy of rank 0's metrics, ``timestamp`` when the driver had
    it from every rank (seconds since the epoch)."""

    iteration: int
    metrics: dict[str, Any]
    timestamp: float


@dataclass(eq=False)
class SinkRun:
    """One run (a ``fit()``, or one tuner trial) as a sink's queue sees it."""

    trial: TrialInfo
    upload: Any = None  # called after the run's end with its local directory (remote storage)
    started: bool = False  # log_trial_start returned
    refused: BaseException | None = None  # the sink's claim on the run's files failed (another writes them)
    discard: bool = False  # the flush timed out: results still queued are dropped
    ended: bool = False  # end_run was called
    results: int = 0  # reported
    logged: int = 0
    dropped: int = 0
    closed: threading.Event = field(default_factory=threading.Event)


@dataclass
class SinkStats:
    """What a sink did so far (all runs): results ``logged`` (its hooks returned), ``dropped``
    (queue full, a hook raised, its run failed to start, or the flush timed out), ``queued`` (not
    handled yet), ``errors`` (hook calls that raised) and the ``last_error``."""

    logged: int = 0
    dropped: int = 0
    queued: int = 0
    errors: int = 0
    last_error: BaseException | None = None


_drains: weakref.WeakSet[Drain] = weakref.WeakSet()
_atexit_registered = False
_atexit_lock = threading.Lock()


class Drain:
    def __init__(self, sink: LoggerCallback, queue_size: int, flush_timeout_s: float):
        self.sink = sink
        self.queue_size = queue_size
        self.flush_timeout_s = flush_timeout_s
        self._cond = threading.Condition()
        self._events: deque[tuple[str, SinkRun, Any]] = deque()
        self._queued = 0  # results in _events
        self._by_thread: dict[int, SinkRun] = {}  # the driver thread iterating each run -> its run
        self._open: set[SinkRun] = set()  # runs whose end the thread has not handled yet
        self._thread: threading.Thread | None = None
        self._stats = SinkStats()
        self._warned_error = False
        self._warned_full = False

    # -- driver side: never blocks (except end_run's bounded wait), never raises ------------------
    def start_run(self, trial: TrialInfo, upload: Any = None) -> None:
        run = SinkRun(trial, upload)
        # A file sink claims its files here, in the order the runs start, not on its thread: of two sinks
        # of one kind writing the same file, the first to start wins even if the other's thread runs first.
        claim = getattr(self.sink, "claim_run", None)
        if claim is not None:
            try:
                claim(trial)
            except Exception as exc:  # noqa: BLE001 - reported by _start, on the sink's thread
                run.refused = exc
        me = threading.get_ident()
        with self._cond:
            stale = self._by_thread.get(me)
            if stale is not None and not stale.ended:  # its fit() never ended (Ctrl-C): close it now
                stale.ended = True
                self._put(("end", stale, True))
            self._by_thread[me] = run
            self._open.add(run)
            self._put(("start", run, None))

    def add_result(self, iteration: int, metrics: dict[str, Any], checkpoint: Checkpoint | None) -> None:
        now = time.time()
        warn = False
        with self._cond:
            run = self._current()
            if run is None or run.ended:
                return
            run.results += 1
            if self._queued >= self.queue_size:
                run.dropped += 1
                self._stats.dropped += 1
                warn, self._warned_full = not self._warned_full, True
            else:
                self._queued += 1
                self._put(("result", run, (ResultRecord(iteration, metrics, now), checkpoint)))
        if warn:
            logger.warning(
                "%s: %d results are waiting to be written; further results are dropped until it catches up "
                "(training is not slowed). Raise its queue_size, or make it faster.",
                self.sink_name, self.queue_size,
            )  # fmt: skip

    def end_run(self, failed: bool) -> None:
        with self._cond:
            run = self._current()
            if run is None or run.ended:
                return
            run.ended = True
            for ident in [i for i, r in self._by_thread.items() if r is run]:
                del self._by_thread[ident]
            self._put(("end", run, failed))
        if run.closed.wait(self.flush_timeout_s):
            return
        with self._cond:
            if run.closed.is_set():
                return
            run.discard = True
            behind = run.results - run.logged - run.dropped
        logger.warning(
            "%s: run %s still had %d results to write after %gs (flush_timeout_s); they are dropped, and "
            "the run is closed when the sink's current call returns.",
            self.sink_name, run.trial.trial_name, behind, self.flush_timeout_s,
        )  # fmt: skip

    def stats(self) -> SinkStats:
        with self._cond:
            return SinkStats(
                logged=self._stats.logged, dropped=self._stats.dropped, queued=self._queued,
                errors=self._stats.errors, last_error=self._stats.last_error,
            )  # fmt: skip

    @property
    def sink_name(self) -> str:
        return type(self.sink).__name__

    def _current(self) -> SinkRun | None:
        """The run of the calling driver thread (each run's hooks are called on the thread iterating
        it: fit()'s caller, or a tuner trial's thread); the only open one if that thread has none."""
        run = self._by_thread.get(threading.get_ident())
        if run is None and len(self._by_thread) == 1:
            run = next(iter(self._by_thread.values()))
        return run

    def _put(self, event: tuple[str, SinkRun, Any]) -> None:
        """Under ``_cond``: queue ``event`` and wake (or start) the thread."""
        self._events.append(event)
        if self._thread is None:
            _register_atexit(self)
            self._thread = threading.Thread(
                target=self._loop, name=f"trainforge-sink-{self.sink_name}", daemon=True
            )
            self._thread.start()
        self._cond.notify()

    # -- the sink's thread -----------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._events:
                    if not self._open:
                        self._thread = None
                        return
                    self._cond.wait()
                batch = [self._events.popleft() for _ in range(min(MAX_BATCH, len(self._events)))]
                self._queued -= sum(1 for kind, _, _ in batch if kind == "result")
            self._handle(batch)

    def _handle(self, batch: list[tuple[str, SinkRun, Any]]) -> None:
        i = 0
        while i < len(batch):
            kind, run, payload = batch[i]
            if kind == "result":
                j = i
                while j < len(batch) and batch[j][0] == "result" and batch[j][1] is run:
                    j += 1
                self._results(run, [item for _, _, item in batch[i:j]])
                i = j
                continue
            if kind == "start":
                self._start(run)
            else:
                self._end(run, bool(payload))
            i += 1

    def _start(self, run: SinkRun) -> None:
        if run.refused is not None:
            self._failed(run.refused, "log_trial_start", run)
            return
        try:
            self.sink.log_trial_start(run.trial)
            run.started = True
        except BaseException as exc:  # noqa: BLE001 - a sink never fails training
            self._failed(exc, "log_trial_start", run)

    def _results(self, run: SinkRun, items: list[tuple[ResultRecord, Checkpoint | None]]) -> None:
        if run.discard or not run.started:
            self._drop(run, len(items))
            return
        segment: list[ResultRecord] = []
        for record, checkpoint in items:
            segment.append(record._replace(metrics=_copy(record.metrics)))
            if checkpoint is not None:  # results up to a checkpoint, then log_trial_save
                self._write(run, segment)
                segment = []
                run.trial.checkpoint = checkpoint
                try:
                    self.sink.log_trial_save(run.trial)
                except BaseException as exc:  # noqa: BLE001
                    self._failed(exc, "log_trial_save", run)
        if segment:
            self._write(run, segment)

    def _write(self, run: SinkRun, records: list[ResultRecord]) -> None:
        if not records:
            return
        try:
            self.sink.log_trial_results(run.trial, records)
        except BaseException as exc:  # noqa: BLE001
            self._failed(exc, "log_trial_result", run)
            self._drop(run, len(records))
            return
        with self._cond:
            run.logged += len(records)
            self._stats.logged += len(records)

    def _end(self, run: SinkRun, failed: bool) -> None:
        try:
            if run.started:
                self.sink.log_trial_end(run.trial, failed=failed)
        except BaseException as exc:  # noqa: BLE001
            self._failed(exc, "log_trial_end", run)
        if run.upload is not None:
            try:
                run.upload(run.trial.local_path)
            except BaseException as exc:  # noqa: BLE001
                self._failed(exc, "uploading the run's files", run)
        if run.dropped:
            logger.warning(
                "%s dropped %d of the %d results of run %s (see its stats()); training was not affected.",
                self.sink_name, run.dropped, run.results, run.trial.trial_name,
            )  # fmt: skip
        with self._cond:
            self._open.discard(run)
        run.closed.set()

    def _drop(self, run: SinkRun, n: int) -> None:
        with self._cond:
            run.dropped += n
            self._stats.dropped += n

    def _failed(self, exc: BaseException, where: str, run: SinkRun) -> None:
        with self._cond:
            self._stats.errors += 1
            self._stats.last_error = exc
            first, self._warned_error = not self._warned_error, True
        logger.debug("%s.%s failed for run %s", self.sink_name, where, run.trial.trial_name, exc_info=exc)
        if first:
            logger.warning(
                "%s: %s failed for run %s: %s: %s. Training goes on; this sink's results are dropped "
                "where it fails (counted in its stats()); later failures are logged at debug level.",
                self.sink_name, where, run.trial.trial_name, type(exc).__name__, exc,
            )  # fmt: skip

    def close_open_runs(self, deadline: float) -> None:
        """At interpreter exit: end the runs whose ``fit()`` never returned (Ctrl-C) as failed, and
        give the thread until ``deadline`` to close them."""
        with self._cond:
            runs = [r for r in self._by_thread.values() if not r.ended]
            for run in runs:
                run.ended = True
                self._put(("end", run, True))
            self._by_thread.clear()
            pending = list(self._open)
        for run in pending:
            run.closed.wait(max(0.0, deadline - time.monotonic()))


def _copy(metrics: dict[str, Any]) -> dict[str, Any]:
    """A copy a sink may change without touching the run's history (``Result.metrics_dataframe``)."""
    import copy

    try:
        return copy.deepcopy(metrics)
    except Exception:  # noqa: BLE001 - something that cannot be copied: a shallow copy then
        return dict(metrics)


def _register_atexit(drain: Drain) -> None:
    global _atexit_registered
    _drains.add(drain)
    with _atexit_lock:
        if not _atexit_registered:
            atexit.register(_close_all)
            _atexit_registered = True


def _close_all() -> None:
    deadline = time.monotonic() + EXIT_FLUSH_S
    for drain in list(_drains):
        try:
            drain.close_open_runs(deadline)
        except Exception:  # noqa: BLE001 - e.g. no new thread at interpreter shutdown: nothing more to do
            logger.debug("could not close the open runs of %s at exit", drain.sink_name, exc_info=True)
