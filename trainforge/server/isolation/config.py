"""``IsolationConfig``: how the jobs of a server with users are kept apart (``ServerConfig.isolation``;
the mechanism it selects is :mod:`trainforge.server.isolation.mechanism`). A module of its own, as light as
the configs beside it: the client imports the server's config, never the sandbox."""

from __future__ import annotations

import dataclasses

MODES = ("auto", "uid", "userns", "off")
UID_BASE = 0x70000000  # 1879048192: above the ranges systemd gives containers (524288-1879048191)
PIDS_MAX = 4096


@dataclasses.dataclass(frozen=True)
class IsolationConfig:
    """How jobs are sandboxed on a server with users (``ServerConfig.isolation``).

    ``mode``: ``auto`` (``uid`` as root, else ``userns`` if bubblewrap can build a sandbox here, else
    none, and then a server with users does not start), ``uid``, ``userns`` (insist on one), or
    ``off`` (``--no-job-isolation``: every job runs as the server's user and sees its files; for
    users who trust each other). ``uid_base``: a user's jobs run as ``uid_base + n`` (n: the user's
    number, 0 for the built-in admin). ``pids_max``: the most tasks (processes and threads) a
    job's cgroup may hold.

    Example::

        IsolationConfig(mode="uid", uid_base=2_000_000_000, pids_max=8192)
    """

    mode: str = "auto"
    uid_base: int = UID_BASE
    pids_max: int = PIDS_MAX

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"IsolationConfig.mode={self.mode!r}: choose one of {', '.join(MODES)}")
        if not isinstance(self.uid_base, int) or isinstance(self.uid_base, bool) or not 1000 <= self.uid_base < 2**31 - 2**20:
            raise ValueError(f"IsolationConfig.uid_base={self.uid_base!r}: give a uid from 1000 to {2**31 - 2**20 - 1} "
                             "with room for a million users above it, and no account of this machine in that range")  # fmt: skip
        if not isinstance(self.pids_max, int) or isinstance(self.pids_max, bool) or self.pids_max < 16:
            raise ValueError(f"IsolationConfig.pids_max={self.pids_max!r}: give a number of tasks >= 16")
