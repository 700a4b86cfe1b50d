"""Failure records, their grouped report, and the exception tree."""

from __future__ import annotations

import pytest

from trainforge import TrainingFailedError, WorkerFailure
from trainforge._internal.exceptions import (
    TrainforgeError,
    WorkerGroupError,
    WorkerStartError,
    format_failures,
)


def exc(
    rank: int, t: float, message: str = "loss is NaN", exc_type: str = "ValueError", **kw
) -> WorkerFailure:
    return WorkerFailure(
        rank=rank, pid=100 + rank, kind="exception", exc_type=exc_type, message=message, time=t, **kw
    )


def died(rank: int, t: float, exit_code: int) -> WorkerFailure:
    return WorkerFailure(rank=rank, pid=100 + rank, kind="died", exit_code=exit_code, time=t)


def test_exception_tree():
    assert issubclass(TrainingFailedError, TrainforgeError)
    assert issubclass(WorkerGroupError, TrainforgeError)
    assert issubclass(WorkerStartError, WorkerGroupError)
    assert not issubclass(TrainingFailedError, WorkerGroupError)
    assert issubclass(TrainforgeError, Exception)


def test_identical_errors_grouped_into_one_entry():
    text = format_failures([exc(2, 5.0), exc(0, 5.1), exc(3, 5.2)])
    assert text.count("ValueError: loss is NaN") == 1
    assert "ranks 0, 2, 3 (pids 100, 102, 103): ValueError: loss is NaN" in text


def test_single_failure_uses_singular():
    assert format_failures([exc(1, 0.0)]) == "rank 1 (pid 101): ValueError: loss is NaN"


def test_root_cause_first():
    # rank 3's error happened first; the other ranks then failed with a different error
    failures = [
        exc(0, 20.0, "connection reset by peer", "RuntimeError"),
        exc(1, 21.0, "connection reset by peer", "RuntimeError"),
        exc(3, 10.0, "CUDA out of memory", "torch.OutOfMemoryError"),
    ]
    text = format_failures(failures)
    lines = text.splitlines()
    assert lines[0] == "rank 3 (pid 103): torch.OutOfMemoryError: CUDA out of memory"
    assert lines[1] == "ranks 0, 1 (pids 100, 101): RuntimeError: connection reset by peer"


def test_different_messages_are_not_grouped():
    text = format_failures([exc(0, 1.0, "a"), exc(1, 2.0, "b")])
    assert "rank 0 (pid 100): ValueError: a" in text and "rank 1 (pid 101): ValueError: b" in text


def test_traceback_and_log_tail_of_the_earliest_member():
    failures = [
        exc(1, 2.0, traceback="Traceback of one\n  line 1\n"),
        exc(0, 1.0, traceback="Traceback of zero\n  line 0\n", log_tail="printed by zero"),
    ]
    text = format_failures(failures)
    assert "traceback of rank 0:\n    Traceback of zero\n      line 0" in text
    assert "last output of rank 0:\n    printed by zero" in text
    assert "Traceback of one" not in text


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (-9, "killed by SIGKILL (exit code -9)"),
        (-11, "killed by SIGSEGV (exit code -11)"),
        (-15, "killed by SIGTERM (exit code -15)"),
        (-200, "killed by signal 200 (exit code -200)"),
        (3, "exit code 3"),
        (None, "still running"),
    ],
)
def test_exit_description(code, expected):
    assert WorkerFailure(rank=0, pid=1, kind="died", exit_code=code).exit_description() == expected


def test_died_failures_show_signal_names_and_group_by_exit_code():
    text = format_failures([died(0, 1.0, -9), died(1, 1.1, -9), died(2, 1.2, 1)])
    assert (
        "ranks 0, 1 (pids 100, 101): worker process died unexpectedly: killed by SIGKILL (exit code -9)"
        in text
    )
    assert "rank 2 (pid 102): worker process died unexpectedly: exit code 1" in text


def test_hung_failure_headline():
    f = WorkerFailure(rank=4, pid=9, kind="hung", message="no report for 600s")
    assert format_failures([f]) == "rank 4 (pid 9): worker hung: no report for 600s"


def test_from_attempts_single():
    err = TrainingFailedError.from_attempts([[exc(1, 0.0)]], max_failures=0)
    assert str(err) == "Training failed: rank 1 (pid 101): ValueError: loss is NaN"
    assert err.failures == [[exc(1, 0.0)]]


def test_from_attempts_lists_every_attempt_oldest_first():
    attempts = [
        [exc(0, 1.0, "first")],
        [died(1, 2.0, -9), died(0, 2.1, -9)],
        [exc(2, 3.0, "third", "KeyError")],
    ]
    err = TrainingFailedError.from_attempts(attempts, max_failures=2)
    lines = str(err).splitlines()
    assert "3 times" in lines[0] and "max_failures=2" in lines[0]
    assert lines[1] == "[attempt 0] rank 0 (pid 100): ValueError: first"
    assert lines[2] == (
        "[attempt 1] ranks 0, 1 (pids 100, 101): worker process died unexpectedly: killed by SIGKILL (exit code -9)"
    )
    assert lines[3] == "[attempt 2] rank 2 (pid 102): KeyError: third"
    assert err.failures is attempts


def test_from_attempts_numbers_attempts_as_get_attempt():
    # A resize between the failures made attempt 1 (no failure): the records say which attempt failed.
    attempts = [[exc(0, 1.0, "first", attempt=0)], [exc(1, 2.0, "second", attempt=2)]]
    lines = str(TrainingFailedError.from_attempts(attempts, max_failures=1)).splitlines()
    assert lines[1:] == ["[attempt 0] rank 0 (pid 100): ValueError: first", "[attempt 2] rank 1 (pid 101): ValueError: second"]


def test_training_failed_error_default_failures():
    assert TrainingFailedError("x").failures == []
