"""Tune experiments on the train server: the trials Tune submits as jobs, grouped by experiment, with
their numbers kept current, the decisions the tuner's scheduler took on them, and experiments
imported from their directory. The views of them (what the API answers) are
:mod:`trainforge.server.experiments.views`; the tables, :mod:`trainforge.server.store.experiment_tables`.

Where the data comes from:

- **A job's spec** says which experiment it is a trial of (``experiment``:
  :class:`~trainforge.server._schemas.TrialTagIn`, set by Tune's ``ServerRun``): when such a job is
  submitted, its experiment and trial are made (or extended).
- **A job's events file** (the one reader, :mod:`trainforge._internal.job_events`): when the server
  reads a trial job's new events in (its events offset moves), the trial counts in the reports that
  came since (its iterations, the metric's latest and best value,
  :class:`~trainforge.server.experiments.trial_stats.Stats`); when the job's state changes, it becomes
  the trial's. Both happen in the thread that changed the job, right after its commit (a listener of
  the store): reading an experiment never writes.
- **A decision** (``POST /jobs/{id}/decisions``: the tuner stopped the trial at a rung, exploited,
  ...) says why the trial ended and *where*: its reports after that iteration are not the trial's.
- **An import** (``trainforge experiments import PATH``) replaces an imported experiment whole: its
  owner's import, or an admin's (another member's is refused, naming the owner, as MLflow refuses a
  second experiment of one name: :class:`ExperimentOwned`).

Every change bumps ``rev``, one counter for all experiments (the live stream's event id), under one
lock; the store is written through its one writer, and only the store speaks SQL
(:class:`~trainforge.server.store.experiments.ExperimentRows`).
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
    from trainforge.server.jobs.service import JobService
    from trainforge.server.store.database import JobsChanged, JobStore
    from trainforge.server.store.experiments import ExperimentWrites, Row

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
    OpenAPI document, whose handlers never run). Made, it takes in what the store holds that its
    trials do not show yet (:meth:`catch_up`), and follows every change of a job from then on
    (:meth:`JobStore.watch <trainforge.server.store.database.JobStore.watch>`): a trial is written when
    its job is submitted, changes state or has its events read in, in the thread that made that change,
    so that reading an experiment never writes."""

    def __init__(self, service: JobService | None):
        self.service = service
        self.curves = CurveCache()
        self.importance = ImportanceCache()
        self._lock = threading.RLock()
        self._trial_jobs: set[int] = set()  # every trial's latest job: the jobs whose changes a trial follows
        self._rev: int | None = None
        self._warmed = False
        self._cuts: dict[int, int | None] = {}  # job id -> its trial's cut (None: none), as the tailer asks
        if service is not None:
            service.store.watch(self._on_jobs_changed)
            service.tailer.cut_of = self.known_cut
            self.catch_up()

    @property
    def store(self) -> JobStore:
        assert self.service is not None
        return self.service.store

    def events_path(self, job_id: int) -> str:
        assert self.service is not None
        return self.service.files.events(job_id)

    def _current_rev(self) -> int:
        if self._rev is None:
            self._rev = self.store.experiments.max_rev()
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
    def catch_up(self) -> None:
        """Take in the trial jobs submitted after the latest one a trial has, and what the trials' jobs
        did since their trial last changed: what a server stopped between a job's change and its
        trial's (the two are separate transactions) left behind. Done once, when made."""
        with self._lock:
            rows = self.store.experiments
            self._trial_jobs |= rows.trial_job_ids()
            self._take(rows.trial_jobs())
            self._refresh(rows.stale_trials())
            if self._trial_jobs:
                self._warm_up()

    def _on_jobs_changed(self, changed: JobsChanged) -> None:
        """The store committed a change of jobs: trial jobs submitted become (or extend) their trial,
        and a trial whose latest job changed state or had its events read in is brought up to it."""
        new = [i for i, spec in changed.added.items()
               if isinstance(tag := spec.get("experiment"), dict) and tag.get("path") is not None]  # fmt: skip
        if not new and not any(j in self._trial_jobs for j in changed.moved):  # most changes: no trial's
            return
        with self._lock:
            if new:
                self._take(self.store.experiments.trial_jobs(new))
            moved = [j for j in changed.moved if j in self._trial_jobs]
            if moved:
                self._refresh(self.store.experiments.stale_trials(moved))

    def _take(self, rows: list[Row]) -> None:
        """Make (or extend) the trials of the trial jobs ``rows`` (under the lock), then bring them up
        to what their jobs did meanwhile."""
        if not rows:
            return
        self.store.experiments.change(lambda writes: self._each(self._take_job, writes, rows))
        taken = [int(row["id"]) for row in rows]
        self._trial_jobs.update(taken)
        self._refresh(self.store.experiments.stale_trials(taken))
        self._warm_up()

    def _warm_up(self) -> None:
        """Import Optuna in the background, once there are trials (its import takes a second or more:
        not in the first importance request)."""
        if not self._warmed:
            self._warmed = True
            threading.Thread(target=warm_up, daemon=True, name="tf-importance-warmup").start()

    def _refresh(self, rows: list[Row]) -> None:
        if rows:
            self.store.experiments.change(lambda writes: self._each(self._refresh_trial, writes, rows))

    @staticmethod
    def _each(fn: Callable[[ExperimentWrites, Row], None], writes: ExperimentWrites, rows: list[Row]) -> None:
        for row in rows:
            fn(writes, row)

    def _take_job(self, writes: ExperimentWrites, row: Row) -> None:
        spec = json.loads(row["spec"])
        tag = spec["experiment"]
        space = json.dumps(tag.get("space") or {})
        experiment_id = writes.experiment_at(tag["path"])
        if experiment_id is None:
            experiment_id = writes.add_experiment(
                path=tag["path"], name=tag["name"], tune_id=tag.get("tune_id"), source="server",
                searcher=tag.get("searcher"), scheduler=tag.get("scheduler"), metric=tag.get("metric"),
                mode=tag.get("mode"), space=space, created_at=row["submitted_at"], owner=row["owner"])  # fmt: skip
        else:  # the tag's values where it has them (a server experiment again, if it was an import)
            given = {k: tag.get(k) for k in ("searcher", "scheduler", "metric", "mode") if tag.get(k) is not None}
            writes.set_experiment(experiment_id, source="server", ended_at=None, **given,
                                  **({"space": space} if space != "{}" else {}))  # fmt: skip
        config = json.dumps(spec.get("config") or {})
        trial = writes.trial(experiment_id, tag["trial_id"])
        if trial is None:
            jobs = [{"job": row["id"], "cut": None, "base": 0}]
            name = str(row["name"]).rpartition("/")[2] or tag["trial_id"]  # the job's name: "<experiment>/<trial>"
            writes.add_trial(experiment_id=experiment_id, trial_id=tag["trial_id"], name=name, config=config,
                             jobs=json.dumps(jobs), job_id=row["id"], state=trial_state(None), rev=self._next_rev())  # fmt: skip
            return
        jobs = json.loads(trial["jobs"])  # the trial goes on in a new job (PBT's exploit: a new run)
        if any(j["job"] == row["id"] for j in jobs):
            return  # taken already (catch_up and a commit's listener may both see a job)
        jobs.append({"job": row["id"], "cut": None, "base": int(trial["iterations"])})
        writes.set_trial(experiment_id, tag["trial_id"], jobs=json.dumps(jobs), job_id=row["id"], job_state=None,
                         scanned=0, config=config, state=trial_state(None), reason=None, ended_at=None,
                         rev=self._next_rev())  # fmt: skip

    def _refresh_trial(self, writes: ExperimentWrites, row: Row) -> None:
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
        writes.set_trial(
            row["experiment_id"], row["trial_id"], job_state=state.value, scanned=scanned,
            state=trial_state(state, (reason or {}).get("kind")), reason=json.dumps(reason) if reason else None,
            iterations=stats.iterations, last=stats.last, best=stats.best, best_at=stats.best_at,
            metrics=json.dumps(stats.metrics) if stats.metrics else None,
            started_at=row["started_at"] if row["started_at"] is not None else row["job_started"],
            ended_at=row["job_ended"] if state.terminal else None, rev=self._next_rev())  # fmt: skip

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
        with self._lock:  # the job's changes meanwhile wait for it, and are taken in after the decision
            row = self.store.experiments.trial_of_job(job_id)
            if row is None:
                raise NotATrial(f"job {job_id} is not a trial of a Tune experiment here (its spec has no "
                                "'experiment'), or is not its trial's latest job: nothing to decide on")  # fmt: skip
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

            def work(writes: ExperimentWrites) -> int:
                seq = writes.add_decision(experiment_id=row["experiment_id"], trial_id=row["trial_id"], job_id=job_id,
                                          ts=ts, kind=d.kind, iteration=reason.get("iteration"),
                                          detail=json.dumps(reason), rev=rev)  # fmt: skip
                writes.set_trial(row["experiment_id"], row["trial_id"], jobs=json.dumps(jobs), reason=json.dumps(reason),
                                 state=trial_state(row["job_state"], d.kind), scanned=offset,
                                 iterations=stats.iterations, last=stats.last, best=stats.best, best_at=stats.best_at,
                                 rev=rev, **({"metrics": json.dumps(stats.metrics)} if stats.metrics else {}))  # fmt: skip
                writes.add_job_event(job_id, JobEvent.TUNE_DECISION, {"trial_id": row["trial_id"], **reason})
                if d.iteration is not None:  # the job's figures are its trial's at the decision, in every view
                    writes.set_job_metrics(job_id, stats.metrics or None)
                return seq

            seq = self.store.experiments.change(work)
            if d.iteration is not None:
                self._cuts[job_id] = d.iteration
        return DecisionOut(seq=seq, experiment_id=row["experiment_id"], trial_id=row["trial_id"], job_id=job_id, ts=ts,
                           kind=d.kind, iteration=reason.get("iteration"), detail=reason, rev=rev)  # fmt: skip

    def known_cut(self, job_id: int) -> int | None:
        """:meth:`cut_of`, read from the store once per job (the tailer asks at each read of a job's
        reports) and kept as :meth:`record` moves it."""
        if job_id not in self._cuts:
            self._cuts[job_id] = self.cut_of(job_id)
        return self._cuts[job_id]

    def cut_of(self, job_id: int) -> int | None:
        """Where a tuner's stop decision ended the trial job ``job_id`` runs (its iteration in the job),
        or None: the job's charts end there too."""
        for jobs in self.store.experiments.jobs_of_trials_with(job_id):
            for j in json.loads(jobs):
                if j["job"] == job_id:
                    return j["cut"]  # type: ignore[no-any-return]
        return None

    # -- imports ------------------------------------------------------------------------------------
    def import_experiment(self, body: ExperimentImportIn, who: Principal = ADMIN_PRINCIPAL) -> int:
        """Put an experiment read from its directory in, imported by ``who`` (replacing an earlier
        import of it: ``who``'s own, or any if ``who`` is an admin); its id. An experiment whose trials
        ran as jobs here is not replaced (NotATrial), nor another user's import (ExperimentOwned)."""
        with self._lock:  # trial jobs were taken in as they came: one may have made it a server experiment
            found = self.store.experiments.experiment_by_path(body.path)
            if found is not None and found["source"] == "server":
                raise NotATrial(f"the experiment at {body.path!r} is experiment {found['id']} here already, its "
                                f"trials ran as this server's jobs: see /experiments/{found['id']}")  # fmt: skip
            if found is not None and found["owner"] != who.name and not who.is_admin:
                owner, known = found["owner"], found["id"]
                raise ExperimentOwned(
                    f"the experiment at {body.path!r} is experiment {known} here, imported by {owner!r}: only they or an "
                    f"admin may import it again. See /experiments/{known}, or copy the directory elsewhere and import "
                    "the copy to have one of your own"
                )
            now = time.time()

            space = json.dumps({k: v.model_dump() for k, v in body.space.items()})
            described = dict(name=body.name, tune_id=body.tune_id, searcher=body.searcher, scheduler=body.scheduler,
                             metric=body.metric, mode=body.mode, space=space, ended_at=body.saved_at or now)  # fmt: skip

            def work(writes: ExperimentWrites) -> int:
                if found is not None:
                    experiment_id = int(found["id"])
                    writes.clear_experiment(experiment_id)
                    writes.set_experiment(experiment_id, **described)
                else:
                    experiment_id = writes.add_experiment(path=body.path, source="import", created_at=now,
                                                          owner=who.name, **described)  # fmt: skip
                for trial in body.trials:
                    self._import_trial(writes, experiment_id, trial, body.metric, body.mode)
                return experiment_id

            return self.store.experiments.change(work)

    def _import_trial(self, writes: ExperimentWrites, experiment_id: int, trial: ImportTrialIn, metric: str | None,
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
        writes.add_trial(
            experiment_id=experiment_id, trial_id=trial.trial_id, name=trial.name, config=json.dumps(trial.config),
            jobs="[]", state=state, reason=json.dumps(reason), iterations=stats.iterations, last=stats.last,
            best=stats.best, best_at=stats.best_at, metrics=json.dumps(stats.metrics) if stats.metrics else None,
            history=json.dumps(history), checkpoint=trial.checkpoint, started_at=trial.started_at,
            ended_at=trial.ended_at, rev=rev)  # fmt: skip
        for d in decisions:
            detail = {**{k: v for k, v in d.model_dump().items() if v is not None}, "text": decision_text(d, 0)}
            writes.add_decision(experiment_id=experiment_id, trial_id=trial.trial_id, job_id=None,
                                ts=trial.ended_at or time.time(), kind=d.kind, iteration=d.iteration,
                                detail=json.dumps(detail), rev=rev)  # fmt: skip

