"""The train server's state: jobs and their events, in SQLite.

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
with ``Last-Event-ID`` misses nothing (:meth:`JobStore.events_after`).
The schema version is ``PRAGMA user_version``; a migration is one transaction, done before the server
serves anything.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from trainforge._internal.job_events import EventType
from trainforge._internal.state_files import open_append
from trainforge.client._states import JobEvent, JobState
from trainforge.server.store.experiment_tables import EXPERIMENT_OWNER, EXPERIMENT_TABLES
from trainforge.server.store.readers import ReaderPool as _ReaderPool
from trainforge.server.store.team_tables import ISOLATION_TABLES, TEAM_TABLES

# Reader connections at most. Each row SQLite steps through releases and retakes the GIL, so readers
# at once mostly wait on each other for it: on 2 cores, 20 threads reading 50 jobs at once, each on a
# connection of its own, read at half the rate of one thread; through 2 connections at 2/3 of it (1:
# 7/8, but then one long read holds up every other). bench/bench_server.py --parts load: the server.
READERS = 2

_MIGRATIONS = {
    1: """
    CREATE TABLE jobs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        name TEXT NOT NULL,
        submission_id TEXT UNIQUE,
        kind TEXT NOT NULL,
        state TEXT NOT NULL,
        priority INTEGER NOT NULL DEFAULT 0,
        spec TEXT NOT NULL,
        submitted_at REAL NOT NULL,
        started_at REAL,
        ended_at REAL,
        attempt INTEGER NOT NULL DEFAULT 0,
        max_retries INTEGER NOT NULL DEFAULT 1,
        grant_json TEXT,
        workers INTEGER,
        gpu_ids TEXT,
        pid INTEGER,
        pid_start_time REAL,
        run_path TEXT,
        exit_code INTEGER,
        failure_class TEXT,
        error TEXT,
        events_offset INTEGER NOT NULL DEFAULT 0,
        last_metrics TEXT,
        reports INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX jobs_state ON jobs(state, id);
    CREATE TABLE events (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id INTEGER NOT NULL,
        ts REAL NOT NULL,
        type TEXT NOT NULL,
        payload TEXT NOT NULL
    );
    CREATE INDEX events_job ON events(job_id, seq);
    """,
    # What a submission asked for (a digest of its spec, name, priority, hold, retries and trainer), so a
    # retried submission_id is recognised, and one reused for another job refused.
    2: "ALTER TABLE jobs ADD COLUMN submission_digest TEXT",
    3: EXPERIMENT_TABLES,  # Tune experiments, their trials and decisions (trainforge.server.store.experiment_tables)
    4: TEAM_TABLES,  # users, jobs' owners, audit, fair-share usage, preemption (trainforge.server.store.team_tables)
    5: EXPERIMENT_OWNER,  # who imported an experiment (trainforge.server.store.experiment_tables)
    6: ISOLATION_TABLES,  # users' uids, jobs' credentials (trainforge.server.store.team_tables)
}
_SCHEMA_VERSION = max(_MIGRATIONS)  # the newest migration: each adds its own key


@dataclasses.dataclass
class JobRow:
    id: int
    name: str
    submission_id: str | None
    kind: str
    state: JobState
    priority: int
    spec: dict[str, Any]
    submitted_at: float
    started_at: float | None
    ended_at: float | None
    attempt: int
    max_retries: int
    grant: dict[str, float] | None
    workers: int | None
    gpu_ids: list[str] | None
    pid: int | None
    pid_start_time: float | None
    run_path: str | None
    exit_code: int | None
    failure_class: str | None
    error: str | None
    events_offset: int
    last_metrics: dict[str, Any] | None
    reports: int
    submission_digest: str | None = None
    owner: str = "admin"  # who submitted it (the state directory's token is the user "admin")
    preemptible: bool = False
    preempted_at: float | None = None  # when it was last asked to give its resources back
    preemptions: int = 0

    @property
    def preempting(self) -> bool:
        """Asked to stop for a higher-priority job: it is requeued once its runner has ended."""
        return self.state == JobState.STOPPING and self.preempted_at is not None and (
            self.started_at is None or self.preempted_at >= self.started_at
        )

    @classmethod
    def from_sql(cls, row: sqlite3.Row) -> JobRow:
        d = dict(row)
        d["preemptible"] = bool(d.get("preemptible"))
        d["spec"] = json.loads(d["spec"])
        d["state"] = JobState(d["state"])
        grant = d.pop("grant_json")
        d["grant"] = json.loads(grant) if grant else None
        d["gpu_ids"] = json.loads(d["gpu_ids"]) if d["gpu_ids"] else None
        d["last_metrics"] = json.loads(d["last_metrics"]) if d["last_metrics"] else None
        return cls(**d)


@dataclasses.dataclass(frozen=True)
class Event:
    seq: int
    job_id: int
    ts: float
    type: str
    payload: dict[str, Any]


# One change of a job (JobStore.update_many): (job id, event or None, its payload, the fields to set).
Change = tuple[int, JobEvent | None, dict[str, Any] | None, dict[str, Any]]

_JSON_COLUMNS = {"spec", "grant_json", "gpu_ids", "last_metrics"}
_COLUMNS = {
    "name", "state", "priority", "started_at", "ended_at", "attempt", "max_retries", "grant_json", "workers",
    "gpu_ids", "pid", "pid_start_time", "run_path", "exit_code", "failure_class", "error", "events_offset",
    "last_metrics", "reports", "spec", "preempted_at", "preemptions",
}  # fmt: skip


class JobStore:
    """Jobs and events in ``path`` (created and migrated on open). Thread-safe."""

    def __init__(self, path: str, *, durable: bool = False, readers: int = READERS):
        self.path = path
        open_append(path).close()  # 0600 first: SQLite gives its -wal and -shm files the database's mode
        self._durable = durable
        self._write_lock = threading.Lock()
        self.readers = _ReaderPool(self._connect, readers)
        self._last_seq = 0
        self._txn_seq = 0  # the highest event seq of the transaction under way (under _write_lock)
        self._txn_counts: list[tuple[tuple[str, str], int]] = []  # its changes of the counts, applied at commit
        self._writer = self._connect()
        self._migrate()
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

    def _migrate(self) -> None:
        with self._write_lock:
            version = self._writer.execute("PRAGMA user_version").fetchone()[0]
            if version > _SCHEMA_VERSION:
                raise RuntimeError(
                    f"{self.path} was written by a newer trainforge (schema {version}, this one knows "
                    f"{_SCHEMA_VERSION}): upgrade trainforge, or start the server with another --state-dir."
                )
            for target in range(version + 1, _SCHEMA_VERSION + 1):
                self._writer.execute("BEGIN IMMEDIATE")
                try:
                    for statement in _MIGRATIONS[target].split(";"):
                        if statement.strip():
                            self._writer.execute(statement)
                    self._writer.execute(f"PRAGMA user_version={target}")
                    self._writer.execute("COMMIT")
                except BaseException:
                    self._writer.execute("ROLLBACK")
                    raise

    # -- writes -----------------------------------------------------------------------------------
    def _transaction(self, work: Any) -> Any:
        with self._write_lock:
            conn = self._writer
            self._txn_seq = 0
            self._txn_counts = []
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
        return value

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
                self._apply(conn, job_id, event, payload, fields)

        self._transaction(work)

    def _apply(
        self, conn: sqlite3.Connection, job_id: int, event: JobEvent | None, payload: dict[str, Any] | None, fields: dict
    ) -> None:
        columns = dict(fields)
        if "grant" in columns:
            columns["grant_json"] = columns.pop("grant")
        unknown = set(columns) - _COLUMNS
        if unknown:
            raise ValueError(f"JobStore.update: unknown field(s) {sorted(unknown)}")
        if "state" in columns:
            self._count(conn, job_id, columns["state"])
        if columns:
            values = [json.dumps(v) if k in _JSON_COLUMNS and v is not None else v for k, v in columns.items()]
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

    # -- the other tables' readers and writers (e.g. trainforge.server.experiments.book) ---------------
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
