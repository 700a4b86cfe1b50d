"""A plan as a bubblewrap command line: the sandbox of a server that is not root (a user namespace
in which the job keeps the server's uid, but sees only its view, has no capability, and lives in
a PID namespace of its own, which the kernel empties when its first process ends).

    argv = command(plan, ["python", "-m", "trainforge.server.jobs.runner", job_dir], chdir=job_dir)

Bubblewrap (``bwrap``, Flatpak's sandbox, the Debian package ``bubblewrap``) builds the same view
as :mod:`~trainforge._internal.sandbox.view`, from the same :meth:`Plan.ops`. It joins no cgroup:
:func:`command` puts a ``sh`` in front that moves itself into the plan's cgroups, then execs it.
"""

from __future__ import annotations

import os
import shutil

from trainforge._internal.sandbox.plan import DEV, PROC, TMPFS, Plan
from trainforge._internal.sandbox.view import gpu_devices

BWRAP = "bwrap"


def available() -> str | None:
    """The path of ``bwrap``, or None."""
    return shutil.which(BWRAP)


def command(plan: Plan, argv: list[str], *, chdir: str, info_fd: int | None = None) -> list[str]:
    """The command that runs ``argv`` in ``plan``'s sandbox, in ``chdir``. With ``info_fd``,
    bubblewrap writes ``{"child-pid": N}`` there: N is the sandbox's first process (the PID
    namespace's init, whose end ends every process in it)."""
    bwrap = available() or BWRAP
    args = [bwrap, "--unshare-user", "--unshare-pid", "--unshare-ipc", "--new-session", "--cap-drop", "ALL"]
    if info_fd is not None:
        args += ["--info-fd", str(info_fd)]
    for kind, path, writable in plan.ops():
        if kind == "bind":
            if os.path.islink(path):
                args += ["--symlink", os.readlink(path), path]
            elif os.path.exists(path):
                args += ["--bind" if writable else "--ro-bind", path, path]
        elif kind == "mask":
            args += ["--tmpfs", path] if os.path.isdir(path) else ["--ro-bind", "/dev/null", path]
        elif kind == PROC:
            args += ["--proc", path]
        elif kind == DEV:  # the usual devices, and the host's GPUs, as the in-process view has them
            args += ["--dev", path]
            for device in gpu_devices():
                args += ["--dev-bind", device, device]
        elif kind == TMPFS:
            args += ["--tmpfs", path]
    args += ["--chdir", chdir, "--", *argv]
    if not plan.cgroups:
        return args
    # sh moves itself (and so what it execs) into each cgroup, then becomes bwrap.
    joins = " && ".join(f'echo $$ > "${i + 1}/cgroup.procs"' for i in range(len(plan.cgroups)))
    return ["/bin/sh", "-c", f'{joins} && shift {len(plan.cgroups)} && exec "$@"', "sh", *plan.cgroups, *args]
