"""``ExperimentRows``: the tables of Tune experiments (``experiments``, ``trials``, ``decisions``:
:mod:`~trainforge.server.store.experiment_tables`), for :class:`~trainforge.server.experiments.book.Experiments`
(which decides what changes) and :mod:`~trainforge.server.experiments.views` (which shows them).

A row read is an ``sqlite3.Row`` (:data:`Row`: its columns by name); JSON columns (``space``,
``config``, ``jobs``, ``reason``, ``metrics``, ``history``, ``detail``) are text both ways, encoded and
decoded by the caller. A change is one transaction: :meth:`ExperimentRows.change` hands its work an
:class:`ExperimentWrites`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from trainforge.client import JobEvent

if TYPE_CHECKING:
    from trainforge.server.store.database import JobStore

Row = sqlite3.Row
_T = TypeVar("_T")

# The columns a change may set (every column but the keys; "id" and "seq" are the database's).
_EXPERIMENT = frozenset({"path", "name", "tune_id", "source", "searcher", "scheduler", "metric", "mode", "space",
                         "created_at", "ended_at", "owner"})  # fmt: skip
_TRIAL = frozenset({"experiment_id", "trial_id", "name", "config", "jobs", "job_id", "job_state", "scanned", "state",
                    "reason", "iterations", "last", "best", "best_at", "metrics", "history", "checkpoint",
                    "started_at", "ended_at", "rev"})  # fmt: skip
_DECISION = frozenset({"experiment_id", "trial_id", "job_id", "ts", "kind", "iteration", "detail", "rev"})
# The columns of a trial that an experiment's summary takes.
_SUMMARY = ("experiment_id, trial_id, state, json_extract(reason, '$.kind') AS kind, last, job_id, checkpoint, config, "
            "started_at, ended_at")
_IS_TRIAL_JOB = "json_extract(spec, '$.experiment.path') IS NOT NULL"


def _columns(table: str, allowed: frozenset[str], columns: dict[str, Any]) -> None:
    unknown = set(columns) - allowed
    if unknown or not columns:
        raise ValueError(f"{table}: columns {sorted(unknown) or '(none)'}: allowed are {sorted(allowed)}")


def _marks(values: Collection[Any]) -> str:
    return ",".join("?" * len(values))


class ExperimentWrites:
    """The writes of one transaction of :meth:`ExperimentRows.change` (on its connection)."""

    def __init__(self, store: JobStore, conn: sqlite3.Connection):
        self._store = store
        self._conn = conn

    def _insert(self, table: str, allowed: frozenset[str], columns: dict[str, Any]) -> int:
        _columns(table, allowed, columns)
        cur = self._conn.execute(f"INSERT INTO {table}({', '.join(columns)}) VALUES ({_marks(columns)})",
                                 tuple(columns.values()))  # fmt: skip
        return int(cur.lastrowid or 0)

    def experiment_at(self, path: str) -> int | None:
        """The id of the experiment of directory ``path``, if there is one."""
        row = self._conn.execute("SELECT id FROM experiments WHERE path = ?", (path,)).fetchone()
        return int(row[0]) if row is not None else None

    def add_experiment(self, **columns: Any) -> int:
        """A new experiment; its id."""
        return self._insert("experiments", _EXPERIMENT, columns)

    def set_experiment(self, experiment_id: int, **columns: Any) -> None:
        _columns("experiments", _EXPERIMENT, columns)
        sets = ", ".join(f"{k} = ?" for k in columns)
        self._conn.execute(f"UPDATE experiments SET {sets} WHERE id = ?", (*columns.values(), experiment_id))

    def clear_experiment(self, experiment_id: int) -> None:
        """Delete the experiment's trials and decisions (an import replaces them)."""
        self._conn.execute("DELETE FROM trials WHERE experiment_id = ?", (experiment_id,))
        self._conn.execute("DELETE FROM decisions WHERE experiment_id = ?", (experiment_id,))

    def trial(self, experiment_id: int, trial_id: str) -> Row | None:
        return self._conn.execute("SELECT * FROM trials WHERE experiment_id = ? AND trial_id = ?",
                                  (experiment_id, trial_id)).fetchone()  # fmt: skip

    def add_trial(self, **columns: Any) -> None:
        self._insert("trials", _TRIAL, columns)

    def set_trial(self, experiment_id: int, trial_id: str, **columns: Any) -> None:
        _columns("trials", _TRIAL, columns)
        sets = ", ".join(f"{k} = ?" for k in columns)
        self._conn.execute(f"UPDATE trials SET {sets} WHERE experiment_id = ? AND trial_id = ?",
                           (*columns.values(), experiment_id, trial_id))  # fmt: skip

    def add_decision(self, **columns: Any) -> int:
        """A tuner's decision; its ``seq``."""
        return self._insert("decisions", _DECISION, columns)

    def set_job_metrics(self, job_id: int, metrics: dict[str, Any] | None) -> None:
        """The job's figures (``last_metrics``: what its row, ``trainforge status`` and Compare show) set to
        ``metrics``: its trial's at the tuner's decision."""
        self._store.apply(self._conn, job_id, None, None, {"last_metrics": metrics})

    def add_job_event(self, job_id: int, type_: JobEvent, payload: dict[str, Any]) -> int:
        """An event of the job (``/events`` sends it once committed); its ``seq``."""
        return self._store.add_event(self._conn, job_id, type_, payload)


class ExperimentRows:
    """The experiments' rows of ``store``."""

    def __init__(self, store: JobStore):
        self._store = store

    def change(self, work: Callable[[ExperimentWrites], _T]) -> _T:
        """``work(writes)`` in one transaction; its result."""
        return self._store.write(lambda conn: work(ExperimentWrites(self._store, conn)))  # type: ignore[no-any-return]

    # -- the trials' jobs ------------------------------------------------------------------------------
    def max_rev(self) -> int:
        """The latest change's number (0: none yet)."""
        rows = self._store.query("SELECT MAX(r) FROM (SELECT MAX(rev) AS r FROM trials UNION ALL "
                                 "SELECT MAX(rev) FROM decisions)")  # fmt: skip
        return int(rows[0][0] or 0)

    def trial_job_ids(self) -> set[int]:
        """Every trial's latest job."""
        return {int(r[0]) for r in self._store.query("SELECT job_id FROM trials WHERE job_id IS NOT NULL")}

    def trial_jobs(self, ids: Sequence[int] | None = None, *, after: int | None = None) -> list[Row]:
        """The jobs (``id, name, spec, submitted_at, owner``) that are trials of an experiment, by id: of
        ``ids``, or with an id above ``after`` (None: above the highest any trial has)."""
        if ids is not None:
            ids = list(ids)[:1000]
            return self._store.query(f"SELECT id, name, spec, submitted_at, owner FROM jobs WHERE id IN ({_marks(ids)}) "
                                     f"AND {_IS_TRIAL_JOB} ORDER BY id", ids) if ids else []  # fmt: skip
        if after is None:
            after = int(self._store.query("SELECT COALESCE(MAX(job_id), 0) FROM trials")[0][0])
        return self._store.query(f"SELECT id, name, spec, submitted_at, owner FROM jobs WHERE id > ? AND {_IS_TRIAL_JOB} "
                                 "ORDER BY id", (after,))  # fmt: skip

    def stale_trials(self, job_ids: Collection[int] | None = None) -> list[Row]:
        """The trials (of the jobs ``job_ids``; None: all) whose latest job's state or events offset
        moved past what the trial shows, with that job's state, offset, times and error and the
        experiment's metric and mode."""
        sql = ("SELECT t.experiment_id, t.trial_id, t.jobs, t.scanned, t.reason, t.iterations, t.last, t.best, "
               "t.best_at, t.metrics, t.started_at, j.state, j.events_offset, j.started_at AS job_started, "
               "j.ended_at AS job_ended, j.error, e.metric, e.mode FROM trials t JOIN jobs j ON j.id = t.job_id "
               "JOIN experiments e ON e.id = t.experiment_id "
               "WHERE (j.state IS NOT t.job_state OR j.events_offset > t.scanned)")  # fmt: skip
        if job_ids is None:
            return self._store.query(sql)
        ids = list(job_ids)
        return self._store.query(sql + f" AND t.job_id IN ({_marks(ids)})", ids) if ids else []

    def trial_of_job(self, job_id: int) -> Row | None:
        """The trial whose latest job is ``job_id`` (``experiment_id, trial_id, jobs, job_state``) with
        its experiment's ``metric`` and ``mode``."""
        rows = self._store.query(
            "SELECT t.experiment_id, t.trial_id, t.jobs, t.job_state, e.metric, e.mode FROM trials t "
            "JOIN experiments e ON e.id = t.experiment_id WHERE t.job_id = ?", (job_id,))  # fmt: skip
        return rows[0] if rows else None

    def jobs_of_trials_with(self, job_id: int) -> list[str]:
        """The ``jobs`` (JSON) of the trials that ran job ``job_id``: as their latest job or (PBT) an earlier one."""
        rows = self._store.query("SELECT jobs FROM trials WHERE job_id = ?", (job_id,))
        if not rows and self._store.query(f"SELECT 1 FROM jobs WHERE id = ? AND {_IS_TRIAL_JOB}", (job_id,)):
            rows = self._store.query("SELECT jobs FROM trials WHERE instr(jobs, ?) > 0", (f'"job": {job_id},',))
        return [str(r[0]) for r in rows]

    # -- the experiments, as the views show them ------------------------------------------------------
    def experiment(self, experiment_id: int) -> Row | None:
        rows = self._store.query("SELECT * FROM experiments WHERE id = ?", (experiment_id,))
        return rows[0] if rows else None

    def experiment_by_path(self, path: str) -> Row | None:
        """The experiment of directory ``path`` (``id, source, owner``), if there is one."""
        rows = self._store.query("SELECT id, source, owner FROM experiments WHERE path = ?", (path,))
        return rows[0] if rows else None

    def experiments(self) -> list[Row]:
        """Every experiment, the newest first."""
        return self._store.query("SELECT * FROM experiments ORDER BY id DESC")

    def trial_summaries(self, experiment_id: int | None = None) -> list[Row]:
        """The summary columns (``experiment_id, trial_id, state, kind`` (why it ended: its reason's),
        ``last, job_id, checkpoint, config, started_at, ended_at``) of the experiment's trials (None:
        every experiment's)."""
        if experiment_id is None:
            return self._store.query(f"SELECT {_SUMMARY} FROM trials")
        return self._store.query(f"SELECT {_SUMMARY} FROM trials WHERE experiment_id = ?", (experiment_id,))

    def trials(self, experiment_id: int, *, states: Sequence[str] | None = None, after_rev: int | None = None,
               columns: str = "*") -> list[Row]:  # fmt: skip
        """The experiment's trials (in ``states``; changed after ``after_rev``), by trial id; ``columns``:
        ``*`` or the ``curves`` columns (``trial_id, state, jobs, history, reason``)."""
        if columns not in ("*", "curves"):
            raise ValueError(f"columns={columns!r}: '*' or 'curves'")
        picked = "trial_id, state, jobs, history, reason" if columns == "curves" else "*"
        sql = f"SELECT {picked} FROM trials WHERE experiment_id = ?"
        args: list[Any] = [experiment_id]
        if states:
            sql += f" AND state IN ({_marks(states)})"
            args += states
        if after_rev is not None:
            sql += " AND rev > ?"
            args.append(after_rev)
        return self._store.query(sql + " ORDER BY trial_id", args)

    def decisions(self, experiment_id: int, *, after_rev: int | None = None) -> list[Row]:
        """The experiment's decisions (recorded after ``after_rev``), in the order they were taken."""
        sql, args = "SELECT * FROM decisions WHERE experiment_id = ?", [experiment_id]
        if after_rev is not None:
            sql += " AND rev > ?"
            args.append(after_rev)
        return self._store.query(sql + " ORDER BY seq", args)

    def ended_version(self, experiment_id: int, active: Sequence[str]) -> tuple[int, int | None]:
        """How many of the experiment's trials are in none of the states ``active``, and the latest
        change among them (what a result computed from the ended trials is kept by)."""
        row = self._store.query(f"SELECT COUNT(*), MAX(rev) FROM trials WHERE experiment_id = ? AND state NOT IN "
                                f"({_marks(active)})", (experiment_id, *active))[0]  # fmt: skip
        return int(row[0]), (int(row[1]) if row[1] is not None else None)

    def results(self, experiment_id: int, state: str, *, but_kind: str | None = None) -> list[Row]:
        """``config, last`` of the experiment's trials in ``state`` that reported its metric (but those
        whose reason is of the kind ``but_kind``)."""
        sql = "SELECT config, last FROM trials WHERE experiment_id = ? AND state = ? AND last IS NOT NULL"
        if but_kind is None:
            return self._store.query(sql, (experiment_id, state))
        return self._store.query(sql + " AND json_extract(reason, '$.kind') IS NOT ?", (experiment_id, state, but_kind))
