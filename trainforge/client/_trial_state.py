"""``TrialState``: the state of a Tune trial, and :func:`trial_state`, the one rule that derives it,
defined once for every view of a trial: Tune's own (its console table, ``experiment_state.json``,
the ``ResultGrid``'s results), the train server's Experiments API
(``GET /api/v1/experiments/{id}/trials``), its experiments pages and the CLI. The names are Ray
Tune's (``Trial.status``)::

    PENDING -> RUNNING -> TERMINATED   it ran to its end, or the tuner ended it on purpose
      |  ^               -> ERROR        it failed, the tuner failed it, or its job was stopped on the server
      v  |               -> PENDING      the tuner runs it again (PBT's exploit; Tuner.restore after Ctrl-C)
     PAUSED                              its job is held in the server's queue (it runs once released)

A trial runs as a job of the train server (or as a run of a local tuner): its state follows from
that run's :class:`~trainforge.client.JobState` and the tuner's :class:`TrialDecision` on it, if it
took one. The choices, as Ray Tune makes them:

- A trial the tuner's scheduler stopped early (**pruned**: ASHA, HyperBand, median stopping) is
  ``TERMINATED``, as is one that used up its budget (``max_t``), met the stop criteria or ran out
  the experiment's time budget: the tuner ended it on purpose; it did not fail. How it ended is its
  decision (the trial's ``reason.kind``: ``pruned``, ``max_t``, ...), which the views show beside
  the state; an experiment's summary counts the pruned ones apart (``pruned``).
- A trial whose job was stopped on the server by someone other than the tuner (the dashboard,
  ``trainforge stop``) is ``ERROR``: the tuner reports it failed, and
  ``Tuner.restore(..., resume_errored=True)`` continues it from its latest checkpoint.
- A trial the tuner will run again is ``PENDING``: PBT continues it from a better trial's
  checkpoint (same id), and after Ctrl-C ``Tuner.restore`` continues it (Ray saves such a trial
  PENDING too).
- A trial whose job waits in the queue, or was lost for a moment (its runner vanished: the job is
  requeued), is ``PENDING``; one whose job is *held* (``PATCH hold``) is ``PAUSED`` until released.

While a trial's job waits on the server, the tuner's console already shows it ``RUNNING`` (it has
started the trial's run, as far as it knows) where the server shows ``PENDING``; once the trial has
ended, every view says the same.
"""

from __future__ import annotations

from typing import Any

from trainforge._internal.str_enum import StrEnum
from trainforge.client._states import JobState


class TrialState(StrEnum):
    """A Tune trial's state (Ray Tune's names; the module docstring says how it is derived). In
    Python a ``str`` (``TrialState.TERMINATED == "TERMINATED"``)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    PAUSED = "PAUSED"
    TERMINATED = "TERMINATED"
    ERROR = "ERROR"

    @property
    def active(self) -> bool:
        """Waits to run, or runs: it may still report."""
        return self in ACTIVE_TRIAL_STATES

    @property
    def ended(self) -> bool:
        """Ended for good (unless a ``Tuner.restore`` resumes an errored one)."""
        return self in (TrialState.TERMINATED, TrialState.ERROR)


ACTIVE_TRIAL_STATES = (TrialState.PENDING, TrialState.RUNNING, TrialState.PAUSED)


class TrialDecision(StrEnum):
    """A decision the tuner took on a trial (what its ``POST /jobs/{id}/decisions`` says): its
    scheduler stopped it early (``PRUNED``: at a rung) or at its budget (``MAX_T``); PBT continued it
    from another trial's checkpoint (``EXPLOIT``); the stop criteria (``STOPPER``) or the
    experiment's time budget (``BUDGET``) stopped it; the tuner was interrupted (``INTERRUPTED``,
    Ctrl-C); or the tuner failed it (``ERROR``, e.g. it did not report the metric)."""

    PRUNED = "pruned"
    MAX_T = "max_t"
    EXPLOIT = "exploit"
    STOPPER = "stopper"
    BUDGET = "budget"
    INTERRUPTED = "interrupted"
    ERROR = "error"


def trial_state(job_state: JobState | str | None, decision: TrialDecision | str | None = None) -> TrialState:
    """The state of a trial whose latest run is in ``job_state`` (None: none submitted yet) after
    the tuner's ``decision`` on it (None: it took none; a kind this version does not know counts as
    none). The rules are the module docstring's."""
    job = JobState(job_state) if job_state is not None else None
    taken = _decision(decision)
    if taken == TrialDecision.ERROR or job == JobState.FAILED:
        return TrialState.ERROR
    if job == JobState.HELD:
        return TrialState.PAUSED
    if job is None or job.waiting or job == JobState.LOST:
        return TrialState.PENDING
    if job.active:
        return TrialState.RUNNING
    if taken in (TrialDecision.EXPLOIT, TrialDecision.INTERRUPTED):
        return TrialState.PENDING  # the tuner runs it again (PBT), or a Tuner.restore does (Ctrl-C)
    if taken is not None or job == JobState.SUCCEEDED:
        return TrialState.TERMINATED
    return TrialState.ERROR  # its job was stopped on the server, not by the tuner


def _decision(value: Any) -> TrialDecision | None:
    try:
        return TrialDecision(value) if value is not None else None
    except ValueError:
        return None
