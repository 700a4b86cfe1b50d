"""The controller: an explicit state machine that drives one run.

    INITIALIZING -> SCHEDULING -> RUNNING -> FINISHED
                        ^   ^        |   |
                        |   |        |   +-> RESIZING (elastic: grow or shrink to what the resources fit, at a checkpoint)
                        |   +--------+-------------+
                        |            v
                    RESTARTING <- (failure, policy says restart)  -> ERRORED (policy says give up)

SCHEDULING waits (up to $TRAINFORGE_RESOURCE_WAIT_S) until the scaling policy finds room for at
least the minimum number of workers. RESIZING happens only right after a committed checkpoint, when
the scaling policy says GROW (more workers fit now) or SHRINK (the resource view dropped, e.g. a
train server took lent workers back, but still fits the minimum): no work is lost and no failure is
counted. Every (re)start continues the metrics history from the latest
committed checkpoint: reports made after it are dropped from the history, as their work is redone.

``run_iter()`` steps it until a terminal state and yields each completed report. Everything it
talks to is injected (worker group factory, backend, storage, checkpoint manager, policy), so unit
tests drive it with a fake worker group.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from trainforge._internal.attempt_reports import AttemptReports
from trainforge._internal.backend import Backend, BackendConfig
from trainforge._internal.checkpoint import Checkpoint
from trainforge._internal.checkpoint_manager import CheckpointManager
from trainforge._internal.controller_hooks import ControllerHooks
from trainforge._internal.exceptions import (
    StorageError,
    TrainingFailedError,
    WorkerFailure,
    WorkerGroupError,
    format_failures,
)
from trainforge._internal.failure_policy import FailureDecision, FailurePolicy
from trainforge._internal.hang_check import hung_workers
from trainforge._internal.metrics_log import MetricsLog
from trainforge._internal.resource_wait import ResourcesUnavailable, ResourceWait
from trainforge._internal.result import Result, TrainingReport
from trainforge._internal.scaling_policy import ScalingDecision, ScalingPolicy
from trainforge._internal.stop_criteria import Stopper
from trainforge._internal.storage import StorageContext
from trainforge._internal.worker_group.api import (
    DoneEvent,
    FailureEvent,
    ReportEvent,
    WorkerGroup,
    WorkerSpec,
)

logger = logging.getLogger("trainforge")

# After the first failure, keep listening this long so simultaneous failures of other ranks are
# grouped into one message, and reports already on the wire are still processed; not once every
# rank has failed or finished.
FAILURE_SETTLE_S = 0.3
POLL_INTERVAL_S = 0.1
STOP_GRACE_S = 1.0  # TrainingIterator.stop(): how long train loops get to reach their next report()


_RESIZE_PREFIX = "resize to "
_RESIZE_SUFFIX = " workers"


def resize_reason(n: int) -> str:
    """The restart reason, in words, that callbacks get for a resize to ``n`` workers (``on_resize``,
    or ``on_restart`` for one without it). The size itself travels as data: ``on_resize``'s ``workers``."""
    return f"{_RESIZE_PREFIX}{n}{_RESIZE_SUFFIX}"


def parse_resize_reason(reason: str) -> int | None:
    """The worker count of a :func:`resize_reason`, or None for any other restart reason (for a
    reader of the text only, such as a test of it: the code passes the count as data)."""
    if not (reason.startswith(_RESIZE_PREFIX) and reason.endswith(_RESIZE_SUFFIX)):
        return None
    n = reason[len(_RESIZE_PREFIX):-len(_RESIZE_SUFFIX)]
    return int(n) if n.isdigit() else None


class RunState(enum.Enum):
    INITIALIZING = "initializing"
    SCHEDULING = "scheduling"
    RUNNING = "running"
    RESTARTING = "restarting"
    RESIZING = "resizing"
    FINISHED = "finished"
    ERRORED = "errored"


class Controller:
    def __init__(
        self,
        hooks: ControllerHooks,
        backend: Backend,
        backend_config: BackendConfig,
        storage: StorageContext,
        checkpoint_manager: CheckpointManager,
        failure_policy: FailurePolicy,
        metrics_log: MetricsLog,
        initial_checkpoint: Checkpoint | None = None,
        scaling_policy: ScalingPolicy | None = None,
        hang_timeout_s: float | None = None,
        stop_event: threading.Event | None = None,
        stopper: Stopper | None = None,
    ):
        self.hooks = hooks
        self.backend = backend
        self.backend_config = backend_config
        self.storage = storage
        self.checkpoints = checkpoint_manager
        self.policy = failure_policy
        self.metrics = metrics_log
        self.initial_checkpoint = initial_checkpoint
        self.scaling = scaling_policy
        self.hang_timeout_s = hang_timeout_s
        self.state = RunState.INITIALIZING
        self.attempt = 0
        self.group: WorkerGroup | None = None
        self.failures: list[list[WorkerFailure]] = []
        self.error: BaseException | None = None
        self._reports: AttemptReports | None = None
        self._specs: list[WorkerSpec] = []
        self._out: list[TrainingReport] = []
        self._resize_to: int | None = None
        self._resource_wait = ResourceWait()  # SCHEDULING's patience
        self.sizes: list[int] = []  # group size of every attempt, for inspection
        self.stop_event = stop_event  # set from any thread: end the run at the next step
        self.stopped = False
        self.stopper = stopper  # RunConfig(stop=...): ends the run at the result it accepts
        self._criteria_met = False

    # -- the loop ---------------------------------------------------------------------------------
    def run_iter(self) -> Iterator[TrainingReport]:
        try:
            while self.state not in (RunState.FINISHED, RunState.ERRORED):
                if self._criteria_met or (self.stop_event is not None and self.stop_event.is_set()):
                    self._stop_requested()
                    out, self._out = self._out, []
                    yield from out  # what every rank reported before it stopped
                    break
                self.step()
                out, self._out = self._out, []
                yield from out
        finally:
            self._stop_group(graceful=False)
            try:
                self.metrics.flush()
            except StorageError as exc:
                logger.warning("could not write the metrics history: %s", exc)

    def _stop_requested(self) -> None:
        """``TrainingIterator.stop()``: each worker's train loop ends at its next ``report()`` (a clean
        end: its ``finally`` blocks run, the report is committed if every rank made it); workers still
        in their loop after the grace period (``stop(grace_s=...)``, default ``STOP_GRACE_S``) get
        SIGTERM, then SIGKILL; reports not every rank made are dropped, and the run ends as it stands."""
        grace = getattr(self.stop_event, "grace_s", None)
        grace = STOP_GRACE_S if grace is None else grace
        clean = False
        if self.group is not None and self.state is RunState.RUNNING and grace > 0:
            clean = self._let_workers_stop(grace)
        self._stop_group(graceful=clean)
        self._discard_incomplete()
        self.stopped = not self._criteria_met  # the stop criteria met: the run finished as asked
        self._transition(RunState.FINISHED)

    def _let_workers_stop(self, grace: float) -> bool:
        """Ask the workers to end at their next report and wait up to ``grace`` seconds; True if every
        rank ended its loop cleanly. A rank that fails meanwhile (say, a collective whose peer has
        left) only ends the wait: the run was stopped, so it counts as no failure."""
        assert self.group is not None and self._reports is not None
        self.group.request_stop()
        failures: list[WorkerFailure] = []
        deadline = time.monotonic() + grace
        while not self._all_ended(failures):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._handle(self.group.poll(min(POLL_INTERVAL_S, left)), failures)
        return not failures and len(self._reports.done) == len(self._specs)

    def step(self) -> None:
        """Advance one iteration; a no-op once FINISHED or ERRORED."""
        if self.state in (RunState.FINISHED, RunState.ERRORED):
            return
        handler = {
            RunState.INITIALIZING: self._initialize,
            RunState.SCHEDULING: self._schedule,
            RunState.RUNNING: self._poll,
            RunState.RESTARTING: self._restart,
            RunState.RESIZING: self._resize,
        }[self.state]
        try:
            # The previous step's committed reports were handed on (yielded) since: their staging
            # directories go now, off the path from a report to its commit.
            self.storage.remove_committed_staging()
            handler()
        except StorageError as exc:
            # The storage failed for good (after retries): the run cannot persist anything more.
            self.error = exc
            self._stop_group(graceful=False)
            self._transition(RunState.ERRORED)

    def _transition(self, state: RunState) -> None:
        logger.debug("controller: %s -> %s", self.state.value, state.value)
        self.state = state

    # -- states -----------------------------------------------------------------------------------
    def _initialize(self) -> None:
        # A run directory with history (fit() again on the same name, restore()) continues from its
        # latest checkpoint.
        self.metrics.truncate(self.checkpoints.latest_metrics_rows)
        self._transition(RunState.SCHEDULING)

    def _schedule(self) -> None:
        try:
            n = self._resource_wait.size(self.scaling) if self.scaling is not None else None
        except ResourcesUnavailable as exc:
            self.error = TrainingFailedError(str(exc), self.failures)
            self._transition(RunState.ERRORED)
            return
        if n is None and self.scaling is not None:
            return  # still waiting; SCHEDULING again on the next step
        self._specs = self.hooks.make_specs(self.attempt, n if n is not None else 0)
        self.sizes.append(len(self._specs))
        self.group = self.hooks.make_worker_group()
        self._reports = AttemptReports(world_size=len(self._specs))
        try:
            t0 = time.monotonic()
            self.group.start(self._specs, self.hooks.preload)
            if self.hooks.worker_init_fn is not None:
                self.group.execute(self.hooks.worker_init_fn)
            self.backend.on_start(self.group, self.backend_config)
            self.backend.on_training_start(self.group, self.backend_config)
            checkpoint = self.checkpoints.latest or self.initial_checkpoint
            self.group.start_training(self.hooks.make_payloads(self.attempt, checkpoint, self._specs))
            logger.info("started %d workers in %.2fs (attempt %d)", len(self._specs), time.monotonic() - t0,
                        self.attempt)
            metadata = self.group.worker_metadata
            for cb in self.hooks.callbacks:
                hook = getattr(cb, "on_workers_start", None)  # optional: callbacks need not subclass Callback
                if hook is not None:
                    hook(metadata)
            if self.hooks.after_start is not None:
                elastic = self.scaling is not None and self.scaling.scaling.elastic
                self.hooks.after_start(len(self._specs), elastic or self.policy.allows(len(self.failures) + 1))
        except WorkerGroupError as exc:
            failures = getattr(exc, "failures", None) or [
                WorkerFailure(rank=-1, pid=None, kind="exception", exc_type=type(exc).__name__,
                              message=str(exc), time=time.time())
            ]
            self._on_failure(list(failures))
            return
        self._transition(RunState.RUNNING)

    def _poll(self) -> None:
        assert self.group is not None
        failures: list[WorkerFailure] = []
        self._handle(self.group.poll(POLL_INTERVAL_S), failures)
        if not failures and self.hang_timeout_s is not None:
            failures = hung_workers(self.group, self.hang_timeout_s)
        if failures:
            deadline = time.monotonic() + FAILURE_SETTLE_S
            while time.monotonic() < deadline and not self._all_ended(failures):
                self._handle(self.group.poll(max(0.0, deadline - time.monotonic())), failures)
            self._on_failure(failures)
            return
        assert self._reports is not None
        if len(self._reports.done) == len(self._specs):
            self._finish()
        elif self._resize_to is not None:
            self._transition(RunState.RESIZING)

    def _all_ended(self, failures: list[WorkerFailure]) -> bool:
        """Every rank failed or finished: the group has nothing more to say (a rank's failure or
        completion comes after all its reports), so the settle window can end."""
        assert self._reports is not None
        ended = {f.rank for f in failures} | set(self._reports.done)
        return ended >= set(range(len(self._specs)))

    def _resize(self) -> None:
        """Grow or shrink an elastic group: stop it right after a committed checkpoint and start one
        of the new size from that checkpoint (no failure is counted)."""
        n, self._resize_to = self._resize_to, None
        assert n is not None
        why = "resources returned" if n > len(self._specs) else "resources reclaimed"
        logger.warning(
            "resizing the worker group from %d to %d workers (%s): restarting as attempt %d from %s",
            len(self._specs), n, why, self.attempt + 1, self._resume_point(),
        )
        self._stop_group(graceful=False)
        self._discard_incomplete()
        self.metrics.truncate(self.checkpoints.latest_metrics_rows)
        self.attempt += 1
        for cb in self.hooks.callbacks:
            on_resize = getattr(cb, "on_resize", None)  # the new size as data; callbacks need not subclass Callback
            if on_resize is not None:
                on_resize(self.attempt, n, resize_reason(n))
            else:
                cb.on_restart(self.attempt, resize_reason(n))
        self._transition(RunState.SCHEDULING)

    def _restart(self) -> None:
        self.metrics.truncate(self.checkpoints.latest_metrics_rows)
        failed, self.attempt = self.attempt, self.attempt + 1
        reason = format_failures(self.failures[-1]).splitlines()[0]
        limit = self.policy.config.max_failures
        logger.warning(
            "attempt %d failed: %s; restarting as attempt %d from %s (failure %d of %s allowed)",
            failed, reason, self.attempt, self._resume_point(), len(self.failures),
            "unlimited" if limit == -1 else limit,
        )
        for cb in self.hooks.callbacks:
            cb.on_restart(self.attempt, reason)
        self._transition(RunState.SCHEDULING)

    def _resume_point(self) -> str:
        latest = self.checkpoints.latest or self.initial_checkpoint
        return latest.path.rstrip("/").rsplit("/", 1)[-1] if latest is not None else "the start"

    # -- events -----------------------------------------------------------------------------------
    def _handle(self, events: list[Any], failures: list[WorkerFailure]) -> None:
        assert self._reports is not None
        for ev in events:
            if isinstance(ev, ReportEvent):
                if self._criteria_met:
                    continue  # the stop criteria's result is the run's last: reports after it are late
                if ev.rank == 0:
                    self.metrics.append(ev.metrics)
                    self._reports.rank0_rows[ev.index] = len(self.metrics.rows)
                complete = self._reports.add(ev)
                if complete is not None:
                    self._complete_report(ev.index, complete)
            elif isinstance(ev, DoneEvent):
                self._reports.done[ev.rank] = ev.report_count
            elif isinstance(ev, FailureEvent):
                failures.append(ev.failure)

    def _complete_report(self, index: int, by_rank: dict[int, ReportEvent]) -> None:
        assert self._reports is not None
        ranks = sorted(by_rank)
        metrics0 = by_rank[0].metrics
        checkpoint = None
        with_ckpt = [r for r in ranks if by_rank[r].has_checkpoint]
        if with_ckpt:
            seq = self.checkpoints.next_index
            rows = self._reports.rank0_rows[index]
            self.metrics.flush()  # the history a restore continues from is on disk before the marker
            checkpoint = self.storage.commit_checkpoint(
                self.attempt, index, with_ckpt, seq, metrics0, extra={"metrics_rows": rows}
            )
            self.checkpoints.register(checkpoint, metrics0, seq, rows)
            self._check_size()
        report = TrainingReport(
            index=self._reports.rank0_rows[index] - 1,  # its row in the history (metrics_dataframe)
            metrics=metrics0,
            all_metrics=[by_rank[r].metrics for r in ranks],
            checkpoint=checkpoint,
            attempt=self.attempt,
        )
        for cb in self.hooks.callbacks:
            cb.on_report(report)
        self._out.append(report)
        self._check_stop_criteria(report)

    def _check_stop_criteria(self, report: TrainingReport) -> None:
        """``RunConfig(stop=...)``: asked with every complete report as Ray Tune's result (rank 0's
        metrics, ``training_iteration``, ``trial_id``); once it says stop, that report is the last:
        rank 0's rows after it go (a rank ahead of the others may have reported again), later
        reports are ignored, and the run ends at the next step."""
        if self.stopper is None or self._criteria_met:
            return
        result = {**report.metrics, "training_iteration": report.index + 1, "trial_id": self.storage.name}
        if self.stopper(self.storage.name, result) or self.stopper.stop_all():
            self._criteria_met = True
            self.metrics.truncate(report.index + 1)

    def _check_size(self) -> None:
        """At a committed checkpoint: resize an elastic group that more (GROW) or fewer (SHRINK)
        workers fit now; the new size is read once more, so a view that changed meanwhile is used
        as it is now, and a resize to the current size is none."""
        if self.scaling is None:
            return
        current = len(self._specs)
        if self.scaling.decide(current) in (ScalingDecision.GROW, ScalingDecision.SHRINK):
            n = self.scaling.size_now()
            if n is not None and n != current:
                self._resize_to = n

    def _on_failure(self, failures: list[WorkerFailure]) -> None:
        for f in failures:
            f.attempt = self.attempt
        self.failures.append(failures)
        self._stop_group(graceful=False)
        if self.hooks.on_failure is not None:
            self.hooks.on_failure(failures)
        self._discard_incomplete()
        if self.policy.decide(len(self.failures)) == FailureDecision.RESTART:
            self._transition(RunState.RESTARTING)
            return
        self.error = TrainingFailedError.from_attempts(self.failures, self.policy.config.max_failures)
        self._transition(RunState.ERRORED)

    def _finish(self) -> None:
        assert self._reports is not None and self.group is not None
        counts = self._reports.done
        if len(set(counts.values())) > 1:
            detail = ", ".join(f"rank {r}: {n}" for r, n in sorted(counts.items()))
            msg = (
                f"Ranks called report() a different number of times ({detail}). Reports not made by every "
                "rank are in the metrics of the ranks that made them, but their checkpoints were not "
                "committed. Make every rank call report() the same number of times (pass checkpoint=None "
                "on ranks that have nothing to save)."
            )
            logger.warning(msg)  # shown once, on the console (progress.console_warnings)
        self._discard_incomplete()
        try:
            self.backend.on_shutdown(self.group, self.backend_config)
        except WorkerGroupError as exc:
            logger.warning("backend on_shutdown failed: %s", exc)
        self._stop_group(graceful=True)
        self._transition(RunState.FINISHED)

    def _discard_incomplete(self) -> None:
        if self._reports is None:
            return
        for index in list(self._reports.pending):
            self.storage.discard_staged(self.attempt, index)
        self._reports.pending.clear()

    def _stop_group(self, graceful: bool) -> None:
        if self.group is not None:
            try:
                self.group.shutdown(graceful=graceful)
            finally:
                hook = getattr(self.backend, "on_attempt_end", None)  # optional on duck-typed backends
                if hook is not None:
                    try:
                        hook(self.backend_config)
                    except Exception as exc:  # releasing must not hide the attempt's outcome
                        logger.warning("backend on_attempt_end failed: %s", exc)

    # -- result -----------------------------------------------------------------------------------
    def result(self) -> Result:
        rows = self.metrics.rows
        return Result(
            metrics=rows[-1] if rows else None,
            checkpoint=self.checkpoints.latest,
            error=self.error,
            path=self.storage.run_path,
            best_checkpoints=self.checkpoints.best_checkpoints,
            metrics_history=list(rows),
            filesystem=self.storage.fs,
            failures=[f for attempt in self.failures for f in attempt],
        )
