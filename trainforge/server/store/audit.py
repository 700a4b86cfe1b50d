"""``AuditRows``: the ``audit`` table (:mod:`~trainforge.server.store.team_tables`), for
:class:`~trainforge.server.team.audit.AuditLog`, which gathers the entries and writes them a moment
later, many in one transaction."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainforge.server.store.database import JobStore

# An entry: (ts, user, role, action, method, path, job_id, status, client, detail).
AuditRow = tuple[float, str, str, str, str, str, "int | None", int, "str | None", "str | None"]


class AuditRowsRefused(ValueError):
    """SQLite refused a batch of entries (a value it cannot store): none of them was written."""


class AuditRows:
    """The audit entries of ``store``."""

    def __init__(self, store: JobStore):
        self._store = store

    def add(self, rows: Sequence[AuditRow]) -> None:
        """Append ``rows`` in one transaction. Once the store is closed (the server is stopping) they
        are dropped; a batch SQLite refuses raises :class:`AuditRowsRefused` (none of it written)."""

        def work(conn: sqlite3.Connection) -> None:
            conn.executemany("INSERT INTO audit(ts, user, role, action, method, path, job_id, status, client, detail) "
                             "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)  # fmt: skip

        try:
            self._store.write(work)
        except sqlite3.ProgrammingError:  # the store closed under us
            pass
        except (sqlite3.Error, OverflowError, ValueError) as exc:
            raise AuditRowsRefused(f"{len(rows)} audit entries refused by SQLite: {exc}") from exc

    def newest(self, *, user: str | None = None, job_id: int | None = None, before: int | None = None,
               limit: int = 100) -> list[dict[str, Any]]:  # fmt: skip
        """Entries, newest first: of ``user``, of ``job_id``, older than the entry ``before`` (its ``seq``)."""
        where, args = [], []
        for column, value in (("user", user), ("job_id", job_id)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        if before is not None:
            where.append("seq < ?")
            args.append(before)
        sql = "SELECT * FROM audit" + (" WHERE " + " AND ".join(where) if where else "")
        return [dict(r) for r in self._store.query(sql + f" ORDER BY seq DESC LIMIT {int(limit)}", args)]
