"""The driver's end of the worker connections: one authenticated TCP listener per run.

Every worker, local process or Ray actor, connects back to it (``multiprocessing.connection`` with a
random 32-byte auth key) and announces itself with the key the driver gave it:

    ("hello", key, info)          the control connection: commands and replies (see worker_main)
    ("output", key, "stdout")     a raw byte stream: the socket becomes the worker's fd 1 (Ray actors)
    ("output", key, "stderr")     likewise for fd 2

Local workers send their output through pipes instead (they are our children); Ray actors may run
on other machines, so their fds 1 and 2 are these sockets. What a process wrote is in the kernel's
socket buffer at once, so the last lines of a worker that segfaults or is SIGKILLed still arrive.
"""

from __future__ import annotations

import os
import pickle
import secrets
import socket
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, Listener
from typing import IO, Any

OnHello = Callable[[Connection, dict[str, Any]], None]
OnOutput = Callable[[str, IO[bytes]], None]


class WorkerListener:
    """Accepts worker connections on ``(host, 0)`` and hands each one to the worker whose key it names.
    ``changed`` is notified after every accepted connection (wait on it for workers to connect)."""

    def __init__(self, host: str = "127.0.0.1"):
        self.authkey = secrets.token_bytes(32)
        self._listener = Listener((host, 0), authkey=self.authkey, backlog=128)
        self._expected: dict[str, tuple[OnHello, OnOutput | None]] = {}
        self.changed = threading.Condition()
        self._closed = False
        threading.Thread(target=self._accept_loop, name="trainforge-accept", daemon=True).start()

    @property
    def address(self) -> str:
        host, port = self._listener.address
        return f"{host}:{port}"

    def new_key(self) -> str:
        return secrets.token_hex(8)

    def expect(self, key: str, on_hello: OnHello, on_output: OnOutput | None = None) -> None:
        with self.changed:
            self._expected[key] = (on_hello, on_output)

    def forget(self, key: str) -> None:
        with self.changed:
            self._expected.pop(key, None)

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``predicate()`` (checked after each connection and every 50 ms) or the timeout."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(min(left, 0.05))
        return True

    def _accept_loop(self) -> None:
        while True:
            try:
                conn = self._listener.accept()
                msg = pickle.loads(conn.recv_bytes())
            except Exception:  # listener closed, or a bad/aborted handshake
                if self._closed:
                    return
                continue
            with self.changed:
                handlers = self._expected.get(msg[1]) if isinstance(msg, tuple) and len(msg) >= 3 else None
                if handlers is None:
                    conn.close()
                    continue
                on_hello, on_output = handlers
                if msg[0] == "hello":
                    no_delay(conn)
                    on_hello(conn, dict(msg[2]))
                elif msg[0] == "output" and on_output is not None and msg[2] in ("stdout", "stderr"):
                    stream = os.fdopen(os.dup(conn.fileno()), "rb")
                    conn.close()
                    on_output(msg[2], stream)
                else:
                    conn.close()
                self.changed.notify_all()

    def close(self) -> None:
        """Stop listening. A connection of our own wakes the accept thread, which then sees
        ``_closed`` and ends (closing the socket alone does not wake a blocked ``accept``)."""
        self._closed = True
        host, port = self._listener.address
        try:
            socket.create_connection((host, port), timeout=1.0).close()
        except OSError:
            pass
        self._listener.close()


def no_delay(conn: Connection) -> None:
    """Send small messages at once on a control connection (both ends set it): with Nagle's
    algorithm, a message that follows one the other end does not answer (the driver's "setup", then
    "execute"; a Ray worker's report, then its "done") waits for the peer's delayed ACK, 40 ms."""
    try:
        with socket.socket(fileno=os.dup(conn.fileno())) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass
