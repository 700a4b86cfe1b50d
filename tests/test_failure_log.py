"""Failures leave a trace, those the run recovered from included: ``run_state.json`` (``"failures"``,
written as they happen), a marker and the traceback in the rank's ``logs/rank_N.log``,
``Result.failures`` and ``Result.from_path(...).failures``."""

from __future__ import annotations

import dataclasses
import json
import os
import time

import pytest

import trainforge as train
from trainforge import (
    DataParallelTrainer,
    FailureConfig,
    Result,
    RunConfig,
    ScalingConfig,
    TrainingFailedError,
    WorkerFailure,
)
from trainforge._internal import failure_log
from trainforge._internal.storage import RUN_STATE_FILE


def _flaky(config):
    """Attempt 0: rank 1 dies (exit code 3). Attempt 1: rank 1 raises. Attempt 2: every rank reports
    which failures run_state.json held when it started, then finishes. Rank 0 waits to be stopped."""
    ctx = train.get_context()
    attempt, rank = ctx.get_attempt(), ctx.get_world_rank()
    print(f"rank {rank} starts attempt {attempt}", flush=True)
    if attempt < 2:
        if rank == 1:
            if attempt == 0:
                os._exit(3)
            raise ValueError("flaky on purpose")
        while True:
            time.sleep(0.05)
    with open(os.path.join(ctx.get_trial_dir(), RUN_STATE_FILE)) as f:
        state = json.load(f)
    train.report({"recorded": [[r["attempt"], r["rank"], r["kind"]] for r in state["failures"]]})


def test_recovered_failures_are_kept_on_disk_in_the_log_and_in_the_result(tmp_path, executor):
    t0 = time.time()
    result = DataParallelTrainer(
        _flaky,
        scaling_config=ScalingConfig(num_workers=2, executor=executor),
        run_config=RunConfig(
            storage_path=str(tmp_path), name="run", verbose=0, failure_config=FailureConfig(max_failures=2)
        ),
    ).fit()
    assert result.error is None
    # On disk while the run went on (what attempt 2 read), as JSON lists:
    assert result.metrics == {"recorded": [[0, 1, "died"], [1, 1, "exception"]]}

    died, raised = result.failures
    # A local worker has an exit status; a Ray actor has Ray's reason instead.
    exit_code, exit_text = (3, "exit code 3") if executor == "local" else (None, "the Ray actor died on node ")
    assert (died.attempt, died.rank, died.kind, died.exit_code) == (0, 1, "died", exit_code)
    assert died.exit_description().startswith(exit_text)
    assert "rank 1 starts attempt 0" in died.log_tail
    assert (raised.attempt, raised.rank, raised.kind, raised.exc_type) == (1, 1, "exception", "ValueError")
    assert raised.message == "flaky on purpose"
    assert "Traceback" in raised.traceback and 'raise ValueError("flaky on purpose")' in raised.traceback
    assert died.pid != raised.pid and all(isinstance(f.pid, int) for f in result.failures)
    assert t0 <= died.time <= raised.time <= time.time()

    state = json.loads(open(os.path.join(result.path, RUN_STATE_FILE)).read())
    assert state["status"] == "finished" and state["error"] is None
    assert [(r["attempt"], r["rank"], r["kind"], r["exit_code"]) for r in state["failures"]] == [
        (0, 1, "died", exit_code),
        (1, 1, "exception", None),
    ]
    assert state["failures"][0]["exit"].startswith(exit_text) and state["failures"][1]["exit"] is None
    assert state["failures"][1]["traceback"] == raised.traceback

    # The rank's log: each failure marked where it happened, between the attempts' output.
    log = open(os.path.join(result.path, "logs", "rank_1.log")).read()
    starts = [log.index(f"rank 1 starts attempt {a}") for a in range(3)]
    marks = [
        log.index(f"----- trainforge: attempt 0: rank 1 (pid {died.pid}) failed at "),
        log.index(f"----- trainforge: attempt 1: rank 1 (pid {raised.pid}) failed at "),
    ]
    assert starts[0] < marks[0] < starts[1] and marks[0] < marks[1] < starts[2]
    assert f"worker process died unexpectedly: {exit_text}" in log
    assert "ValueError: flaky on purpose\nTraceback (most recent call last):\n" in log
    assert "----- trainforge" not in open(os.path.join(result.path, "logs", "rank_0.log")).read()

    # And back from the directory.
    loaded = Result.from_path(result.path).failures
    assert [_fields(f) for f in loaded] == [_fields(f) for f in result.failures]
    assert loaded[0].headline() == "worker process died unexpectedly: " + (
        "exit code 3" if executor == "local" else died.message
    )


def _fields(f: WorkerFailure) -> dict:
    return {k: v for k, v in failure_log.failure_to_json(f).items() if k != "exit"}


def test_final_failure_is_recorded_with_the_earlier_ones(tmp_path):
    def loop():
        raise ValueError(f"boom in attempt {train.get_context().get_attempt()}")

    trainer = DataParallelTrainer(
        loop,
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(
            storage_path=str(tmp_path), name="run", verbose=0, failure_config=FailureConfig(max_failures=1)
        ),
    )
    with pytest.raises(TrainingFailedError) as info:
        trainer.fit()
    state = json.loads((tmp_path / "run" / RUN_STATE_FILE).read_text())
    assert state["status"] == "errored" and "[attempt 1] rank 0" in state["error"]
    assert [(r["attempt"], r["message"]) for r in state["failures"]] == [(0, "boom in attempt 0"), (1, "boom in attempt 1")]
    loaded = Result.from_path(str(tmp_path / "run"))
    assert isinstance(loaded.error, TrainingFailedError)
    assert loaded.error.failures == info.value.failures  # one list per attempt, as raised
    assert [f.attempt for f in loaded.failures] == [0, 1]


def test_a_run_without_failures_records_none(tmp_path):
    result = DataParallelTrainer(
        lambda: train.report({"x": 1}),
        run_config=RunConfig(storage_path=str(tmp_path), name="run", verbose=0),
    ).fit()
    assert result.failures == [] and Result.from_path(result.path).failures == []
    assert json.loads((tmp_path / "run" / RUN_STATE_FILE).read_text())["failures"] == []


# -- units --------------------------------------------------------------------------------------------


def test_json_round_trip_keeps_every_field():
    f = WorkerFailure(rank=2, pid=42, kind="died", exit_code=-9, log_tail="last\n", time=12.5, attempt=3)
    data = failure_log.failure_to_json(f)
    assert set(data) == {field.name for field in dataclasses.fields(WorkerFailure)} | {"exit"}
    assert data["exit"] == "killed by SIGKILL (exit code -9)"
    assert failure_log.failure_from_json(json.loads(json.dumps(data))) == f


def test_marker_of_a_hung_rank_carries_its_stacks(tmp_path):
    f = WorkerFailure(rank=0, pid=7, kind="hung", message="no report for 5s", traceback="Thread 0x1:\n  File x\n",
                      time=0.0, attempt=2)
    failure_log.mark_rank_logs(str(tmp_path), [f, dataclasses.replace(f, rank=-1)])
    text = (tmp_path / "rank_0.log").read_text()
    assert text.startswith("----- trainforge: attempt 2: rank 0 (pid 7) failed at ")
    assert text.endswith(": worker hung: no report for 5s\nThread 0x1:\n  File x\n")
    assert os.listdir(tmp_path) == ["rank_0.log"]  # rank -1 (a group that did not start) has no log
