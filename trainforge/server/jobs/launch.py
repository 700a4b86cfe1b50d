"""Launching a granted job's runner: its environment, its sandbox and credential (on a server with
users), its cgroup, then the process (:meth:`Processes.spawn`). What :meth:`JobService._start`
does once the scheduler granted a job and the grant is recorded.

A job on a single-user server runs as before: the server's user and environment, no sandbox, no
cgroup (joining one costs the first step ~5-10 ms, a kernel RCU grace period). A job on a server
with users is sandboxed
(:mod:`trainforge.server.jobs.sandboxes`): its environment is built, not inherited, and carries its own
credential (:mod:`trainforge.server.team.job_tokens`) and the server's address instead of any token of
the server's.
"""

from __future__ import annotations

import dataclasses
import subprocess

from trainforge._internal import zygote
from trainforge._internal.constants import ENV_ADDRESS, ENV_TOKEN
from trainforge._internal.run_outcome import FailureClass
from trainforge.server.jobs.processes import Processes, job_env
from trainforge.server.jobs.sandboxes import JobSandboxes, server_start_env
from trainforge.server.scheduling.rule import JobRequest
from trainforge.server.store.database import JobRow
from trainforge.server.team.job_tokens import JobTokens


class LaunchError(Exception):
    """The job cannot start (before its runner exists): why, and whose fault (``user_error`` or
    ``infra``)."""

    def __init__(self, message: str, failure_class: FailureClass = FailureClass.INFRA):
        super().__init__(message)
        self.failure_class = failure_class


@dataclasses.dataclass
class Launcher:
    """What starting a runner needs of the server: its processes, its sandboxes, the jobs'
    credentials, its id and (once it serves) its URL."""

    processes: Processes
    sandboxes: JobSandboxes
    tokens: JobTokens
    server_id: str
    url: str = ""

    def launch(self, job: JobRow, request: JobRequest, *, job_dir: str, attempt: int,
               gpu_ids: list[str] | None) -> subprocess.Popen[bytes] | zygote.ZygoteChild:  # fmt: skip
        """Start job ``job``'s runner (attempt ``attempt``, with ``gpu_ids``: None when the machine
        has none to share out). :class:`LaunchError` if it cannot, saying why."""
        try:
            return self._launch(job, request, job_dir=job_dir, attempt=attempt, gpu_ids=gpu_ids)
        except OSError as exc:  # the spawn itself: no memory, no process slot, a state directory changed under us
            raise LaunchError(f"could not start the job's runner: {exc}") from None

    def _launch(self, job: JobRow, request: JobRequest, *, job_dir: str, attempt: int,
                gpu_ids: list[str] | None) -> subprocess.Popen[bytes] | zygote.ZygoteChild:  # fmt: skip
        spec_env = job.spec.get("env") or {}

        def env_of(base: dict[str, str] | None) -> dict[str, str]:
            return job_env(job_id=job.id, server_id=self.server_id, attempt=attempt, job_dir=job_dir,
                           spec_env=spec_env, gpu_ids=gpu_ids, base=base)  # fmt: skip

        if not self.sandboxes.active():  # a single-user server: as before, not even a cgroup (moving a
            return self.processes.spawn(job_dir, env_of(None))  # process into one costs an RCU grace period)
        memory = request.request(request.upper_workers).get("memory")
        try:
            plan, who = self.sandboxes.prepare(job, job_dir, memory_max=int(memory) if memory else None)
        except LookupError as exc:  # its owner was removed since it was queued
            raise LaunchError(f"the job's owner {job.owner!r} is no longer a user of this server ({exc}): an admin "
                              "may resubmit it", FailureClass.USER_ERROR) from None  # fmt: skip
        except (OSError, KeyError, ValueError) as exc:
            raise LaunchError(f"could not prepare the job's sandbox: {exc}") from None
        env = env_of(self.sandboxes.base_env(who))
        env[ENV_ADDRESS] = self.url
        env[ENV_TOKEN] = self.tokens.issue(job.id, job.owner)
        return self.processes.spawn(job_dir, env, plan=dataclasses.replace(plan, env=env), start_env=server_start_env())

    def ended(self, job_id: int) -> None:
        """The job's runner is gone and its processes killed: its credential stops working, its
        cgroup goes."""
        self.tokens.revoke(job_id)
        self.processes.forget_cgroup(job_id)
