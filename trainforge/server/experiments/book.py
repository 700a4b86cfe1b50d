"""Tune experiments on the train server: the trials Tune submits as jobs, grouped by experiment, with
their numbers kept current, the decisions the tuner's scheduler took on them, and experiments
imported from their directory. The views of them (what the API answers) are
:mod:`trainforge.server.experiments.views`; the tables, :mod:`trainforge.server.store.experiment_tables`.

Where the data comes from:

- **A job's spec** says which experiment it is a trial of (``experiment``:
  :class:`~trainforge.server._schemas.TrialTagIn`, set by Tune's ``ServerRun``). :meth:`sync`
  finds the jobs submitted since it last looked, and makes (or extends) their experiment and trial.
- **A job's events file** (the one reader, :mod:`trainforge._internal.job_events`): each sync counts
  in the reports that came since (the trial's iterations, the metric's latest and best value,
  :class:`~trainforge.server.experiments.trial_stats.Stats`), and the job's state becomes the trial's.
- **A decision** (``POST /jobs/{id}/decisions``: the tuner stopped the trial at a rung, exploited,
  ...) says why the trial ended and *where*: its reports after that iteration are not the trial's.
- **An import** (``trainforge experiments import PATH``) replaces an imported experiment whole: its
  owner's import, or an admin's (another member's is refused, naming the owner, as MLflow refuses a
  second experiment of one name: :class:`ExperimentOwned`).

Every change bumps ``rev``, one counter for all experiments (the live stream's event id), under one
lock; the store is written through its one writer.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainforge._internal.metric_path import lookup
from trainforge.client import JobEvent, JobState, TrialDecision, TrialState, trial_state
from trainforge.server.experiments.importance import ImportanceCache, warm_up
from trainforge.server.experiments.schemas import DecisionIn, DecisionOut, ExperimentImportIn, ImportTrialIn
from trainforge.server.experiments.trial_stats import CurveCache, Stats, number
from trainforge.server.team.users import ADMIN_PRINCIPAL, Principal

if TYPE_CHECKING:
    import sqlite3

    from trainforge.server.jobs.service import JobService
    from trainforge.server.store.database import JobStore

class ExperimentNotFound(LookupError):
    """No such experiment (HTTP 404)."""


class NotATrial(RuntimeError):
    """A request about a job that is no trial of an experiment here, or an import that would replace
    an experiment whose trials run here (HTTP 409)."""


class ExperimentOwned(RuntimeError):
    """An import of a directory another user imported (HTTP 409, naming them)."""


def ended_reason(job_state: str, error: str | None) -> dict[str, Any] | None:
    """Why a trial ended when the tuner said nothing: its job's end (its ``kind``: completed, failed
    or stopped; a decision's kind otherwise, :class:`~trainforge.client.TrialDecision`)."""
    if job_state == JobState.SUCCEEDED:
        return {"kind": "completed", "text": "ran to its end"}
    if job_state == JobState.FAILED:
        first = (error or "").strip().splitlines()
        return {"kind": "failed", "text": "error: " + (first[-1] if first else "its job failed")}
    if job_state == JobState.STOPPED:
        return {"kind": "stopped", "text": "its job was stopped on the server (not by the tuner)"}
    return None


def decision_text(d: DecisionIn, base: int) -> str:
    """A decision in words, e.g. "ASHAScheduler stopped it at rung 1 (training_iteration 4)"."""
    if d.text:
        return d.text
    at = f"training_iteration {base + d.iteration}" if d.iteration is not None else "its latest report"
    who = d.rule or "the scheduler"
    if d.kind == TrialDecision.PRUNED:
        rung = f" at rung {d.rung}" if d.rung is not None else ""
        return f"{who} stopped it{rung} ({at})"
    return {
        "max_t": f"{who}: reached its max_t ({at})",
        "exploit": f"exploited trial {d.source_trial} ({at}): continues from its checkpoint",
        "stopper": f"the stop criteria stopped it ({at})",
        "budget": f"the experiment's time budget ran out ({at})",
        "interrupted": f"the tuner was interrupted ({at})",
        "error": f"the tuner failed it ({at})",
    }[d.kind]


class Experiments:
    """The experiments of one server (``service``: its store and job files; None only for the
    OpenAPI document, whose handlers never run)."""

    def __init__(self, service: JobService | None):
        self.service = service
        self.curves = CurveCache()
        self.importance = ImportanceCache()
        self._lock = threading.RLock()
        self._watermark: int | None = None  # the highest job id looked at
        self._rev: int | None = None
        self._warmed = False

    @property
    def store(self) -> JobStore:
        assert self.service is not None
        return self.service.store

    def events_path(self, job_id: int) -> str:
        assert self.service is not None
        return self.service.files.events(job_id)

    def _current_rev(self) -> int:
        if self._rev is None:
            row = self.store.query("SELECT MAX(r) FROM (SELECT MAX(rev) AS r FROM trials UNION ALL "
                                   "SELECT MAX(rev) FROM decisions)")  # fmt: skip
            self._rev = int(row[0][0] or 0)
        return self._rev

    def _next_rev(self) -> int:
        self._rev = self._current_rev() + 1
        return self._rev

    @property
    def rev(self) -> int:
        """The latest change's number (of any experiment)."""
        with self._lock:
            return self._current_rev()

    # -- following the trials' jobs ----------------------------------------------------------------
    def sync(self) -> None:
        """Take in the trial jobs submitted since the last sync, and what their jobs did since."""
        with self._lock:
            store = self.store
            top = int(store.query("SELECT COALESCE(MAX(id), 0) FROM jobs")[0][0])
            if self._watermark is None:
                self._watermark = int(store.query("SELECT COALESCE(MAX(job_id), 0) FROM trials")[0][0])
            if top > self._watermark:
                rows = store.query(
                    "SELECT id, name, spec, submitted_at, owner FROM jobs WHERE id > ? AND id <= ? "
                    "AND json_extract(spec, '$.experiment.path') IS NOT NULL ORDER BY id", (self._watermark, top))
                if rows:
                    store.write(lambda conn: self._each(self._take_job, conn, rows))
                self._watermark = top
            if not self._warmed and top:
                self._warmed = True  # Optuna's import takes a second or more: not in the first importance request
                threading.Thread(target=warm_up, daemon=True, name="tf-importance-warmup").start()
            changed = store.query(
                "SELECT t.experiment_id, t.trial_id, t.jobs, t.scanned, t.reason, t.iterations, t.last, t.best, "
                "t.best_at, t.metrics, t.started_at, j.state, j.events_offset, j.started_at AS job_started, "
                "j.ended_at AS job_ended, j.error, e.metric, e.mode FROM trials t JOIN jobs j ON j.id = t.job_id "
                "JOIN experiments e ON e.id = t.experiment_id "
                "WHERE j.state IS NOT t.job_state OR j.events_offset > t.scanned")
            if changed:
                store.write(lambda conn: self._each(self._refresh, conn, changed))

    @staticmethod
    def _each(fn: Callable[[sqlite3.Connection, sqlite3.Row], None], conn: sqlite3.Connection,
              rows: list[sqlite3.Row]) -> None:  # fmt: skip
        for row in rows:
            fn(conn, row)

    def _take_job(self, conn: sqlite3.Connection, row: sqlite3.Row) -> None:
        spec = json.loads(row["spec"])
        tag = spec["experiment"]
        found = conn.execute("SELECT id FROM experiments WHERE path = ?", (tag["path"],)).fetchone()
        if found is None:
            cur = conn.execute(
                "INSERT INTO experiments(path, name, tune_id, source, searcher, scheduler, metric, mode, space, "
                "created_at, owner) VALUES (?, ?, ?, 'server', ?, ?, ?, ?, ?, ?, ?)",
                (tag["path"], tag["name"], tag.get("tune_id"), tag.get("searcher"), tag.get("scheduler"),
                 tag.get("metric"), tag.get("mode"), json.dumps(tag.get("space") or {}), row["submitted_at"],
                 row["owner"]))  # fmt: skip
            experiment_id = int(cur.lastrowid or 0)
        else:
            experiment_id = int(found[0])
            conn.execute(
                "UPDATE experiments SET source = 'server', ended_at = NULL, searcher = COALESCE(?, searcher), "
                "scheduler = COALESCE(?, scheduler), metric = COALESCE(?, metric), mode = COALESCE(?, mode), "
                "space = CASE WHEN ? = '{}' THEN space ELSE ? END WHERE id = ?",
                (tag.get("searcher"), tag.get("scheduler"), tag.get("metric"), tag.get("mode"),
                 json.dumps(tag.get("space") or {}), json.dumps(tag.get("space") or {}), experiment_id))  # fmt: skip
        config = json.dumps(spec.get("config") or {})
        trial = conn.execute("SELECT jobs, iterations FROM trials WHERE experiment_id = ? AND trial_id = ?",
                             (experiment_id, tag["trial_id"])).fetchone()  # fmt: skip
        if trial is None:
            jobs = [{"job": row["id"], "cut": None, "base": 0}]
            name = str(row["name"]).rpartition("/")[2] or tag["trial_id"]  # the job's name: "<experiment>/<trial>"
            conn.execute(
                "INSERT INTO trials(experiment_id, trial_id, name, config, jobs, job_id, state, rev) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (experiment_id, tag["trial_id"], name, config, json.dumps(jobs), row["id"], trial_state(None),
                 self._next_rev()))  # fmt: skip
            return
        jobs = json.loads(trial["jobs"])  # the trial goes on in a new job (PBT's exploit: a new run)
        jobs.append({"job": row["id"], "cut": None, "base": int(trial["iterations"])})
        conn.execute(
            "UPDATE trials SET jobs = ?, job_id = ?, job_state = NULL, scanned = 0, config = ?, state = ?, "
            "reason = NULL, ended_at = NULL, rev = ? WHERE experiment_id = ? AND trial_id = ?",
            (json.dumps(jobs), row["id"], config, trial_state(None), self._next_rev(), experiment_id,
             tag["trial_id"]))  # fmt: skip

    def _refresh(self, conn: sqlite3.Connection, row: sqlite3.Row) -> None:
        jobs = json.loads(row["jobs"])
        latest = jobs[-1]
        stats = Stats(iterations=row["iterations"], last=row["last"], best=row["best"], best_at=row["best_at"],
                      metrics=json.loads(row["metrics"]) if row["metrics"] else None)  # fmt: skip
        scanned = stats.read(self.events_path(latest["job"]), row["scanned"], base=latest["base"], cut=latest["cut"],
                             metric=row["metric"], mode=row["mode"])  # fmt: skip
        reason = json.loads(row["reason"]) if row["reason"] else None
        state = JobState(row["state"])
        if reason is None and state.terminal:
            reason = ended_reason(state, row["error"])
        conn.execute(
            "UPDATE trials SET job_state = ?, scanned = ?, state = ?, reason = ?, iterations = ?, last = ?, best = ?, "
            "best_at = ?, metrics = ?, started_at = COALESCE(started_at, ?), ended_at = ?, rev = ? "
            "WHERE experiment_id = ? AND trial_id = ?",
            (state.value, scanned, trial_state(state, (reason or {}).get("kind")), json.dumps(reason) if reason else None,
             stats.iterations, stats.last, stats.best, stats.best_at, json.dumps(stats.metrics) if stats.metrics else None,
             row["job_started"], row["job_ended"] if state.terminal else None, self._next_rev(),
             row["experiment_id"], row["trial_id"]))  # fmt: skip

    def recount(self, jobs: list[dict[str, Any]], metric: str | None, mode: str | None) -> tuple[Stats, int]:
        """A trial's numbers counted again from all its jobs' events files (after a cut moved); the
        byte offset its latest job's file was read to."""
        stats, offset = Stats(), 0
        for j in jobs:
            offset = stats.read(self.events_path(j["job"]), 0, base=j["base"], cut=j["cut"], metric=metric, mode=mode)
        return stats, offset

    # -- decisions ----------------------------------------------------------------------------------
    def record(self, job_id: int, d: DecisionIn) -> DecisionOut:
        """The tuner's decision on the trial job ``job_id`` runs: recorded, the trial's reason set, its
        reports cut at the decision's iteration, and an event of the job (``tune_decision``)."""
        with self._lock:
            self.sync()
            rows = self.store.query(
                "SELECT t.experiment_id, t.trial_id, t.jobs, t.job_state, e.metric, e.mode FROM trials t "
                "JOIN experiments e ON e.id = t.experiment_id WHERE t.job_id = ?", (job_id,))
            if not rows:
                raise NotATrial(f"job {job_id} is not a trial of a Tune experiment here (its spec has no "
                                "'experiment'), or is not its trial's latest job: nothing to decide on")  # fmt: skip
            row = rows[0]
            jobs = json.loads(row["jobs"])
            if d.iteration is not None:
                jobs[-1]["cut"] = d.iteration
            base = int(jobs[-1]["base"])
            detail = {k: v for k, v in d.model_dump().items() if v is not None and k != "kind"}
            reason = {**detail, "kind": d.kind, "text": decision_text(d, base)}
            if d.iteration is not None:
                reason["iteration"] = base + d.iteration
            stats, offset = self.recount(jobs, row["metric"], row["mode"])
            ts = time.time()

            rev = self._next_rev()

            def work(conn: sqlite3.Connection) -> int:
                cur = conn.execute(
                    "INSERT INTO decisions(experiment_id, trial_id, job_id, ts, kind, iteration, detail, rev) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (row["experiment_id"], row["trial_id"], job_id, ts, d.kind, reason.get("iteration"),
                     json.dumps(reason), rev))  # fmt: skip
                conn.execute(
                    "UPDATE trials SET jobs = ?, reason = ?, state = ?, scanned = ?, iterations = ?, last = ?, best = ?, "
                    "best_at = ?, metrics = COALESCE(?, metrics), rev = ? WHERE experiment_id = ? AND trial_id = ?",
                    (json.dumps(jobs), json.dumps(reason), trial_state(row["job_state"], d.kind), offset,
                     stats.iterations, stats.last, stats.best, stats.best_at,
                     json.dumps(stats.metrics) if stats.metrics else None, rev, row["experiment_id"],
                     row["trial_id"]))  # fmt: skip
                self.store.add_event(conn, job_id, JobEvent.TUNE_DECISION, {"trial_id": row["trial_id"], **reason})
                return int(cur.lastrowid or 0)

            seq = self.store.write(work)
            self.sync()  # the job's state may have moved meanwhile
        return DecisionOut(seq=seq, experiment_id=row["experiment_id"], trial_id=row["trial_id"], job_id=job_id, ts=ts,
                           kind=d.kind, iteration=reason.get("iteration"), detail=reason, rev=rev)  # fmt: skip

    def cut_of(self, job_id: int) -> int | None:
        """Where a tuner's stop decision ended the trial job ``job_id`` runs (its iteration in the job),
        or None: the job's charts end there too."""
        rows = self.store.query("SELECT jobs FROM trials WHERE job_id = ?", (job_id,))
        if not rows and self.store.query("SELECT 1 FROM jobs WHERE id = ? AND json_extract(spec, '$.experiment.path') "
                                         "IS NOT NULL", (job_id,)):  # an earlier job of a trial (PBT)  # fmt: skip
            rows = self.store.query("SELECT jobs FROM trials WHERE instr(jobs, ?) > 0", (f'"job": {job_id},',))
        for row in rows:
            for j in json.loads(row["jobs"]):
                if j["job"] == job_id:
                    return j["cut"]  # type: ignore[no-any-return]
        return None

    # -- imports ------------------------------------------------------------------------------------
    def import_experiment(self, body: ExperimentImportIn, who: Principal = ADMIN_PRINCIPAL) -> int:
        """Put an experiment read from its directory in, imported by ``who`` (replacing an earlier
        import of it: ``who``'s own, or any if ``who`` is an admin); its id. An experiment whose trials
        ran as jobs here is not replaced (NotATrial), nor another user's import (ExperimentOwned)."""
        with self._lock:
            self.sync()  # trial jobs not looked at yet may have made it a server experiment
            found = self.store.query("SELECT id, source, owner FROM experiments WHERE path = ?", (body.path,))
            if found and found[0]["source"] == "server":
                raise NotATrial(f"the experiment at {body.path!r} is experiment {found[0]['id']} here already, its "
                                f"trials ran as this server's jobs: see /experiments/{found[0]['id']}")  # fmt: skip
            if found and found[0]["owner"] != who.name and not who.is_admin:
                owner, known = found[0]["owner"], found[0]["id"]
                raise ExperimentOwned(
                    f"the experiment at {body.path!r} is experiment {known} here, imported by {owner!r}: only they or an "
                    f"admin may import it again. See /experiments/{known}, or copy the directory elsewhere and import "
                    "the copy to have one of your own"
                )
            now = time.time()

            def work(conn: sqlite3.Connection) -> int:
                if found:
                    experiment_id = int(found[0]["id"])
                    conn.execute("DELETE FROM trials WHERE experiment_id = ?", (experiment_id,))
                    conn.execute("DELETE FROM decisions WHERE experiment_id = ?", (experiment_id,))
                    conn.execute(
                        "UPDATE experiments SET name = ?, tune_id = ?, searcher = ?, scheduler = ?, metric = ?, mode = ?, "
                        "space = ?, ended_at = ? WHERE id = ?",
                        (body.name, body.tune_id, body.searcher, body.scheduler, body.metric, body.mode,
                         json.dumps({k: v.model_dump() for k, v in body.space.items()}), body.saved_at or now,
                         experiment_id))  # fmt: skip
                else:
                    cur = conn.execute(
                        "INSERT INTO experiments(path, name, tune_id, source, searcher, scheduler, metric, mode, space, "
                        "created_at, ended_at, owner) VALUES (?, ?, ?, 'import', ?, ?, ?, ?, ?, ?, ?, ?)",
                        (body.path, body.name, body.tune_id, body.searcher, body.scheduler, body.metric, body.mode,
                         json.dumps({k: v.model_dump() for k, v in body.space.items()}), now, body.saved_at or now,
                         who.name))  # fmt: skip
                    experiment_id = int(cur.lastrowid or 0)
                for trial in body.trials:
                    self._import_trial(conn, experiment_id, trial, body.metric, body.mode)
                return experiment_id

            return int(self.store.write(work))

    def _import_trial(self, conn: sqlite3.Connection, experiment_id: int, trial: ImportTrialIn, metric: str | None,
                      mode: str | None) -> None:  # fmt: skip
        decisions = list(trial.decisions)
        if not decisions and trial.status == TrialState.TERMINATED and trial.pruned:
            it = number(trial.metrics.get("training_iteration"))
            decisions = [DecisionIn(kind=TrialDecision.PRUNED, iteration=int(it) if it is not None else None)]
        last = decisions[-1] if decisions else None
        cut = last.iteration if last is not None else None
        stats = Stats()
        for iteration, t, value in (trial.history.get(metric or "") or []):
            if cut is None or iteration <= cut:
                stats.add(iteration, t, {metric: value} if metric else {}, metric, mode)
        stats.metrics = dict(trial.metrics) or None
        value = number(lookup(trial.metrics, metric))
        if value is not None and (cut is None or not stats.iterations):
            stats.last = value
        if stats.iterations == 0:
            stats.iterations = int(number(trial.metrics.get("training_iteration")) or 0)
        if last is not None:
            reason: dict[str, Any] | None = {**{k: v for k, v in last.model_dump().items() if v is not None},
                                             "text": decision_text(last, 0)}  # fmt: skip
        elif trial.status == TrialState.ERROR:
            first = (trial.error or "").strip().splitlines()
            reason = {"kind": "error", "text": "error: " + (first[-1] if first else "the trial failed")}
        elif trial.status == TrialState.TERMINATED:
            reason = {"kind": "completed", "text": "ran to its end"}
        else:
            reason = {"kind": "interrupted", "text": f"unfinished ({trial.status}) when the experiment was imported: "
                      "Tuner.restore continues it"}  # fmt: skip
        # The snapshot's status is the trial's state (the tuner derived it: trial_state); one that did
        # not end waits for a Tuner.restore (nothing runs it now).
        state = trial.status if trial.status.ended else TrialState.PENDING
        history = {k: [p for p in points if cut is None or p[0] <= cut] for k, points in trial.history.items()}
        rev = self._next_rev()
        conn.execute(
            "INSERT INTO trials(experiment_id, trial_id, name, config, jobs, state, reason, iterations, last, best, "
            "best_at, metrics, history, checkpoint, started_at, ended_at, rev) "
            "VALUES (?, ?, ?, ?, '[]', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (experiment_id, trial.trial_id, trial.name, json.dumps(trial.config), state, json.dumps(reason),
             stats.iterations, stats.last, stats.best, stats.best_at, json.dumps(stats.metrics) if stats.metrics else None,
             json.dumps(history), trial.checkpoint, trial.started_at, trial.ended_at, rev))  # fmt: skip
        for d in decisions:
            detail = {**{k: v for k, v in d.model_dump().items() if v is not None}, "text": decision_text(d, 0)}
            conn.execute(
                "INSERT INTO decisions(experiment_id, trial_id, job_id, ts, kind, iteration, detail, rev) "
                "VALUES (?, ?, NULL, ?, ?, ?, ?, ?)",
                (experiment_id, trial.trial_id, trial.ended_at or time.time(), d.kind, d.iteration, json.dumps(detail),
                 rev))  # fmt: skip

