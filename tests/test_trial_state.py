"""A Tune trial's state (``trainforge.client.trial_state``): the one rule every view takes (the tuner,
the server's Experiments API and pages, the CLI), in Ray Tune's names. Pure: no server, no tuner."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainforge.client import JobState, TrialDecision, TrialState, trial_state

DECISIONS = st.one_of(st.none(), st.sampled_from(list(TrialDecision)), st.text(max_size=12))
JOB_STATES = st.one_of(st.none(), st.sampled_from(list(JobState)))


@pytest.mark.parametrize(("job_state", "decision", "expected"), [
    (None, None, TrialState.PENDING),  # tagged, its job not seen yet
    (JobState.HELD, None, TrialState.PAUSED),  # held in the queue: runs once released
    (JobState.STARTING, None, TrialState.RUNNING), (JobState.STOPPING, TrialDecision.PRUNED, TrialState.RUNNING),
    (JobState.SUCCEEDED, TrialDecision.PRUNED, TrialState.TERMINATED),  # pruned as its run ended anyway
    (JobState.STOPPED, TrialDecision.BUDGET, TrialState.TERMINATED),
    (JobState.SUCCEEDED, TrialDecision.INTERRUPTED, TrialState.PENDING),
    (JobState.STOPPED, "a newer tuner's kind", TrialState.ERROR),  # an unknown kind is no decision
    (JobState.SUCCEEDED, "a newer tuner's kind", TrialState.TERMINATED),
])  # fmt: skip
def test_the_rules_the_docstring_states(job_state, decision, expected):
    assert trial_state(job_state, decision) is expected


@given(JOB_STATES, DECISIONS)
def test_every_job_state_and_decision_has_one_state_in_rays_names(job_state, decision):
    state = trial_state(job_state, decision)
    assert isinstance(state, TrialState) and state.value in {"PENDING", "RUNNING", "PAUSED", "TERMINATED", "ERROR"}
    assert trial_state(None if job_state is None else job_state.value, decision) is state  # plain strings alike
    failed = job_state == JobState.FAILED or decision == TrialDecision.ERROR
    assert (state is TrialState.ERROR) == (failed or (job_state == JobState.STOPPED and decision not in set(TrialDecision)))
    if not failed and job_state is not None and job_state.active:
        assert state is TrialState.RUNNING  # a decision ends a trial only once its job has ended
    if not failed and job_state is not None and job_state.terminal and decision in (TrialDecision.PRUNED, TrialDecision.MAX_T, TrialDecision.STOPPER, TrialDecision.BUDGET):
        assert state is TrialState.TERMINATED  # pruned or not: the tuner ended it, as Ray shows it
    assert state.active == (not state.ended)


def test_the_client_exports_the_vocabulary():
    import trainforge.client

    assert {"TrialState", "TrialDecision", "trial_state"} <= set(trainforge.client.__all__)
    assert [s.value for s in TrialState] == ["PENDING", "RUNNING", "PAUSED", "TERMINATED", "ERROR"]
