"""``UserRows``: the ``users`` table and the ``user_uid`` counter (:mod:`~trainforge.server.store.team_tables`),
for :class:`~trainforge.server.team.users.UserBook`, which keeps the users in memory and decides
what changes; here is only how each change is written, each in one transaction. A row is a plain
``dict`` of the table's columns."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainforge.server.store.database import JobStore

# What UserRows.update may set.
_FIELDS = frozenset({"role", "key_id", "salt", "token_hash", "shares", "quota", "rotated_at", "os_user"})


class UserExists(RuntimeError):
    """A user of that name is there already (what :meth:`UserRows.add` found)."""


class NoSuchUser(LookupError):
    """No user of that name (what a change of one found)."""


def _next_uid(conn: sqlite3.Connection) -> int:
    """Inside a write: the next user number (from 1; the admin's is 0), never one given before."""
    row = conn.execute("SELECT value FROM counters WHERE name='user_uid'").fetchone()
    value = (int(row[0]) if row else 0) + 1
    conn.execute("INSERT INTO counters(name, value) VALUES ('user_uid', ?) "
                 "ON CONFLICT(name) DO UPDATE SET value=excluded.value", (value,))  # fmt: skip
    return value


def _one(conn: sqlite3.Connection, name: str) -> dict[str, Any]:
    row = conn.execute("SELECT * FROM users WHERE name=?", (name,)).fetchone()
    if row is None:
        raise NoSuchUser(name)
    return dict(row)


class UserRows:
    """The users' rows of ``store``."""

    def __init__(self, store: JobStore):
        self._store = store

    def all(self) -> list[dict[str, Any]]:
        """Every user's row, by name."""
        return [dict(r) for r in self._store.query("SELECT * FROM users ORDER BY name")]

    def add(self, name: str, *, role: str, key_id: str, salt: str, token_hash: str, shares: float,
            quota: str | None, created_at: float, os_user: str | None) -> dict[str, Any]:  # fmt: skip
        """Insert the user ``name`` with the next user number (:class:`UserExists` if there is one); its row."""

        def work(conn: sqlite3.Connection) -> dict[str, Any]:
            if conn.execute("SELECT 1 FROM users WHERE name=?", (name,)).fetchone():
                raise UserExists(name)
            conn.execute(
                "INSERT INTO users(name, role, key_id, salt, token_hash, shares, quota, created_at, uid, os_user) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (name, role, key_id, salt, token_hash, shares, quota, created_at, _next_uid(conn), os_user),
            )  # fmt: skip
            return _one(conn, name)

        return self._store.write(work)  # type: ignore[no-any-return]

    def update(self, name: str, **fields: Any) -> dict[str, Any]:
        """Set ``fields`` (columns of ``users``, not the name nor the number) of ``name``'s row
        (:class:`NoSuchUser` if there is none); the row after."""
        unknown = set(fields) - _FIELDS
        if unknown or not fields:
            raise ValueError(f"UserRows.update: fields {sorted(unknown) or '(none)'}: allowed are {sorted(_FIELDS)}")
        sets = ", ".join(f"{column}=?" for column in fields)

        def work(conn: sqlite3.Connection) -> dict[str, Any]:
            conn.execute(f"UPDATE users SET {sets} WHERE name=?", (*fields.values(), name))
            return _one(conn, name)

        return self._store.write(work)  # type: ignore[no-any-return]

    def give_uid(self, name: str) -> dict[str, Any]:
        """``name``'s row, with the next user number given them if they have none yet (a user from
        before numbers were); :class:`NoSuchUser` if there is none."""

        def work(conn: sqlite3.Connection) -> dict[str, Any]:
            row = _one(conn, name)
            if row["uid"] is None:
                conn.execute("UPDATE users SET uid=? WHERE name=?", (_next_uid(conn), name))
                row = _one(conn, name)
            return row

        return self._store.write(work)  # type: ignore[no-any-return]

    def remove(self, name: str, keep_as: Callable[[Callable[[str], bool]], str]) -> tuple[str, int]:
        """In one transaction: delete ``name``'s row (:class:`NoSuchUser` if there is none), and give
        their jobs, experiments and fair-share usage to the name ``keep_as(taken)`` returns, where
        ``taken(n)`` says whether any job or usage is held under ``n`` already. Returns that name and
        how many jobs it holds."""

        def work(conn: sqlite3.Connection) -> tuple[str, int]:
            if conn.execute("DELETE FROM users WHERE name=?", (name,)).rowcount == 0:
                raise NoSuchUser(name)
            tombstone = keep_as(lambda n: conn.execute(
                "SELECT 1 FROM jobs WHERE owner=? UNION ALL SELECT 1 FROM usage WHERE user=? LIMIT 1", (n, n)
            ).fetchone() is not None)  # fmt: skip
            conn.execute("UPDATE usage SET user=? WHERE user=?", (tombstone, name))
            return tombstone, self._store.rename_owner(conn, name, tombstone)

        return self._store.write(work)  # type: ignore[no-any-return]
