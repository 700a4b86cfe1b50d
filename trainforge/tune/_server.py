"""Trials as jobs of a train server (``TuneConfig.server``).

:func:`connect` finds the server a tuner uses (or None: trials run here, as ``fit_iter()`` runs);
:class:`ServerRun` is one trial's run as a job of that server, with the interface the tuner's loop
uses of ``fit_iter()``'s iterator: iterate it for the reports, ``stop()`` from any thread,
``.result`` afterwards.

The server runs the trial's trainer as it runs ``trainer.submit()``'s: in its own processes, with the
trainer's ``RunConfig``, which names the experiment directory. The server's processes must reach
that directory at the same path: the same machine, a file system both see, or cloud storage. Run
callbacks of the ``RunConfig`` run there too, not in the tuner's process.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from collections.abc import Iterator
from typing import Any

from trainforge import Result
from trainforge._internal.constants import ENV_ADDRESS, ENV_JOB_ID
from trainforge._internal.trainer_job import fetch_result, trainer_job
from trainforge.client import (
    Client,
    Job,
    JobConflictError,
    JobNotFoundError,
    JobState,
    JobStatus,
    ServerError,
    ServerNotFoundError,
    TrialDecision,
    discover,
)
from trainforge.tune._experiment_info import decision_body

logger = logging.getLogger("trainforge.tune")

PROBE_TIMEOUT_S = 5.0  # how long the tuner waits for a server it found to answer
MAX_NAME = 200  # the API's limit on a job's name


def connect(setting: str | bool | None, *, announce: bool = False) -> Client | None:
    """The client of the server that trials run on, or None to run them here.

    ``setting`` is ``TuneConfig.server``: False: None. A URL: that server, which must answer
    (ServerNotFoundError, ServerError otherwise). None: in a process of a server's job (a tuner
    submitted as a job) None, so trials stay within the job's grant; else the server
    ``$TRAINFORGE_ADDRESS`` names (which must answer), else the one that
    :func:`~trainforge.client.discover` finds (its state directory's ``address`` file) if it
    answers, else None. Never starts a server.
    """
    if setting is False or (setting is None and os.environ.get(ENV_JOB_ID)):
        return None
    if isinstance(setting, str):
        client = _answering(setting, None, f"TuneConfig.server={setting!r}")
    elif os.environ.get(ENV_ADDRESS):
        where = f"${ENV_ADDRESS}={os.environ[ENV_ADDRESS]!r} (TuneConfig.server=None uses it)"
        client = _answering(os.environ[ENV_ADDRESS], None, where, hint="unset it or pass TuneConfig(server=False)")
    else:
        try:
            address, token = discover()
        except ServerNotFoundError:
            return None  # no server on this machine: trials run here, as without one
        try:
            client = _answering(address, token, f"the train server found at {address}")
        except ServerNotFoundError as exc:  # a stale address file (the server is gone)
            logger.debug("tune: %s; trials run here", exc)
            return None
        except ServerError as exc:  # something answers there, but not as our server
            logger.warning("tune: %s; trials run here (TuneConfig(server=URL) to insist)", exc)
            return None
    if announce:
        print(f"tune: trials run as jobs of the train server at {client.address} (its dashboard: "
              f"{client.address}/)", flush=True)  # fmt: skip
    return client


def _answering(address: str, token: str | None, where: str, *, hint: str = "") -> Client:
    """A client of ``address`` once the server answered (its resources: the token is checked too)."""
    try:
        Client(address, token=token, timeout=PROBE_TIMEOUT_S).resources()
    except ServerNotFoundError as exc:
        raise ServerNotFoundError(
            f"{where}: no train server answers there ({exc.__cause__ or exc}). Start it (`trainforge server "
            f"start`), fix the address{', ' + hint if hint else ''}, or pass TuneConfig(server=False) to run "
            "the trials on this machine."
        ) from exc
    except ServerError as exc:
        fix = ("give its token in $TRAINFORGE_TOKEN (or its state directory in $TRAINFORGE_SERVER_DIR)"
               if exc.status == 401 else "check that a train server serves there")  # fmt: skip
        raise ServerError(exc.status, f"{where}: the server refused the tuner ({exc.detail}): {fix}") from exc
    return Client(address, token=token)


class ServerRun:
    """One trial's run as a job of a train server; the job is queued on construction.

    Iterating yields the job's reports as ``fit_iter()`` yields them and ends when the job ends;
    ``.result`` is then the run's :class:`~trainforge.Result` (its ``error`` if it failed; for a job
    that ``stop()`` stopped before its run returned, the run so far with no error; one stopped on the
    server by someone else is an error). ``stop()`` returns at once. A connection to the server lost
    for good raises :class:`TrialLostError` from the iteration.
    """

    def __init__(self, client: Client, trainer: Any, *, name: str, grace_s: float | None = None,
                 experiment: dict[str, Any] | None = None):  # fmt: skip
        tagged = {"experiment": experiment} if experiment is not None else {}  # the server's Experiments pages
        spec = trainer_job(  # with the train loop's config, flattened: the dashboard groups by it
            trainer, name=_job_name(name), submission_id=uuid.uuid4().hex, **tagged,
            cannot_send=f"trial {name}: its trainer cannot be sent to the train server at {client.address}",
            fix=": the trainable, its config and with_parameters objects must pickle (create open files, locks and "
            "connections inside the trainable), or pass TuneConfig(server=False) to run trials on this machine.",
        )  # fmt: skip
        self.client = client
        self.name = name
        self.grace_s = grace_s
        self.job: Job = client.submit(spec)
        self.result: Result | None = None
        self._last: Any = None  # the latest report
        self._checkpoint: Any = None  # the latest reported checkpoint
        self._stopper: threading.Thread | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ServerRun({self.name!r}, job={self.job.id}, server={self.client.address!r})"

    def __iter__(self) -> Iterator[Any]:
        try:
            for report in self.job.reports():
                self._last = report
                self._checkpoint = report.checkpoint or self._checkpoint
                yield report
            status = self.job.status()
            if not status.ended:  # the stream ended without the job's end (a server restart)
                status = self.job.wait()
            self.result = self._final(status)
        except ServerNotFoundError as exc:
            raise TrialLostError(
                f"trial {self.name}: lost the train server at {self.client.address} while it ran as job "
                f"{self.job.id} ({exc}). The job goes on there if the server does: see `trainforge status "
                f"{self.job.id}`, stop it with `trainforge stop {self.job.id}`; once the server answers, run "
                "the tuner again (or Tuner.restore) to continue the experiment."
            ) from exc

    def stop(self, decision: dict[str, Any] | None = None) -> None:
        """Ask the server to stop the job; returns at once (a thread waits for the server).
        ``decision``: why (the tuner's decision: kind, iteration, ...), sent first: the server records
        it and ends the trial's reports where it was taken, though the job runs on until the stop
        reaches it."""
        with self._lock:
            if self._stopper is not None:
                return
            self._stopper = threading.Thread(target=self._stop, args=(decision,), daemon=True,
                                             name=f"tune-stop-job{self.job.id}")  # fmt: skip
        self._stopper.start()

    def _stop(self, decision: dict[str, Any] | None) -> None:
        if decision is not None:
            try:
                self.client.request("POST", f"/jobs/{self.job.id}/decisions", json=decision_body(decision))
            except (ServerError, ServerNotFoundError) as exc:  # an older server (404), or one gone: the stop matters more
                logger.debug("tune: job %s: the server did not take the decision %s: %s", self.job.id, decision, exc)
        # A trial that met its stop criteria or used its budget ran to its end (Ray: TERMINATED): its job
        # ends SUCCEEDED. One the scheduler pruned, or the tuner stopped for any other reason, ends STOPPED.
        complete = decision is not None and decision.get("kind") in (TrialDecision.STOPPER, TrialDecision.MAX_T)
        try:
            self.job.stop(grace_s=self.grace_s, complete=complete)
        except JobConflictError:
            pass  # it has ended meanwhile
        except (ServerError, ServerNotFoundError) as exc:  # the iteration reports a server lost for good
            logger.warning("tune: could not stop job %s of trial %s: %s", self.job.id, self.name, exc)

    def _final(self, status: JobStatus) -> Result:
        try:
            return fetch_result(self.client, self.job.id)
        except JobNotFoundError:  # it ended before its run returned (stopped, lost, or its code failed outside fit)
            pass
        except (ServerError, ServerNotFoundError):
            raise
        except Exception as exc:  # noqa: BLE001 - it does not unpickle here, e.g. an error class this process lacks
            return self._so_far(status, RuntimeError(
                f"job {self.job.id} {status.state}; its Result does not unpickle here "
                f"({type(exc).__name__}: {exc}): see `trainforge logs {self.job.id}`"))  # fmt: skip
        if status.state in (JobState.STOPPED, JobState.SUCCEEDED) and self._stopper is not None:
            return self._so_far(status, None)  # the tuner stopped it: the run so far, as a local stop()
        if status.state == JobState.STOPPED:
            return self._so_far(status, RuntimeError(
                f"job {self.job.id} was stopped on the train server at {self.client.address} (its dashboard "
                "or `trainforge stop`), not by the tuner; Tuner.restore(..., resume_errored=True) continues "
                "the trial from its latest checkpoint"))  # fmt: skip
        return self._so_far(status, RuntimeError(
            f"{status.describe()} (on {self.client.address}): see `trainforge logs {self.job.id}`"))  # fmt: skip

    def _so_far(self, status: JobStatus, error: BaseException | None) -> Result:
        last = self._last
        return Result(metrics=dict(last.metrics) if last is not None else None,
                      checkpoint=self._checkpoint, error=error,
                      path=status.raw.get("run_path") or "")  # fmt: skip


class TrialLostError(RuntimeError):
    """The tuner lost the train server a trial ran on (it did not answer for a minute)."""


def _job_name(name: str) -> str:
    """``name`` within the API's limit (the end kept: the trial's own name is there)."""
    return name if len(name) <= MAX_NAME else "…" + name[-(MAX_NAME - 1) :]
