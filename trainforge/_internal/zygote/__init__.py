"""A warm fork server: one process that has imported trainforge (and what earlier jobs needed, torch
for instance) forks a train-server job's runner and its local workers, instead of each starting a
fresh interpreter and importing everything again.

    python -m trainforge._internal.zygote SOCKET_PATH [--preload a,b] [--learn FILE]

The train server starts one (``trainforge server start``; ``--no-warm`` turns it off) and gives its
jobs ``$TRAINFORGE_ZYGOTE=SOCKET_PATH``; :class:`~trainforge._internal.worker_group.local_pool.
LocalProcessPool` then asks it for its worker processes. Without the variable nothing changes.

This package is the zygote's interface (what its users import); its parts:

- ``protocol``: :class:`SpawnRequest` and the framing on the Unix socket, one connection per child;
- ``client``: :func:`spawn` and :class:`ZygoteChild` (that connection, with Popen's ``pid``/``poll``/
  ``wait``/``returncode``/``send_signal``/``kill``);
- ``launcher``: :func:`launch` starts a zygote, :func:`socket_path` says where its socket goes;
- ``mark``: how a forked child makes ``/proc/PID/environ`` (which is how the server finds every
  process of a job) show its job's identifying variables (``TRAINFORGE_JOB_ID=...``,
  ``TRAINFORGE_SERVER_ID=...``) over a placeholder (:data:`MARK_VAR`); a zygote that cannot do that
  (checked at start) refuses to serve, and the server falls back to fresh processes. Processes the
  child forks inherit the marked block; processes it ``exec``s get its real environment;
- ``server``: the zygote's loop (forking, exit statuses, learning modules, its lifetime);
- ``child``: what a forked child does to become ``python -m module`` as far as the job can tell.
"""

from trainforge._internal.zygote.child import STARTUP_VARS
from trainforge._internal.zygote.client import ZygoteChild, ZygoteUnavailable, spawn
from trainforge._internal.zygote.launcher import launch, socket_path
from trainforge._internal.zygote.mark import MARK_LEN, MARK_VAR
from trainforge._internal.zygote.protocol import ENV_ZYGOTE, SpawnRequest

__all__ = [
    "ENV_ZYGOTE",
    "MARK_LEN",
    "MARK_VAR",
    "STARTUP_VARS",
    "SpawnRequest",
    "ZygoteChild",
    "ZygoteUnavailable",
    "launch",
    "socket_path",
    "spawn",
]
