"""Helpers for tests that watch processes."""

from __future__ import annotations

import psutil


def pid_alive(pid: int) -> bool:
    try:
        p = psutil.Process(pid)
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_until_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait up to ``timeout`` for every pid to exit; return those still alive."""
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    _gone, alive = psutil.wait_procs(procs, timeout=timeout)
    return [p.pid for p in alive if pid_alive(p.pid)]
