"""The zygote's client side: :func:`spawn` asks a zygote to fork a process; :class:`ZygoteChild` is
that process, with the parts of :class:`subprocess.Popen`'s interface the worker pool and the
server use."""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import socket
import subprocess
import threading
from typing import Any

from trainforge._internal.zygote.protocol import (
    CHANNEL_PREFIX,
    MAX_CHANNEL_REQUEST,
    PID,
    SpawnRequest,
    recv_exact,
)


class ZygoteUnavailable(OSError):
    """No zygote answers at the socket (or it refused): start the process the usual way."""


class ZygoteChild:
    """A process forked by the zygote, with the parts of :class:`subprocess.Popen`'s interface the
    worker pool and the server use. Thread-safe."""

    def __init__(self, sock: socket.socket, pid: int, args: list[str]):
        self._sock = sock
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self._lock = threading.Lock()
        self.stdout: Any = None
        self.stderr: Any = None

    def _read_status(self, timeout: float | None) -> bool:
        with self._lock:
            if self.returncode is not None:
                return True
            ready, _, _ = select.select([self._sock], [], [], timeout)
            if not ready:
                return False
            data = b""
            with contextlib.suppress(OSError):
                data = recv_exact(self._sock, PID.size)
            # A zygote that died first cannot say: count the child as killed (its parent-death signal).
            self.returncode = PID.unpack(data)[0] if len(data) == PID.size else -signal.SIGKILL
            self._sock.close()
            return True

    def poll(self) -> int | None:
        self._read_status(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._read_status(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def spawn(path: str, request: SpawnRequest, fds: list[int], timeout: float = 10.0) -> ZygoteChild:
    """Ask the zygote at ``path`` to fork ``request``; ZygoteUnavailable if it cannot. ``path``
    ``fd:N`` is a sandboxed job's channel (see the protocol module)."""
    if path.startswith(CHANNEL_PREFIX):
        return _spawn_by_channel(path, request, fds, timeout)
    blob = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
        socket.send_fds(sock, [PID.pack(len(blob))], fds)
        sock.sendall(blob)
        data = recv_exact(sock, PID.size)
        sock.settimeout(None)
    except OSError as exc:
        sock.close()
        raise ZygoteUnavailable(f"the zygote at {path} did not fork: {exc}") from exc
    return _started(sock, data, path, request)


def _spawn_by_channel(path: str, request: SpawnRequest, fds: list[int], timeout: float) -> ZygoteChild:
    """Fork ``request`` through the job channel ``fd:N``: one message, the request as JSON with the
    child's connection (a new socket pair: we keep one end) first among the attached fds."""
    blob = request.to_json()
    if len(blob) > MAX_CHANNEL_REQUEST:
        raise ZygoteUnavailable(f"a request of {len(blob)} bytes does not fit the job channel ({MAX_CHANNEL_REQUEST})")
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with socket.socket(fileno=os.dup(int(path[len(CHANNEL_PREFIX):]))) as channel:  # a copy: ours to close
            socket.send_fds(channel, [blob], [theirs.fileno(), *fds])
        theirs.close()
        mine.settimeout(timeout)
        data = recv_exact(mine, PID.size)
        mine.settimeout(None)
    except (OSError, ValueError) as exc:
        mine.close()
        theirs.close()
        raise ZygoteUnavailable(f"the job's zygote channel ({path}) did not fork: {exc}") from exc
    return _started(mine, data, path, request)


def _started(sock: socket.socket, data: bytes, path: str, request: SpawnRequest) -> ZygoteChild:
    """The child whose pid the zygote answered with (``data``), or ZygoteUnavailable with its reason."""
    if len(data) != PID.size:
        sock.close()
        raise ZygoteUnavailable(f"the zygote at {path} closed the connection")
    pid = PID.unpack(data)[0]
    if pid == 0:  # refused, with the reason
        size = PID.unpack(recv_exact(sock, PID.size))[0]
        reason = recv_exact(sock, size).decode(errors="replace")
        sock.close()
        raise ZygoteUnavailable(f"the zygote at {path} cannot fork this process: {reason}")
    if pid < 0:
        sock.close()
        raise ZygoteUnavailable(f"the zygote at {path} could not fork (errno {-pid})")
    return ZygoteChild(sock, pid, [request.target, *map(str, request.args)])
