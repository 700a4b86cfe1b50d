"""The train server's state: jobs and their events, in SQLite (the other tables' rows: the modules
beside this one, reached as this store's attributes).

One database file (``<state_dir>/state.db``), WAL mode with ``synchronous=NORMAL`` (a commit survives
a crash of the server; only a power loss can roll back the last ones), ``busy_timeout`` 5 s. Every
write goes through **one** connection behind a lock (one writer, as SQLite wants: concurrent
writers on separate connections are what gives "database is locked" under bursts); reads borrow one
of at most ``READERS`` connections (:class:`~trainforge.server.store.readers.ReaderPool`), which WAL lets run beside the writer. A
read holds its connection only while SQLite steps through the rows: however many threads read (the
HTTP server's thread pool, SSE streams, the scheduler), the store never has more than ``READERS + 1``
connections (and open files) to the database.

Each change of a job is one transaction: the row's update and an ``events`` row with a monotonic
``seq``. ``seq`` is the id of the server-sent event that carries it, so a client that reconnects
with ``Last-Event-ID`` misses nothing (:meth:`JobStore.events_after`). Whoever keeps facts derived
from the jobs (the Tune experiments' trials) is told of each committed change that concerns them
(:meth:`JobStore.watch`), so that they write where the fact arises, never on a read.
The schema version is ``PRAGMA user_version``; the migrations are :mod:`~trainforge.server.store.migrations`.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from trainforge._internal.job_events import EventType
from trainforge._internal.state_files import open_append
from trainforge.client import JobEvent, JobState
from trainforge.server.store.audit import AuditRows
from trainforge.server.store.experiments import ExperimentRows
from trainforge.server.store.job_rows import COLUMNS, JSON_COLUMNS, Change, Event, JobRow
from trainforge.server.store.migrations import migrate
from trainforge.server.store.readers import ReaderPool as _ReaderPool
from trainforge.server.store.tokens import JobTokenRows
from trainforge.server.store.users import UserRows

__all__ = ["READERS", "Change", "Event", "JobRow", "JobStore", "JobsChanged"]

logger = logging.getLogger(__name__)

# Reader connections at most. Each row SQLite steps through releases and retakes the GIL, so readers
# at once mostly wait on each other for it: on 2 cores, 20 threads reading 50 jobs at once, each on a
# connection of its own, read at half the rate of one thread; through 2 connections at 2/3 of it (1:
# 7/8, but then one long read holds up every other). bench/bench_server.py --parts load: the server.
READERS = 2


@dataclasses.dataclass(frozen=True)
class JobsChanged:
    """What one committed transaction did to the jobs, as :meth:`JobStore.watch`'s listeners are told:
    the jobs it ``added`` (id -> spec) and those whose state or events offset it ``moved``."""

    added: Mapping[int, Mapping[str, Any]]
    moved: frozenset[int]


class JobStore:
    """Jobs and events in ``path`` (created and migrated on open), and the other tables' rows:
    :attr:`users`, :attr:`audit`, :attr:`job_tokens`, :attr:`experiments`. Thread-safe."""

    def __init__(self, path: str, *, durable: bool = False, readers: int = READERS):
        self.path = path
        open_append(path).close()  # 0600 first: SQLite gives its -wal and -shm files the database's mode
        self._durable = durable
        self._write_lock = threading.Lock()
        self.readers = _ReaderPool(self._connect, readers)
        self._last_seq = 0
        self._txn_seq = 0  # the highest event seq of the transaction under way (under _write_lock)
        self._txn_counts: list[tuple[tuple[str, str], int]] = []  # its changes of the counts, applied at commit
        self._txn_added: dict[int, Mapping[str, Any]] = {}  # the jobs it added (for the listeners)
        self._txn_moved: set[int] = set()  # the jobs whose state or events offset it changed
        self._listeners: list[Callable[[JobsChanged], None]] = []
        self._writer = self._connect()
        with self._write_lock:
            migrate(self._writer, path)
        self.users = UserRows(self)
        self.audit = AuditRows(self)
        self.job_tokens = JobTokenRows(self)
        self.experiments = ExperimentRows(self)
        self._last_seq = self._writer.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()[0]
        # Jobs by (owner, state), kept in memory (the operators' /metrics reads it at every scrape).
        self._counts = collections.Counter({(r[0], r[1]): int(r[2]) for r in self._writer.execute(
            "SELECT owner, state, COUNT(*) FROM jobs GROUP BY owner, state")})  # fmt: skip

    # -- connections ------------------------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=5.0, isolation_level=None, check_same_thread=False)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={'FULL' if self._durable else 'NORMAL'}")
        conn.execute("PRAGMA busy_timeout=5000")
        return conn

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[sqlite3.Row]:
        """The rows of one query, on a borrowed reader connection (given back before they are parsed;
        never one borrow inside another, which could wait forever for the pool)."""
        with self.readers.lend() as conn:
            return conn.execute(sql, args).fetchall()

    def close(self) -> None:
        """Close every connection (a reader still lent closes when its read ends); reads and
        writes after this raise ``sqlite3.ProgrammingError``."""
        self.readers.close()
        with self._write_lock:
            self._writer.close()

    # -- writes -----------------------------------------------------------------------------------
    def _transaction(self, work: Any) -> Any:
        with self._write_lock:
            conn = self._writer
            self._txn_seq = 0
            self._txn_counts = []
            self._txn_added, self._txn_moved = {}, set()
            conn.execute("BEGIN IMMEDIATE")
            try:
                value = work(conn)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            if self._txn_seq:  # committed: readers may now be told about these events
                self._last_seq = self._txn_seq
            for key, n in self._txn_counts:
                self._counts[key] += n
            changed = JobsChanged(self._txn_added, frozenset(self._txn_moved))
            listeners = list(self._listeners) if changed.added or changed.moved else []
        for listener in listeners:  # outside the lock: a listener may write (its own transaction)
            try:
                listener(changed)
            except Exception:  # the change is committed: a listener's failure must not undo the caller's
                logger.exception("a listener of the store's job changes failed on %s", changed)
        return value

    def watch(self, listener: Callable[[JobsChanged], None]) -> None:
        """Call ``listener`` after each committed transaction that added jobs or changed a job's state
        or events offset, in the committing thread, after the write lock is released (it may read and
        write the store; its exceptions are logged, never raised to the committer). Two commits of two
        threads may reach a listener in either order: it reads the current rows, not the change's."""
        with self._write_lock:
            self._listeners.append(listener)

    def counts(self) -> dict[tuple[str, str], int]:
        """How many jobs each ``(owner, state)`` has now (in memory: no query)."""
        with self._write_lock:
            return {k: n for k, n in self._counts.items() if n}

    def _count(self, conn: sqlite3.Connection, job_id: int, new_state: str | None) -> None:
        """Inside a transaction, before the job's state changes to ``new_state`` (None: deleted)."""
        row = conn.execute("SELECT owner, state FROM jobs WHERE id=?", (job_id,)).fetchone()
        if row is not None:
            self._txn_counts.append(((row[0], row[1]), -1))
            if new_state is not None:
                self._txn_counts.append(((row[0], str(new_state)), 1))

    def _event(self, conn: sqlite3.Connection, job_id: int, type_: JobEvent, payload: dict[str, Any]) -> int:
        cur = conn.execute(
            "INSERT INTO events(job_id, ts, type, payload) VALUES (?, ?, ?, ?)",
            (job_id, time.time(), JobEvent(type_).value, json.dumps(payload)),
        )
        self._txn_seq = max(self._txn_seq, int(cur.lastrowid or 0))
        return self._txn_seq

    def add_job(
        self,
        *,
        name: str,
        kind: str,
        spec: dict[str, Any],
        priority: int = 0,
        held: bool = False,
        max_retries: int = 1,
        submission_id: str | None = None,
        digest: str | None = None,
        materialize: Callable[[int], None] | None = None,
        owner: str = "admin",
        preemptible: bool = False,
    ) -> tuple[JobRow, bool]:
        """Insert a job (QUEUED, or HELD) and its ``submitted`` event. With a ``submission_id`` that
        is already known, nothing is inserted: returns ``(that job, False)``. ``materialize(job_id)``
        runs inside the transaction, after the insert and before the commit (the job's files are put
        in place there): if it raises, or the process dies in it, the job was never committed."""

        def work(conn: sqlite3.Connection) -> tuple[int, bool]:
            if submission_id is not None:
                row = conn.execute("SELECT id FROM jobs WHERE submission_id=?", (submission_id,)).fetchone()
                if row is not None:
                    return int(row[0]), False
            state = JobState.HELD if held else JobState.QUEUED
            cur = conn.execute(
                "INSERT INTO jobs(name, submission_id, kind, state, priority, spec, submitted_at, max_retries, "
                "submission_digest, owner, preemptible) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (name, submission_id, kind, state, priority, json.dumps(spec), time.time(), max_retries, digest, owner,
                 int(preemptible)),
            )  # fmt: skip
            job_id = int(cur.lastrowid or 0)
            self._txn_counts.append(((owner, str(state)), 1))
            self._txn_added[job_id] = spec
            self._event(conn, job_id, JobEvent.SUBMITTED, {"state": state, "name": name, "priority": priority})
            if materialize is not None:
                materialize(job_id)
            return job_id, True

        job_id, created = self._transaction(work)
        job = self.get(job_id)
        assert job is not None
        return job, created

    def update(self, job_id: int, event: JobEvent | None = None, payload: dict[str, Any] | None = None, **fields: Any) -> None:
        """Set ``fields`` of the job and, with ``event``, append that event (``payload`` plus the new
        state, if it changed), in one transaction."""
        self.update_many([(job_id, event, payload, fields)])

    def update_many(self, changes: Iterable[Change]) -> None:
        changes = list(changes)

        def work(conn: sqlite3.Connection) -> None:
            for job_id, event, payload, fields in changes:
                self.apply(conn, job_id, event, payload, fields)

        self._transaction(work)

    def apply(
        self, conn: sqlite3.Connection, job_id: int, event: JobEvent | None, payload: dict[str, Any] | None, fields: dict
    ) -> None:
        """One change of a job (see :meth:`update`) in the transaction of ``conn`` (the store's modules'
        transactions that change a job too)."""
        columns = dict(fields)
        if "grant" in columns:
            columns["grant_json"] = columns.pop("grant")
        unknown = set(columns) - COLUMNS
        if unknown:
            raise ValueError(f"JobStore.update: unknown field(s) {sorted(unknown)}")
        if "state" in columns:
            self._count(conn, job_id, columns["state"])
            self._txn_moved.add(job_id)
        elif "events_offset" in columns:
            self._txn_moved.add(job_id)
        if columns:
            values = [json.dumps(v) if k in JSON_COLUMNS and v is not None else v for k, v in columns.items()]
            sets = ", ".join(f"{k}=?" for k in columns)
            conn.execute(f"UPDATE jobs SET {sets} WHERE id=?", (*values, job_id))
        if event is not None:
            body = dict(payload or {})
            if "state" in fields:
                body.setdefault("state", fields["state"])
            self._event(conn, job_id, event, body)

    def rename_owner(self, conn: sqlite3.Connection, old: str, new: str) -> int:
        """Inside a transaction: every job and experiment of ``old`` becomes ``new``'s (the counts by
        owner follow at commit). Returns how many jobs."""
        by_state = conn.execute("SELECT state, COUNT(*) FROM jobs WHERE owner=? GROUP BY state", (old,)).fetchall()
        conn.execute("UPDATE jobs SET owner=? WHERE owner=?", (new, old))
        conn.execute("UPDATE experiments SET owner=? WHERE owner=?", (new, old))
        for state, n in by_state:
            self._txn_counts += [((old, state), -int(n)), ((new, state), int(n))]
        return sum(int(n) for _, n in by_state)

    def delete(self, job_id: int) -> None:
        def work(conn: sqlite3.Connection) -> None:
            self._count(conn, job_id, None)
            conn.execute("DELETE FROM jobs WHERE id=?", (job_id,))
            self._event(conn, job_id, JobEvent.DELETED, {})

        self._transaction(work)

    # -- for the store's own modules (the other tables' rows); nowhere else: no SQL outside the store --
    def write(self, work: Callable[[sqlite3.Connection], Any]) -> Any:
        """``work(conn)`` in one write transaction on the one writer connection; its result."""
        return self._transaction(work)

    def add_event(self, conn: sqlite3.Connection, job_id: int, type_: JobEvent, payload: dict[str, Any]) -> int:
        """Inside :meth:`write`'s ``work``: append an event of the job (``/events`` sends it once committed)."""
        return self._event(conn, job_id, type_, payload)

    def query(self, sql: str, args: Sequence[Any] = ()) -> list[sqlite3.Row]:
        """The rows of one read query, on a reader connection."""
        return self._read(sql, args)

    # -- fair-share usage (trainforge.server.scheduling.accounting's UsageStore) -------------------------
    def usage_rows(self) -> dict[str, tuple[float, float]]:
        """Each user's decayed usage as last saved: user -> (value, as of when)."""
        return {row["user"]: (float(row["value"]), float(row["at"])) for row in self._read("SELECT user, value, at FROM usage")}

    def save_usage(self, values: Mapping[str, float], at: float) -> None:
        """Each user's usage ``values`` as of ``at``."""

        def work(conn: sqlite3.Connection) -> None:
            conn.executemany("INSERT INTO usage(user, value, at) VALUES (?, ?, ?) ON CONFLICT(user) DO UPDATE "
                             "SET value=excluded.value, at=excluded.at", [(u, v, at) for u, v in values.items()])  # fmt: skip

        self._transaction(work)

    # -- reads ------------------------------------------------------------------------------------
    def get(self, job_id: int) -> JobRow | None:
        rows = self._read("SELECT * FROM jobs WHERE id=?", (job_id,))
        return JobRow.from_sql(rows[0]) if rows else None

    def jobs(
        self,
        states: Sequence[str] | None = None,
        *,
        before: int | None = None,
        after: int | None = None,
        limit: int | None = None,
        newest_first: bool = True,
        name: str | None = None,
    ) -> list[JobRow]:
        """Jobs in ``states`` (all if None), by id; keyset paging with ``before``/``after`` (ids)."""
        where, args = _job_filter(states, before, after, name)
        sql = f"SELECT * FROM jobs{where} ORDER BY id {'DESC' if newest_first else 'ASC'}"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [JobRow.from_sql(r) for r in self._read(sql, args)]

    def jobs_running_since(self, since: float, limit: int = 200) -> list[JobRow]:
        """Jobs that held resources at some point after ``since`` (started, and not ended before it),
        the latest started first."""
        sql = ("SELECT * FROM jobs WHERE started_at IS NOT NULL AND (ended_at IS NULL OR ended_at >= ?) "
               f"ORDER BY started_at DESC LIMIT {int(limit)}")  # fmt: skip
        return [JobRow.from_sql(r) for r in self._read(sql, [since])]

    def jobs_by_run_path(self, paths: Sequence[str]) -> dict[str, JobRow]:
        """For each of ``paths``, the job one of whose runs (its latest, or an earlier one's
        ``run_start`` event) has that run directory; the newest job where several had. Paths that no
        job's run had are left out."""
        paths = list(dict.fromkeys(paths))[:500]
        if not paths:
            return {}
        marks = ",".join("?" * len(paths))
        sql = (f"SELECT run_path AS path, id FROM jobs WHERE run_path IN ({marks}) UNION "
               f"SELECT json_extract(payload, '$.run_path') AS path, job_id AS id FROM events "
               f"WHERE type = ? AND json_extract(payload, '$.run_path') IN ({marks}) ORDER BY id")  # fmt: skip
        newest = {r["path"]: r["id"] for r in self._read(sql, [*paths, EventType.RUN_START.value, *paths])}
        jobs = {i: job for i in set(newest.values()) if (job := self.get(i)) is not None}
        return {path: jobs[i] for path, i in newest.items() if i in jobs}

    def names(self, ids: Sequence[int]) -> dict[int, tuple[str, int]]:
        """The name and priority of each of the jobs ``ids`` (at most 1000) that exist, in one query
        (a page of the queue: no row parsed whole)."""
        ids = list(dict.fromkeys(ids))[:1000]
        sql = f"SELECT id, name, priority FROM jobs WHERE id IN ({','.join('?' * len(ids))})"
        return {int(r[0]): (r[1], int(r[2])) for r in (self._read(sql, ids) if ids else [])}

    def by_submission(self, submission_id: str) -> JobRow | None:
        rows = self._read("SELECT * FROM jobs WHERE submission_id=?", (submission_id,))
        return JobRow.from_sql(rows[0]) if rows else None

    def owner_of(self, job_id: int) -> str | None:
        """Who submitted the job ``job_id`` (None: no such job)."""
        rows = self._read("SELECT owner FROM jobs WHERE id=?", (job_id,))
        return str(rows[0][0]) if rows else None

    def oldest_submitted_at(self, state: str) -> float | None:
        """When the oldest job in ``state`` was submitted (None: no job is)."""
        rows = self._read("SELECT submitted_at FROM jobs WHERE state=? ORDER BY id LIMIT 1", (state,))
        return float(rows[0][0]) if rows else None

    def ids(self) -> set[int]:
        """Every job's id."""
        return {int(r[0]) for r in self._read("SELECT id FROM jobs")}

    def count(self, states: Sequence[str] | None = None, *, before: int | None = None, name: str | None = None) -> int:
        """How many jobs :meth:`jobs` with these filters would list without a limit."""
        where, args = _job_filter(states, before, None, name)
        sql = f"SELECT COUNT(*) FROM jobs{where}"
        return int(self._read(sql, args)[0][0])

    @property
    def last_seq(self) -> int:
        return self._last_seq

    def events_after(self, seq: int, job_id: int | None = None, limit: int = 1000) -> list[Event]:
        sql = "SELECT * FROM events WHERE seq > ?"
        args: list[Any] = [seq]
        if job_id is not None:
            sql += " AND job_id = ?"
            args.append(job_id)
        sql += f" ORDER BY seq LIMIT {int(limit)}"
        return [
            Event(r["seq"], r["job_id"], r["ts"], r["type"], json.loads(r["payload"]))
            for r in self._read(sql, args)
        ]


def _job_filter(
    states: Sequence[str] | None, before: int | None, after: int | None, name: str | None
) -> tuple[str, list[Any]]:
    """The ``WHERE`` clause (with its leading space, or empty) and arguments of a job listing's filters."""
    where: list[str] = []
    args: list[Any] = []
    if states:
        where.append(f"state IN ({','.join('?' * len(states))})")
        args.extend(states)
    if before is not None:
        where.append("id < ?")
        args.append(before)
    if after is not None:
        where.append("id > ?")
        args.append(after)
    if name:
        where.append("instr(name, ?) > 0")  # a plain substring (LIKE would treat _ and % as wildcards)
        args.append(name)
    return (" WHERE " + " AND ".join(where) if where else ""), args
