"""The store's schema, as numbered migrations: migration ``n`` takes a database from schema ``n - 1`` to
``n``, and the schema a database is at is its ``PRAGMA user_version`` (0: empty). :func:`migrate` runs the
missing ones, each in one transaction, when :class:`~trainforge.server.store.database.JobStore` opens
the file (before the server serves anything); a database of a newer schema than this code knows is
refused, naming what to do.

**Adding a migration**: a new key ``max(MIGRATIONS) + 1`` whose statements (separated by ``;``, none
containing one) take the newest schema one step on: ``ALTER TABLE ... ADD COLUMN`` with a default that
says what the rows from before mean, ``CREATE TABLE``/``CREATE INDEX``. A migration once released is
never edited or renumbered (databases out there are at its number); the tables' meaning is written in
the docstring of the module holding its SQL (:mod:`~trainforge.server.store.experiment_tables`,
:mod:`~trainforge.server.store.team_tables`). ``tests/test_server_store.py`` opens a database made by
an earlier release's code (``tests/data/state_v6.sql``) and checks the schema a fresh one gets.
"""

from __future__ import annotations

import sqlite3

from trainforge.server.store.experiment_tables import (
    EXPERIMENT_OWNER,
    EXPERIMENT_TABLES,
    TRIAL_STATES_OF_TUNE,
)
from trainforge.server.store.team_tables import ISOLATION_TABLES, TEAM_TABLES

MIGRATIONS: dict[int, str] = {
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
    7: TRIAL_STATES_OF_TUNE,  # trials' states in Tune's names (trainforge.server.store.experiment_tables)
    # A stop that completes the run (POST /jobs/{id}/stop {"complete": true}: a tuner's stop criteria or a
    # trial's max_t reached): the job ends SUCCEEDED, not STOPPED (trainforge.server.jobs.outcome).
    8: "ALTER TABLE jobs ADD COLUMN complete_on_stop INTEGER NOT NULL DEFAULT 0",
}
SCHEMA_VERSION = max(MIGRATIONS)  # the newest migration: each adds its own key


def migrate(conn: sqlite3.Connection, path: str) -> None:
    """Bring the database on ``conn`` (the file ``path``, named in the error) to :data:`SCHEMA_VERSION`,
    one transaction per migration; a database of a newer schema raises ``RuntimeError`` saying what to do."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise RuntimeError(
            f"{path} was written by a newer trainforge (schema {version}, this one knows "
            f"{SCHEMA_VERSION}): upgrade trainforge, or start the server with another --state-dir."
        )
    for target in range(version + 1, SCHEMA_VERSION + 1):
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in MIGRATIONS[target].split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version={target}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
