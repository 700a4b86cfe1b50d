"""``JobService``: the train server's core, under its HTTP API. Queues jobs, decides (with
:func:`~trainforge.server._scheduler.decide`) on every event, starts a runner per admitted job,
follows it, stops it, and reattaches the runners that outlived a previous server.

Every change is written to the :class:`~trainforge.server._store.JobStore` *before* it takes effect
(the grant before the runner starts; the runner's pid and start time as soon as it exists), so a
server killed at any point finds on restart what it had started. A job's processes all carry
``TRAINFORGE_JOB_ID`` and ``TRAINFORGE_SERVER_ID`` in their environment, so anything left of a job
is found and killed by them, whoever its parent is now.

Threads: the API's (any number) call the public methods; one waiter per runner (``Popen.wait`` for
a runner this server started, a pidfd for one it reattached); one tailer that reads the runners'
event files every 50 ms. Scheduling runs under one lock, on the thread whose event caused it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import psutil

from trainforge._internal import constants, state_files, zygote
from trainforge.server import _store as st
from trainforge.server._crash import crash_point
from trainforge.server._runner import (
    EVENTS_FILE,
    EXIT_FILE,
    GRANT_FILE,
    OUTPUT_FILE,
    RESULT_FILE,
    SPEC_FILE,
    TRAINER_FILE,
    write_atomic,
)
from trainforge.server._scheduler import Decision, JobRequest, Pending, check_fits, decide, free_resources

logger = logging.getLogger(__name__)

ENV_SERVER_ID = constants.ENV_SERVER_ID
_TAIL_INTERVAL_S = 0.05
_EPS = 1e-9
ZYGOTE_LOG = "zygote.log"
_STAGING_PREFIX = ".new-"  # jobs/.new-<hex>: a submission's files before its row is committed
WARM_MODULES_FILE = "warm_modules"  # what earlier jobs' workers imported: the next zygote starts with it
# What a runner and its workers import for any job: the zygote has them before the first job.
WARM_PRELOAD = (
    "trainforge", "trainforge.server._runner", "trainforge._internal.worker_main", "trainforge._internal.train_fn",
    "trainforge._internal.worker_group.local", "trainforge._internal.job_events", "trainforge._internal.datasets",
    "cloudpickle", "multiprocessing.connection",
)  # fmt: skip


class NotFoundError(LookupError):
    """No such job (HTTP 404)."""


class ConflictError(RuntimeError):
    """The job is not in a state that allows this (HTTP 409)."""


@dataclasses.dataclass
class _Sized:
    """What a job's new events show of its worker group's size (:meth:`JobService._ingest`)."""

    resized: int | None = None  # the workers of its latest elastic resize (a "restart" with "workers")
    world: int | None = None  # its size at the latest event that shows one (None: unknown since)
    news: bool = False  # an event showed the size, or made it unknown (a failure restart, a new run)


@dataclasses.dataclass
class _Runner:
    job_id: int
    pid: int
    popen: subprocess.Popen[bytes] | zygote.ZygoteChild | None  # None: reattached after a server restart
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


def request_from_spec(spec: dict[str, Any], job_id: int = 0, *, priority: int = 0, held: bool = False) -> JobRequest:
    """What a job spec asks for (``job_id`` 0: a request checked before the job has an id)."""
    return JobRequest(
        job_id=job_id,
        seq=job_id,
        per_worker=spec.get("per_worker", {}),
        min_workers=int(spec.get("min_workers", 1)),
        max_workers=spec.get("max_workers"),
        driver=spec.get("driver", {}),
        priority=priority,
        held=held,
    )


def request_of(job: st.JobRow) -> JobRequest:
    return request_from_spec(job.spec, job.id, priority=job.priority, held=job.state == st.HELD)


def submission_digest(*, name: str, spec: dict[str, Any], trainer_blob: bytes | None, priority: int, hold: bool,
                      max_retries: int) -> str:  # fmt: skip
    """What a submission asked for, as a digest: the same request retried has the same one."""
    h = hashlib.sha256(json.dumps([name, spec, priority, hold, max_retries], sort_keys=True, default=str).encode())
    h.update(hashlib.sha256(trainer_blob).digest() if trainer_blob is not None else b"-")
    return h.hexdigest()


def _read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            value = json.load(f)
        return value if isinstance(value, dict) else None
    except (OSError, ValueError):
        return None


class JobService:
    def __init__(self, state_dir: str, capacity: dict[str, float], *, durable: bool = False, stop_grace_s: float = 10.0,
                 warm: bool = True):  # fmt: skip
        self.state_dir = state_dir
        self.warm = warm
        self._zygote: subprocess.Popen[bytes] | None = None
        self._zygote_path: str | None = None  # set once the zygote serves
        self.jobs_dir = os.path.join(state_dir, "jobs")
        state_files.make_dir(self.jobs_dir)  # 0700, as each job's directory: they hold specs, environments, logs
        self.capacity = dict(capacity)
        self.stop_grace_s = stop_grace_s
        db = os.path.join(state_dir, "state.db")
        state_files.open_append(db).close()  # 0600 first: SQLite gives its -wal and -shm files the database's mode
        self.store = st.JobStore(db, durable=durable)
        self.server_id = self._server_id()
        self._lock = threading.RLock()
        self._runners: dict[int, _Runner] = {}
        self._requests: dict[int, JobRequest] = {}  # waiting jobs (queued or held)
        self._grants: dict[int, dict[str, float]] = {}  # jobs holding resources
        self._gpu_owner: dict[str, int] = {}
        self._decision: Decision | None = None  # the latest; its reasons are worked out when asked for
        self._pending: dict[int, Pending] | None = None
        self._shapes: dict[int, tuple[JobRequest, int]] = {}  # running elastic jobs: request, workers
        # Running elastic jobs asked to shrink (by _shrink): job id -> target workers. Their grant file
        # says the target; their grant here still counts their current workers until _resized sees
        # them run within it. Empty after a server restart (see _resized).
        self._shrinking: dict[int, int] = {}
        self._world: dict[int, int] = {}  # running elastic jobs' group sizes, as their latest events show
        self._offsets: dict[int, int] = {}
        self._ingest_locks: dict[int, threading.Lock] = {}
        self._closing = threading.Event()
        self._tailer: threading.Thread | None = None
        self.last_decision_s = 0.0
        self.started_at = time.time()
        from trainforge.server._usage import UsageSampler

        self.usage = UsageSampler(self)

    def _server_id(self) -> str:
        path = os.path.join(self.state_dir, "server_id")
        value = (open(path).read().strip() if os.path.exists(path) else "") or uuid.uuid4().hex[:12]
        write_atomic(path, value)
        return value

    def job_dir(self, job_id: int) -> str:
        return os.path.join(self.jobs_dir, str(job_id))

    # -- start-up and shut-down -------------------------------------------------------------------
    def recover(self) -> dict[str, int]:
        """Before serving: load the queue, reattach the runners that are still alive, finish the jobs
        whose runner ended while the server was down (from their exit file) and mark vanished ones
        lost. Returns counts by outcome."""
        counts = {"queued": 0, "reattached": 0, "ended": 0, "lost": 0, "broken": 0, "swept": self._sweep()}
        stopping: list[int] = []
        with self._lock:
            for job in self.store.jobs(st.WAITING_STATES, newest_first=False):
                missing = self._missing_files(job)
                if missing is not None:
                    self._fail_broken(job.id, missing)
                    counts["broken"] += 1
                    continue
                self._requests[job.id] = request_of(job)
                counts["queued"] += 1
            for job in self.store.jobs(st.ACTIVE_STATES, newest_first=False):
                self._grants[job.id] = dict(job.grant or {})
                for gpu in job.gpu_ids or []:
                    self._gpu_owner[gpu] = job.id
                self._offsets[job.id] = job.events_offset
                shape = request_of(job)
                if shape.upper_workers > shape.min_workers and job.workers:
                    self._shapes[job.id] = (shape, job.workers)
                pid = job.pid if job.pid is not None else self._find_runner(job.id)
                if pid is not None and self._alive(pid, job.pid_start_time if job.pid is not None else None):
                    runner = _Runner(job.id, pid, None)
                    self._runners[job.id] = runner
                    # A runner started just before the crash (no pid recorded yet) is running now.
                    state = {"state": st.RUNNING} if job.state == st.STARTING else {}
                    self.store.update(job.id, "reattached", {"pid": pid}, pid=pid, **state)
                    crash_point("reattach:recorded")
                    threading.Thread(target=self._watch_pid, args=(runner,), daemon=True, name=f"tf-job{job.id}").start()
                    counts["reattached"] += 1
                    if job.state == st.STOPPING:  # asked to stop before the crash: finish stopping it
                        stopping.append(job.id)
                else:
                    counts["ended" if os.path.exists(os.path.join(self.job_dir(job.id), EXIT_FILE)) else "lost"] += 1
                    self._finish(job.id, None, schedule=False)
            self._schedule()
        for job_id in stopping:
            threading.Thread(target=self.stop, args=(job_id,), daemon=True, name=f"tf-job{job_id}-stop").start()
        return counts

    def _sweep(self) -> int:
        """At start: remove what submissions that never committed left in ``jobs/`` (staging
        directories, each of which may hold a large trainer, and ``jobs/<id>`` without a row: a crash
        between the move and the commit, or between a delete's commit and its removal). Returns how
        many were removed."""
        ids = self.store.ids()
        removed = 0
        for entry in os.listdir(self.jobs_dir):
            if entry.startswith(_STAGING_PREFIX) or (entry.isdigit() and int(entry) not in ids):
                shutil.rmtree(os.path.join(self.jobs_dir, entry), ignore_errors=True)
                removed += 1
        return removed

    def _missing_files(self, job: st.JobRow) -> str | None:
        """What of the job's files is missing (its directory, spec, trainer), or None if whole."""
        need = [SPEC_FILE] + ([TRAINER_FILE] if job.kind == "trainer" else [])
        missing = [name for name in need if not os.path.isfile(os.path.join(self.job_dir(job.id), name))]
        return ", ".join(os.path.join("jobs", str(job.id), name) for name in missing) or None

    def _fail_broken(self, job_id: int, missing: str) -> None:
        error = (f"the job's files are incomplete (missing {missing} in the server's state directory): it cannot "
                 "run; submit it again")  # fmt: skip
        self.store.update(job_id, "ended", {"error": error}, state=st.FAILED, failure_class="infra", error=error,
                          ended_at=time.time(), pid=None)  # fmt: skip

    def start(self) -> None:
        self._tailer = threading.Thread(target=self._tail_loop, daemon=True, name="tf-tailer")
        self._tailer.start()
        self.usage.start()
        if self.warm:
            self._start_zygote()

    def _start_zygote(self) -> None:
        """The warm fork server (``_internal/zygote.py``) that jobs' runners and workers are forked
        from once it is ready (a second or so after start: jobs started before then get fresh
        processes, as they do when it is off or fails)."""
        path = zygote.socket_path(self.state_dir)
        try:
            proc, ready_fd = zygote.launch(
                path, log_path=os.path.join(self.state_dir, ZYGOTE_LOG), preload=WARM_PRELOAD,
                learn_file=os.path.join(self.state_dir, WARM_MODULES_FILE),
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

    def active_jobs(self) -> list[int]:
        with self._lock:
            return sorted(self._runners)

    def close(self) -> None:
        """Stop following the jobs (they keep running; the next server reattaches them). The zygote
        stops serving and exits once the processes it forked have ended."""
        self._closing.set()
        self.usage.close()
        self._zygote_path = None
        if self._zygote is not None and self._zygote.stdin is not None:
            self._zygote.stdin.close()
        if self._tailer is not None:
            self._tailer.join(timeout=5)
        self.store.close()

    # -- submission and changes -------------------------------------------------------------------
    def submit(
        self,
        *,
        name: str,
        spec: dict[str, Any],
        trainer_blob: bytes | None = None,
        priority: int = 0,
        hold: bool = False,
        max_retries: int = 1,
        submission_id: str | None = None,
    ) -> tuple[st.JobRow, bool]:
        """Queue a job; ValueError (with the numbers) if it can never fit. With a known
        ``submission_id``, returns that job and False instead of queueing another (ConflictError if
        that key was used for a different submission).

        Crash-safe order: the job's files (spec, trainer) are written to a staging directory, then,
        inside the transaction that inserts its row, moved to ``jobs/<id>``; the commit comes last. A
        crash before the commit leaves no job (the staging directory, or a ``jobs/<id>`` without a
        row, is swept at the next start); after it, a whole one."""
        check_fits(request_from_spec(spec), self.capacity)
        digest = submission_digest(name=name, spec=spec, trainer_blob=trainer_blob, priority=priority, hold=hold,
                                   max_retries=max_retries)  # fmt: skip
        if submission_id is not None:
            known = self.store.by_submission(submission_id)
            if known is not None:
                return self._resubmitted(known, submission_id, digest), False
        staging = os.path.join(self.jobs_dir, f"{_STAGING_PREFIX}{uuid.uuid4().hex}")
        state_files.make_dir(staging)
        try:
            if trainer_blob is not None:
                write_atomic(os.path.join(staging, TRAINER_FILE), trainer_blob)
            write_atomic(os.path.join(staging, SPEC_FILE), json.dumps(spec))
            crash_point("submit:staged")

            def place(job_id: int) -> None:
                crash_point("submit:inserted")
                final = self.job_dir(job_id)
                if os.path.lexists(final):  # left by a job whose row was never committed: not this one's
                    shutil.rmtree(final, ignore_errors=True)
                os.replace(staging, final)
                crash_point("submit:placed")

            with self._lock:
                job, created = self.store.add_job(
                    name=name, kind=spec["kind"], spec=spec, priority=priority, held=hold,
                    max_retries=max_retries, submission_id=submission_id, digest=digest, materialize=place,
                )  # fmt: skip
                crash_point("submit:committed")
                if not created:  # the same key raced in from another request
                    return self._resubmitted(job, submission_id, digest), False
                self._requests[job.id] = request_of(job)
                self._schedule()
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # gone already once placed
        return self.get(job.id), True

    @staticmethod
    def _resubmitted(job: st.JobRow, submission_id: str | None, digest: str) -> st.JobRow:
        if job.submission_digest is not None and job.submission_digest != digest:
            raise ConflictError(
                f"submission_id {submission_id!r} was used for job {job.id} ({job.name}), which asked for something "
                "else: a new job needs a new submission_id (the same one is only for retrying the same submission)"
            )
        return job

    def _write_spec(self, job: st.JobRow) -> None:
        if os.path.isdir(self.job_dir(job.id)):  # else the job fails at its start, naming what is missing
            write_atomic(os.path.join(self.job_dir(job.id), SPEC_FILE), json.dumps(job.spec))

    def get(self, job_id: int) -> st.JobRow:
        job = self.store.get(job_id)
        if job is None:
            raise NotFoundError(f"no job {job_id} (list them with `trainforge jobs`)")
        return job

    def pending(self, job_id: int) -> Pending | None:
        with self._lock:
            return self._pending_index().get(job_id)

    def _pending_index(self) -> dict[int, Pending]:
        if self._pending is None:
            pending = self._decision.pending if self._decision is not None else []
            self._pending = {p.job_id: p for p in pending if p.job_id in self._requests}
        return self._pending

    def patch(self, job_id: int, *, priority: int | None = None, hold: bool | None = None) -> st.JobRow:
        with self._lock:
            job = self.get(job_id)
            if job.state not in st.WAITING_STATES:
                raise ConflictError(
                    f"job {job_id} is {job.state}: priority and hold can be changed only while it waits in the queue"
                )
            fields: dict[str, Any] = {}
            if priority is not None and priority != job.priority:
                fields["priority"] = priority
            if hold is not None and hold != (job.state == st.HELD):
                fields["state"] = st.HELD if hold else st.QUEUED
            if fields:
                event = "held" if hold and "state" in fields else "released" if "state" in fields else "priority"
                self.store.update(job_id, event, {"priority": fields.get("priority", job.priority)}, **fields)
                self._requests[job_id] = request_of(self.get(job_id))
                self._schedule()
            return self.get(job_id)

    def retry(self, job_id: int, checkpoint: str | None = None) -> st.JobRow:
        """Queue a finished job again; a trainer job continues its last run from its latest checkpoint,
        or starts a new run from ``checkpoint`` (its ``resume_from_checkpoint``) when one is given."""
        with self._lock:
            job = self.get(job_id)
            if job.state not in (st.FAILED, st.STOPPED, st.SUCCEEDED):
                raise ConflictError(
                    f"job {job_id} is {job.state}: only a job that has ended (FAILED, STOPPED or SUCCEEDED) "
                    "can be retried"
                )
            if job.state == st.SUCCEEDED and checkpoint is None:
                raise ConflictError(f"job {job_id} SUCCEEDED: retry it from one of its checkpoints (checkpoint=...)")
            if checkpoint is not None and job.kind == "script":
                raise ConflictError(
                    f"job {job_id} runs a script, which builds its own trainer: pass the checkpoint to its "
                    f"resume_from_checkpoint (trainforge.Checkpoint({checkpoint!r})) and submit it again"
                )
            spec = dict(job.spec)
            spec.pop("resume_run_path", None)
            spec.pop("resume_checkpoint", None)
            if checkpoint is not None:
                spec["resume_checkpoint"] = checkpoint
            elif job.run_path:
                spec["resume_run_path"] = job.run_path
            self.store.update(job_id, "retry", None, state=st.QUEUED, ended_at=None, spec=spec)
            self._requeue(job_id)
            self._schedule()
            return self.get(job_id)

    def _requeue(self, job_id: int) -> None:
        job = self.get(job_id)
        self._write_spec(job)
        self._requests[job_id] = request_of(job)

    def delete(self, job_id: int) -> None:
        with self._lock:
            job = self.get(job_id)
            if job.state not in st.TERMINAL_STATES:
                raise ConflictError(f"job {job_id} is {job.state}: stop it first; only ended jobs can be deleted")
            self.store.delete(job_id)
        shutil.rmtree(self.job_dir(job_id), ignore_errors=True)

    # -- stopping ---------------------------------------------------------------------------------
    def stop(self, job_id: int, *, grace_s: float | None = None, force: bool = False) -> st.JobRow:
        """Stop a job. A waiting one is cancelled at once. A running one is sent SIGINT (as Ctrl-C:
        its workers stop, committed checkpoints stay), or SIGKILL with ``force``; whatever is left of
        it after ``grace_s`` is killed. Returns once every process of the job is gone and its grant
        is released."""
        grace = self.stop_grace_s if grace_s is None else grace_s
        with self._lock:
            job = self.get(job_id)
            if job.state in st.WAITING_STATES:
                self._requests.pop(job_id, None)
                if self._pending is not None:
                    self._pending.pop(job_id, None)
                self.store.update(
                    job_id, "stopped", {"while": job.state}, state=st.STOPPED, ended_at=time.time(),
                    failure_class="stopped",
                )  # fmt: skip
                self._schedule()
                return self.get(job_id)
            if job.state not in st.ACTIVE_STATES:
                raise ConflictError(f"job {job_id} already ended ({job.state}); nothing to stop")
            runner = self._runners.get(job_id)
            if job.state != st.STOPPING:
                self.store.update(job_id, "stopping", {"grace_s": grace, "force": force}, state=st.STOPPING)
                crash_point("stop:stopping")
        if runner is None:  # STARTING without a runner yet cannot happen under the lock; be safe
            self._kill_job(job_id)
            self._finish(job_id, None)
            return self.get(job_id)
        if not force:
            try:
                os.kill(runner.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
            crash_point("stop:signalled")
        if force or not runner.done.wait(grace):
            self._kill_job(job_id, runner.pid)
        if not runner.done.wait(30.0):
            raise RuntimeError(f"job {job_id}: its runner (pid {runner.pid}) did not go away after SIGKILL")
        return self.get(job_id)

    def job_processes(self, job_id: int) -> list[psutil.Process]:
        """Every live process of the job on this machine, found by its environment."""
        return find_job_processes(self.server_id, [job_id])[job_id]

    def _find_runner(self, job_id: int) -> int | None:
        for proc in self.job_processes(job_id):
            try:
                if "trainforge.server._runner" in " ".join(proc.cmdline()):
                    return proc.pid
            except psutil.Error:
                continue
        return None

    def _kill_job(self, job_id: int, runner_pid: int | None = None) -> None:
        procs = self.job_processes(job_id)
        if runner_pid is not None and all(p.pid != runner_pid for p in procs):
            try:
                procs.append(psutil.Process(runner_pid))
            except psutil.Error:
                pass
        for proc in procs:
            try:
                proc.kill()
            except psutil.Error:
                pass
        me = os.getpid()
        ours = {r.pid for r in self._runners.values() if r.popen is not None}
        for proc in procs:
            if proc.pid in ours:
                continue  # a runner this server started: its waiter thread reaps it (and keeps its exit code)
            try:
                if proc.ppid() == me:
                    os.waitpid(proc.pid, 0)  # an orphan handed to us (subreaper): reap it
                else:
                    proc.wait(timeout=10)
            except (psutil.Error, ChildProcessError, OSError):
                pass

    @staticmethod
    def _alive(pid: int, start_time: float | None) -> bool:
        try:
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                return False
            return start_time is None or abs(proc.create_time() - start_time) < 0.01
        except psutil.Error:
            return False

    # -- scheduling and starting ------------------------------------------------------------------
    def _schedule(self) -> None:
        with self._lock:
            if self._closing.is_set():
                return
            t0 = time.perf_counter()
            decision = decide(list(self._requests.values()), list(self._grants.values()), self.capacity)
            self.last_decision_s = time.perf_counter() - t0
            self._decision, self._pending = decision, None
            for start in decision.starts:
                self._start(start.job_id, start.workers, start.grant)
            self._shrink(decision)
            self._grow(decision.reserved)

    def _shrink(self, decision: Decision) -> None:
        """Take lent workers back: the workers an elastic job runs above its minimum are lent. When
        the first waiting job that is not held (``decision.blocked``) lacks resources that such
        extras hold, the lending jobs (lowest priority first, then newest first) are asked to shrink,
        never below their minimum, just enough for it to fit, counting what jobs already shrinking
        will give back; if all the extras together are not enough, nobody is asked. Asking writes the smaller
        grant file (the core reads it at the job's next committed checkpoint and resizes there, so no
        work is lost; a job that never checkpoints gives nothing back until it ends) and records a
        ``shrink`` event; the grant here shrinks only once the job runs within it (:meth:`_resized`).
        Only the first blocked job is looked at, so this stays cheap however long the queue."""
        waiting = self._requests.get(decision.blocked) if decision.blocked is not None else None
        if waiting is None or not self._shapes:
            return
        free = free_resources(self.capacity, self._grants.values())
        for job_id, target in self._shrinking.items():  # what shrinks under way will give back
            request, workers = self._shapes[job_id]
            for k, v in request.per_worker.items():
                free[k] = free.get(k, 0.0) + (workers - target) * v
        lacking = {k: v - free.get(k, 0.0) for k, v in waiting.min_request.items() if v > free.get(k, 0.0) + _EPS}
        if not lacking:
            return  # the shrinks under way will make room
        lenders = sorted(
            (job_id for job_id, (request, workers) in self._shapes.items()
             if job_id not in self._shrinking and workers > request.min_workers
             and any(request.per_worker.get(k, 0.0) > 0 for k in lacking)),
            key=lambda job_id: (self._shapes[job_id][0].priority, -job_id),
        )  # fmt: skip
        targets: list[tuple[int, int]] = []
        for job_id in lenders:
            request, workers = self._shapes[job_id]
            need = [math.ceil(left / request.per_worker[k] - _EPS) for k, left in lacking.items()
                    if request.per_worker.get(k, 0.0) > 0]  # fmt: skip
            if not need:
                continue
            give = min(workers - request.min_workers, max(need))
            targets.append((job_id, workers - give))
            for k in list(lacking):
                lacking[k] -= give * request.per_worker.get(k, 0.0)
                if lacking[k] <= _EPS:
                    del lacking[k]
            if not lacking:
                break
        if lacking:
            return  # not enough even from all of them: shrinking would only slow them down
        for job_id, target in targets:
            request, _ = self._shapes[job_id]
            self._write_grant(job_id, request, target)
            self._shrinking[job_id] = target
            self.store.update(job_id, "shrink", {"workers": target, "for_job": waiting.job_id})

    def _grow(self, reserved: set[str]) -> None:
        """Running elastic jobs below their maximum take free resources that no waiting job lacks:
        their grant file grows, and the core resizes the group at its next checkpoint (it re-reads
        the file at every sizing decision). Growing only into what no waiting job lacks is what keeps
        grow and :meth:`_shrink` from ping-ponging; a job being shrunk does not grow."""
        free = free_resources(self.capacity, self._grants.values())
        for job_id in sorted(self._shapes):
            request, workers = self._shapes[job_id]
            kinds = {k for k, v in request.per_worker.items() if v > 0}
            if workers >= request.upper_workers or kinds & reserved or job_id in self._shrinking:
                continue
            extra = 0
            while workers + extra < request.upper_workers and all(
                free.get(k, 0.0) + 1e-9 >= (extra + 1) * v for k, v in request.per_worker.items()
            ):
                extra += 1
            if not extra:
                continue
            workers += extra
            grant = request.request(workers)
            for k, v in request.per_worker.items():
                free[k] = free.get(k, 0.0) - extra * v
            self._shapes[job_id] = (request, workers)
            self._grants[job_id] = grant
            self._write_grant(job_id, request, workers)
            self.store.update(job_id, "grow", {"workers": workers, "grant": grant}, workers=workers, grant=grant)

    def _write_grant(self, job_id: int, request: JobRequest, workers: int) -> None:
        # What the job's workers may use (the driver's share is not theirs), re-read by the core at
        # every sizing decision, so an elastic job sizes itself to its grant.
        share = {k: workers * v for k, v in request.per_worker.items()}
        write_atomic(os.path.join(self.job_dir(job_id), GRANT_FILE), json.dumps(share))

    def queue(self) -> list[Pending]:
        with self._lock:
            return list(self._pending_index().values())

    def free(self) -> dict[str, float]:
        with self._lock:
            return free_resources(self.capacity, self._grants.values())

    def grants(self) -> dict[int, dict[str, Any]]:
        with self._lock:
            owners: dict[int, list[str]] = {}
            for gpu, job_id in self._gpu_owner.items():
                owners.setdefault(job_id, []).append(gpu)
            return {j: {"grant": dict(g), "gpu_ids": sorted(owners.get(j, []))} for j, g in self._grants.items()}

    def gpu_owners(self) -> dict[str, int]:
        with self._lock:
            return dict(self._gpu_owner)

    def _gpu_ids(self) -> list[str]:
        from trainforge._internal.worker_env import local_gpu_ids

        return local_gpu_ids()[: int(self.capacity.get("GPU", 0))]

    def _start(self, job_id: int, workers: int, grant: dict[str, float]) -> None:
        job = self.get(job_id)
        request = self._requests.pop(job_id)
        missing = self._missing_files(job)
        if missing is not None:  # never a 500 or a job left QUEUED with no reason: it fails, saying why
            self._fail_broken(job_id, missing)
            return
        want_gpus = math.ceil(grant.get("GPU", 0.0) - 1e-9)  # a fractional grant (0.5) needs one GPU to use
        gpu_ids = [g for g in self._gpu_ids() if g not in self._gpu_owner][:want_gpus]
        job_dir = self.job_dir(job_id)
        try:
            self._write_grant(job_id, request, workers)
        except OSError as exc:  # a full disk, a state directory changed under the server
            error = f"could not write the job's grant file: {exc}"
            self.store.update(job_id, "ended", {"error": error}, state=st.FAILED, failure_class="infra", error=error,
                              ended_at=time.time())  # fmt: skip
            return
        if request.upper_workers > request.min_workers:
            self._shapes[job_id] = (request, workers)
        for stale in (EXIT_FILE, RESULT_FILE):
            try:
                os.remove(os.path.join(job_dir, stale))
            except FileNotFoundError:
                pass
        attempt = job.attempt + 1
        self._grants[job_id] = dict(grant)
        for gpu in gpu_ids:
            self._gpu_owner[gpu] = job_id
        self._offsets.setdefault(job_id, job.events_offset)
        # Persisted before the runner exists: a server killed right after this finds the job by its id.
        self.store.update(
            job_id, "starting", {"workers": workers, "grant": grant, "gpu_ids": gpu_ids, "attempt": attempt},
            state=st.STARTING, grant=grant, workers=workers, gpu_ids=gpu_ids, attempt=attempt,
            started_at=time.time(), ended_at=None, exit_code=None, error=None, failure_class=None, pid=None,
        )  # fmt: skip
        crash_point("start:granted")
        env = dict(os.environ)
        env.pop(constants.ENV_CRASH_AT, None)  # the server's fault injection is not the job's
        env[constants.ENV_JOB_ATTEMPT] = str(attempt)
        env.update({str(k): str(v) for k, v in (job.spec.get("env") or {}).items()})
        env[constants.ENV_JOB_ID] = str(job_id)
        env[ENV_SERVER_ID] = self.server_id
        env[constants.ENV_JOB_EVENTS] = os.path.join(job_dir, EVENTS_FILE)
        env[constants.ENV_LOCAL_RESOURCES] = "@" + os.path.join(job_dir, GRANT_FILE)
        if want_gpus or self._gpu_ids():
            env[constants.ENV_CUDA_VISIBLE_DEVICES] = ",".join(gpu_ids)
        env["PYTHONUNBUFFERED"] = "1"
        ray_mod = sys.modules.get("ray")
        if ray_mod is not None and ray_mod.is_initialized() and not env.get("RAY_ADDRESS"):
            # A server on a Ray cluster it joined without $RAY_ADDRESS ("auto", or a driver's own
            # connection): the job joins the same cluster, and "auto" picks the Ray executor.
            env["RAY_ADDRESS"] = ray_mod.get_runtime_context().gcs_address
        try:
            popen = self._spawn_runner(job_dir, env)
        except OSError as exc:
            self._release(job_id)
            self.store.update(
                job_id, "failed", {"error": str(exc)}, state=st.FAILED, failure_class="infra",
                error=f"could not start the job's runner: {exc}", ended_at=time.time(),
            )  # fmt: skip
            return
        try:
            start_time: float | None = psutil.Process(popen.pid).create_time()
        except psutil.Error:
            start_time = None
        crash_point("start:spawned")
        runner = _Runner(job_id, popen.pid, popen)
        self._runners[job_id] = runner
        self.store.update(job_id, "running", {"pid": popen.pid}, state=st.RUNNING, pid=popen.pid, pid_start_time=start_time)
        threading.Thread(target=self._wait_child, args=(runner,), daemon=True, name=f"tf-job{job_id}").start()

    def _spawn_runner(self, job_dir: str, env: dict[str, str]) -> subprocess.Popen[bytes] | zygote.ZygoteChild:
        """The job's runner, in its own session, output to the job's log: forked from the warm zygote
        when it serves (its workers then are too), else a fresh ``python -m trainforge.server._runner``."""
        with state_files.open_append(os.path.join(job_dir, OUTPUT_FILE)) as out:
            path = self._zygote_path
            if path is not None and self._zygote is not None and self._zygote.poll() is None:
                request = zygote.SpawnRequest(
                    target="trainforge.server._runner:main", args=[job_dir], env={**env, zygote.ENV_ZYGOTE: path},
                    cwd=job_dir, fds={1: 0, 2: 0}, new_session=True, mark=(constants.ENV_JOB_ID, ENV_SERVER_ID),
                )  # fmt: skip
                try:
                    return zygote.spawn(path, request, [out.fileno()])
                except zygote.ZygoteUnavailable as exc:
                    logger.warning("%s: starting the job's runner fresh", exc)
            return subprocess.Popen(
                [sys.executable, "-m", "trainforge.server._runner", job_dir],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                cwd=job_dir, start_new_session=True,
            )  # fmt: skip

    def _release(self, job_id: int) -> None:
        self._grants.pop(job_id, None)
        self._shapes.pop(job_id, None)
        self._shrinking.pop(job_id, None)
        self._world.pop(job_id, None)
        for gpu in [g for g, j in self._gpu_owner.items() if j == job_id]:
            del self._gpu_owner[gpu]

    # -- following runners ------------------------------------------------------------------------
    def _wait_child(self, runner: _Runner) -> None:
        assert runner.popen is not None
        code = runner.popen.wait()
        self._finish(runner.job_id, code)

    def _watch_pid(self, runner: _Runner) -> None:
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
            while self._alive(runner.pid, None):
                time.sleep(0.1)
        self._finish(runner.job_id, None)

    def _finish(self, job_id: int, returncode: int | None, *, schedule: bool = True) -> None:
        """The job's runner is gone (``returncode`` None when it was not our child): read what it
        left, kill any process of the job still alive, release the grant, record the outcome."""
        if self._closing.is_set():
            return
        self._ingest(job_id)
        self._kill_job(job_id)
        outcome = _read_json(os.path.join(self.job_dir(job_id), EXIT_FILE))
        crash_point("finish:read")
        with self._lock:
            job = self.get(job_id)
            runner = self._runners.pop(job_id, None)
            self._release(job_id)
            now = time.time()
            common: dict[str, Any] = {"ended_at": now, "pid": None}
            if outcome is not None:
                status = outcome.get("status")
                state = {"succeeded": st.SUCCEEDED, "stopped": st.STOPPED}.get(str(status), st.FAILED)
                if job.state == st.STOPPING and state == st.FAILED:
                    state = st.STOPPED
                failure = outcome.get("failure_class") if state == st.FAILED else ("stopped" if state == st.STOPPED else None)
                self.store.update(
                    job_id, "ended", {"exit_code": outcome.get("exit_code"), "error": outcome.get("error")},
                    state=state, exit_code=outcome.get("exit_code"), error=outcome.get("error"),
                    failure_class=failure, **common,
                )  # fmt: skip
            elif job.state == st.STOPPING:
                self.store.update(
                    job_id, "ended", {"exit_code": returncode, "killed": True}, state=st.STOPPED,
                    exit_code=returncode, failure_class="stopped", **common,
                )  # fmt: skip
            else:
                how = f"exit code {returncode}" if returncode is not None and returncode >= 0 else (
                    f"killed by {signal.Signals(-returncode).name}" if returncode is not None else "gone"
                )  # fmt: skip
                error = f"the job's runner (pid {job.pid}) ended without an outcome ({how})"
                if job.attempt <= job.max_retries:
                    spec = dict(job.spec)
                    if job.run_path:
                        spec["resume_run_path"] = job.run_path
                    self.store.update_many(
                        [
                            (job_id, "lost", {"error": error}, {"state": st.LOST, "error": error, "pid": None}),
                            (job_id, "requeued", {"attempt": job.attempt, "max_retries": job.max_retries},
                             {"state": st.QUEUED, "spec": spec}),
                        ]
                    )  # fmt: skip
                    self._requeue(job_id)
                else:
                    self.store.update_many(
                        [
                            (job_id, "lost", {"error": error}, {"state": st.LOST, "error": error}),
                            (job_id, "ended", {"error": error},
                             {"state": st.FAILED, "failure_class": "lost", "error": error, **common}),
                        ]
                    )  # fmt: skip
            if schedule:
                self._schedule()
        if runner is not None:
            runner.done.set()

    def _tail_loop(self) -> None:
        while not self._closing.wait(_TAIL_INTERVAL_S):
            self._tail_once()

    def _tail_once(self) -> None:
        """One pass of the tailer over the running jobs' event files."""
        for job_id in list(self._runners):
            try:
                sized = self._ingest(job_id)
                self._resized(job_id, sized)  # after the ingest lock is released: it takes self._lock
            except Exception:  # a bad line or a vanished file must not stop the others
                logger.exception("reading job %s's events", job_id)

    def _ingest(self, job_id: int) -> _Sized:
        """Read the job's new events (complete lines past the stored offset) into the store: the
        lifecycle ones as events, the reports as the job's latest metrics; the new offset in the same
        transaction, so nothing is recorded twice after a server restart. Returns what they show of
        the job's group size (a report's ranks, a resize's workers), for :meth:`_resized`."""
        sized = _Sized()
        lock = self._ingest_locks.setdefault(job_id, threading.Lock())
        with lock:
            path = os.path.join(self.job_dir(job_id), EVENTS_FILE)
            offset = self._offsets.get(job_id)
            if offset is None:
                offset = self._offsets[job_id] = self.get(job_id).events_offset
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    data = f.read()
            except FileNotFoundError:
                return sized
            end = data.rfind(b"\n")
            if end < 0:
                return sized
            changes: list[tuple[int, str | None, dict[str, Any] | None, dict[str, Any]]] = []
            fields: dict[str, Any] = {}
            reports = 0
            for line in data[: end + 1].splitlines():
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                kind = event.get("type")
                if kind == "report":
                    reports += 1
                    fields["last_metrics"] = event.get("metrics")
                    sized.world, sized.news = len(event.get("all_metrics") or ()) or None, True
                elif kind == "run_start":
                    changes.append((job_id, "run_start", {"run_path": event.get("run_path")}, {"run_path": event.get("run_path")}))
                    sized.world, sized.news = None, True
                elif kind in ("restart", "run_end"):
                    payload = {k: v for k, v in event.items() if k not in ("type", "metrics")}
                    changes.append((job_id, kind, payload, {}))
                    if kind == "restart":
                        workers = event.get("workers")  # set on an elastic resize (job_events)
                        if isinstance(workers, int):
                            sized.resized = workers
                        sized.world, sized.news = (workers if isinstance(workers, int) else None), True
            new_offset = offset + end + 1
            if reports:
                job = self.get(job_id)
                fields["reports"] = job.reports + reports
            fields["events_offset"] = new_offset
            changes.append((job_id, None, None, fields))
            self.store.update_many(changes)
            self._offsets[job_id] = new_offset
        return sized

    def _resized(self, job_id: int, sized: _Sized) -> None:
        """After :meth:`_ingest` (and outside its lock: this takes ``self._lock``), what the job's
        new events show of its group size. Its grant here shrinks, and the resources it gave back go
        to the waiting jobs at once, when it resized to fewer workers than it holds (the shrink
        :meth:`_shrink` asked for; after a server restart ``_shrinking`` is empty, but the grant file
        it resized to still said the smaller size), or when it was asked to shrink to a size it
        already runs within (a grow it had not applied yet). A grow resize needs nothing: its grant
        grew first. Recorded as a ``shrunk`` event."""
        if not sized.news and sized.resized is None and job_id not in self._shrinking:
            return  # nothing new about its size (most passes of the tailer): no lock taken
        with self._lock:
            shape = self._shapes.get(job_id)
            if shape is None or self._closing.is_set():
                return
            if sized.news:
                if sized.world is None:
                    self._world.pop(job_id, None)
                else:
                    self._world[job_id] = sized.world
            request, granted = shape
            target = self._shrinking.get(job_id)
            if sized.resized is not None and sized.resized < granted:
                workers = sized.resized
            elif target is not None and self._world.get(job_id, granted) <= target:
                workers = target
            else:
                return
            if target is not None and workers <= target:
                del self._shrinking[job_id]
            grant = request.request(workers)
            self._shapes[job_id] = (request, workers)
            self._grants[job_id] = grant
            fields: dict[str, Any] = {"workers": workers, "grant": grant}
            keep = math.ceil(grant.get("GPU", 0.0) - 1e-9)
            gpu_ids = [g for g, owner in self._gpu_owner.items() if owner == job_id]
            if len(gpu_ids) > keep:  # its workers use the first of its CUDA_VISIBLE_DEVICES: free the rest
                ordered = [g for g in self.get(job_id).gpu_ids or [] if g in gpu_ids]
                for gpu in ordered[keep:]:
                    del self._gpu_owner[gpu]
                fields["gpu_ids"] = ordered[:keep]
            self.store.update(job_id, "shrunk", {"workers": workers, "grant": grant}, **fields)
            self._schedule()
