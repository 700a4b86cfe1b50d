"""``JobTokenRows``: the ``job_tokens`` table (:mod:`~trainforge.server.store.team_tables`): each running
job's credential as its hash, for :class:`~trainforge.server.team.job_tokens.JobTokens`."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainforge.server.store.database import JobStore


class JobTokenRows:
    """The job credentials' rows of ``store``."""

    def __init__(self, store: JobStore):
        self._store = store

    def all(self) -> dict[int, tuple[str, str]]:
        """Job id -> (owner, token hash), of every job that holds a credential."""
        return {int(r[0]): (str(r[1]), str(r[2])) for r in self._store.query("SELECT job_id, owner, token_hash FROM job_tokens")}

    def put(self, job_id: int, owner: str, token_hash: str, created_at: float) -> None:
        """The job's credential (replacing an earlier one of it)."""

        def work(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO job_tokens(job_id, owner, token_hash, created_at) VALUES (?, ?, ?, ?) "
                         "ON CONFLICT(job_id) DO UPDATE SET owner=excluded.owner, token_hash=excluded.token_hash, "
                         "created_at=excluded.created_at", (job_id, owner, token_hash, created_at))  # fmt: skip

        self._store.write(work)

    def delete(self, job_id: int) -> None:
        """The job's credential, gone."""
        self._store.write(lambda conn: conn.execute("DELETE FROM job_tokens WHERE job_id=?", (job_id,)))
