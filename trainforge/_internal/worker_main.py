"""Entry point of a local worker process: ``python -m trainforge._internal.worker_main``.

The worker connects back to the driver over a loopback socket (address and auth key in the
environment), then serves commands:

    ("setup", sys_path, cwd, env)  join the run: the driver's sys.path and cwd, this rank's environment
    ("execute", call_id, blob)  run cloudpickled (fn, args, kwargs); reply ("result", call_id, ok, blob)
    ("train", blob)             run the train loop; replies ("report", ...)*, then ("done", n) or ("error", ...)
    ("exit",)                   flush and exit 0

A reader thread owns ``recv``: if the driver goes away (EOF), the worker exits at once, so a killed
driver never leaves workers behind. A sender thread owns ``send``, so ``report`` only queues.
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

ENV_DRIVER_ADDR = "TRAINFORGE_DRIVER_ADDR"
ENV_AUTHKEY = "TRAINFORGE_AUTHKEY"
ENV_STACK_FILE = "TRAINFORGE_STACK_FILE"
STACK_SIGNAL = signal.SIGUSR1
_stack_file: Any = None

_STOP = object()
BATCH_LINGER_S = 0.05


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
    """Reader and sender threads around one multiprocessing connection."""

    def __init__(self, conn: Any):
        self.conn = conn
        self.commands: queue.SimpleQueue = queue.SimpleQueue()
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._urgent = threading.Event()
        self._reader = threading.Thread(target=self._read_loop, name="trainforge-reader", daemon=True)
        self._sender = threading.Thread(target=self._send_loop, name="trainforge-sender", daemon=True)
        self._reader.start()
        self._sender.start()

    def _read_loop(self) -> None:
        while True:
            try:
                data = self.conn.recv_bytes()
            except (EOFError, OSError):
                # The driver is gone: nobody can use our results, and we must not linger.
                os._exit(17)
            self.commands.put(pickle.loads(data))

    def _send_loop(self) -> None:
        while True:
            first = self._outbox.get()
            if first is _STOP:
                return
            batch = [first]
            if first[1] is None and first[0][0] == "report":
                # Metrics-only reports wait up to BATCH_LINGER_S for company: one socket write and one
                # driver wake-up per batch instead of per report. Anything urgent cuts this short.
                self._urgent.wait(BATCH_LINGER_S)
            self._urgent.clear()
            stop = False
            while True:
                try:
                    item = self._outbox.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    stop = True
                    break
                batch.append(item)
            msgs = [msg for msg, _ in batch]
            try:
                payload = msgs[0] if len(msgs) == 1 else ("batch", msgs)
                self.conn.send_bytes(pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL))
            except (EOFError, OSError):
                os._exit(17)
            for _, sent in batch:
                if sent is not None:
                    sent.set()
            if stop:
                return

    def send(self, msg: tuple, wait: bool = False) -> None:
        """Queue ``msg``. Metrics-only reports may be held back up to BATCH_LINGER_S and sent in a
        batch; everything else goes out at once. With ``wait``, return only once the message is in
        the socket (so it reaches the driver even if this process is killed right after)."""
        sent = threading.Event() if wait else None
        self._outbox.put((msg, sent))
        if wait or msg[0] != "report":
            self._urgent.set()
        if sent is not None:
            sent.wait()

    def flush_and_close(self) -> None:
        self._outbox.put(_STOP)
        self._urgent.set()
        self._sender.join(timeout=30)


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


def _run_training(channel: _Channel, blob: bytes) -> bool:
    """Run the train loop; return True on success."""
    from trainforge._internal.train_fn import run_train_payload

    try:
        count = run_train_payload(blob, channel.send)
    except BaseException as exc:  # noqa: BLE001 - reported to the driver
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            channel.send(("done", -1))
            return True
        channel.send(("error",) + _format_exception(exc))
        return False
    channel.send(("done", count))
    return True


def main() -> int:
    _set_parent_death_signal()
    faulthandler.enable()  # a segfault prints the Python stack to stderr (streamed to the driver)
    stack_path = os.environ.get(ENV_STACK_FILE)
    if stack_path:
        # SIGUSR1 dumps every thread's stack into this file, even while the main thread is blocked
        # in C code (a collective, a lock): the driver uses it to show where a hung worker is.
        global _stack_file
        _stack_file = open(stack_path, "a")  # noqa: SIM115 - lives as long as the process
        faulthandler.register(STACK_SIGNAL, file=_stack_file, all_threads=True, chain=False)
    # Stop cleanly on SIGTERM: raise in the main thread so `finally` blocks and atexit run.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from multiprocessing.connection import Client

    host, port = os.environ[ENV_DRIVER_ADDR].rsplit(":", 1)
    authkey = bytes.fromhex(os.environ.pop(ENV_AUTHKEY))
    conn = Client((host, int(port)), authkey=authkey)
    channel = _Channel(conn)
    channel.send(("hello", os.getpid()))

    for module in filter(None, os.environ.get("TRAINFORGE_WORKER_PRELOAD", "").split(",")):
        try:
            __import__(module)
        except ImportError:
            pass

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
            # Run the user's atexit handlers, then skip the interpreter's module teardown, which
            # takes up to a second with torch loaded and does nothing useful here.
            import atexit

            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
            channel.flush_and_close()
            os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
