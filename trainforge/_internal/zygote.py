"""A warm fork server: one process that has imported trainforge (and what earlier jobs needed, torch
for instance) forks a train-server job's runner and its local workers, instead of each starting a
fresh interpreter and importing everything again.

    python -m trainforge._internal.zygote SOCKET_PATH [--preload a,b] [--learn FILE]

The train server starts one (``trainforge server start``; ``--no-warm`` turns it off) and gives its
jobs ``$TRAINFORGE_ZYGOTE=SOCKET_PATH``; :class:`~trainforge._internal.worker_group.local_pool.
LocalProcessPool` then asks it for its worker processes. Without the variable nothing changes.

Protocol, one Unix-socket connection per child: the client sends one pickled :class:`SpawnRequest`
with the file descriptors the child gets (stdin, stdout, stderr, a report ring) attached
(``SCM_RIGHTS``); the zygote forks and replies the child's pid (8 bytes), then, when the child ends,
its exit status as :class:`subprocess.Popen` reports it (8 bytes, negative for a signal) and closes
the connection. :class:`ZygoteChild` is that connection, with Popen's ``pid``/``poll``/``wait``/
``returncode``/``send_signal``/``kill``.

The child is what ``python -m module`` would have been, as far as the job can tell: its own
environment, working directory, ``sys.argv``, fds 0-2 and the requested extra fds, default signal
handlers, its own session if asked, torch's thread count from ``$OMP_NUM_THREADS``. One thing a fork
cannot change is the environment block ``/proc/PID/environ`` shows (the one the process was
``exec``'d with), which is how the server finds every process of a job. So the zygote is started with
a placeholder variable (:data:`MARK_VAR`) whose bytes the child overwrites in place with the job's
identifying variables (``TRAINFORGE_JOB_ID=...``, ``TRAINFORGE_SERVER_ID=...``); a zygote that
cannot do that (checked at start) refuses to serve, and the server falls back to fresh processes.
Processes the child forks inherit the marked block; processes it ``exec``s get its real environment.

Learning: a request names modules its child will import (``preload``); the zygote imports the ones
it lacks once it has been idle for :data:`LEARN_IDLE_S` (never while a request waits), and appends
them to the ``--learn`` file, so the next zygote (after a server restart) starts with them.

Lifetime: the zygote's stdin is a pipe from the server. When it closes (the server exited or was
killed) the zygote stops listening and exits once its last child has ended: the children of a job
that outlives a server crash still get their exit statuses through it.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from typing import Any

from trainforge._internal.state_files import open_append

ENV_ZYGOTE = "TRAINFORGE_ZYGOTE"  # a job's zygote socket: its local workers are forked from it
MARK_VAR = "TRAINFORGE_ZYGOTE_MARK"
MARK_LEN = 240  # room for the identifying variables of a job (job id, server id)
_PAD_VAR = "TRAINFORGE_PAD"
LEARN_IDLE_S = 1.0
_PID = struct.Struct("!q")
_MAX_REQUEST = 1 << 20


@dataclasses.dataclass
class SpawnRequest:
    """What to run in the forked child: ``module:function`` called with ``args``; its return value
    (or SystemExit's code) is the exit code. ``fds`` maps each child fd number to the index of an
    attached descriptor. ``mark``: variable names (present in ``env``) that ``/proc/PID/environ``
    must show. ``watch_pid``: the child kills its process group when that process ends (the
    parent-death signal a worker gets from its real parent)."""

    target: str
    args: list[Any]
    env: dict[str, str]
    cwd: str
    fds: dict[int, int]
    new_session: bool = True
    mark: tuple[str, ...] = ()
    watch_pid: int | None = None
    preload: tuple[str, ...] = ()


# -- client side --------------------------------------------------------------------------------------
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
                data = _recv_exact(self._sock, _PID.size)
            # A zygote that died first cannot say: count the child as killed (its parent-death signal).
            self.returncode = _PID.unpack(data)[0] if len(data) == _PID.size else -signal.SIGKILL
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
    """Ask the zygote at ``path`` to fork ``request``; ZygoteUnavailable if it cannot."""
    blob = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
        socket.send_fds(sock, [_PID.pack(len(blob))], fds)
        sock.sendall(blob)
        data = _recv_exact(sock, _PID.size)
        sock.settimeout(None)
    except OSError as exc:
        sock.close()
        raise ZygoteUnavailable(f"the zygote at {path} did not fork: {exc}") from exc
    if len(data) != _PID.size:
        sock.close()
        raise ZygoteUnavailable(f"the zygote at {path} closed the connection")
    pid = _PID.unpack(data)[0]
    if pid == 0:  # refused, with the reason
        size = _PID.unpack(_recv_exact(sock, _PID.size))[0]
        reason = _recv_exact(sock, size).decode(errors="replace")
        sock.close()
        raise ZygoteUnavailable(f"the zygote at {path} cannot fork this process: {reason}")
    if pid < 0:
        sock.close()
        raise ZygoteUnavailable(f"the zygote at {path} could not fork (errno {-pid})")
    return ZygoteChild(sock, pid, [request.target, *map(str, request.args)])


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


# -- the environment mark -------------------------------------------------------------------------
def _mark_address() -> tuple[int, int] | None:
    """Where the placeholder's bytes are in our exec-time environment block: (address, length)."""
    libc = ctypes.CDLL(None)
    environ = ctypes.POINTER(ctypes.c_void_p).in_dll(libc, "environ")
    prefix = f"{MARK_VAR}=".encode()
    i = 0
    while environ[i]:
        addr = environ[i]
        if ctypes.string_at(addr, len(prefix)) == prefix:
            length = len(ctypes.string_at(addr))
            return (addr, length) if length >= len(prefix) + MARK_LEN else None
        i += 1
    return None


def _mark_bytes(pairs: list[tuple[str, str]], length: int) -> bytes | None:
    body = b"".join(f"{k}={v}".encode() + b"\0" for k, v in pairs)
    pad = length - len(body) - len(_PAD_VAR) - 1
    return None if pad < 0 else body + f"{_PAD_VAR}=".encode() + b"#" * pad


def _write_mark(where: tuple[int, int], pairs: list[tuple[str, str]]) -> bool:
    data = _mark_bytes(pairs, where[1])
    if data is None:
        return False
    ctypes.memmove(where[0], data, len(data))
    return True


def _proc_environ() -> dict[str, str]:
    with open("/proc/self/environ", "rb") as f:
        entries = f.read().split(b"\0")
    return dict(e.decode(errors="replace").split("=", 1) for e in entries if b"=" in e)


def _check_marking(where: tuple[int, int] | None) -> str | None:
    """None if writing the placeholder in place shows in /proc/self/environ; else why not."""
    if where is None:
        return f"${MARK_VAR} is missing or shorter than {MARK_LEN} characters"
    original = ctypes.string_at(where[0], where[1])
    try:
        if not _write_mark(where, [("TRAINFORGE_MARK_CHECK", "1")]):
            return "the placeholder is too short"
        if _proc_environ().get("TRAINFORGE_MARK_CHECK") != "1":
            return "/proc/self/environ does not show the rewritten environment"
    except OSError as exc:
        return f"cannot read /proc/self/environ: {exc}"
    finally:
        ctypes.memmove(where[0], original, len(original))
    return None


# -- server side ----------------------------------------------------------------------------------
class _Zygote:
    def __init__(self, path: str, learn_file: str | None, ready_fd: int | None = None):
        self.path = path
        self.ready_fd = ready_fd
        self.learn_file = learn_file
        self.mark = _mark_address()
        self.children: dict[int, socket.socket] = {}
        self.to_learn: list[str] = []
        self.listener: socket.socket | None = None
        self.wake_r, self.wake_w = os.pipe()

    def serve(self) -> int:
        problem = _check_marking(self.mark)
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
            watch: list[Any] = [self.wake_r]
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
        if os.path.basename(parent).startswith(_TMP_PREFIX):  # socket_path()'s private directory
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
                    conn.sendall(_PID.pack(os.waitstatus_to_exitcode(status)))
                conn.close()

    def _accept(self, listener: socket.socket) -> None:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        fds: list[int] = []
        try:
            _, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
            if uid != os.getuid():
                raise PermissionError(f"a process of uid {uid} asked; only uid {os.getuid()} may")
            conn.settimeout(10.0)
            head, fds, _, _ = socket.recv_fds(conn, _PID.size, 16)
            if len(head) < _PID.size:
                head += _recv_exact(conn, _PID.size - len(head))
            size = _PID.unpack(head)[0]
            if not 0 < size <= _MAX_REQUEST:
                raise ValueError(f"bad request size {size}")
            request: SpawnRequest = pickle.loads(_recv_exact(conn, size))
            refused = _startup_difference(request.env)
            if refused is not None:
                conn.sendall(_PID.pack(0) + _PID.pack(len(refused.encode())) + refused.encode())
                conn.close()
                return
            pid = self._fork(request, fds, conn)
        except Exception as exc:  # a broken client must not take the zygote down
            print(f"trainforge zygote: bad request: {exc!r}", file=sys.stderr, flush=True)
            with contextlib.suppress(OSError):
                conn.sendall(_PID.pack(-1))
            conn.close()
            return
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        conn.settimeout(None)
        self.children[pid] = conn
        conn.sendall(_PID.pack(pid))
        for module in request.preload:
            if module not in sys.modules and module not in self.to_learn:
                self.to_learn.append(module)

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
        pid = os.fork()
        if pid:
            os.close(marked_w)
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
            code = self._become(request, fds, [conn], marked_w)
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

    def _become(self, request: SpawnRequest, fds: list[int], close: list[socket.socket], marked_w: int) -> int:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGUSR1, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL if sig != signal.SIGPIPE else signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for sock in close:
            sock.close()
        if self.listener is not None:
            self.listener.close()
        for fd in (self.wake_r, self.wake_w):
            os.close(fd)
        for sock in self.children.values():
            sock.close()
        if request.new_session:
            os.setsid()
        # fds: to high numbers first (a received fd may sit on a target number), then into place.
        floor = max([64, *request.fds]) + 1
        # The mark pipe too: its number in the zygote may be one of the targets (a ring fd's number).
        moved = _dup_high(marked_w, floor)
        os.close(marked_w)
        marked_w = moved
        high = {target: _dup_high(fds[index], floor) for target, index in request.fds.items()}
        for fd in fds:
            os.close(fd)
        if 0 not in high:
            devnull = os.open(os.devnull, os.O_RDONLY)
            high[0] = _dup_high(devnull, floor)
            os.close(devnull)
        for target, fd in high.items():
            os.dup2(fd, target, inheritable=target <= 2 or target in request.fds)
            os.close(fd)
        _reopen_std_streams(request.env.get("PYTHONUNBUFFERED", "") not in ("", "0"))
        assert self.mark is not None
        pairs = [(k, request.env[k]) for k in request.mark if k in request.env]
        if pairs and not _write_mark(self.mark, pairs):
            raise RuntimeError(f"the job's identifying variables do not fit in ${MARK_VAR}: {pairs}")
        _apply_pythonpath(os.environ.get("PYTHONPATH", ""), request.env.get("PYTHONPATH", ""))
        os.environ.clear()
        os.environ.update(request.env)
        os.chdir(request.cwd)
        if sys.path and sys.path[0] == _START_CWD:
            sys.path[0] = request.cwd
        module_name, _, attr = request.target.partition(":")
        sys.argv = [module_name, *map(str, request.args)]
        _set_cmdline([sys.executable, "-m", module_name, *map(str, request.args)])
        os.write(marked_w, b"m")
        os.close(marked_w)
        if "torch" in sys.modules and os.environ.get("OMP_NUM_THREADS", "").isdigit():
            sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        if request.watch_pid is not None:
            _watch_parent(request.watch_pid)
        module = __import__(module_name, fromlist=["_"])
        result = getattr(module, attr)(*request.args)
        return result if isinstance(result, int) else 0


def _reopen_std_streams(unbuffered: bool) -> None:
    """New sys.stdin/stdout/stderr on fds 0-2, buffered as a fresh interpreter's would be with this
    environment (``$PYTHONUNBUFFERED``: written through; else stdout line-buffered only on a tty)."""
    import io

    def text(fd: int, write: bool, line_buffering: bool) -> io.TextIOWrapper:
        raw = io.FileIO(fd, "w" if write else "r", closefd=False)
        buffered = (io.BufferedWriter if write else io.BufferedReader)(raw)  # type: ignore[operator]
        return io.TextIOWrapper(buffered, encoding="utf-8", errors="backslashreplace" if fd == 2 else "strict",
                                line_buffering=line_buffering, write_through=write and unbuffered)  # fmt: skip

    sys.stdin = sys.__stdin__ = text(0, False, False)  # type: ignore[misc]
    sys.stdout = sys.__stdout__ = text(1, True, os.isatty(1))  # type: ignore[misc]
    sys.stderr = sys.__stderr__ = text(2, True, True)  # type: ignore[misc]


def _set_cmdline(argv: list[str]) -> None:
    """What ``ps`` and /proc/PID/cmdline show for us: ``argv`` written over the zygote's own argument
    area (it leaves room: see main()), truncated to fit, padded with NULs."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48, 49 of stat)
    except (OSError, IndexError, ValueError):
        return
    data = " ".join(argv).encode()[: end - start - 2] + b"\0"
    # One space-separated string, as setproctitle writes it: with the area's last byte not a NUL,
    # Linux shows it up to the first NUL (no trailing empty arguments), and psutil splits it again.
    ctypes.memmove(start, data + b" " * (end - start - len(data)), end - start)


# What Python reads only as it starts (and LD_* as the dynamic loader does): a process whose
# environment sets them differently from the zygote's cannot be a fork of it.
STARTUP_VARS = (
    "PYTHONHASHSEED", "PYTHONOPTIMIZE", "PYTHONDONTWRITEBYTECODE", "PYTHONWARNINGS", "PYTHONSAFEPATH",
    "PYTHONNOUSERSITE", "PYTHONUSERBASE", "PYTHONIOENCODING", "PYTHONUTF8", "PYTHONDEVMODE", "PYTHONMALLOC",
    "PYTHONHOME", "PYTHONPLATLIBDIR", "PYTHONINTMAXSTRDIGITS", "PYTHONFAULTHANDLER", "PYTHONTRACEMALLOC",
    "PYTHONPROFILEIMPORTTIME", "PYTHONNODEBUGRANGES", "PYTHONSTARTUP", "LD_PRELOAD", "LD_LIBRARY_PATH",
)  # fmt: skip


def _startup_difference(env: dict[str, str]) -> str | None:
    for name in STARTUP_VARS:
        if env.get(name) != os.environ.get(name):
            return f"its environment sets ${name} differently, which Python (or the loader) reads only at start"
    return None


def _apply_pythonpath(old: str, new: str) -> None:
    """sys.path as a fresh interpreter with ``$PYTHONPATH=new`` would have it: the zygote's own
    entries out, the new ones in after sys.path[0]."""
    if old == new:
        return
    drop = {e for p in old.split(os.pathsep) if p for e in (p, os.path.abspath(p))}
    rest = [p for p in sys.path[1:] if p not in drop]
    sys.path[:] = sys.path[:1] + [os.path.abspath(p) for p in new.split(os.pathsep) if p] + rest


def _dup_high(fd: int, floor: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor)


def _watch_parent(pid: int) -> None:
    """Kill our process group when ``pid`` ends (as a worker's parent-death signal would)."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        os.killpg(os.getpgrp(), signal.SIGKILL)  # already gone
        return

    def watch() -> None:
        select.select([pidfd], [], [])
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="trainforge-parent-watch", daemon=True).start()


_START_CWD = os.getcwd()
_TMP_PREFIX = "tf-zygote-"
_ROOM = 512  # bytes of command line the zygote keeps free for its children's (see _set_cmdline)


def socket_path(state_dir: str) -> str:
    """Where a server with this state directory puts its zygote's socket: in it if the path fits a
    Unix socket's 107 bytes, else in a private (0700) temporary directory."""
    path = os.path.join(state_dir, f"zygote-{os.getpid()}.sock")
    if len(path.encode()) <= 100:
        return path
    import tempfile

    return os.path.join(tempfile.mkdtemp(prefix=_TMP_PREFIX), "z.sock")


def launch(path: str, *, log_path: str, learn_file: str | None = None, preload: tuple[str, ...] = (),
           env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], int]:  # fmt: skip
    """Start a zygote listening at ``path``, in its own session, output to ``log_path``. Returns the
    process and a pipe fd that gets one line (then EOF) once it serves, or EOF if it will not. Keep
    the process object alive: its stdin is the zygote's lifeline (closed: the zygote winds down)."""
    env = dict(os.environ if env is None else env)
    env[MARK_VAR] = "#" * MARK_LEN
    ready_r, ready_w = os.pipe()
    cmd = [sys.executable, "-m", "trainforge._internal.zygote", path, "--ready-fd", str(ready_w),
           "--preload", ",".join(preload), "--room", " " * _ROOM]  # fmt: skip
    if learn_file:
        cmd += ["--learn", learn_file]
    try:
        with open_append(log_path) as log:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    pass_fds=(ready_w,), start_new_session=True)  # fmt: skip
    except BaseException:
        os.close(ready_r)
        raise
    finally:
        os.close(ready_w)
    return proc, ready_r


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m trainforge._internal.zygote")
    parser.add_argument("socket_path")
    parser.add_argument("--preload", default="")
    parser.add_argument("--learn", default=None, help="a file of modules to import (one per line), appended to")
    parser.add_argument("--ready-fd", type=int, default=None, help="write the ready line here, then close it")
    parser.add_argument("--room", default="", help="blank room for the children's command lines")
    args = parser.parse_args(argv)
    modules = [m for m in args.preload.split(",") if m]
    if args.learn and os.path.exists(args.learn):
        with open(args.learn) as f:
            modules += [line.strip() for line in f if line.strip()]
    for module in dict.fromkeys(modules):
        with contextlib.suppress(Exception):
            __import__(module)
    return _Zygote(args.socket_path, args.learn, args.ready_fd).serve()


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip the interpreter's teardown: with torch imported it takes about a second, and a tuner (or a
    # server) waits for the zygote to exit.
    os._exit(code)
