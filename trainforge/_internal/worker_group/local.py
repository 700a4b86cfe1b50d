"""Workers as local processes started by trainforge itself (the default executor).

Processes come from a :class:`LocalProcessPool` (fresh, or pre-started standby ones), each in its
own session so a terminal's Ctrl-C reaches only the driver, which then stops them. Shutdown
escalates: ("exit" command when graceful) -> SIGTERM to the worker's process group -> bounded wait
-> SIGKILL, so no worker or worker child is ever left behind; a worker whose train loop already
failed (or that ended) is SIGKILLed at once. Reaping the killed processes overlaps with the start of
the next group (the pool's reaper). The messaging is shared with the Ray executor
(:class:`SocketWorkerGroup`); what is local is how processes start, die and are stopped.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

from trainforge._internal.config import ScalingConfig
from trainforge._internal.exceptions import WorkerFailure
from trainforge._internal.process_tree import signal_groups
from trainforge._internal.worker_group.api import Executor, WorkerGroup, WorkerMetadata, WorkerSpec
from trainforge._internal.worker_group.local_pool import LocalProcessPool, WorkerProcess
from trainforge._internal.worker_group.socket_group import SocketWorkerGroup
from trainforge._internal.worker_group.worker_main import STACK_SIGNAL

_Worker = WorkerProcess


class LocalWorkerGroup(SocketWorkerGroup):
    """``pool``: where processes come from (shared across a run's attempts); without one the group
    makes a private pool and closes it at shutdown."""

    def __init__(
        self,
        log_dir: str | None = None,
        log_to_driver: bool = True,
        pool: LocalProcessPool | None = None,
    ):
        super().__init__(log_dir, log_to_driver)
        self._own_pool = pool is None
        self._pool = pool if pool is not None else LocalProcessPool(stack_dir=log_dir)

    # -- starting ---------------------------------------------------------------------------------
    def _launch(self, specs: list[WorkerSpec], preload: tuple[str, ...]) -> None:
        self._workers = self._pool.acquire(len(specs), preload)
        for w, spec in zip(self._workers, specs, strict=True):
            w.spec = spec
        self._pool.wait_connected(self._workers)
        for w in self._workers:
            w.name_stack_file(w.rank)  # logs/rank_N.stack, beside rank_N.log

    def _metadata(self, w: _Worker) -> WorkerMetadata:
        assert w.spec is not None
        return WorkerMetadata(w.rank, w.spec.local_rank, w.spec.node_rank, w.pid, socket.gethostname(), "127.0.0.1",
                              list(w.spec.gpu_ids))  # fmt: skip

    # -- deaths -----------------------------------------------------------------------------------
    def _exited(self, workers: list[_Worker]) -> set[int]:
        return {w.rank for w in workers if w.proc.poll() is not None}

    def _await_exit(self, w: _Worker, timeout: float) -> None:
        try:
            w.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass

    def _death(self, w: _Worker) -> WorkerFailure:
        return WorkerFailure(
            rank=w.rank,
            pid=w.pid,
            kind="died",
            exit_code=w.proc.poll(),
            log_tail="".join(list(w.tail)[-40:]),
            time=time.time(),
        )

    # -- stacks -----------------------------------------------------------------------------------
    def dump_stacks(self, rank: int, timeout: float = 3.0) -> str:
        """SIGUSR1 makes faulthandler write every thread's stack into the worker's stack file from
        the signal handler, so it works even while the worker holds the GIL in C code."""
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

    # -- stopping ---------------------------------------------------------------------------------
    def _stop(self, running: list[_Worker], grace: float) -> None:
        # Workers that ended or whose train loop failed: SIGKILL now (their process groups too), no
        # grace to wait out.
        running_pids = {w.pid for w in running}
        signal_groups([w.pid for w in self._workers if w.pid not in running_pids], signal.SIGKILL)
        if running:
            signal_groups([w.pid for w in running], signal.SIGTERM)
            self._wait_exit(running, grace)
        # Whatever is left, including children the workers started in their process groups.
        signal_groups([w.pid for w in self._workers], signal.SIGKILL)

    def _reap(self) -> None:
        """Every worker is killed by now. With the run's pool, waiting for them to end and closing
        their files is left to the pool's reaper (joined when the pool closes), so that the next
        group starts meanwhile; a group with a private pool does it here."""
        if self._own_pool:
            self._await_and_close()
        else:
            self._pool.reap(self._await_and_close)

    def _await_and_close(self) -> None:
        for w in self._workers:
            self._await_exit(w, 10)
        super()._reap()

    def _release(self) -> None:
        for w in self._workers:
            w.remove_stack_file_if_empty()
        if self._own_pool:
            self._pool.close()


class LocalExecutor(Executor):
    """Workers are processes on this machine, from a pool shared by the run's attempts."""

    name = "local"

    def __init__(self, scaling: ScalingConfig, preload: tuple[str, ...], log_dir: str | None, log_to_driver: bool,
                 may_restart: bool = False):  # fmt: skip
        from trainforge._internal.worker_group.env import spawn_env

        self.scaling = scaling
        self._preload = preload
        self._log_dir = log_dir
        self._log_to_driver = log_to_driver
        self.pool = LocalProcessPool(spawn_env=spawn_env(scaling), stack_dir=log_dir)
        if may_restart:
            # Its zygote imports while the driver sets up, forks the first group's workers and, from
            # the first step on, standby ones: a worker dying early finds them ready.
            self.pool.start_zygote(preload)

    def make_group(self) -> WorkerGroup:
        return LocalWorkerGroup(log_dir=self._log_dir, log_to_driver=self._log_to_driver, pool=self.pool)

    def make_specs(self, attempt: int, n: int) -> list[WorkerSpec]:
        from trainforge._internal.devices import local_gpu_groups
        from trainforge._internal.worker_group.env import local_worker_specs

        return local_worker_specs(self.scaling, attempt, n, local_gpu_groups(self.scaling, n))

    def available(self) -> dict[str, float]:
        from trainforge._internal.resources import local_available

        return local_available()

    def after_start(self, n: int, may_restart: bool) -> None:
        if may_restart:
            self.pool.prewarm(self.scaling.max_workers, self._preload)

    def close(self) -> None:
        self.pool.close()
