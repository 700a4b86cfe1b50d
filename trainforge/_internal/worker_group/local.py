"""Workers as local processes started by trainforge itself (the default executor).

Processes come from a :class:`LocalProcessPool` (fresh, or pre-started standby ones), each in its
own session so a terminal's Ctrl-C reaches only the driver, which then stops them. Shutdown
escalates: ("exit" command when graceful) -> SIGTERM to the worker's process group -> bounded wait
-> SIGKILL, so no worker or worker child is ever left behind.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any

from trainforge._internal import constants
from trainforge._internal.exceptions import WorkerFailure, WorkerGroupError, format_failures
from trainforge._internal.worker_group.api import (
    DoneEvent,
    Event,
    FailureEvent,
    ReportEvent,
    WorkerGroup,
    WorkerMetadata,
    WorkerSpec,
)
from trainforge._internal.worker_group.local_pool import LocalProcessPool, WorkerProcess, kill_process_groups
from trainforge._internal.worker_main import STACK_SIGNAL

_Worker = WorkerProcess


class LocalWorkerGroup(WorkerGroup):
    """``pool``: where processes come from (shared across a run's attempts); without one the group
    makes a private pool and closes it at shutdown."""

    def __init__(
        self,
        log_dir: str | None = None,
        log_to_driver: bool = True,
        pool: LocalProcessPool | None = None,
    ):
        self._log_dir = log_dir
        self._log_to_driver = log_to_driver
        self._own_pool = pool is None
        self._pool = pool if pool is not None else LocalProcessPool(stack_dir=log_dir)
        self._workers: list[_Worker] = []
        self._events: list[Event] = []
        self._results: dict[tuple[int, int], tuple[bool, Any]] = {}
        self._call_id = 0
        self._log_lock = threading.Lock()
        self._shutdown_done = False

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self, specs: list[WorkerSpec], preload: tuple[str, ...] = ()) -> None:
        self._workers = self._pool.acquire(len(specs), preload)
        for w, spec in zip(self._workers, specs, strict=True):
            w.spec = spec
            if self._log_dir is not None:
                w.log_file = open(os.path.join(self._log_dir, f"rank_{spec.rank}.log"), "ab")  # noqa: SIM115
            else:
                w.log_file = open(os.devnull, "wb")  # noqa: SIM115
            for s in w.streamers:
                s.assign(spec.rank, w.pid, w.log_file, self._log_lock, w.tail, self._log_to_driver, w.touch)
        self._pool.wait_connected(self._workers)
        for w in self._workers:
            assert w.spec is not None
            self._send(w, ("setup", list(sys.path), os.getcwd(), dict(w.spec.env)))

    @property
    def num_workers(self) -> int:
        return len(self._workers)

    @property
    def worker_metadata(self) -> list[WorkerMetadata]:
        host = socket.gethostname()
        out = []
        for w in self._workers:
            assert w.spec is not None
            out.append(
                WorkerMetadata(w.rank, w.spec.local_rank, w.spec.node_rank, w.pid, host, "127.0.0.1",
                               list(w.spec.gpu_ids))
            )
        return out

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self._workers]

    # -- messaging --------------------------------------------------------------------------------
    def _send(self, w: _Worker, msg: tuple) -> None:
        assert w.conn is not None
        try:
            w.conn.send_bytes(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))
        except (OSError, EOFError):
            pass  # noticed as a death by _receive

    def _receive(self, timeout: float) -> None:
        """Read whatever arrives within ``timeout``; record events, results and deaths."""
        conns = [w.conn for w in self._workers if w.conn is not None and not w.conn.closed]
        by_conn = {id(w.conn): w for w in self._workers}
        ready = wait(conns, timeout) if conns else []
        if not conns and timeout:
            time.sleep(min(timeout, 0.05))
        for conn in ready:
            w = by_conn[id(conn)]
            while True:
                try:
                    data = conn.recv_bytes()  # type: ignore[union-attr]
                except (EOFError, OSError):
                    conn.close()  # type: ignore[union-attr]
                    break
                self._dispatch(w, pickle.loads(data))
                if not conn.poll():  # type: ignore[union-attr]
                    break
        self._check_deaths()

    def _dispatch(self, w: _Worker, msg: tuple) -> None:
        kind = msg[0]
        if kind == "batch":
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
        for w in self._workers:
            if w.failed or w.exit_sent:
                continue
            conn_closed = w.conn is not None and w.conn.closed
            if w.proc.poll() is None and not conn_closed:
                continue
            if w.proc.poll() is None:
                try:
                    w.proc.wait(timeout=2.0)
                except subprocess.TimeoutExpired:
                    pass
            self._join_logs(w, 1.0)
            w.failed = True
            self._events.append(FailureEvent(self._died(w)))

    def _died(self, w: _Worker) -> WorkerFailure:
        return WorkerFailure(
            rank=w.rank,
            pid=w.pid,
            kind="died",
            exit_code=w.proc.poll(),
            log_tail="".join(list(w.tail)[-40:]),
            time=time.time(),
        )

    def _join_logs(self, w: _Worker, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for s in w.streamers:
            s.join(max(0.0, deadline - time.monotonic()))

    # -- execute ----------------------------------------------------------------------------------
    def execute_async(self, ranks: list[int], fn: Callable[..., Any], args: tuple, kwargs: dict) -> int:
        import cloudpickle

        self._call_id += 1
        blob = cloudpickle.dumps((fn, args, kwargs))
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

    def dump_stacks(self, rank: int, timeout: float = 3.0) -> str:
        w = self._workers[rank]
        try:
            start = os.path.getsize(w.stack_file)
        except OSError:
            start = 0
        try:
            os.kill(w.pid, STACK_SIGNAL)
        except ProcessLookupError:
            return ""
        # faulthandler writes the dump in one go from the signal handler: wait for the file to grow,
        # then for it to stop growing.
        deadline = time.monotonic() + timeout
        size, stable_since = start, None
        while time.monotonic() < deadline:
            try:
                now_size = os.path.getsize(w.stack_file)
            except OSError:
                now_size = start
            if now_size > start and now_size == size:
                if stable_since is None:
                    stable_since = time.monotonic()
                elif time.monotonic() - stable_since > 0.1:
                    break
            else:
                stable_since = None
            size = now_size
            time.sleep(0.02)
        try:
            with open(w.stack_file) as f:
                f.seek(start)
                return f.read()
        except OSError:
            return ""

    def poll(self, timeout: float) -> list[Event]:
        if not self._events:
            self._receive(timeout)
        events, self._events = self._events, []
        return events

    # -- shutdown ---------------------------------------------------------------------------------
    def shutdown(self, graceful: bool = True) -> None:
        if self._shutdown_done:
            return
        self._shutdown_done = True
        grace = constants.shutdown_grace_s() if graceful else min(1.0, constants.shutdown_grace_s())
        alive = [w for w in self._workers if w.proc.poll() is None]
        if graceful:
            for w in alive:
                if w.conn is not None and not w.conn.closed:
                    w.exit_sent = True
                    self._send(w, ("exit",))
            self._wait_exit(alive, grace)
            alive = [w for w in alive if w.proc.poll() is None]
        for w in self._workers:
            w.exit_sent = True
        if alive:
            kill_process_groups([w.pid for w in alive], signal.SIGTERM)
            self._wait_exit(alive, grace)
        # Whatever is left, including children the workers started in their process groups.
        kill_process_groups([w.pid for w in self._workers], signal.SIGKILL)
        for w in self._workers:
            try:
                w.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - unkillable (D state)
                pass
            self._join_logs(w, 2.0)
            if w.conn is not None:
                w.conn.close()
            if w.log_file is not None:
                with self._log_lock:
                    w.log_file.close()
        if self._own_pool:
            self._pool.close()

    @staticmethod
    def _wait_exit(workers: list[_Worker], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for w in workers:
            try:
                w.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
