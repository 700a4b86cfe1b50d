"""The outcome a job's runner writes (``exit.json``) and the server reads: one writer, one reader, one
pair of enums (``RunStatus``, ``FailureClass``) that the runner, the server's API and the client take."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from trainforge._internal.run_outcome import FailureClass, RunOutcome, RunStatus, read_outcome, write_outcome

OUTCOMES = st.builds(RunOutcome, status=st.sampled_from(list(RunStatus)), exit_code=st.integers(-255, 255),
                     failure_class=st.one_of(st.none(), st.sampled_from(list(FailureClass))),
                     error=st.one_of(st.none(), st.text(max_size=50)))  # fmt: skip


@given(OUTCOMES)
def test_what_the_runner_writes_the_server_reads_back(tmp_path_factory, outcome):
    path = str(tmp_path_factory.mktemp("job") / "exit.json")
    write_outcome(path, outcome)
    assert read_outcome(path) == outcome
    assert json.loads(open(path).read())["status"] == outcome.status.value  # the file's words: the enum's values


def test_the_file_format_is_the_one_older_runners_wrote(tmp_path):
    path = tmp_path / "exit.json"
    path.write_text(json.dumps({"status": "failed", "failure_class": "user_error", "error": "exit code 3", "exit_code": 3}))
    assert read_outcome(str(path)) == RunOutcome.failed(FailureClass.USER_ERROR, "exit code 3", exit_code=3)
    path.write_text(json.dumps({"status": "exploded", "failure_class": "cosmic rays", "exit_code": "x"}))
    assert read_outcome(str(path)) == RunOutcome(RunStatus.FAILED, 1)  # unknown words: a failure, whose unknown
    path.write_text("[1, 2]")
    assert read_outcome(str(path)) is None
    assert read_outcome(str(tmp_path / "missing.json")) is None  # the runner was lost


def test_the_server_records_the_runners_failure_class(tmp_path):
    from trainforge.client import JobState
    from trainforge.server.jobs.outcome import run_ended
    from trainforge.server.store.database import JobStore

    store = JobStore(str(tmp_path / "state.db"))
    try:
        job, _ = store.add_job(name="j", kind="script", spec={"kind": "script", "path": "/x.py"})
        for outcome, state, failure in [
            (RunOutcome.failed(FailureClass.INFRA, "no sandbox"), JobState.FAILED, FailureClass.INFRA),
            (RunOutcome.stopped(), JobState.STOPPED, FailureClass.STOPPED),
            (RunOutcome.succeeded(), JobState.SUCCEEDED, None),
        ]:
            ((_, _, _, fields),), requeue = run_ended(job, outcome, 0, 1.0)
            assert (fields["state"], fields["failure_class"], requeue) == (state, failure, False)
    finally:
        store.close()


def test_a_job_stopped_because_its_run_is_complete_ends_succeeded(tmp_path):
    """A tuner stops a trial's job that met its stop criteria with ``complete`` (issue 36: such trial
    jobs all showed STOPPED, exit 130): it ends SUCCEEDED, whether its runner wrote that it was stopped
    or was killed at the end of the grace period; a plain stop still ends STOPPED."""
    import dataclasses

    from trainforge.client import JobState
    from trainforge.server.jobs.outcome import run_ended
    from trainforge.server.store.database import JobStore

    store = JobStore(str(tmp_path / "state.db"))
    try:
        job, _ = store.add_job(name="j", kind="script", spec={"kind": "script", "path": "/x.py"})
        stopping = dataclasses.replace(job, state=JobState.STOPPING, pid=1)
        for complete, state, failure in [(True, JobState.SUCCEEDED, None), (False, JobState.STOPPED, FailureClass.STOPPED)]:
            row = dataclasses.replace(stopping, complete_on_stop=complete)
            for outcome in (RunOutcome.stopped(), None):  # what it wrote, or killed after the grace period
                ((_, _, payload, fields),), requeue = run_ended(row, outcome, -9, 1.0)
                assert (fields["state"], fields["failure_class"], requeue) == (state, failure, False), (complete, outcome)
                assert payload.get("complete", False) is complete
        failed = run_ended(dataclasses.replace(stopping, complete_on_stop=True),
                           RunOutcome.failed(FailureClass.USER_ERROR, "boom"), 1, 1.0)[0][0][3]  # fmt: skip
        # An error while it stops is the interrupt's (as for any stop, where it counts as STOPPED): complete.
        assert failed["state"] == JobState.SUCCEEDED
        # The stored flag survives a restart of the server (migration 8) and is cleared when the job runs again.
        store.update(job.id, None, None, complete_on_stop=True)
        assert store.get(job.id).complete_on_stop is True
    finally:
        store.close()
