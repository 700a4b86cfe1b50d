"""The half of a worker group that talks to workers: the same for local processes and Ray actors.

Every worker runs ``worker_main``'s command loop behind one socket to the driver (see listener.py).
:class:`SocketWorkerGroup` sends commands (setup, execute, train, stacks, exit), reads the replies
and reports, and records deaths; its subclasses only say how workers are started
(:meth:`_launch`), found dead (:meth:`_exited`, :meth:`_death`), asked for their stacks
(:meth:`dump_stacks`) and stopped (:meth:`_stop`, :meth:`_reap`, :meth:`_release`).
"""

from __future__ import annotations

import abc
import collections
import os
import pickle
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

from trainforge._internal import constants
from trainforge._internal.exceptions import WorkerFailure, WorkerGroupError, format_failures
from trainforge._internal.log_streaming import LogStreamer
from trainforge._internal.state_files import create, data_modes
from trainforge._internal.worker_group.api import (
    DoneEvent,
    Event,
    FailureEvent,
    ReportEvent,
    WorkerGroup,
    WorkerMetadata,
    WorkerSpec,
)

TAIL_LINES = 60
READ_INTERVAL_S = 0.02  # while training, the driver reads socket-borne reports at most this often
# The report rings of local workers are drained at least this often. A ring wakes the driver for a
# record that finds it empty, unless its writer is a busy one: a drain took several records from it,
# or took records less than RING_BUSY_GAP_S after the previous drain that did. A busy writer is then
# drained at this pace (its wake-ups disarmed until the next drain), so a worker reporting every step
# wakes the driver ~50 times a second, not at each report; a worker reporting less often than every
# RING_BUSY_GAP_S has each report handled when it is written.
RING_DRAIN_S = 0.02
RING_BUSY_GAP_S = RING_DRAIN_S / 2


class WorkerHandle:
    """The driver's record of one worker: its connection, output streams and state."""

    def __init__(self) -> None:
        self.spec: WorkerSpec | None = None
        self.conn: Connection | None = None
        self.finished = False  # sent "done" or "error": its train loop is over
        self.failed = False  # a failure was recorded for it
        self.exit_sent = False
        self.tail: collections.deque = collections.deque(maxlen=TAIL_LINES)
        self.streamers: list[LogStreamer] = []
        self.log_file: Any = None
        self.last_progress = time.monotonic()
        self.stacks: dict[int, str] = {}  # replies to "stacks" commands, by request id
        self.ring: Any = None  # a local worker's report ring (report_ring.RingReader)
        self.ring_busy_until = 0.0  # its wake-ups are disarmed until then (socket_group.RING_DRAIN_S)
        self.ring_last_records = float("-inf")  # when a drain last took records from the ring
        self.after_count = 0  # ordered ("after") socket messages read: the ring is read up to their tag

    @property
    def rank(self) -> int:
        return self.spec.rank if self.spec is not None else -1

    @property
    def pid(self) -> int:
        raise NotImplementedError

    def touch(self) -> None:
        self.last_progress = time.monotonic()

    def join_output(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for s in self.streamers:
            s.join(max(0.0, deadline - time.monotonic()))


class SocketWorkerGroup(WorkerGroup):
    def __init__(self, log_dir: str | None = None, log_to_driver: bool = True):
        self._last_read = 0.0
        self._log_dir = log_dir
        self._log_to_driver = log_to_driver
        self._workers: list[Any] = []
        self._events: list[Event] = []
        self._results: dict[tuple[int, int], tuple[bool, Any]] = {}
        self._call_id = 0
        self._log_lock = threading.Lock()
        self._shutdown_done = False

    # -- what subclasses implement ----------------------------------------------------------------
    @abc.abstractmethod
    def _launch(self, specs: list[WorkerSpec], preload: tuple[str, ...]) -> None:
        """Start (or take) one worker per spec into ``self._workers`` (in rank order, each with its
        ``spec``, as soon as it exists, so that shutdown() stops it whatever happens next), then wait
        until every one is connected. Raise ``WorkerStartError`` if one does not come up."""

    @abc.abstractmethod
    def _exited(self, workers: list[Any]) -> set[int]:
        """Ranks of those ``workers`` whose process (actor) has ended."""

    @abc.abstractmethod
    def _await_exit(self, w: Any, timeout: float) -> None:
        """Wait up to ``timeout`` for the worker's process (actor) to end."""

    @abc.abstractmethod
    def _death(self, w: Any) -> WorkerFailure:
        """The failure record of a worker that died (its connection closed or its process ended)."""

    @abc.abstractmethod
    def _stop(self, running: list[Any], grace: float) -> None:
        """Stop every worker for good: ``running`` are those that may still do useful work (their
        train loop did not fail) and did not end after the exit command; the others may be killed
        at once."""

    def _release(self) -> None:
        """Free what the group holds once its workers are stopped (a pool, a placement group)."""

    def _metadata(self, w: Any) -> WorkerMetadata:
        raise NotImplementedError

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self, specs: list[WorkerSpec], preload: tuple[str, ...] = ()) -> None:
        self._launch(specs, preload)
        for w in self._workers:
            assert w.spec is not None
            self._open_log(w)
            self._send(w, ("setup", list(sys.path), os.getcwd(), dict(w.spec.env)))

    def _open_log(self, w: WorkerHandle) -> None:
        assert w.spec is not None
        if self._log_dir is not None:
            w.log_file = create(os.path.join(self._log_dir, f"rank_{w.spec.rank}.log"), "ab", data_modes().file)
        else:
            w.log_file = open(os.devnull, "wb")  # noqa: SIM115
        for s in w.streamers:
            s.assign(w.spec.rank, w.pid, w.log_file, self._log_lock, w.tail, self._log_to_driver, w.touch)

    @property
    def num_workers(self) -> int:
        return len(self._workers)

    @property
    def worker_metadata(self) -> list[WorkerMetadata]:
        return [self._metadata(w) for w in self._workers]

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self._workers]

    # -- messaging --------------------------------------------------------------------------------
    def _send(self, w: WorkerHandle, msg: tuple) -> None:
        assert w.conn is not None
        try:
            w.conn.send_bytes(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))
        except (OSError, EOFError):
            pass  # noticed as a death by _receive

    def request_stop(self) -> None:
        for w in self._workers:
            if w.conn is not None and not w.conn.closed and not w.finished:
                self._send(w, ("stop",))

    def _receive(self, timeout: float) -> None:
        """Read whatever arrives within ``timeout`` (a socket message, or a report ring's wake-up);
        record events, results and deaths."""
        conns = [w.conn for w in self._workers if w.conn is not None and not w.conn.closed]
        by_conn = {id(w.conn): w for w in self._workers}
        rings = {}  # armed: the next record that finds the ring empty wakes us
        now = time.monotonic()
        for w in self._workers:
            if w.ring is None or w.ring.wake_fd is None:
                continue
            if now < w.ring_busy_until:  # drained of records just now: until then, drained at that pace
                timeout = min(timeout, w.ring_busy_until - now)
                continue
            w.ring.arm(True)
            rings[id(w.ring)] = w.ring
        if any(r.written_since_drain() for r in rings.values()):
            timeout = 0.0  # records came after the last drain: their writer may have seen it unarmed
        ready = wait(conns + list(rings.values()), timeout) if conns else []
        if not conns and timeout:
            time.sleep(min(timeout, 0.05))
        for obj in ready:
            ring = rings.get(id(obj))
            if ring is not None:
                ring.clear_wake()  # before the drain below: a record written after it signals again
            else:
                self._read_available(by_conn[id(obj)])
        for w in self._workers:
            if w.ring is not None:
                self._drain_ring(w)
        self._check_deaths()

    def _read_available(self, w: WorkerHandle) -> None:
        """Dispatch every message waiting on ``w``'s socket; close it at EOF."""
        conn = w.conn
        while conn is not None and not conn.closed:
            try:
                if not conn.poll():
                    return
                data = conn.recv_bytes()
            except (EOFError, OSError):
                conn.close()
                return
            self._dispatch(w, pickle.loads(data))

    def _drain_ring(self, w: WorkerHandle, upto: int | None = None, everything: bool = False) -> None:
        records = w.ring.drain(upto, None if everything else w.after_count)
        if records and w.ring.wake_fd is not None:
            now = time.monotonic()
            if len(records) > 1 or now - w.ring_last_records < RING_BUSY_GAP_S:
                w.ring.arm(False)  # a busy writer: its next records wait for the drain RING_DRAIN_S from now
                w.ring_busy_until = now + RING_DRAIN_S
            w.ring_last_records = now
        for data in records:
            self._dispatch(w, pickle.loads(data))

    def _dispatch(self, w: WorkerHandle, msg: tuple) -> None:
        kind = msg[0]
        if kind == "after":  # sent after ring records up to this position: those come first
            self._drain_ring(w, msg[1])
            w.after_count += 1
            self._dispatch(w, msg[2])
        elif kind == "drain":  # the worker's ring is full; _receive drains it
            pass
        elif kind == "batch":
            for m in msg[1]:
                self._dispatch(w, m)
        elif kind == "report":
            w.last_progress = time.monotonic()
            _, index, payload, staged, t = msg
            self._events.append(ReportEvent(w.rank, index, pickle.loads(payload), staged, t))
        elif kind == "result":
            _, call_id, ok, blob = msg
            self._results[(call_id, w.rank)] = (ok, blob)
        elif kind == "done":
            w.finished = True
            self._events.append(DoneEvent(w.rank, msg[1]))
        elif kind == "stacks":
            w.stacks[msg[1]] = msg[2]
        elif kind == "error":
            _, exc_type, message, tb = msg
            w.finished = True
            w.failed = True
            self._events.append(
                FailureEvent(
                    WorkerFailure(
                        rank=w.rank,
                        pid=w.pid,
                        kind="exception",
                        exc_type=exc_type,
                        message=message,
                        traceback=tb,
                        time=time.time(),
                    )
                )
            )

    def _check_deaths(self) -> None:
        candidates = [w for w in self._workers if not (w.failed or w.exit_sent)]
        if not candidates:
            return
        exited = self._exited(candidates)
        for w in candidates:
            conn_closed = w.conn is not None and w.conn.closed
            if w.rank not in exited and not conn_closed:
                continue
            if w.rank not in exited:
                self._await_exit(w, 2.0)
            self._drain_dead(w)  # its last messages come before its death
            w.join_output(1.0)
            w.failed = True
            self._events.append(FailureEvent(self._death(w)))

    def _drain_dead(self, w: WorkerHandle) -> None:
        """What a dead worker sent is still ours: its socket's last messages, then its whole ring."""
        self._read_available(w)
        if w.ring is not None:
            self._drain_ring(w, everything=True)

    # -- execute ----------------------------------------------------------------------------------
    def execute_async(self, ranks: list[int], fn: Callable[..., Any], args: tuple, kwargs: dict) -> int:
        from trainforge._internal import code_pickle

        self._call_id += 1
        blob = code_pickle.dumps((fn, args, kwargs))
        for r in ranks:
            self._send(self._workers[r], ("execute", self._call_id, blob))
        return self._call_id

    def _gather(self, call_id: int, ranks: list[int]) -> list[Any]:
        import cloudpickle

        while True:
            failures = [e.failure for e in self._events if isinstance(e, FailureEvent) and e.failure.rank in ranks]
            if failures:
                raise WorkerGroupError(format_failures(failures))
            if all((call_id, r) in self._results for r in ranks):
                break
            self._receive(0.1)
        out, errors = [], []
        for r in ranks:
            ok, blob = self._results.pop((call_id, r))
            if ok:
                out.append(cloudpickle.loads(blob))
            else:
                exc_type, message, tb = blob
                errors.append(
                    WorkerFailure(rank=r, pid=self._workers[r].pid, kind="exception", exc_type=exc_type,
                                  message=message, traceback=tb, time=time.time())
                )
        if errors:
            err = WorkerGroupError(format_failures(errors))
            err.failures = errors  # type: ignore[attr-defined]
            raise err
        return out

    def execute(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        ranks = list(range(len(self._workers)))
        return self._gather(self.execute_async(ranks, fn, args, kwargs), ranks)

    def execute_single(self, rank: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._gather(self.execute_async([rank], fn, args, kwargs), [rank])[0]

    # -- training ---------------------------------------------------------------------------------
    def start_training(self, payloads: list[bytes]) -> None:
        now = time.monotonic()
        for w, blob in zip(self._workers, payloads, strict=True):
            w.last_progress = now
            self._send(w, ("train", blob))

    def last_progress(self) -> dict[int, float]:
        return {w.rank: w.last_progress for w in self._workers if not w.finished and not w.failed}

    def poll(self, timeout: float) -> list[Event]:
        if not self._events and self._workers and all(w.ring is not None for w in self._workers):
            # Local workers: a report that lands in an empty ring wakes us (its eventfd), later ones
            # wait for the drain that wake-up causes; the sockets wake us for everything else (a death,
            # a finished loop); and the rings are drained every RING_DRAIN_S anyway.
            self._receive(min(timeout, RING_DRAIN_S))
            events, self._events = self._events, []
            return events
        # Workers send every report at once (so none is lost if they die); the driver batches by
        # reading at most every READ_INTERVAL_S, so frequent reports do not wake it per message.
        wait_more = self._last_read + READ_INTERVAL_S - time.monotonic()
        if wait_more > 0 and not self._events:
            time.sleep(min(wait_more, timeout))
        if not self._events:
            self._receive(timeout)
            self._last_read = time.monotonic()
        events, self._events = self._events, []
        return events

    def _request_stacks(self, rank: int, timeout: float) -> str:
        """Ask the worker's reader thread for every thread's stack (``faulthandler.dump_traceback``)."""
        w = self._workers[rank]
        if w.conn is None or w.conn.closed:
            return ""
        self._call_id += 1
        request = self._call_id
        self._send(w, ("stacks", request))
        deadline = time.monotonic() + timeout
        while request not in w.stacks and time.monotonic() < deadline and not w.conn.closed:
            self._receive(min(0.05, max(0.0, deadline - time.monotonic())))
        return w.stacks.pop(request, "")

    # -- shutdown ---------------------------------------------------------------------------------
    def shutdown(self, graceful: bool = True) -> None:
        """Exit command (when graceful) and a bounded wait, then :meth:`_stop` escalates; then
        :meth:`_reap` and :meth:`_release`."""
        if self._shutdown_done:
            return
        self._shutdown_done = True
        grace = constants.shutdown_grace_s() if graceful else min(1.0, constants.shutdown_grace_s())
        exited = self._exited(self._workers) if self._workers else set()
        # A worker whose train loop failed (it sent its error, or was found dead) has no cleanup
        # left worth waiting for: it is not counted as running, so _stop kills it at once.
        running = [w for w in self._workers if w.rank not in exited and not w.failed]
        if graceful:
            for w in running:
                if w.conn is not None and not w.conn.closed:
                    w.exit_sent = True
                    self._send(w, ("exit",))
            self._wait_exit(running, grace)
            exited = self._exited(running) if running else set()
            running = [w for w in running if w.rank not in exited]
        for w in self._workers:
            w.exit_sent = True
        self._stop(running, grace)
        self._reap()
        self._release()

    def _reap(self) -> None:
        """Once :meth:`_stop` killed every worker: take their last output, close their connections
        and logs."""
        for w in self._workers:
            w.join_output(2.0)
            if w.conn is not None:
                w.conn.close()
            if w.ring is not None:
                w.ring.close()
            if w.log_file is not None:
                with self._log_lock:
                    w.log_file.close()

    def _wait_exit(self, workers: list[Any], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for w in workers:
            self._await_exit(w, max(0.0, deadline - time.monotonic()))
