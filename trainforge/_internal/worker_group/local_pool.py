"""Local worker processes: spawning them, and keeping standby ones ready for fast restarts.

A worker process (``python -u -m trainforge._internal.worker_group.worker_main``) starts without a rank: it
connects back to the pool's loopback listener (random auth key), says hello with its pid, imports
its preload modules (torch for a TorchTrainer) and waits. A worker group then takes processes from
the pool and gives each its rank and environment in the "setup" message.

Standby workers: once a run that may restart (``max_failures != 0`` or elastic) is training, the pool
starts spare processes that have imported torch and ``torch._dynamo`` (what the first
DistributedDataParallel needs) and trainforge ahead of time, so a restart or a resize skips the ~2.5 s
of imports. They are forked from a zygote of the pool's own (standby_zygote.py), which imports once
for all of them; where it cannot serve they are fresh processes, and in a job of a warm train server
they come from the server's zygote. They are killed when the run ends. The zygote starts with such a
run (:meth:`LocalProcessPool.start_zygote`) and forks the first group's workers too: their imports
are its own, done once while the driver sets up, and it serves standby workers from the first step
on (a worker that died in the first seconds used to find the zygote still importing, competing
with the running workers for the cores).

Reaper: a group that stopped (killed) its workers hands the wait for their ends and the closing of
their files to :meth:`LocalProcessPool.reap`, so the next group starts meanwhile; :meth:`close` waits
for it, so nothing outlives the run.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from trainforge._internal import constants, zygote
from trainforge._internal.exceptions import WorkerStartError
from trainforge._internal.log_streaming import LogStreamer
from trainforge._internal.process_tree import signal_groups
from trainforge._internal.worker_group import report_ring
from trainforge._internal.worker_group.listener import WorkerListener
from trainforge._internal.worker_group.socket_group import WorkerHandle
from trainforge._internal.worker_group.standby_zygote import StandbyZygote
from trainforge._internal.zygote import ENV_ZYGOTE, ZygoteChild

logger = logging.getLogger("trainforge")


class WorkerProcess(WorkerHandle):
    """One local worker process; ``spec`` is None while it waits on standby.

    ``stack_file``: where SIGUSR1 makes the worker write every thread's stack. The worker opens it
    at start-up, before it has a rank, as ``.worker_{n}.stack``; :meth:`name_stack_file` renames it
    ``rank_{rank}.stack`` once it has one, and :meth:`remove_stack_file_if_empty` removes it at the
    end unless a stack was dumped into it."""

    def __init__(self, proc: subprocess.Popen | ZygoteChild, stack_file: str, preload: tuple[str, ...], key: str):
        super().__init__()
        self.proc = proc
        self.stack_file = stack_file
        self.preload = preload
        self.key = key
        self._stack_ino: int | None = None  # the inode we named rank_{rank}.stack

    @property
    def pid(self) -> int:
        return self.proc.pid

    def name_stack_file(self, rank: int) -> None:
        """Rename the stack file after ``rank`` (call once the worker is connected, so the file
        exists). The worker's open file follows the rename. Dumps that an earlier attempt's worker
        of the same rank left there are copied to the head of the new file first."""
        target = os.path.join(os.path.dirname(self.stack_file), f"rank_{rank}.stack")
        if self.stack_file == target:
            return
        try:
            if os.path.exists(target) and os.path.getsize(target) > 0:
                with open(target, "rb") as earlier, open(self.stack_file, "ab") as ours:
                    shutil.copyfileobj(earlier, ours)
            os.replace(self.stack_file, target)
            self._stack_ino = os.stat(target).st_ino
        except OSError:
            return  # keep the start-up name: dump_stacks still reads it
        self.stack_file = target

    def remove_stack_file_if_empty(self) -> None:
        """Remove the stack file unless a stack was dumped into it (or it is no longer ours: a later
        worker of the same rank took the name)."""
        try:
            st = os.stat(self.stack_file)
            if st.st_size == 0 and self._stack_ino in (None, st.st_ino):
                os.remove(self.stack_file)
        except OSError:
            pass


def _warm_modules(preload: tuple[str, ...]) -> tuple[str, ...]:
    """What a standby worker for ``preload`` workers imports ahead: with torch, ``torch._dynamo`` (the
    first DistributedDataParallel imports it) and trainforge.torch."""
    extra = ("torch._dynamo", "trainforge.torch") if "torch" in preload else ("trainforge",)
    return tuple(dict.fromkeys(preload + extra))


class LocalProcessPool:
    def __init__(self, spawn_env: dict[str, str] | None = None, stack_dir: str | None = None):
        self._listener = WorkerListener("127.0.0.1")
        self._spawn_env = dict(spawn_env or {})
        self._stack_dir = stack_dir
        self._tmp_dir: str | None = None
        self._standby: list[WorkerProcess] = []
        self._closed = False
        self._seq = 0
        self._zygote_failed = False
        self._all_pids: list[int] = []
        self._reapers: list[threading.Thread] = []
        self._zygote: StandbyZygote | None = None  # forks the standby workers (standby_zygote.py)
        self._zygote_unusable = False
        self._warmer: threading.Thread | None = None  # forks them once the zygote serves
        self._finalizer = weakref.finalize(self, signal_groups, self._all_pids, signal.SIGKILL)

    # -- spawning ---------------------------------------------------------------------------------
    def _stack_path(self) -> str:
        if self._stack_dir is None:
            import tempfile

            self._tmp_dir = self._stack_dir = tempfile.mkdtemp(prefix="trainforge_stacks_")
        self._seq += 1
        return os.path.join(self._stack_dir, f".worker_{self._seq}.stack")  # renamed by rank at setup

    def _env(self) -> dict[str, str]:
        return {**os.environ, **self._spawn_env}

    def spawn(self, preload: tuple[str, ...], zygote_path: str | None = None) -> WorkerProcess:
        """A new worker process: forked by the zygote at ``zygote_path`` (raising ZygoteUnavailable
        if it cannot), else by the train server's zygote, else a fresh interpreter."""
        key = self._listener.new_key()
        env = self._env()
        env[constants.ENV_DRIVER_ADDR] = self._listener.address
        env[constants.ENV_AUTHKEY] = self._listener.authkey.hex()
        env[constants.ENV_WORKER_KEY] = key
        env["PYTHONUNBUFFERED"] = "1"
        env[constants.ENV_WORKER_PRELOAD] = ",".join(preload)
        stack_file = self._stack_path()
        env[constants.ENV_STACK_FILE] = stack_file
        # The worker's reports come through a shared-memory ring (see report_ring.py), passed as an
        # inherited anonymous memory file: nothing to clean up in the file system, whatever happens;
        # and an eventfd the worker signals when the ring goes from empty to non-empty (we wait on it).
        ring_fd = report_ring.create_ring_fd() if report_ring.available() else None
        try:
            wake_fd = report_ring.create_wake_fd() if ring_fd is not None else None
        except OSError:
            if ring_fd is not None:
                os.close(ring_fd)
            raise
        if ring_fd is not None:
            env[constants.ENV_REPORT_RING_FD] = str(ring_fd)
        if wake_fd is not None:
            env[constants.ENV_REPORT_WAKE_FD] = str(wake_fd)
        child_fds = tuple(fd for fd in (ring_fd, wake_fd) if fd is not None)
        # Expected before the process exists: a worker forked from a zygote says hello within milliseconds.
        hello: dict[str, Any] = {}

        def on_hello(conn: Connection, info: dict[str, Any]) -> None:  # under the listener's lock
            w = hello.get("worker")
            if w is None:
                hello["conn"] = conn
            else:
                w.conn = conn

        self._listener.expect(key, on_hello)
        try:
            proc: subprocess.Popen[bytes] | ZygoteChild | None = None
            if zygote_path is not None:
                proc = self._fork_from_zygote(zygote_path, env, child_fds, preload)
            elif env.get(ENV_ZYGOTE) and not self._zygote_failed:
                try:
                    proc = self._fork_from_zygote(env[ENV_ZYGOTE], env, child_fds, preload)
                except zygote.ZygoteUnavailable as exc:
                    logger.warning("%s; starting this run's workers as fresh processes", exc)
                    self._zygote_failed = True
            if proc is None:
                proc = subprocess.Popen(
                    [sys.executable, "-u", "-m", "trainforge._internal.worker_group.worker_main"],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,  # Ctrl-C in a terminal reaches the driver only; it stops us
                    pass_fds=child_fds,
                )
            w = WorkerProcess(proc, stack_file, preload, key)
            if ring_fd is not None:
                w.ring = report_ring.RingReader(ring_fd, wake_fd)
                wake_fd = None  # the reader owns our copy now
        except BaseException:
            self._listener.forget(key)
            raise
        finally:
            if ring_fd is not None:
                os.close(ring_fd)  # the child has its copy; our mapping stays
            if wake_fd is not None:
                os.close(wake_fd)
        for pipe, target in ((proc.stdout, "stdout"), (proc.stderr, "stderr")):
            assert pipe is not None
            w.streamers.append(LogStreamer(pipe, target))

        with self._listener.changed:
            hello["worker"] = w
            if "conn" in hello:
                w.conn = hello["conn"]
        self._all_pids.append(proc.pid)
        return w

    def _fork_from_zygote(self, path: str, env: dict[str, str], child_fds: tuple[int, ...],
                          preload: tuple[str, ...]) -> ZygoteChild:  # fmt: skip
        """The worker forked by the zygote at ``path`` (the train server's, ``$TRAINFORGE_ZYGOTE``, or
        the pool's own; see _internal/zygote/): it has trainforge (and torch, once needed) imported
        already; ``child_fds`` are given to it under the same numbers. ZygoteUnavailable if the zygote
        does not answer."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        fds = [out_w, err_w, *child_fds]
        mapping = {1: 0, 2: 1, **{fd: 2 + i for i, fd in enumerate(child_fds)}}
        request = zygote.SpawnRequest(
            target="trainforge._internal.worker_group.worker_main:main", args=[], env=env, cwd=os.getcwd(), fds=mapping,
            new_session=True, mark=(constants.ENV_JOB_ID, constants.ENV_SERVER_ID), watch_pid=os.getpid(),
            preload=preload,
        )  # fmt: skip
        try:
            child = zygote.spawn(path, request, fds)
        except zygote.ZygoteUnavailable:
            for fd in (out_r, out_w, err_r, err_w):
                os.close(fd)
            raise
        os.close(out_w)  # the worker has its copies
        os.close(err_w)
        child.stdout = open(out_r, "rb")  # noqa: SIM115 - read by the worker's LogStreamer until EOF
        child.stderr = open(err_r, "rb")  # noqa: SIM115
        return child

    def acquire(self, n: int, preload: tuple[str, ...]) -> list[WorkerProcess]:
        """``n`` processes: live standby ones first (waiting for those the zygote is about to fork:
        they are ready sooner than fresh ones), then forked by the zygote, then fresh ones."""
        if self._warmer is not None:
            self._warmer.join(constants.worker_start_timeout_s())
        z = self._usable_zygote(preload)
        if (z is not None and not (self._warmer is not None and self._warmer.is_alive())
                and not z.wait_ready(constants.worker_start_timeout_s())):  # fmt: skip
            logger.warning("the zygote for this run's workers does not serve; starting them as fresh processes")
            self._zygote_unusable = True
        taken: list[WorkerProcess] = []
        while self._standby and len(taken) < n:
            w = self._standby.pop(0)
            if w.proc.poll() is None and set(preload) <= set(w.preload):
                taken.append(w)
            else:
                self._discard(w)
        while len(taken) < n:
            taken.append(self._fork_or_spawn(preload))
        return taken

    def _usable_zygote(self, preload: tuple[str, ...]) -> StandbyZygote | None:
        """The pool's zygote, if it runs, has not failed, and imports what ``preload`` workers need."""
        z = self._zygote
        return z if z is not None and not self._zygote_unusable and set(preload) <= set(z.preload) else None

    def _fork_or_spawn(self, preload: tuple[str, ...]) -> WorkerProcess:
        z = self._usable_zygote(preload)
        if z is not None and z.serving:
            try:
                return self.spawn(z.preload, z.path)
            except zygote.ZygoteUnavailable as exc:
                logger.warning("%s; starting workers as fresh processes", exc)
                self._zygote_unusable = True
        return self.spawn(preload)

    def prewarm(self, n: int, preload: tuple[str, ...]) -> None:
        """Have ``n`` standby processes wait: forked by the pool's zygote (started now if need be) as
        soon as it serves, from a thread; or else started at once. Call from a long-lived thread:
        Linux ties a (fresh) child's parent-death signal to the thread that spawned it."""
        warm = _warm_modules(preload)
        if self._closed or (self._warmer is not None and self._warmer.is_alive()):
            return  # the warmer fills the list
        self._standby = [w for w in self._standby if w.proc.poll() is None]
        if len(self._standby) >= n:
            return
        self.start_zygote(preload)
        z = self._usable_zygote(warm)
        if z is not None:
            self._warmer = threading.Thread(target=self._fork_standbys, args=(z, n), name="trainforge-standby",
                                            daemon=True)  # fmt: skip
            self._warmer.start()
            return
        while len(self._standby) < n and not self._closed:
            self._standby.append(self.spawn(warm))

    def start_zygote(self, preload: tuple[str, ...]) -> None:
        """Start the pool's zygote (importing what standby workers for ``preload`` workers have) unless
        it runs, cannot, or the train server's zygote forks the workers. Started before the first group,
        it forks that group's workers too (acquire() waits for it): the first group's imports are then
        the zygote's, done once, and it serves standby workers from the first step on."""
        if self._zygote is not None or self._zygote_unusable or self._closed or self._env().get(ENV_ZYGOTE):
            return
        try:
            self._zygote = StandbyZygote(_warm_modules(preload), self._env())
            self._all_pids.append(self._zygote.pid)
        except OSError as exc:
            logger.warning("could not start a zygote for this run's workers (%s); starting them fresh", exc)
            self._zygote_unusable = True

    def _fork_standbys(self, z: StandbyZygote, n: int) -> None:
        """The warmer thread: once the zygote serves, fork standby workers until ``n`` wait."""
        if not z.wait_ready(constants.worker_start_timeout_s()):
            return  # not serving (yet): the next acquire() starts fresh processes
        while len(self._standby) < n and not self._closed:
            try:
                self._standby.append(self.spawn(z.preload, z.path))
            except (zygote.ZygoteUnavailable, OSError) as exc:
                if not self._closed:
                    logger.warning("%s; standby workers will be fresh processes", exc)
                    self._zygote_unusable = True
                return

    @property
    def standby_count(self) -> int:
        return len(self._standby)

    # -- connections ------------------------------------------------------------------------------
    def wait_connected(self, workers: list[WorkerProcess]) -> None:
        timeout = constants.worker_start_timeout_s()
        deadline = time.monotonic() + timeout
        while True:
            if self._listener.wait_for(
                lambda: all(w.conn is not None for w in workers)
                or any(w.conn is None and w.proc.poll() is not None for w in workers),
                max(0.0, deadline - time.monotonic()),
            ) and all(w.conn is not None for w in workers):
                for w in workers:
                    self._listener.forget(w.key)
                return
            for w in workers:
                if w.conn is None and w.proc.poll() is not None:
                    w.join_output(2.0)
                    raise WorkerStartError(
                        f"worker rank {w.rank} (pid {w.pid}) exited during start-up with exit code "
                        f"{w.proc.returncode}; last output:\n{''.join(w.tail)}"
                    )
            if time.monotonic() > deadline:
                missing = [w.rank for w in workers if w.conn is None]
                raise WorkerStartError(
                    f"workers {missing} did not connect within {timeout:.0f}s; raise "
                    f"${constants.ENV_START_TIMEOUT_S} if the machine is slow."
                )

    # -- cleanup ----------------------------------------------------------------------------------
    def _discard(self, w: WorkerProcess) -> None:
        signal_groups([w.pid], signal.SIGKILL)
        self._listener.forget(w.key)
        try:
            w.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover
            pass
        w.join_output(1.0)
        if w.conn is not None:
            w.conn.close()
        if w.ring is not None:
            w.ring.close()
        w.remove_stack_file_if_empty()

    def reap(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` (a stopped group's wait for its killed workers, bounded) in a thread that
        :meth:`close` joins."""
        self._reapers = [t for t in self._reapers if t.is_alive()]
        t = threading.Thread(target=fn, name="trainforge-reaper", daemon=True)
        t.start()
        self._reapers.append(t)

    def close(self) -> None:
        """Kill the standby processes, wait for the reaper, stop listening. Workers handed to groups
        are theirs."""
        self._closed = True
        if self._zygote is not None and not self._zygote.serving:
            self._zygote.kill()  # still importing: nothing forked from it, and the warmer stops waiting
        if self._warmer is not None:
            self._warmer.join()
        for t in self._reapers:
            t.join()
        self._reapers = []
        for w in self._standby:
            self._discard(w)
        self._standby = []
        if self._zygote is not None:
            self._zygote.close()  # after every worker it forked was reaped (their exit statuses come through it)
        self._listener.close()
        self._finalizer.detach()
        if self._tmp_dir is not None:
            shutil.rmtree(self._tmp_dir, ignore_errors=True)
