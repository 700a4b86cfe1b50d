"""Ending processes: the one kill-and-reap helper every part uses (worker groups, the train server,
the tests and benchmarks), so a process is never left running, or left a zombie, by one of them.

    signal_groups([pgid, ...], signal.SIGTERM)   # a signal to whole process groups; gone ones skipped
    alive = kill_and_reap(procs, timeout=10)     # SIGKILL, then wait until each is gone and reaped
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any


def signal_groups(pgids: Iterable[int], sig: int) -> None:
    """Send ``sig`` to each process group (a process started with ``start_new_session`` leads one);
    groups already gone, or not ours to signal, are skipped."""
    for pgid in pgids:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_and_reap(procs: Iterable[Any], *, timeout: float = 10.0, skip_reap: Iterable[int] = ()) -> list[Any]:
    """SIGKILL every process of ``procs`` (``psutil.Process`` objects or pids), then wait up to
    ``timeout`` seconds until each is gone. A child of this process (or an orphan handed to it as a
    subreaper) is reaped, so none is left a zombie; ``skip_reap``: pids whose exit code a waiter
    thread of the caller collects itself (they are killed, not waited for). Returns the processes
    still alive after the timeout (none, normally)."""
    import psutil

    targets: list[psutil.Process] = []
    for p in procs:
        try:
            targets.append(p if isinstance(p, psutil.Process) else psutil.Process(int(p)))
        except psutil.Error:
            continue
    for p in targets:
        try:
            p.kill()
        except psutil.Error:
            pass
    skip = set(skip_reap)
    me = os.getpid()
    waited = []
    for p in targets:
        if p.pid in skip:
            continue
        try:
            if p.ppid() == me:
                os.waitpid(p.pid, 0)  # ours: reap it (psutil's wait would too, but only via polling)
                continue
        except (psutil.Error, ChildProcessError, OSError):
            continue
        waited.append(p)
    _gone, alive = psutil.wait_procs(waited, timeout=timeout)
    return list(alive)


def reap_zombie_children(skip: Iterable[int] = ()) -> list[int]:
    """Reap every child of this process that has exited (a zombie), but ``skip`` (pids a waiter
    thread of the caller waits for itself): orphans of a killed job come to a subreaper, and must
    not stay zombies under it. Returns the pids reaped."""
    import psutil

    skipped = set(skip)
    reaped: list[int] = []
    try:
        children = psutil.Process().children()
    except psutil.Error:
        return reaped
    for child in children:
        try:
            if child.pid in skipped or child.status() != psutil.STATUS_ZOMBIE:
                continue
            os.waitpid(child.pid, 0)
            reaped.append(child.pid)
        except (psutil.Error, ChildProcessError, OSError):
            continue
    return reaped
