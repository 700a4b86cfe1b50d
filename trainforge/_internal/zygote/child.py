"""The forked child: what a process forked by the zygote does to become the process a
:class:`~trainforge._internal.zygote.protocol.SpawnRequest` asks for.

The child is what ``python -m module`` would have been, as far as the job can tell: its own
environment, working directory, ``sys.argv``, fds 0-2 and the requested extra fds, default signal
handlers, its own session if asked, torch's thread count from ``$OMP_NUM_THREADS``, its command line
and (through :mod:`~trainforge._internal.zygote.mark`) its job's identifying variables in
``/proc/PID/environ``. What a fork cannot change (the variables Python reads only as it starts,
:data:`STARTUP_VARS`) must match the zygote's: :func:`startup_difference` says when it does not.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import socket
import sys
import threading

from trainforge._internal.zygote.mark import MARK_VAR, write_mark
from trainforge._internal.zygote.protocol import CHANNEL_PREFIX, ENV_ZYGOTE, SpawnRequest

_START_CWD = os.getcwd()

# What Python reads only as it starts (and LD_* as the dynamic loader does): a process whose
# environment sets them differently from the zygote's cannot be a fork of it.
STARTUP_VARS = (
    "PYTHONHASHSEED", "PYTHONOPTIMIZE", "PYTHONDONTWRITEBYTECODE", "PYTHONWARNINGS", "PYTHONSAFEPATH",
    "PYTHONNOUSERSITE", "PYTHONUSERBASE", "PYTHONIOENCODING", "PYTHONUTF8", "PYTHONDEVMODE", "PYTHONMALLOC",
    "PYTHONHOME", "PYTHONPLATLIBDIR", "PYTHONINTMAXSTRDIGITS", "PYTHONFAULTHANDLER", "PYTHONTRACEMALLOC",
    "PYTHONPROFILEIMPORTTIME", "PYTHONNODEBUGRANGES", "PYTHONSTARTUP", "LD_PRELOAD", "LD_LIBRARY_PATH",
)  # fmt: skip


def startup_difference(env: dict[str, str]) -> str | None:
    """Why a process with environment ``env`` cannot be a fork of this one; None if it can."""
    for name in STARTUP_VARS:
        if env.get(name) != os.environ.get(name):
            return f"its environment sets ${name} differently, which Python (or the loader) reads only at start"
    return None


def become(
    request: SpawnRequest,
    fds: list[int],
    marked_w: int,
    mark: tuple[int, int] | None,
    close: list[socket.socket],
    close_fds: list[int],
    channel: socket.socket | None = None,
) -> int:
    """In the freshly forked child: close the zygote's sockets (``close``) and fds (``close_fds``),
    enter the request's sandbox (if any: before anything of the request is used), set up the process
    ``request`` asks for, write one byte to ``marked_w`` once it is marked, and run its target;
    returns the exit code. ``channel``: the job channel this child gets (``$TRAINFORGE_ZYGOTE=fd:N``)."""
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGUSR1, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL if sig != signal.SIGPIPE else signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sock in close:
        sock.close()
    for fd in close_fds:
        os.close(fd)
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
    # A sandboxed job's: its cgroups, view and identity, before its environment, directory or code
    # are used (after its fds: a failure is said in its own output).
    if request.sandbox:
        from trainforge._internal.sandbox import Plan, enter

        enter(Plan.from_json(request.sandbox))
    assert mark is not None
    pairs = [(k, request.env[k]) for k in request.mark if k in request.env]
    if pairs and not write_mark(mark, pairs):
        raise RuntimeError(f"the job's identifying variables do not fit in ${MARK_VAR}: {pairs}")
    _apply_pythonpath(os.environ.get("PYTHONPATH", ""), request.env.get("PYTHONPATH", ""))
    os.environ.clear()
    os.environ.update(request.env)
    if channel is not None:  # not inherited by what the job execs: a fork of ours uses it, nothing else
        os.environ[ENV_ZYGOTE] = f"{CHANNEL_PREFIX}{_dup_high(channel.fileno(), floor)}"
        channel.close()
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
    area (it leaves room: see launcher.launch()), truncated to fit, padded with NULs."""
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
