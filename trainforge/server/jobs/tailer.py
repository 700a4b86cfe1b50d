"""``EventsTailer``: the running jobs' events files (:mod:`trainforge._internal.job_events`) read
into the store, from the byte offset each job's last read stopped at.

The lifecycle events (``run_start``, ``restart``, ``run_end``) become the job's events in the store,
the reports its latest metrics and report count; the new offset goes into the same transaction, so
nothing is recorded twice after a server restart. What the events show of the job's group size is
returned (:class:`Sized`) for the elastic bookkeeping (:mod:`trainforge.server.jobs.elastic`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

from trainforge._internal.job_events import EventType, read_events
from trainforge.client import JobEvent
from trainforge.server.store.database import Change, JobRow, JobStore


@dataclasses.dataclass
class Sized:
    """What a job's new events show of its worker group's size."""

    resized: int | None = None  # the workers of its latest elastic resize (a "restart" with "workers")
    world: int | None = None  # its size at the latest event that shows one (None: unknown since)
    news: bool = False  # an event showed the size, or made it unknown (a failure restart, a new run)


class EventsTailer:
    """Reads jobs' events files into ``store``; ``events_path(id)`` is each job's file,
    ``get_job(id)`` its row (for the offset to start from, and its report count)."""

    def __init__(self, store: JobStore, events_path: Callable[[int], str], get_job: Callable[[int], JobRow]):
        self.store = store
        self._events_path = events_path
        self._get_job = get_job
        self._offsets: dict[int, int] = {}
        self._locks: dict[int, threading.Lock] = {}
        # Where a tuner's decision ended the trial a job runs (its reports past that iteration are not the
        # trial's, so they do not become the job's figures, ``last_metrics``): the experiments book sets it.
        self.cut_of: Callable[[int], int | None] = lambda job_id: None

    def track(self, job_id: int, offset: int) -> None:
        """Read the job's file on from ``offset`` (the stored one) unless it is read already."""
        self._offsets.setdefault(job_id, offset)

    def ingest(self, job_id: int) -> Sized:
        """Read the job's new events (complete lines past its offset) into the store, the new offset
        in the same transaction. Returns what they show of the job's group size (a report's ranks, a
        resize's workers)."""
        sized = Sized()
        lock = self._locks.setdefault(job_id, threading.Lock())
        with lock:
            offset = self._offsets.get(job_id)
            if offset is None:
                offset = self._offsets[job_id] = self._get_job(job_id).events_offset
            lines, new_offset = read_events(self._events_path(job_id), offset)
            if new_offset == offset:
                return sized  # no complete line yet
            events = list(lines)
            changes: list[Change] = []
            fields: dict[str, Any] = {}
            reports = 0
            cut = self.cut_of(job_id) if any(e.get("type") == EventType.REPORT for e in events) else None
            for event in events:
                kind = event.get("type")
                if kind == EventType.REPORT:
                    reports += 1
                    index = event.get("index")
                    if cut is None or not isinstance(index, int) or index < cut:
                        fields["last_metrics"] = event.get("metrics")
                    sized.world, sized.news = len(event.get("all_metrics") or ()) or None, True
                elif kind == EventType.RUN_START:
                    run_path = event.get("run_path")
                    changes.append((job_id, JobEvent.RUN_START, {"run_path": run_path}, {"run_path": run_path}))
                    sized.world, sized.news = None, True
                elif kind in (EventType.RESTART, EventType.RUN_END):
                    payload = {k: v for k, v in event.items() if k not in ("type", "metrics")}
                    changes.append((job_id, JobEvent(str(kind)), payload, {}))
                    if kind == EventType.RESTART:
                        workers = event.get("workers")  # set on an elastic resize (job_events)
                        if isinstance(workers, int):
                            sized.resized = workers
                        sized.world, sized.news = (workers if isinstance(workers, int) else None), True
            if reports:
                fields["reports"] = self._get_job(job_id).reports + reports
            fields["events_offset"] = new_offset
            changes.append((job_id, None, None, fields))
            self.store.update_many(changes)
            self._offsets[job_id] = new_offset
        return sized
