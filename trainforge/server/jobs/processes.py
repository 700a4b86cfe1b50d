"""A server's job processes: each started job's runner (forked from the warm zygote when it serves,
else a fresh ``python -m trainforge.server.jobs.runner``), the environment every process of the job
inherits, the threads that wait for the runners to end, and finding and killing what is left of a
job, whoever its parent is now.

A job's processes all carry ``TRAINFORGE_JOB_ID`` and ``TRAINFORGE_SERVER_ID`` in their
environment (:func:`job_env`), so :func:`find_job_processes` finds them by it, and a runner that
outlived a previous server is adopted (:meth:`Processes.adopt`) and followed by its pid. Where the
server can make cgroups, each job's processes are in its cgroup too (``cgroup_of``): a process
that drops those variables, or calls ``setsid``, is still found and killed with the job.

A sandboxed job's runner (:mod:`trainforge.server.jobs.sandboxes`) starts with its plan: forked from
the warm pool into it (the pool then forks its workers through the job's channel), or started
fresh as ``python -P -m trainforge.server.jobs.runner`` in ``/`` with only the server's own start-up
environment and the plan (which it enters before anything else), or, in a user namespace, in
bubblewrap.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psutil

from trainforge._internal import constants, sandbox, state_files, zygote
from trainforge._internal.process_tree import kill_and_reap, reap_zombie_children
from trainforge._internal.sandbox import JobCgroup, Plan
from trainforge.server._crash import crash_point
from trainforge.server.jobs.runner import EVENTS_FILE, GRANT_FILE, OUTPUT_FILE

logger = logging.getLogger(__name__)

ENV_SERVER_ID = constants.ENV_SERVER_ID
RUNNER_MODULE = "trainforge.server.jobs.runner"
ZYGOTE_LOG = "zygote.log"
WARM_MODULES_FILE = "warm_modules"  # what earlier jobs' workers imported: the next zygote starts with it
# What a runner and its workers import for any job: the zygote has them before the first job.
WARM_PRELOAD = (
    "trainforge", RUNNER_MODULE, "trainforge._internal.worker_group.worker_main", "trainforge._internal.train_fn",
    "trainforge._internal.worker_group.local", "trainforge._internal.job_events", "trainforge._internal.datasets",
    "cloudpickle", "multiprocessing.connection", "trainforge._internal.sandbox",
)  # fmt: skip


@dataclasses.dataclass
class Runner:
    """A job's runner process: ``popen`` None for one adopted after a server restart (not our child)."""

    job_id: int
    pid: int
    popen: subprocess.Popen[bytes] | zygote.ZygoteChild | None
    done: threading.Event = dataclasses.field(default_factory=threading.Event)


def find_job_processes(server_id: str, job_ids: list[int]) -> dict[int, list[psutil.Process]]:
    """The live processes of each job, in one pass over the machine's processes: those whose
    environment (``/proc/PID/environ``: the exec-time block, which a forked job process rewrites in
    place, see zygote.py) names the job and this server."""
    want = {str(j): j for j in job_ids}
    found: dict[int, list[psutil.Process]] = {j: [] for j in job_ids}
    for proc in psutil.process_iter():
        try:
            env = proc.environ()
        except (psutil.Error, OSError):
            continue
        job = want.get(env.get(constants.ENV_JOB_ID, ""))
        if job is not None and env.get(ENV_SERVER_ID) == server_id:
            found[job].append(proc)
    return found


def alive(pid: int, start_time: float | None) -> bool:
    """``pid`` runs (not a zombie) and, given ``start_time``, is the process that started then."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return start_time is None or abs(proc.create_time() - start_time) < 0.01
    except psutil.Error:
        return False


def job_env(*, job_id: int, server_id: str, attempt: int, job_dir: str, spec_env: dict[str, Any],
            gpu_ids: list[str] | None, base: dict[str, str] | None = None) -> dict[str, str]:  # fmt: skip
    """The environment of a job's runner (and so of all its processes): ``base`` (None: the
    server's, less its fault injection; a sandboxed job's is built, see ``_sandboxes``), plus the
    job's own (``spec_env``), its id and attempt, its events and grant files and, with ``gpu_ids``
    (None: the machine has no GPUs to share out), ``CUDA_VISIBLE_DEVICES``."""
    env = dict(os.environ) if base is None else dict(base)
    env.pop(constants.ENV_CRASH_AT, None)  # the server's fault injection is not the job's
    env[constants.ENV_JOB_ATTEMPT] = str(attempt)
    env.update({str(k): str(v) for k, v in spec_env.items()})
    env[constants.ENV_JOB_ID] = str(job_id)
    env[ENV_SERVER_ID] = server_id
    env[constants.ENV_JOB_EVENTS] = os.path.join(job_dir, EVENTS_FILE)
    env[constants.ENV_LOCAL_RESOURCES] = "@" + os.path.join(job_dir, GRANT_FILE)
    if gpu_ids is not None:
        env[constants.ENV_CUDA_VISIBLE_DEVICES] = ",".join(gpu_ids)
    env["PYTHONUNBUFFERED"] = "1"
    ray_mod = sys.modules.get("ray")
    if ray_mod is not None and ray_mod.is_initialized() and not env.get("RAY_ADDRESS"):
        # A server on a Ray cluster it joined without $RAY_ADDRESS ("auto", or a driver's own
        # connection): the job joins the same cluster, and "auto" picks the Ray executor.
        env["RAY_ADDRESS"] = ray_mod.get_runtime_context().gcs_address
    return env


@contextlib.contextmanager
def _output(path: str) -> Iterator[Any]:
    """The job's output log opened to append to. Anything else the job left at that name (a link, a
    FIFO) is removed first: the server writes there, never through what the job put."""
    try:
        out = state_files.open_append(path)
    except OSError:
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            os.unlink(path)
        out = state_files.open_append(path)
    with out:
        yield out


class Processes:
    """The runners of one server's jobs (``runners``: job id -> :class:`Runner`) and the warm pool
    they are forked from. ``on_exit(job_id, returncode)`` is called on a waiter thread when a runner
    is gone (``returncode`` None when it was not our child)."""

    def __init__(self, state_dir: str, server_id: str, *, warm: bool, on_exit: Callable[[int, int | None], None],
                 cgroup_of: Callable[[int], JobCgroup | None] = lambda job_id: None,
                 zygote_env: dict[str, str] | None = None):  # fmt: skip
        self.state_dir = state_dir
        self.server_id = server_id
        self.warm = warm
        self.runners: dict[int, Runner] = {}
        self._on_exit = on_exit
        self._cgroup_of = cgroup_of
        self._zygote_env = zygote_env
        self._zygote: subprocess.Popen[bytes] | None = None
        self._zygote_path: str | None = None  # set once the zygote serves
        self._closing = threading.Event()

    # -- the warm pool ----------------------------------------------------------------------------
    def start_zygote(self) -> None:
        """The warm fork server (``_internal/zygote.py``) that jobs' runners and workers are forked
        from once it is ready (a second or so after start: jobs started before then get fresh
        processes, as they do when it is off or fails)."""
        path = zygote.socket_path(self.state_dir)
        try:
            proc, ready_fd = zygote.launch(
                path, log_path=os.path.join(self.state_dir, ZYGOTE_LOG), preload=WARM_PRELOAD,
                learn_file=os.path.join(self.state_dir, WARM_MODULES_FILE), env=self._zygote_env,
            )  # fmt: skip
        except OSError as exc:
            logger.warning("no warm process pool (%s): every job starts fresh processes", exc)
            return
        self._zygote = proc

        def await_ready() -> None:
            try:
                ready, _, _ = select.select([ready_fd], [], [], 60.0)
                line = os.read(ready_fd, 100) if ready else b""
            finally:
                os.close(ready_fd)
            if line.startswith(b"ready") and not self._closing.is_set():
                self._zygote_path = path
            else:
                logger.warning("the warm process pool did not start (see %s): every job starts fresh processes",
                               os.path.join(self.state_dir, ZYGOTE_LOG))  # fmt: skip

        threading.Thread(target=await_ready, daemon=True, name="tf-zygote-ready").start()

    @property
    def warm_pool(self) -> dict[str, Any]:
        """The warm pool's state, for /health and the dashboard."""
        proc = self._zygote
        return {
            "enabled": self.warm,
            "ready": self._zygote_path is not None and proc is not None and proc.poll() is None,
            "pid": proc.pid if proc is not None else None,
        }

    def close(self) -> None:
        """The zygote stops serving and exits once the processes it forked have ended; the runners
        go on (the next server adopts them)."""
        self._closing.set()
        self._zygote_path = None
        if self._zygote is not None and self._zygote.stdin is not None:
            self._zygote.stdin.close()

    # -- runners ----------------------------------------------------------------------------------
    def spawn(self, job_dir: str, env: dict[str, str], *, plan: Plan | None = None,
              start_env: dict[str, str] | None = None) -> subprocess.Popen[bytes] | zygote.ZygoteChild:  # fmt: skip
        """The job's runner, in its own session, output to the job's log: forked from the warm zygote
        when it serves (its workers then are too), else a fresh ``python -m trainforge.server.jobs.runner``.
        With a sandbox ``plan`` (whose ``env`` is the job's), confined by it; ``start_env``: what a
        fresh sandboxed runner starts with (the server's own, never the job's). Not yet one of
        :attr:`runners` (:meth:`add` it once it is recorded)."""
        with _output(os.path.join(job_dir, OUTPUT_FILE)) as out:
            path = self._zygote_path
            warm = path is not None and self._zygote is not None and self._zygote.poll() is None
            if warm and (plan is None or plan.uid is not None):
                request = zygote.SpawnRequest(
                    target=f"{RUNNER_MODULE}:main", args=[job_dir], cwd=job_dir, fds={1: 0, 2: 0}, new_session=True,
                    mark=(constants.ENV_JOB_ID, ENV_SERVER_ID),
                    env={**env, zygote.ENV_ZYGOTE: str(path)} if plan is None else plan.env,
                    sandbox=plan.to_json() if plan is not None else None, channel=plan is not None,
                )  # fmt: skip
                assert path is not None
                try:
                    return zygote.spawn(path, request, [out.fileno()])
                except zygote.ZygoteUnavailable as exc:
                    logger.warning("%s: starting the job's runner fresh", exc)
            if plan is None:
                return subprocess.Popen(
                    [sys.executable, "-m", RUNNER_MODULE, job_dir],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                    cwd=job_dir, start_new_session=True,
                )  # fmt: skip
            # Fresh and sandboxed: nothing of the job's (its environment, its directory as the current
            # one, which `python -m` would put first on sys.path) reaches the process before it is confined.
            # -P: no current directory on sys.path; -s: no user site (a job could put a .pth file in $HOME's)
            runner = [sys.executable, "-P", "-s", "-m", RUNNER_MODULE, job_dir]
            argv = runner if plan.uid is not None else sandbox.bwrap_command(plan, runner, chdir=job_dir)
            return subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env={**(start_env or {}), sandbox.ENV_PLAN: plan.to_json()}, cwd="/", start_new_session=True,
            )  # fmt: skip

    def add(self, job_id: int, pid: int, popen: subprocess.Popen[bytes] | zygote.ZygoteChild | None = None) -> Runner:
        """Count ``pid`` as the job's runner (``popen`` None: adopted, not our child); :meth:`follow`
        it once that is recorded."""
        runner = Runner(job_id, pid, popen)
        self.runners[job_id] = runner
        return runner

    def follow(self, runner: Runner) -> None:
        """Wait for the runner on a thread of its own, then call ``on_exit``: ``Popen.wait`` for our
        child (its exit code), a pidfd for an adopted one."""
        target = self._wait_child if runner.popen is not None else self._watch_pid
        threading.Thread(target=target, args=(runner,), daemon=True, name=f"tf-job{runner.job_id}").start()

    def _wait_child(self, runner: Runner) -> None:
        assert runner.popen is not None
        code = runner.popen.wait()
        self._on_exit(runner.job_id, code)

    def _watch_pid(self, runner: Runner) -> None:
        try:
            fd = os.pidfd_open(runner.pid)
        except (OSError, AttributeError):
            fd = None
        if fd is not None:
            try:
                select.select([fd], [], [])
            finally:
                os.close(fd)
        else:  # no pidfd (old kernel): poll
            while alive(runner.pid, None):
                time.sleep(0.1)
        self._on_exit(runner.job_id, None)

    # -- finding and killing ----------------------------------------------------------------------
    def job_processes(self, job_id: int) -> list[psutil.Process]:
        """Every live process of the job on this machine: in its cgroup, or found by its environment."""
        return self.jobs_processes([job_id])[job_id]

    def jobs_processes(self, job_ids: list[int]) -> dict[int, list[psutil.Process]]:
        """:meth:`job_processes` of several jobs, in one scan of the machine's processes."""
        found = find_job_processes(self.server_id, job_ids)
        for job_id in job_ids:
            group = self._cgroup_of(job_id)
            if group is None:
                continue
            known = {p.pid for p in found[job_id]}
            for pid in group.pids() - known:
                try:
                    found[job_id].append(psutil.Process(pid))
                except psutil.Error:
                    pass
        return found

    def find_runner(self, job_id: int) -> int | None:
        """The pid of the job's runner among its processes (one started just before a crash, before
        its pid was recorded), or None."""
        for proc in self.job_processes(job_id):
            try:
                if RUNNER_MODULE in " ".join(proc.cmdline()):
                    return proc.pid
            except psutil.Error:
                continue
        return None

    def stop(self, runner: Runner, *, grace_s: float, force: bool = False) -> None:
        """Stop a job's runner as Ctrl-C would (SIGINT: its workers stop, its committed checkpoints
        stay), or at once with ``force``; whatever is left of the job after ``grace_s`` is killed.
        Returns once the runner is gone (``runner.done``, set by whoever ``on_exit`` calls)."""
        if not force:
            try:
                os.kill(runner.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
            crash_point("stop:signalled")
        if force or not runner.done.wait(grace_s):
            self.kill_job(runner.job_id, runner.pid)
        if not runner.done.wait(30.0):
            raise RuntimeError(f"job {runner.job_id}: its runner (pid {runner.pid}) did not go away after SIGKILL")

    def stop_job(self, job_id: int, *, grace_s: float) -> None:
        """:meth:`stop` the job's runner, if it has one."""
        runner = self.runners.get(job_id)
        if runner is not None:
            self.stop(runner, grace_s=grace_s)

    def kill_job(self, job_id: int, runner_pid: int | None = None) -> None:
        """SIGKILL every process of the job (and ``runner_pid``) and wait until they are gone: its
        whole cgroup at once where it has one (forks under way included), then what its environment
        names; the ones that were ours (orphans come to the server, a subreaper) are reaped."""
        procs = self.job_processes(job_id)
        if runner_pid is not None and all(p.pid != runner_pid for p in procs):
            try:
                procs.append(psutil.Process(runner_pid))
            except psutil.Error:
                pass
        group = self._cgroup_of(job_id)
        if group is not None and not group.kill(timeout=10):
            logger.warning("job %s: processes still in its cgroup after SIGKILL: %s", job_id, sorted(group.pids()))
        # A runner this server started is reaped by its waiter thread (which keeps its exit code).
        ours = {r.pid for r in self.runners.values() if r.popen is not None}
        kill_and_reap(procs, timeout=10, skip_reap=ours)
        reap_zombie_children(skip=ours | ({self._zygote.pid} if self._zygote is not None else set()))

    def forget_cgroup(self, job_id: int) -> None:
        """Remove the (emptied) cgroup of a job that ended."""
        group = self._cgroup_of(job_id)
        if group is not None:
            group.remove()
