"""Entering a plan in this process: the first thing a sandboxed job's process does, as root, before
any of the job's code runs (the runner started fresh, or a process forked from the warm pool).

    enter(plan)   # joined its cgroups, in its view, its own user: no way back

Order: join the cgroups (while root may write there), a mount and an IPC namespace of its own, the
view (:mod:`~trainforge._internal.sandbox.view`), then the identity: supplementary groups, gid, uid
(all three of real, effective and saved, so no capability is left), "dumpable" again (a change of
uid clears it, which would make the process's own ``/proc/self`` files root's), and
``no_new_privs``, so no set-uid program can give anything back.
"""

from __future__ import annotations

import os

from trainforge._internal import constants
from trainforge._internal.sandbox import linux, view
from trainforge._internal.sandbox.plan import Plan

ENV_PLAN = constants.ENV_SANDBOX_PLAN  # a fresh runner's plan (JSON), removed from its environment once read


def join_cgroups(directories: tuple[str, ...], pid: int = 0) -> None:
    """Move process ``pid`` (0: this one) into each cgroup directory (one per hierarchy)."""
    me = str(pid or os.getpid())
    for directory in directories:
        with open(os.path.join(directory, "cgroup.procs"), "w") as f:
            f.write(me)


def enter(plan: Plan) -> None:
    """Confine this process by ``plan`` (see the module docstring). Raises OSError, naming the call
    that failed, if it cannot: the caller must then not run the job."""
    if os.geteuid() != 0:
        raise PermissionError(f"entering a sandbox in-process needs root (this process is uid {os.geteuid()})")
    if plan.uid is None or plan.gid is None:
        raise ValueError("an in-process sandbox needs the uid and gid the job runs as")
    join_cgroups(plan.cgroups)
    linux.unshare(linux.CLONE_NEWNS | linux.CLONE_NEWIPC)
    view.build(plan)
    os.setgroups(list(plan.groups))
    os.setresgid(plan.gid, plan.gid, plan.gid)
    os.setresuid(plan.uid, plan.uid, plan.uid)
    linux.prctl(linux.PR_SET_DUMPABLE, 1)
    linux.prctl(linux.PR_SET_NO_NEW_PRIVS, 1)


def enter_from_environment() -> bool:
    """In a job's first process, started fresh: with ``$TRAINFORGE_SANDBOX_PLAN``, enter that plan
    (a plan without a uid: the process is in bubblewrap's sandbox already) and take its ``env``
    as the environment. True if it entered a plan."""
    text = os.environ.pop(ENV_PLAN, None)
    if not text:
        return False
    plan = Plan.from_json(text)
    if plan.uid is not None:
        enter(plan)
    os.environ.clear()
    os.environ.update(plan.env)
    return True
