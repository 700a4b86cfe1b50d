"""How a train server shared by a team keeps each job to itself: the mechanism it chooses at start.

Members trust the admin, not each other; a job is the member's code, so it must not reach the
server's files (the token, ``state.db``), another job's directory or result, or the server's
processes, and everything it starts must end with it. Which mechanism serves depends on who the
server runs as:

- **uid** (the server runs as root, as Slurm's daemons do): every job runs as an OS identity of its
  own user's (``uid_base`` plus the user's number, never reused; or an account named with
  ``users set NAME --os-user LOGIN``), with no capability and ``no_new_privs``, in a mount namespace
  whose root holds only what the job may see (:mod:`trainforge._internal.sandbox`), entered
  in-process so that the warm pool still forks its processes.
- **userns** (not root): bubblewrap builds the same view in a user namespace; the job keeps the
  server's uid but sees nothing else of its files, has no capability, and lives in a PID namespace
  of its own. Paths a member names (working directory, code, storage) are lent only as far as any
  user of the machine may read (or write) them. Its processes start fresh (no warm pool).
- **none**: no sandbox. A single-user server (no users added) runs jobs so, as before; a server with
  users refuses to start so unless the operator passes ``--no-job-isolation`` ("trusted users only").

Either way each sandboxed job gets a cgroup where the server may make one (root, or a delegated
cgroup): ``stop``, preemption and a lost runner kill everything in it, ``setsid`` or not; a memory
request becomes a limit; ``pids_max`` bounds its tasks.
"""

from __future__ import annotations

import dataclasses
import os

from trainforge._internal.sandbox import Hierarchies, bwrap_problem, in_process_problem
from trainforge.server.isolation.config import IsolationConfig


@dataclasses.dataclass
class Isolation:
    """What this server does (chosen by :meth:`choose`): ``mode`` ``uid``, ``userns`` or ``none``;
    ``why`` (a line: how it was chosen, or what is missing); ``cgroups`` (None: no cgroup here)."""

    mode: str
    why: str
    config: IsolationConfig
    cgroups: Hierarchies | None = None

    @property
    def sandboxes(self) -> bool:
        return self.mode in ("uid", "userns")

    @classmethod
    def choose(cls, config: IsolationConfig) -> Isolation:
        groups = Hierarchies.discover()
        cgroups = groups if groups.usable else None
        if config.mode == "off":
            return cls("none", "off (--no-job-isolation): jobs run as the server's user; for users who trust each other",
                       config, cgroups)  # fmt: skip
        root = os.geteuid() == 0
        problems = []
        if config.mode in ("auto", "uid") and root:
            problem = in_process_problem()
            if problem is None:
                return cls("uid", f"uid: each user's jobs run as uids from {config.uid_base}, in a mount namespace of "
                                  "their own", config, cgroups)  # fmt: skip
            problems.append(f"no in-process sandbox ({problem})")
        elif config.mode == "uid":
            problems.append(f"mode uid needs the server to run as root (it is uid {os.geteuid()})")
        if config.mode in ("auto", "userns"):
            problem = bwrap_problem()
            if problem is None:
                return cls("userns", "userns: jobs run in bubblewrap sandboxes (user, mount and PID namespaces)",
                           config, cgroups)  # fmt: skip
            problems.append(problem)
        return cls("none", "unavailable: " + "; ".join(problems), config, cgroups)

    def lines(self) -> list[str]:
        """What ``server start`` and ``server doctor`` say of it."""
        out = [f"job isolation: {self.why}"]
        if self.cgroups is not None:
            out.append(f"job cgroups: {self.cgroups.describe()}")
            out += [f"job cgroups: {p}" for p in self.cgroups.problems]
        else:
            why = "; ".join(Hierarchies.discover().problems) or "the cgroup file system is not writable by this user"
            out.append(f"job cgroups: none ({why}): `stop` finds a job's processes by their environment, and a "
                       "process that drops it escapes")  # fmt: skip
        return out

    def refusal(self, users: int) -> str | None:
        """Why a server with ``users`` users besides the admin may not start, or None."""
        if users and self.mode == "none" and self.config.mode != "off":
            return (f"this server has {users} user(s) besides the admin, and no way to keep their jobs apart here "
                    f"({self.why.removeprefix('unavailable: ')}): a member's job could read the admin's token. Run "
                    "the server as root, install bubblewrap (Debian: apt-get install bubblewrap), or, if the users "
                    "trust each other, start it with --no-job-isolation")  # fmt: skip
        return None
