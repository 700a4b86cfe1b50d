"""Can this host build a sandbox, and how: checked by trying, in a child process or with bubblewrap
itself (a container may refuse what the kernel offers)."""

from __future__ import annotations

import contextlib
import os
import subprocess

from trainforge._internal.sandbox import bwrap, linux


def in_process_problem() -> str | None:
    """None if a child of ours can unshare its mount namespace and mount a tmpfs (what
    :func:`~trainforge._internal.sandbox.enter` needs; root in a container without CAP_SYS_ADMIN
    cannot); else why not."""
    if os.geteuid() != 0:
        return f"this process is not root (uid {os.geteuid()})"
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        with contextlib.suppress(BaseException):
            linux.unshare(linux.CLONE_NEWNS)
            linux.mount(None, "/", None, linux.MS_REC | linux.MS_PRIVATE)
            linux.mount("tmpfs", "/tmp", "tmpfs", 0, "size=4k")
            code = 0
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return None if os.waitstatus_to_exitcode(status) == 0 else "unshare(CLONE_NEWNS) and mount are refused here"


def bwrap_problem() -> str | None:
    """None if bubblewrap can make a user and PID namespace here; else why not."""
    path = bwrap.available()
    if path is None:
        return "bubblewrap is not installed (Debian: apt-get install bubblewrap)"
    try:
        proc = subprocess.run([path, "--unshare-user", "--unshare-pid", "--ro-bind", "/", "/", "--proc", "/proc",
                               "true"], capture_output=True, text=True, timeout=20)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap does not run ({exc})"
    if proc.returncode != 0:
        return f"bubblewrap cannot make a user namespace here ({proc.stderr.strip() or proc.returncode})"
    return None
