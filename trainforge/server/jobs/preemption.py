"""Carrying out a decision's preemptions (rule 8 of :mod:`trainforge.server.scheduling.rule`): each
victim is recorded STOPPING (``preempting``) in the store first, so a server killed now finds it
stopping and finishes stopping it, then asked to stop as Ctrl-C would, on a thread of its own; once
its runner has ended, the service requeues it (:func:`trainforge.server.jobs.outcome.run_ended`) and
it resumes from its latest committed checkpoint."""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Iterable

from trainforge.client import JobEvent, JobState
from trainforge.server.scheduling.ledger import ResourceLedger
from trainforge.server.store.database import JobStore

logger = logging.getLogger(__name__)



class Preemptor:
    """``stop_runner(job_id)`` stops a job's runner (as Ctrl-C, then a kill after the grace period)
    and returns once it is gone; ``counts``: preemptions by user."""

    def __init__(self, store: JobStore, ledger: ResourceLedger, stop_runner: Callable[[int], None],
                 counts: collections.Counter[str]):  # fmt: skip
        self.store = store
        self.ledger = ledger
        self.stop_runner = stop_runner
        self.counts = counts

    def preempt(self, victims: Iterable[int], for_job: int | None, now: float) -> None:
        """Ask each of ``victims`` to give its resources back to ``for_job`` (the caller holds the
        service's lock)."""
        for job_id in victims:
            held = self.ledger.get(job_id)
            if held is None or held.stopping:
                continue
            job = self.store.get(job_id)
            if job is None or job.state != JobState.RUNNING:
                continue  # still starting: its runner cannot take Ctrl-C yet; the next decision sees it
            self.ledger.preempted(job_id, now)
            self.store.update(
                job_id, JobEvent.PREEMPTING, {"for_job": for_job, "priority": job.priority, "preemptions": job.preemptions + 1},
                state=JobState.STOPPING, preempted_at=now, preemptions=job.preemptions + 1,
            )  # fmt: skip
            self.counts[job.owner] += 1
            logger.info("preempting job %s (%s, priority %s) for job %s", job_id, job.owner, job.priority, for_job)
            threading.Thread(target=self._stop, args=(job_id,), daemon=True, name=f"tf-job{job_id}-preempt").start()

    def _stop(self, job_id: int) -> None:
        try:
            self.stop_runner(job_id)
        except Exception:  # noqa: BLE001 - a thread of its own: say what failed, the server goes on
            logger.exception("preempting job %s", job_id)
