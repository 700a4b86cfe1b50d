"""``ResourceLedger``: the one owner of what the train server's running jobs hold.

It alone keeps, for each job holding resources, its grant (what it is charged: what the scheduler
counts against capacity and quotas), the GPUs it was given by id, whose it is, its priority, whether
it may be preempted, when it started and was last preempted, and whether it was asked to stop; and it
charges its user's usage (:class:`~trainforge.server.scheduling.accounting.Accounting`) from the
moment it holds resources until it releases them. Nothing else changes those tables: the job service
and the elastic bookkeeping call :meth:`hold`, :meth:`resize`, :meth:`release`, :meth:`stopping` and
:meth:`preempted`; the scheduler reads :meth:`running`, the pages and ``/metrics`` read
:meth:`holdings`, :meth:`usage` and :meth:`grants`.

Time is an argument of every method that changes or reads usage (``now``, seconds since the epoch
on a server), so tests drive it. The ledger takes no lock: its owner (the job service) calls it under
its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from trainforge.server.scheduling.accounting import Accounting
from trainforge.server.scheduling.gpus import GpuOwners
from trainforge.server.scheduling.resources import Resources, add, free_resources
from trainforge.server.scheduling.sharing import RunningJob


@dataclasses.dataclass
class Holding:
    """A job holding resources, as the ledger keeps it."""

    user: str
    grant: dict[str, float]
    priority: int = 0
    preemptible: bool = False
    started_at: float = 0.0
    preempted_at: float | None = None  # when it was last asked to give its resources back
    stopping: bool = False  # asked to stop (or preempted): what it holds comes free once it has


class ResourceLedger:
    """See the module docstring. ``capacity``: the service's (a dict it may change: the free amounts
    and dominant shares read it as it is); ``accounting``: the users' usage."""

    def __init__(self, capacity: dict[str, float], accounting: Accounting, gpus: GpuOwners | None = None):
        self.capacity = capacity
        self.accounting = accounting
        self.gpus = gpus if gpus is not None else GpuOwners(capacity.get("GPU", 0.0))
        self._held: dict[int, Holding] = {}

    # -- changes ---------------------------------------------------------------------------------------
    def hold(self, job_id: int, grant: Resources, now: float, *, user: str, priority: int = 0,
             preemptible: bool = False, started_at: float | None = None, preempted_at: float | None = None,
             stopping: bool = False) -> None:  # fmt: skip
        """``job_id`` holds ``grant`` from ``now`` on (its user charged from now); ``started_at``: when
        it started (a job found running at recovery started before ``now``)."""
        self._held[job_id] = Holding(user, dict(grant), priority, preemptible,
                                     now if started_at is None else started_at, preempted_at, stopping)  # fmt: skip
        self.accounting.start(job_id, user, grant, now)

    def take_gpus(self, job_id: int) -> tuple[list[str], bool]:
        """Free GPUs for ``job_id``'s grant, held from now on (:meth:`GpuOwners.take`)."""
        return self.gpus.take(job_id, self._held[job_id].grant if job_id in self._held else {})

    def hold_gpus(self, job_id: int, ids: list[str]) -> None:
        """``job_id`` holds the GPUs ``ids`` (found running at recovery)."""
        self.gpus.hold(job_id, ids)

    def resize(self, job_id: int, grant: Resources, now: float, *, gpu_ids: list[str] | None = None) -> None:
        """``job_id`` holds ``grant`` from ``now`` on (an elastic job grew or shrank), and, given
        ``gpu_ids``, only those of its GPUs (the others come free)."""
        held = self._held.get(job_id)
        if held is None:
            return
        held.grant = dict(grant)
        self.accounting.change(job_id, grant, now)
        if gpu_ids is not None:
            self.gpus.release(job_id)
            self.gpus.hold(job_id, gpu_ids)

    def release(self, job_id: int, now: float) -> None:
        """``job_id`` released everything it held at ``now`` (its user charged up to then)."""
        if self._held.pop(job_id, None) is not None:
            self.accounting.end(job_id, now)
        self.gpus.release(job_id)

    def stopping(self, job_id: int) -> None:
        """``job_id`` was asked to stop: what it holds comes free once it has (no one is preempted for it)."""
        if job_id in self._held:
            self._held[job_id].stopping = True

    def preempted(self, job_id: int, now: float) -> None:
        """``job_id`` was asked at ``now`` to give its resources back."""
        if job_id in self._held:
            held = self._held[job_id]
            held.stopping, held.preempted_at = True, now

    def rename(self, old: str, new: str) -> None:
        """The user ``old`` is called ``new`` from now on (a removed user's jobs and usage)."""
        for held in self._held.values():
            if held.user == old:
                held.user = new
        self.accounting.rename(old, new)

    # -- reads -----------------------------------------------------------------------------------------
    def __contains__(self, job_id: object) -> bool:
        return job_id in self._held

    def __len__(self) -> int:
        return len(self._held)

    def get(self, job_id: int) -> Holding | None:
        return self._held.get(job_id)

    def grant(self, job_id: int) -> dict[str, float]:
        """What ``job_id`` holds (nothing when it holds nothing)."""
        held = self._held.get(job_id)
        return dict(held.grant) if held is not None else {}

    def grants(self) -> dict[int, dict[str, float]]:
        """What each job holding resources holds (copies)."""
        return {job_id: dict(h.grant) for job_id, h in self._held.items()}

    def owners(self) -> dict[int, str]:
        """Whose each job holding resources is."""
        return {job_id: h.user for job_id, h in self._held.items()}

    def free(self) -> dict[str, float]:
        """What the capacity has left after every grant."""
        return free_resources(self.capacity, (h.grant for h in self._held.values()))

    def holdings(self) -> dict[str, dict[str, float]]:
        """What each user's jobs hold, by kind."""
        out: dict[str, dict[str, float]] = {}
        for held in self._held.values():
            add(out.setdefault(held.user, {}), held.grant)
        return out

    def held_by(self, user: str) -> dict[str, float]:
        """What ``user``'s jobs hold, by kind."""
        out: dict[str, float] = {}
        for held in self._held.values():
            if held.user == user:
                add(out, held.grant)
        return out

    def gpu_ids(self, job_id: int) -> list[str]:
        """The GPUs ``job_id`` holds, in order."""
        return self.gpus.by_job().get(job_id, [])

    def gpu_owners(self) -> dict[str, int]:
        """GPU id -> the job holding it (a copy)."""
        return dict(self.gpus.owner)

    def gpus_by_job(self) -> dict[int, list[str]]:
        """Job id -> the GPUs it holds, in order."""
        return self.gpus.by_job()

    def usage(self, now: float) -> dict[str, float]:
        """Each user's decayed usage as of ``now``, what their jobs hold until ``now`` included."""
        return self.accounting.usage(now)

    def running(self, now: float, lendable: Mapping[int, Resources] | None = None) -> list[RunningJob]:
        """The jobs holding resources as :func:`~trainforge.server.scheduling.rule.decide` takes them,
        as of ``now`` (``lendable``: what elastic jobs hold above their minimum)."""
        lent = lendable or {}
        return [RunningJob(job_id, h.grant, user=h.user, priority=h.priority, preemptible=h.preemptible,
                           run_s=max(0.0, now - h.started_at), stopping=h.stopping, lendable=lent.get(job_id, {}),
                           since_preempted_s=None if h.preempted_at is None else max(0.0, now - h.preempted_at))
                for job_id, h in self._held.items()]  # fmt: skip
