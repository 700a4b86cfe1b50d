"""Processes of the tests and benchmarks: which ones are left over, waiting for them to go, ending them.

A test run tags itself: ``tag_run()`` puts ``$TRAINFORGE_TEST_RUN`` (``<run id>/<xdist worker>``) into
its environment, which every process it starts inherits, so ``tagged_processes()`` finds them all even
once they are nobody's children. Ending processes goes through ``trainforge._internal.process_tree``'s
``kill_and_reap``, the one kill-and-reap helper.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterable

import psutil

from trainforge._internal.process_tree import kill_and_reap

RUN_ENV = "TRAINFORGE_TEST_RUN"

# Ray's daemons and agents, and the cluster-wide helper actors Ray Data starts once and keeps.
_RAY_SYSTEM_NAMES = ("ray::IDLE", "raylet", "gcs_server", "ray::DashboardAgent", "ray::RuntimeEnvAgent",
                     "ray::_StatsActor", "ray::_AutoscalingCoordinatorActor", "ray::_Autoscali", "ray::_StatsActo")
_RAY_SYSTEM_SCRIPTS = ("ray/_private/workers/default_worker.py", "ray/dashboard/", "ray/_private/log_monitor.py",
                       "ray/autoscaler/", "ray_process_reaper")  # fmt: skip


def pid_alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def wait_until_gone(pids: Iterable[int], timeout: float) -> list[int]:
    """Wait up to ``timeout`` seconds for every pid to exit; return those still alive."""
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    _gone, alive = psutil.wait_procs(procs, timeout=timeout)
    return [p.pid for p in alive if pid_alive(p.pid)]


def describe(p: psutil.Process, width: int | None = None) -> str:
    """``"PID command line"`` (cut to ``width`` characters), or ``"PID gone"``."""
    try:
        cmd = " ".join(p.cmdline())
    except psutil.Error:
        return f"{p.pid} gone"
    return f"{p.pid} {cmd[:width] if width else cmd}"


def processes_with_env(key: str, value: str, *, prefix: bool = False) -> list[psutil.Process]:
    """Live processes (zombies left out, this one too) whose environment has ``key=value`` (with
    ``prefix``: a value starting with ``value``), whoever their parent is."""
    found = []
    me = os.getpid()
    for p in psutil.process_iter():
        if p.pid == me:
            continue
        try:
            got = p.environ().get(key)
            if got is not None and (got.startswith(value) if prefix else got == value):
                if p.status() != psutil.STATUS_ZOMBIE:
                    found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def kill_procs(procs: Iterable[psutil.Process], timeout: float = 10.0) -> list[str]:
    """SIGKILL ``procs`` and wait (``timeout``) until they are gone; returns what was killed, described."""
    procs = list(procs)
    killed = [describe(p, 120) for p in procs if pid_alive(p.pid)]
    kill_and_reap(procs, timeout=timeout)
    return killed


# --------------------------------------------------------------------------------------------------
# The process-leak check of the tests (conftest.py's autouse fixture and the run's end).
# --------------------------------------------------------------------------------------------------
def tag_run(worker: str | None) -> str:
    """Tag this process's environment (inherited by all it starts) with the test run: the controller
    (``worker`` None) makes a new run id; an xdist worker appends its name to the id it inherited."""
    if worker is None:
        tag = uuid.uuid4().hex[:12]
    else:
        tag = f"{os.environ.get(RUN_ENV, 'run').split('/')[0]}/{worker}"
    os.environ[RUN_ENV] = tag
    return tag


def tagged_processes(tag: str) -> list[psutil.Process]:
    """Live processes of the run ``tag`` (its id alone: those of all its workers), this one excepted."""
    return [p for p in processes_with_env(RUN_ENV, tag, prefix=True) if p.pid != os.getpid()]


def ray_system_process(p: psutil.Process) -> bool:
    """A process of Ray's own that may come and go between tests: an idle pooled worker (or one
    starting up), a node's daemon or agent. Actors (named ``ray::ClassName...``) are not."""
    try:
        name, cmd = p.name(), " ".join(p.cmdline())
    except psutil.Error:
        return True
    if name in _RAY_SYSTEM_NAMES or cmd.startswith(_RAY_SYSTEM_NAMES):
        return True
    return any(script in cmd for script in _RAY_SYSTEM_SCRIPTS)


def child_pids() -> set[int]:
    """The pids of all descendants of this process."""
    return {p.pid for p in psutil.Process().children(recursive=True)}


def wait_settled(settle_s: float = 2.0, timeout: float = 60.0) -> set[int]:
    """Wait until this process's descendants stay the same for ``settle_s`` seconds (a fixture whose
    object starts processes in the background, such as standby workers, waits so before a test's
    leftover check takes its snapshot); returns them. ``TimeoutError`` after ``timeout`` seconds."""
    from trainforge._testing.wait import wait_until

    pids, since = child_pids(), time.monotonic()

    def settled() -> bool:
        nonlocal pids, since
        now = child_pids()
        if now != pids:
            pids, since = now, time.monotonic()
        return time.monotonic() - since >= settle_s

    wait_until(settled, timeout, f"the child processes to stay the same for {settle_s:g} s", interval=0.1)
    return pids


def trees(roots: Iterable[int]) -> set[int]:
    """The pids of ``roots`` and of all their descendants still there."""
    pids: set[int] = set()
    for pid in roots:
        try:
            pids |= {pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))}
        except psutil.NoSuchProcess:
            pass
    return pids


def leftover_children(before: set[int], owned_roots: Iterable[int] = ()) -> list[tuple[object, ...]]:
    """The descendants of this process that were not there ``before`` (Ray's own processes and the
    trees under ``owned_roots`` left out) and are still there 5 s on; those are killed, and returned
    as ``(pid, name, cmdline)``."""
    leftover = [
        p for p in psutil.Process().children(recursive=True) if p.pid not in before and not ray_system_process(p)
    ]
    owned = trees(owned_roots)  # listed after: a process seen above is still in its tree
    leftover = [p for p in leftover if p.pid not in owned]
    if not leftover:
        return []
    _gone, alive = psutil.wait_procs(leftover, timeout=5)
    described = [_describe_tuple(p) for p in alive]
    kill_and_reap(alive, timeout=10)
    return described


def _describe_tuple(p: psutil.Process) -> tuple[object, ...]:
    try:
        return (p.pid, p.name(), p.cmdline())
    except psutil.Error:
        return (p.pid, "gone")
