"""The worker side of the protocol: a local process (``python -m trainforge._internal.worker_group.worker_main``,
see :func:`main`) or a Ray actor (:func:`run_in_actor`) runs the same command loop.

The worker connects back to the driver's listener (address, auth key and its key given by the
driver), says ("hello", key, info), then serves commands:

    ("setup", sys_path, cwd, env)  join the run: the driver's sys.path and cwd, this rank's environment
    ("execute", call_id, blob)  run cloudpickled (fn, args, kwargs); reply ("result", call_id, ok, blob)
    ("train", blob)             run the train loop; replies ("report", ...)*, then ("done", n) or ("error", ...)
    ("stacks", id)              reply ("stacks", id, text): every thread's stack, from the reader thread
    ("stop",)                   end the train loop at its next report() (a clean end), from the reader thread
    ("exit",)                   flush and exit 0 (a Ray actor returns instead; the driver then kills it)

A reader thread owns ``recv``: if the driver goes away (EOF), the worker exits at once, so a killed
driver never leaves workers behind. ``send`` writes from the calling thread. A local worker's
reports go into a shared-memory ring instead of the socket (no system call, but one write to the
ring's wake-up eventfd when the driver had read everything before; see report_ring.py);
socket messages sent after ring records say so (``("after", ring_position, msg)``), so the driver
reads the ring up to there first and sees everything in the order it was sent.
Only the standard library and cloudpickle are imported before the user's code needs more.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import queue
import signal
import sys
import threading
import traceback
from typing import Any

from trainforge._internal.constants import (
    ENV_AUTHKEY,
    ENV_DRIVER_ADDR,
    ENV_REPORT_RING_FD,
    ENV_REPORT_WAKE_FD,
    ENV_STACK_FILE,
    ENV_WORKER_KEY,
)
from trainforge._internal.state_files import create, data_modes

STACK_SIGNAL = signal.SIGUSR1
_stack_file: Any = None



def _set_parent_death_signal() -> None:
    """Ask Linux to SIGKILL us when the driver dies (belt and braces beside the EOF watcher)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except Exception:
        pass


class _Channel:
    """A reader thread and a locked, synchronous send around one multiprocessing connection (and,
    for a local worker, its report ring).

    ``send`` writes from the calling thread: when it returns, the message is in the socket or the
    ring, so it reaches the driver even if this process is killed the next instant (a checkpoint
    every rank reported is never lost). A report costs a copy into shared memory (local workers) or
    one small write (Ray actors); the driver reads in batches.
    """

    def __init__(self, conn: Any, ring_fd: int | None = None, wake_fd: int | None = None):
        self.conn = conn
        self.commands: queue.SimpleQueue = queue.SimpleQueue()
        self._send_lock = threading.Lock()
        self.ring: Any = None
        if ring_fd is not None:
            from trainforge._internal.worker_group.report_ring import RingWriter

            self.ring = RingWriter(ring_fd, nudge=lambda: self._send_bytes(pickle.dumps(("drain",))), wake_fd=wake_fd)
            os.close(ring_fd)
        elif wake_fd is not None:
            os.close(wake_fd)
        self._closing = False
        self._reader = threading.Thread(target=self._read_loop, name="trainforge-reader", daemon=True)
        self._reader.start()

    def _read_loop(self) -> None:
        while True:
            try:
                data = self.conn.recv_bytes()
            except (EOFError, OSError):
                if self._closing:
                    return
                # The driver is gone: nobody can use our results, and we must not linger.
                os._exit(17)
            cmd = pickle.loads(data)
            if cmd[0] == "stacks":
                # Answered here, not by the main thread, which may be stuck (a hang is why we ask);
                # unordered, so it never waits for the ring's lock.
                self._send_bytes(pickle.dumps(("stacks", cmd[1], _all_stacks()), protocol=pickle.HIGHEST_PROTOCOL))
            elif cmd[0] == "stop":
                # Also here, not queued: the main thread is busy in the train loop, whose next
                # report() raises StopTraining (a clean end, as sys.exit(0)).
                from trainforge._internal.session import request_stop

                request_stop()
            else:
                self.commands.put(cmd)

    def send(self, msg: tuple, wait: bool = False) -> None:
        """Send ``msg`` now: when this returns, it reaches the driver even if this process dies the
        next instant (``wait`` is accepted for callers that need the guarantee; every send gives it).
        Metrics-only reports go into the ring when there is one (a record too big for it takes the
        socket; a record the driver finds in an empty ring wakes it). A report with a checkpoint takes
        the socket, in its place among the records: one socket write per checkpoint."""
        ring = self.ring
        if ring is None:
            self._send_bytes(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))
            return
        if msg[0] == "report" and not msg[3]:  # ("report", index, payload, has_checkpoint, time)
            data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
            if ring.fits(len(data)):
                ring.put(data)
                return
        # Through the socket, in its place: the driver reads the ring up to ``position`` before it,
        # and no record written after it (tagged with the new count) before it.
        with ring.lock:
            ring.tag += 1
            self._send_bytes(pickle.dumps(("after", ring.position, msg), protocol=pickle.HIGHEST_PROTOCOL))

    def _send_bytes(self, data: bytes) -> None:
        with self._send_lock:
            try:
                self.conn.send_bytes(data)
            except (EOFError, OSError):
                if self._closing:
                    return
                os._exit(17)

    def flush_and_close(self) -> None:
        self._closing = True
        self.conn.close()


def _all_stacks() -> str:
    """Every thread's Python stack, as faulthandler prints it (works while they are blocked in C)."""
    import tempfile

    with tempfile.TemporaryFile("w+") as f:
        faulthandler.dump_traceback(file=f, all_threads=True)
        f.seek(0)
        return f.read()


def _format_exception(exc: BaseException) -> tuple[str, str, str]:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return type(exc).__name__, str(exc), tb


def _run_execute(channel: _Channel, call_id: int, blob: bytes) -> None:
    import cloudpickle

    try:
        fn, args, kwargs = cloudpickle.loads(blob)
        value = fn(*args, **kwargs)
        channel.send(("result", call_id, True, cloudpickle.dumps(value)))
    except BaseException as exc:  # noqa: BLE001 - reported to the driver
        channel.send(("result", call_id, False, _format_exception(exc)))


def _raised_by_ray(exc: BaseException) -> bool:
    """A SystemExit Ray raised in this (actor) process to end it, as it does when the node's raylet
    dies: the train loop did not fail, the worker is being taken away."""
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == "raise_sys_exit_with_custom_error_message" or code.co_filename.endswith("_raylet.pyx"):
            return True
        tb = tb.tb_next
    return False


def _run_training(channel: _Channel, blob: bytes) -> bool:
    """Run the train loop; return True on success."""
    from trainforge._internal.train_fn import run_train_payload

    try:
        count = run_train_payload(blob, channel.send)
    except BaseException as exc:  # noqa: BLE001 - reported to the driver
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            channel.send(("done", -1))
            return True
        if isinstance(exc, SystemExit) and _raised_by_ray(exc):
            raise  # Ray tears this worker down (its node's raylet is gone): its verdict, not ours, says why
        channel.send(("error",) + _format_exception(exc))
        return False
    channel.send(("done", count))
    return True


def connect(address: str, authkey: bytes, key: str, info: dict[str, Any], ring_fd: int | None = None,
            wake_fd: int | None = None) -> _Channel:  # fmt: skip
    """Connect to the driver's listener at ``address`` ("host:port") and say hello."""
    from multiprocessing.connection import Client

    from trainforge._internal.worker_group.listener import no_delay

    host, port = address.rsplit(":", 1)
    conn = Client((host, int(port)), authkey=authkey)
    no_delay(conn)
    channel = _Channel(conn, ring_fd, wake_fd)
    channel._send_bytes(pickle.dumps(("hello", key, info), protocol=pickle.HIGHEST_PROTOCOL))
    return channel


def _preload(modules: Any) -> None:
    for module in modules:
        try:
            __import__(module)
        except ImportError:
            pass


def serve(channel: _Channel) -> None:
    """The command loop; returns after the "exit" command, once everything queued was sent."""
    while True:
        cmd = channel.commands.get()
        kind = cmd[0]
        if kind == "setup":
            # Rank, world size, devices: a standby worker learns them only now.
            _, sys_path, cwd, env = cmd
            os.environ.update(env)
            for p in reversed(sys_path):
                if p not in sys.path:
                    sys.path.insert(0, p)
            try:
                os.chdir(cwd)
            except OSError:
                pass
        elif kind == "execute":
            _run_execute(channel, cmd[1], cmd[2])
        elif kind == "train":
            _run_training(channel, cmd[1])
        elif kind == "exit":
            sys.stdout.flush()
            sys.stderr.flush()
            channel.flush_and_close()
            return


def main() -> int:
    """A local worker process: the driver's address, auth key and our key are in the environment."""
    _set_parent_death_signal()
    faulthandler.enable()  # a segfault prints the Python stack to stderr (streamed to the driver)
    stack_path = os.environ.get(ENV_STACK_FILE)
    if stack_path:
        # SIGUSR1 dumps every thread's stack into this file, even while the main thread is blocked
        # in C code (a collective, a lock): the driver uses it to show where a hung worker is.
        global _stack_file
        _stack_file = create(stack_path, "a", data_modes().file)  # lives as long as the process
        faulthandler.register(STACK_SIGNAL, file=_stack_file, all_threads=True, chain=False)
    # Stop cleanly on SIGTERM: raise in the main thread so `finally` blocks and atexit run.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    authkey = bytes.fromhex(os.environ.pop(ENV_AUTHKEY))
    ring_fd = os.environ.pop(ENV_REPORT_RING_FD, None)
    wake_fd = os.environ.pop(ENV_REPORT_WAKE_FD, None)
    channel = connect(os.environ[ENV_DRIVER_ADDR], authkey, os.environ.pop(ENV_WORKER_KEY), {"pid": os.getpid()},
                      int(ring_fd) if ring_fd else None, int(wake_fd) if wake_fd else None)  # fmt: skip
    _preload(filter(None, os.environ.get("TRAINFORGE_WORKER_PRELOAD", "").split(",")))
    serve(channel)
    # Run the user's atexit handlers, then skip the interpreter's module teardown, which takes up to
    # a second with torch loaded and does nothing useful here.
    import atexit

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _redirect_output(address: str, authkey: bytes, key: str) -> dict[int, int]:
    """Make fds 1 and 2 sockets to the driver (one each), which prints and logs what arrives with
    this rank's prefix. Writes land in the kernel at once, so nothing is lost if we die. Returns the
    saved original fds."""
    from multiprocessing.connection import Client

    host, port = address.rsplit(":", 1)
    saved: dict[int, int] = {}
    for fd, target, stream in ((1, "stdout", sys.stdout), (2, "stderr", sys.stderr)):
        conn = Client((host, int(port)), authkey=authkey)
        conn.send_bytes(pickle.dumps(("output", key, target), protocol=pickle.HIGHEST_PROTOCOL))
        stream.flush()
        saved[fd] = os.dup(fd)
        os.dup2(conn.fileno(), fd)
        conn.close()
    return saved


def _restore_output(saved: dict[int, int]) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, original in saved.items():
        os.dup2(original, fd)  # the socket's last reference goes: the driver sees the end of the stream
        os.close(original)


def run_in_actor(address: str, authkey: bytes, key: str, env: dict[str, str], preload: tuple[str, ...],
                 info: dict[str, Any]) -> None:  # fmt: skip
    """A Ray actor's long-running method: the same protocol as a local worker, from inside Ray's worker
    process (its stdout/stderr redirected to the driver); returns after the "exit" command."""
    os.environ.update(env)
    saved = _redirect_output(address, authkey, key)
    try:
        faulthandler.enable()  # a segfault's Python stack goes to fd 2, i.e. to the driver
        channel = connect(address, authkey, key, {"pid": os.getpid(), **info})
        _preload(preload)
        serve(channel)
    finally:
        _restore_output(saved)


if __name__ == "__main__":
    sys.exit(main())
