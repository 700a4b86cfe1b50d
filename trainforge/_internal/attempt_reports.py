"""``AttemptReports``: the reports of one attempt, held by report index until every rank has made
them (a report is complete, and its checkpoint committed, only then)."""

from __future__ import annotations

from dataclasses import dataclass, field

from trainforge._internal.worker_group.api import ReportEvent


@dataclass
class AttemptReports:
    """Reports of one attempt, by report index, until every rank has made them."""

    world_size: int
    pending: dict[int, dict[int, ReportEvent]] = field(default_factory=dict)
    counts: dict[int, int] = field(default_factory=dict)
    done: dict[int, int] = field(default_factory=dict)
    rank0_rows: dict[int, int] = field(default_factory=dict)  # report index -> history length after it

    def add(self, ev: ReportEvent) -> dict[int, ReportEvent] | None:
        self.counts[ev.rank] = self.counts.get(ev.rank, 0) + 1
        by_rank = self.pending.setdefault(ev.index, {})
        by_rank[ev.rank] = ev
        if len(by_rank) == self.world_size:
            return self.pending.pop(ev.index)
        return None
