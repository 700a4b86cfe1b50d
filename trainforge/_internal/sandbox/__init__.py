"""Sandboxes for the processes of a train server's jobs (the mechanism; the server decides each
job's :class:`Plan`): a view of the file system, an identity, cgroups.

- ``plan``: :class:`Plan` and :class:`Bind`, what a job may see and who it is;
- ``enter``: :func:`enter`, confine this process by a plan (root, in-process: the runner started
  fresh, or a process forked from the warm pool), :func:`join_cgroups`;
- ``view``: the mount namespace and new root :func:`enter` builds;
- ``bwrap``: the same plan as a bubblewrap command line, for a server that is not root;
- ``cgroups``: :class:`Hierarchies` (what the host mounts, by role) and :class:`JobCgroup`
  (create with limits, kill everything in it, usage, remove);
- ``probe``: whether this host can build either kind (:func:`in_process_problem`,
  :func:`bwrap_problem`);
- ``linux``: the system calls, through ctypes.
"""

from trainforge._internal.sandbox.bwrap import available as bwrap_available
from trainforge._internal.sandbox.bwrap import command as bwrap_command
from trainforge._internal.sandbox.cgroups import Hierarchies, JobCgroup
from trainforge._internal.sandbox.enter import (
    ENV_PLAN,
    enter,
    enter_from_environment,
    join_cgroups,
)
from trainforge._internal.sandbox.plan import Bind, Plan
from trainforge._internal.sandbox.probe import bwrap_problem, in_process_problem

__all__ = [
    "ENV_PLAN",
    "Bind",
    "Hierarchies",
    "JobCgroup",
    "Plan",
    "enter",
    "enter_from_environment",
    "join_cgroups",
    "bwrap_available",
    "bwrap_command",
    "bwrap_problem",
    "in_process_problem",
]
