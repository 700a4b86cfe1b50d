"""``JobService``: the train server's core, under its HTTP API. Queues jobs, decides (with
:func:`~trainforge.server.scheduling.rule.decide`) on every event, starts a runner per admitted job,
follows it, stops it, and reattaches the runners that outlived a previous server.

Every change is written to the :class:`~trainforge.server.store.database.JobStore` *before* it takes effect
(the grant before the runner starts; the runner's pid and start time as soon as it exists), so a
server killed at any point finds on restart what it had started.

Its collaborators: the waiting jobs in start order (``scheduling.waiting``), the job directories
(``files``), launching a runner (``launch``: its environment, sandbox, credential and cgroup), the
runner processes (``processes``: starting, waiting, adopting, killing), the events tailer
(``tailer``), the elastic jobs' sizes (``elastic``), how a run ended (``outcome``), the usage
sampler (``usage``), the scheduling rules' side (``scheduling``: the
:class:`~trainforge.server.scheduling.ledger.ResourceLedger`, the only owner of what running jobs
hold, which GPUs and whose usage; the policies; the preemption executor; the counters; the alarm
that decides again at the next moment a time-based rule could change the answer, such as a
preemptible job passing its exemption) and, for a server a team shares, its users
(``team.users``) and their jobs' sandboxes (``sandboxes``).

Threads: the API's (any number) call the public methods; one waiter per runner (``Popen.wait`` for
a runner this server started, a pidfd for one it reattached); one tailer that reads the runners'
event files every 50 ms; the scheduler's alarm, only while a time-based rule waits for a moment.
Scheduling runs under one lock, on the thread whose event (or alarm) caused it. Time comes from
``clock`` (tests pass their own).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psutil

from trainforge._internal.run_outcome import FailureClass
from trainforge._internal.state_files import write_atomic
from trainforge.client import ACTIVE_STATES, TERMINAL_STATES, WAITING_STATES, JobEvent, JobState
from trainforge.server._crash import crash_point
from trainforge.server.isolation.config import IsolationConfig
from trainforge.server.isolation.mechanism import Isolation
from trainforge.server.jobs.elastic import Elastic
from trainforge.server.jobs.files import JobFiles
from trainforge.server.jobs.idempotency import ConflictError, NotFoundError, resubmitted, submission_digest
from trainforge.server.jobs.launch import Launcher, LaunchError
from trainforge.server.jobs.outcome import broken, run_ended
from trainforge.server.jobs.processes import Processes, alive
from trainforge.server.jobs.sandboxes import JobSandboxes, server_start_env
from trainforge.server.jobs.scheduling import Scheduling
from trainforge.server.jobs.tailer import EventsTailer, Sized
from trainforge.server.jobs.usage import UsageSampler
from trainforge.server.scheduling.decision import Decision, Pending
from trainforge.server.scheduling.rule import JobRequest, check_fits
from trainforge.server.scheduling.team_policy import TeamPolicy
from trainforge.server.scheduling.waiting import WaitingQueue
from trainforge.server.store.database import JobRow, JobStore
from trainforge.server.team.audit import AuditLog
from trainforge.server.team.job_tokens import JobTokens
from trainforge.server.team.users import ADMIN, UserBook

logger = logging.getLogger(__name__)

_TAIL_INTERVAL_S = 0.05


def request_of(job: JobRow) -> JobRequest:
    return JobRequest.from_spec(job.spec, job.id, priority=job.priority, held=job.state == JobState.HELD,
                                user=job.owner)  # fmt: skip


class JobService:
    def __init__(self, state_dir: str, capacity: dict[str, float], *, durable: bool = False, stop_grace_s: float = 10.0,
                 warm: bool = True, team: TeamPolicy | None = None, isolation: Isolation | None = None,
                 secret_files: tuple[str, ...] = (), clock: Callable[[], float] = time.time):  # fmt: skip
        self.state_dir = state_dir
        self.warm = warm
        self.jobs_dir = os.path.join(state_dir, "jobs")
        self.files = JobFiles(self.jobs_dir)
        self.capacity = dict(capacity)
        self.stop_grace_s = stop_grace_s
        self.store = JobStore(os.path.join(state_dir, "state.db"), durable=durable)
        self.server_id = self._server_id()
        self._lock = threading.RLock()
        self.clock = clock
        self._waiting = WaitingQueue()  # queued or held, in start order
        self._decision: Decision | None = None  # the latest; its reasons are worked out when asked for
        self._closing = threading.Event()
        self._tail_thread: threading.Thread | None = None
        self.started_at = time.time()
        self.users = UserBook(self.store)
        # None (a service made by hand, as unit tests do): no sandbox, no cgroup (serve() chooses one)
        self.isolation = isolation or Isolation("none", "not chosen", IsolationConfig(mode="off"))
        self.sandboxes = JobSandboxes(state_dir, self.isolation, self.users, self.server_id, secret_files)
        self.processes = Processes(state_dir, self.server_id, warm=warm, on_exit=self._finish,
                                   cgroup_of=self.sandboxes.cgroup,
                                   zygote_env=server_start_env() if self.isolation.sandboxes else None)  # fmt: skip
        self.job_tokens = JobTokens(self.store)
        self.launcher = Launcher(self.processes, self.sandboxes, self.job_tokens, self.server_id)
        self.tailer = EventsTailer(self.store, self.files.events, self.get)
        self.usage = UsageSampler(self.active_jobs, self.processes.jobs_processes, self.sandboxes.cgroup)
        self.audit = AuditLog(self.store)
        self.scheduling = Scheduling(self.store, self.capacity, team or TeamPolicy(), self.users, self._stop_preempted,
                                     lock=self._lock, on_alarm=self._schedule, clock=clock)  # fmt: skip
        self.ledger = self.scheduling.ledger
        self.elastic = Elastic(self.ledger, self.store, self.files, self.get)

    def _server_id(self) -> str:
        path = os.path.join(self.state_dir, "server_id")
        value = (open(path).read().strip() if os.path.exists(path) else "") or uuid.uuid4().hex[:12]
        write_atomic(path, value)
        return value

    def job_dir(self, job_id: int) -> str:
        return self.files.dir(job_id)

    # -- start-up and shut-down -------------------------------------------------------------------
    def recover(self) -> dict[str, int]:
        """Before serving: load the queue, reattach the runners that are still alive, finish the jobs
        whose runner ended while the server was down (from their exit file) and mark vanished ones
        lost. Returns counts by outcome."""
        counts = {"queued": 0, "reattached": 0, "ended": 0, "lost": 0, "broken": 0,
                  "swept": self.files.sweep(self.store.ids()) + self.sandboxes.sweep_cgroups()}  # fmt: skip
        stopping: list[tuple[int, bool]] = []
        with self._lock:
            for job in self.store.jobs(WAITING_STATES, newest_first=False):
                missing = self.files.missing(job)
                if missing is not None:
                    self.store.update_many([broken(job.id, missing, time.time())])
                    counts["broken"] += 1
                    continue
                self._waiting.put(request_of(job))
                counts["queued"] += 1
            for job in self.store.jobs(ACTIVE_STATES, newest_first=False):
                self.scheduling.hold(job, job.grant or {}, self.clock(), started_at=job.started_at)
                self.ledger.hold_gpus(job.id, job.gpu_ids or [])
                self.tailer.track(job.id, job.events_offset)
                if job.workers:
                    self.elastic.track(job.id, request_of(job), job.workers)
                pid = job.pid if job.pid is not None else self.processes.find_runner(job.id)
                if pid is not None and alive(pid, job.pid_start_time if job.pid is not None else None):
                    runner = self.processes.add(job.id, pid)
                    # A runner started just before the crash (no pid recorded yet) is running now.
                    state = {"state": JobState.RUNNING} if job.state == JobState.STARTING else {}
                    self.store.update(job.id, JobEvent.REATTACHED, {"pid": pid}, pid=pid, **state)
                    crash_point("reattach:recorded")
                    self.processes.follow(runner)
                    counts["reattached"] += 1
                    if job.state == JobState.STOPPING:
                        stopping.append((job.id, job.preempting))
                else:
                    counts["ended" if self.files.has_outcome(job.id) else "lost"] += 1
                    self._finish(job.id, None, schedule=False)
            self._schedule()
        for job_id, preempting in stopping:  # asked to stop (or preempted) before the crash: finish it
            threading.Thread(target=self._stop_preempted if preempting else self.stop, args=(job_id,), daemon=True,
                             name=f"tf-job{job_id}-stop").start()  # fmt: skip
        return counts

    def _fail(self, job_id: int, error: str, failure_class: FailureClass = FailureClass.INFRA,
              event: JobEvent = JobEvent.ENDED) -> None:  # fmt: skip
        """The job ends FAILED before its runner ran, saying why."""
        self.store.update(job_id, event, {"error": error}, state=JobState.FAILED, failure_class=failure_class,
                          error=error, ended_at=time.time(), pid=None)  # fmt: skip

    def start(self) -> None:
        self._tail_thread = threading.Thread(target=self._tail_loop, daemon=True, name="tf-tailer")
        self._tail_thread.start()
        self.usage.start()
        if self.warm:
            self.processes.start_zygote()

    def active_jobs(self) -> list[int]:
        with self._lock:
            return sorted(self.processes.runners)

    def close(self) -> None:
        """Stop following the jobs (they keep running; the next server reattaches them). The zygote
        stops serving and exits once the processes it forked have ended."""
        self._closing.set()
        self.scheduling.alarm.close()
        self.usage.close()
        with self._lock:
            self.ledger.accounting.persist(self.clock())
        self.audit.close()
        self.processes.close()
        if self._tail_thread is not None:
            self._tail_thread.join(timeout=5)
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
        owner: str = ADMIN,
        preemptible: bool = False,
    ) -> tuple[JobRow, bool]:
        """Queue a job; ValueError (with the numbers) if it can never fit. With a known
        ``submission_id``, returns that job and False instead of queueing another (ConflictError if
        that key was used for a different submission).

        Crash-safe order: the job's files (spec, trainer) are written to a staging directory, then,
        inside the transaction that inserts its row, moved to ``jobs/<id>``; the commit comes last. A
        crash before the commit leaves no job (the staging directory, or a ``jobs/<id>`` without a
        row, is swept at the next start); after it, a whole one."""
        check_fits(JobRequest.from_spec(spec, user=owner), self.capacity, self.scheduling.quota(owner))
        digest = submission_digest(name=name, spec={**spec, "preemptible": preemptible}, trainer_blob=trainer_blob,
                                   priority=priority, hold=hold, max_retries=max_retries)  # fmt: skip
        if submission_id is not None:
            known = self.store.by_submission(submission_id)
            if known is not None:
                return resubmitted(known, submission_id, digest), False
        with self.files.staged(spec, trainer_blob) as staging:
            crash_point("submit:staged")

            def place(job_id: int) -> None:
                crash_point("submit:inserted")
                self.files.place(staging, job_id)
                crash_point("submit:placed")

            with self._lock:
                job, created = self.store.add_job(
                    name=name, kind=spec["kind"], spec=spec, priority=priority, held=hold,
                    max_retries=max_retries, submission_id=submission_id, digest=digest, materialize=place,
                    owner=owner, preemptible=preemptible,
                )  # fmt: skip
                crash_point("submit:committed")
                if not created:  # the same key raced in from another request
                    return resubmitted(job, submission_id, digest), False
                self.scheduling.counters.submissions[owner] += 1
                self._waiting.put(request_of(job))
                self._schedule()
        return self.get(job.id), True

    def get(self, job_id: int) -> JobRow:
        job = self.store.get(job_id)
        if job is None:
            raise NotFoundError(f"no job {job_id} (list them with `trainforge jobs`)")
        return job

    def pending(self, job_id: int) -> Pending | None:
        with self._lock:
            if self._decision is None or job_id not in self._waiting:
                return None
            return self._decision.reason(job_id)

    def patch(self, job_id: int, *, priority: int | None = None, hold: bool | None = None) -> JobRow:
        with self._lock:
            job = self.get(job_id)
            if job.state not in WAITING_STATES:
                raise ConflictError(
                    f"job {job_id} is {job.state}: priority and hold can be changed only while it waits in the queue"
                )
            fields: dict[str, Any] = {}
            if priority is not None and priority != job.priority:
                fields["priority"] = priority
            if hold is not None and hold != (job.state == JobState.HELD):
                fields["state"] = JobState.HELD if hold else JobState.QUEUED
            if fields:
                event = JobEvent.HELD if hold and "state" in fields else JobEvent.RELEASED if "state" in fields else JobEvent.PRIORITY
                self.store.update(job_id, event, {"priority": fields.get("priority", job.priority)}, **fields)
                self._waiting.put(request_of(self.get(job_id)))
                self._schedule()
            return self.get(job_id)

    def retry(self, job_id: int, checkpoint: str | None = None) -> JobRow:
        """Queue a finished job again; a trainer job continues its last run from its latest checkpoint,
        or starts a new run from ``checkpoint`` (its ``resume_from_checkpoint``) when one is given."""
        with self._lock:
            job = self.get(job_id)
            if job.state not in TERMINAL_STATES:
                raise ConflictError(
                    f"job {job_id} is {job.state}: only a job that has ended (FAILED, STOPPED or SUCCEEDED) "
                    "can be retried"
                )
            if job.state == JobState.SUCCEEDED and checkpoint is None:
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
            self.store.update(job_id, JobEvent.RETRY, None, state=JobState.QUEUED, ended_at=None, spec=spec)
            self._requeue(job_id)
            self._schedule()
            return self.get(job_id)

    def _requeue(self, job_id: int) -> None:
        job = self.get(job_id)
        self.files.write_spec(job)
        self._waiting.put(request_of(job))

    def delete(self, job_id: int) -> None:
        with self._lock:
            job = self.get(job_id)
            if job.state not in TERMINAL_STATES:
                raise ConflictError(f"job {job_id} is {job.state}: stop it first; only ended jobs can be deleted")
            self.store.delete(job_id)
        self.files.remove(job_id)

    # -- stopping ---------------------------------------------------------------------------------
    def stop(self, job_id: int, *, grace_s: float | None = None, force: bool = False, complete: bool = False) -> JobRow:
        """Stop a job. A waiting one is cancelled at once. A running one is sent SIGINT (as Ctrl-C:
        its workers stop, committed checkpoints stay), or SIGKILL with ``force``; whatever is left of
        it after ``grace_s`` is killed. Returns once every process of the job is gone and its grant
        is released. ``complete``: its run is complete (a tuner's stop criteria, a trial's budget): it
        ends SUCCEEDED once stopped (a waiting one is cancelled, STOPPED: it never ran)."""
        grace = self.stop_grace_s if grace_s is None else grace_s
        with self._lock:
            job = self.get(job_id)
            if job.state in WAITING_STATES:
                self._waiting.discard(job_id)
                self.store.update(
                    job_id, JobEvent.STOPPED, {"while": job.state}, state=JobState.STOPPED, ended_at=time.time(),
                    failure_class=FailureClass.STOPPED,
                )  # fmt: skip
                self._schedule()
                return self.get(job_id)
            if job.state not in ACTIVE_STATES:
                raise ConflictError(f"job {job_id} already ended ({job.state}); nothing to stop")
            runner = self.processes.runners.get(job_id)
            self.ledger.stopping(job_id)
            if job.state != JobState.STOPPING or job.preempting:  # stopped while preempted: it ends STOPPED
                self.store.update(job_id, JobEvent.STOPPING, {"grace_s": grace, "force": force, "complete": complete},
                                  state=JobState.STOPPING, preempted_at=None if job.preempting else job.preempted_at,
                                  complete_on_stop=complete)  # fmt: skip
                crash_point("stop:stopping")
        if runner is None:  # STARTING without a runner yet cannot happen under the lock; be safe
            self.processes.kill_job(job_id)
            self._finish(job_id, None)
            return self.get(job_id)
        self.processes.stop(runner, grace_s=grace, force=force)
        return self.get(job_id)

    # -- scheduling and starting ------------------------------------------------------------------
    def _schedule(self) -> None:
        with self._lock:
            if self._closing.is_set():
                return
            now = self.clock()
            decision = self._decision = self.scheduling.decide(self._waiting, self.elastic.lendable(), now)
            for start in decision.starts:
                self._start(start.job_id, start.workers, start.grant)
            blocked = self._waiting.get(decision.blocked) if decision.blocked is not None else None
            self.elastic.shrink(blocked, now)
            self.elastic.grow(decision.reserved, self.scheduling.headroom, now)
            self.scheduling.carry_out(decision, blocked, now)  # preemptions; the alarm, for a time-based rule

    @property
    def last_decision_s(self) -> float:
        return self.scheduling.counters.last_decision_s

    def _stop_preempted(self, job_id: int) -> None:
        self.processes.stop_job(job_id, grace_s=self.stop_grace_s)

    def reschedule(self) -> None:  # decide again (the users' quotas or shares changed)
        self._schedule()

    def remove_user(self, name: str) -> tuple[str, int]:
        """:meth:`UserBook.remove` (their jobs and usage pass to a name no user can have), and the
        same in what the scheduler keeps of their waiting and running jobs; that name, and how many jobs."""
        with self._lock:
            tombstone, jobs = self.users.remove(name)
            self.ledger.rename(name, tombstone)
            for job_id in [j.job_id for j in self._waiting if j.user == name]:
                self._waiting.put(request_of(self.get(job_id)))
            self._schedule()
        return tombstone, jobs

    def queue(self) -> list[Pending]:  # every waiting job's reason (queue_page: only a page's)
        with self._lock:
            pending = self._decision.pending if self._decision is not None else []
            return [p for p in pending if p.job_id in self._waiting]

    def queue_page(self, offset: int, limit: int) -> tuple[list[Pending], int]:
        """The waiting jobs' reasons ``offset`` to ``offset + limit`` in start order, and how many wait."""
        with self._lock:
            decision = self._decision
            page = decision.page(offset, limit) if decision is not None else []
            return [p for p in page if p.job_id in self._waiting], decision.waiting if decision is not None else 0

    def free(self) -> dict[str, float]:
        return self.scheduling.free()

    def grants(self) -> dict[int, dict[str, Any]]:
        return self.scheduling.grants()

    def gpu_owners(self) -> dict[str, int]:
        return self.scheduling.gpu_owners()

    def _start(self, job_id: int, workers: int, grant: dict[str, float]) -> None:
        job = self.get(job_id)
        request = self._waiting.pop(job_id)
        missing = self.files.missing(job)
        if missing is not None:  # never a 500 or a job left QUEUED with no reason: it fails, saying why
            self.store.update_many([broken(job_id, missing, time.time())])
            return
        try:
            self.files.write_grant(job_id, request, workers)
        except OSError as exc:  # a full disk, a state directory changed under the server
            self._fail(job_id, f"could not write the job's grant file: {exc}")
            return
        self.elastic.track(job_id, request, workers)
        self.files.clear_outcome(job_id)
        attempt = job.attempt + 1
        self.scheduling.hold(job, grant, self.clock())  # charged from now on
        gpu_ids, tell_gpus = self.ledger.take_gpus(job_id)
        self.tailer.track(job_id, job.events_offset)
        # Persisted before the runner exists: a server killed right after this finds the job by its id.
        self.store.update(
            job_id, JobEvent.STARTING, {"workers": workers, "grant": grant, "gpu_ids": gpu_ids, "attempt": attempt},
            state=JobState.STARTING, grant=grant, workers=workers, gpu_ids=gpu_ids, attempt=attempt,
            started_at=time.time(), ended_at=None, exit_code=None, error=None, failure_class=None, pid=None, complete_on_stop=False,
        )  # fmt: skip
        crash_point("start:granted")
        try:
            popen = self.launcher.launch(job, request, job_dir=self.job_dir(job_id), attempt=attempt,
                                         gpu_ids=gpu_ids if tell_gpus else None)  # fmt: skip
        except LaunchError as exc:
            self._release(job_id)
            self.launcher.ended(job_id)
            self._fail(job_id, str(exc), exc.failure_class, JobEvent.FAILED)
            return
        try:
            start_time: float | None = psutil.Process(popen.pid).create_time()
        except psutil.Error:
            start_time = None
        crash_point("start:spawned")
        runner = self.processes.add(job_id, popen.pid, popen)
        self.store.update(job_id, JobEvent.RUNNING, {"pid": popen.pid}, state=JobState.RUNNING, pid=popen.pid,
                          pid_start_time=start_time)  # fmt: skip
        self.processes.follow(runner)

    def _release(self, job_id: int) -> None:
        self.ledger.release(job_id, self.clock())  # charged up to now
        self.elastic.forget(job_id)

    # -- following runners ------------------------------------------------------------------------
    def _finish(self, job_id: int, returncode: int | None, *, schedule: bool = True) -> None:
        """The job's runner is gone (``returncode`` None when it was not our child): read what it
        left, kill any process of the job still alive, release the grant, record the outcome."""
        if self._closing.is_set():
            return
        self.tailer.ingest(job_id)
        self.processes.kill_job(job_id)
        self.launcher.ended(job_id)  # its credential ends with it, and its cgroup goes
        outcome = self.files.outcome(job_id)
        crash_point("finish:read")
        with self._lock:
            job = self.get(job_id)
            runner = self.processes.runners.pop(job_id, None)
            self._release(job_id)
            changes, requeue = run_ended(job, outcome, returncode, time.time())
            self.store.update_many(changes)
            if requeue:
                self._requeue(job_id)
            if schedule:
                self._schedule()
        if runner is not None:
            runner.done.set()

    def _tail_loop(self) -> None:
        while not self._closing.wait(_TAIL_INTERVAL_S):
            self._tail_once()

    def _tail_once(self) -> None:
        """One pass of the tailer over the running jobs' event files."""
        for job_id in list(self.processes.runners):
            try:
                sized = self.tailer.ingest(job_id)
                self._resized(job_id, sized)  # after the ingest lock is released: it takes self._lock
            except Exception:  # a bad line or a vanished file must not stop the others
                logger.exception("reading job %s's events", job_id)

    def _resized(self, job_id: int, sized: Sized) -> None:
        """What the job's new events show of its group size (:meth:`Elastic.resized`); when its grant
        shrank, the resources it gave back go to the waiting jobs at once."""
        if not self.elastic.has_news(job_id, sized):
            return  # nothing new about its size (most passes of the tailer): no lock taken
        with self._lock:
            if self._closing.is_set():
                return
            if self.elastic.resized(job_id, sized, self.clock()):
                self._schedule()
