"""The zygote's server loop: it listens on its Unix socket, forks a child per request (the child's
set-up is :mod:`~trainforge._internal.zygote.child`'s), reports each child's exit status, and learns
the modules its children import.

Learning: a request names modules its child will import (``preload``); the zygote imports the ones
it lacks once it has been idle for :data:`LEARN_IDLE_S` (never while a request waits), and appends
them to the ``--learn`` file, so the next zygote (after a server restart) starts with them.

Lifetime: the zygote's stdin is a pipe from the server. When it closes (the server exited or was
killed) the zygote stops listening and exits once its last child has ended: the children of a job
that outlives a server crash still get their exit statuses through it.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import socket
import struct
import sys
import time
import traceback
from typing import Any

from trainforge._internal.state_files import open_append
from trainforge._internal.zygote.child import become, startup_difference
from trainforge._internal.zygote.launcher import TMP_PREFIX
from trainforge._internal.zygote.mark import check_marking, mark_address
from trainforge._internal.zygote.protocol import (
    MAX_CHANNEL_REQUEST,
    MAX_REQUEST,
    PID,
    SpawnRequest,
    recv_exact,
)

LEARN_IDLE_S = 1.0


class Zygote:
    """One zygote process's server: :meth:`serve` runs until the server is gone and every child has
    ended; returns the process's exit code."""

    def __init__(self, path: str, learn_file: str | None, ready_fd: int | None = None):
        self.path = path
        self.ready_fd = ready_fd
        self.learn_file = learn_file
        self.mark = mark_address()
        self.children: dict[int, socket.socket] = {}
        self.channels: dict[socket.socket, str] = {}  # a sandboxed job's channel -> its sandbox plan (JSON)
        self.to_learn: list[str] = []
        self.listener: socket.socket | None = None
        self.wake_r, self.wake_w = os.pipe()

    def serve(self) -> int:
        problem = check_marking(self.mark)
        if problem is not None:
            print(f"trainforge zygote: cannot mark its children's environment ({problem}); not serving",
                  file=sys.stderr, flush=True)  # fmt: skip
            return 3
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server's Ctrl-C is not ours; EOF on stdin is
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        listener = self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            listener.bind(self.path)
        finally:
            os.umask(old_umask)
        listener.listen(128)
        print(f"trainforge zygote: ready at {self.path} (pid {os.getpid()})", flush=True)
        if self.ready_fd is not None:
            os.write(self.ready_fd, f"ready {os.getpid()}\n".encode())
            os.close(self.ready_fd)
        server_alive = True
        idle_since = time.monotonic()
        while server_alive or self.children:
            watch: list[Any] = [self.wake_r, *self.channels]
            if server_alive:
                watch += [listener, sys.stdin]
            timeout = LEARN_IDLE_S if self.to_learn else None
            ready, _, _ = select.select(watch, [], [], timeout)
            if self.wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(self.wake_r, 4096)
            self._reap()
            if server_alive and sys.stdin in ready and not os.read(sys.stdin.fileno(), 4096):
                server_alive = False  # the server is gone: serve no one new, stay for our children
                listener.close()
                self._remove_socket()
            for channel in [c for c in ready if c in self.channels]:
                self._accept_channel(channel)
            if server_alive and listener in ready:
                self._accept(listener)
                idle_since = time.monotonic()
            elif self.to_learn and time.monotonic() - idle_since >= LEARN_IDLE_S:
                self._learn()
        return 0

    def _remove_socket(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        parent = os.path.dirname(self.path)
        if os.path.basename(parent).startswith(TMP_PREFIX):  # socket_path()'s private directory
            with contextlib.suppress(OSError):
                os.rmdir(parent)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.sendall(PID.pack(os.waitstatus_to_exitcode(status)))
                conn.close()

    def _accept(self, listener: socket.socket) -> None:
        """A request on the zygote's socket: the server's (its uid only), pickled, fds attached."""
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        fds: list[int] = []
        request: SpawnRequest | None = None
        problem: Exception | None = None
        try:
            _, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
            if uid != os.getuid():
                raise PermissionError(f"a process of uid {uid} asked; only uid {os.getuid()} may")
            conn.settimeout(10.0)
            head, fds, _, _ = socket.recv_fds(conn, PID.size, 16)
            if len(head) < PID.size:
                head += recv_exact(conn, PID.size - len(head))
            size = PID.unpack(head)[0]
            if not 0 < size <= MAX_REQUEST:
                raise ValueError(f"bad request size {size}")
            request = pickle.loads(recv_exact(conn, size))
        except Exception as exc:  # a broken client must not take the zygote down
            problem = exc
        if self._serve(conn, fds, request, problem, "bad request") and request is not None:
            for module in request.preload:  # learned from the server's requests only, never a job's
                if module not in sys.modules and module not in self.to_learn:
                    self.to_learn.append(module)

    def _accept_channel(self, channel: socket.socket) -> None:
        """One request on a sandboxed job's channel (JSON, the child's connection attached first):
        forked into the channel's plan, whatever it asks. A closed channel (its runner ended) is dropped."""
        try:
            data, fds, flags, _ = socket.recv_fds(channel, MAX_CHANNEL_REQUEST, 16)
        except OSError:
            data, fds, flags = b"", [], 0
        if not data and not fds:
            self.channels.pop(channel, None)
            channel.close()
            return
        if not fds:
            print("trainforge zygote: a job channel's request with no connection attached", file=sys.stderr, flush=True)
            return
        conn = socket.socket(fileno=fds.pop(0))
        request: SpawnRequest | None = None
        problem: Exception | None = None
        try:
            if flags & socket.MSG_TRUNC:
                raise ValueError(f"a request over {MAX_CHANNEL_REQUEST} bytes")
            request = SpawnRequest.from_json(data, self.channels[channel])
        except Exception as exc:  # a job's bad request: refused, the zygote goes on
            problem = exc
        self._serve(conn, fds, request, problem, "bad request on a job channel")

    def _serve(self, conn: socket.socket, fds: list[int], request: SpawnRequest | None, problem: Exception | None,
               what: str) -> bool:  # fmt: skip
        """Answer one request on ``conn``: refused (a ``problem`` reading it, or an environment a fork
        cannot have), or forked, the child then counted as ours. The attached ``fds`` are closed here
        (the child has its copies). True if it forked."""
        try:
            if problem is not None or request is None:
                raise problem or ValueError("no request")
            refused = startup_difference(request.env)
            if refused is not None:
                conn.sendall(PID.pack(0) + PID.pack(len(refused.encode())) + refused.encode())
                conn.close()
                return False
            pid = self._fork(request, fds, conn)
        except Exception as exc:  # a broken client must not take the zygote down
            print(f"trainforge zygote: {what}: {exc!r}", file=sys.stderr, flush=True)
            with contextlib.suppress(OSError):
                conn.sendall(PID.pack(-1))
            conn.close()
            return False
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        conn.settimeout(None)
        self.children[pid] = conn
        conn.sendall(PID.pack(pid))
        return True

    def _learn(self) -> None:
        learned = []
        for module in self.to_learn:
            try:
                __import__(module)
                learned.append(module)
            except Exception:  # noqa: BLE001 - a module the child could not import either
                pass
        self.to_learn = []
        if learned and self.learn_file:
            with contextlib.suppress(OSError), open_append(self.learn_file, "utf-8") as f:
                f.write("".join(m + "\n" for m in learned))

    def _fork(self, request: SpawnRequest, fds: list[int], conn: socket.socket) -> int:
        """Fork the child; return its pid once it is marked (its environment block and command line
        say whose it is), so that whoever looks for the job's processes from then on finds it."""
        marked_r, marked_w = os.pipe()
        channel = child_channel = None
        if request.channel and request.sandbox:
            channel, child_channel = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid:
            os.close(marked_w)
            if channel is not None and child_channel is not None:
                child_channel.close()
                self.channels[channel] = request.sandbox or ""
            try:
                ready, _, _ = select.select([marked_r], [], [], 10.0)
                if ready:
                    os.read(marked_r, 1)
            finally:
                os.close(marked_r)
            return pid
        code = 1
        os.close(marked_r)
        try:  # the child: nothing here may return into the zygote's loop
            ours = [conn, *([self.listener] if self.listener is not None else []), *self.children.values(),
                    *self.channels, *([channel] if channel is not None else [])]  # fmt: skip
            code = become(request, fds, marked_w, self.mark, ours, [self.wake_r, self.wake_w],
                          channel=child_channel)  # fmt: skip
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:  # noqa: BLE001 - shown on the child's stderr
            traceback.print_exc()
            code = 1
        finally:
            with contextlib.suppress(BaseException):
                import atexit

                atexit._run_exitfuncs()
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(BaseException):
                    stream.flush()
            os._exit(code if isinstance(code, int) else 1)
