"""A failed run's one-line reason (trainforge/_internal/failure_reason.py), from failure records."""

from __future__ import annotations

import os

from hypothesis import given
from hypothesis import strategies as st

from trainforge._internal.exceptions import TrainingFailedError, WorkerFailure
from trainforge._internal.failure_reason import (
    error_text,
    exception_reason,
    failure_reason,
    reason_of,
    user_frame,
)

TRAINFORGE_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "trainforge", "_internal", "train_fn.py")
TRACEBACK = f'''Traceback (most recent call last):
  File "{TRAINFORGE_FILE}", line 94, in _run_train_payload
    out = payload.train_fn(*args)
  File "/home/me/proj/train.py", line 12, in loop
    check(lr)
  File "/home/me/proj/train.py", line 8, in check
    raise ValueError("bad lr")
  File "{os.__file__}", line 1, in fake_stdlib_frame
ValueError: bad lr
'''


def test_the_innermost_frame_of_the_users_own_files_is_the_place():
    assert user_frame(TRACEBACK) == "train.py:8, in check"
    assert user_frame(f'  File "{TRAINFORGE_FILE}", line 3, in f\n  File "<dynamic-code>", line 2, in g\n') is None


def test_a_worker_failure_is_its_headline_and_the_users_line():
    raised = WorkerFailure(rank=1, pid=7, kind="exception", exc_type="ValueError", message="bad lr", traceback=TRACEBACK)
    assert failure_reason(raised) == "ValueError: bad lr (train.py:8, in check)"
    died = WorkerFailure(rank=0, pid=8, kind="died", exit_code=-9)
    assert failure_reason(died) == "worker process died unexpectedly: killed by SIGKILL (exit code -9)"


def test_a_retried_run_gives_the_root_cause_of_its_last_attempt():
    first = [WorkerFailure(rank=0, pid=1, kind="died", exit_code=1, time=1.0, attempt=0)]
    later = WorkerFailure(rank=1, pid=3, kind="died", exit_code=-15, time=3.0, attempt=1)
    root = WorkerFailure(rank=0, pid=2, kind="exception", exc_type="KeyError", message="'x'", traceback=TRACEBACK,
                         time=2.0, attempt=1)  # fmt: skip
    exc = TrainingFailedError.from_attempts([first, [later, root]], max_failures=1)
    assert exception_reason(exc) == "KeyError: 'x' (train.py:8, in check) [2 attempts]"
    text = error_text(exc)
    assert reason_of(text) == exception_reason(exc) and "traceback of rank 0" in text


def test_an_exception_of_the_jobs_own_code_names_its_line_and_keeps_its_traceback():
    def fails():
        raise RuntimeError("first line\nsecond line")

    try:
        fails()
    except RuntimeError as exc:
        line = fails.__code__.co_firstlineno + 1
        assert exception_reason(exc) == f"RuntimeError: first line (test_failure_reason.py:{line}, in fails)"
        text = error_text(exc)
        assert text.splitlines()[0] == exception_reason(exc)
        assert "Traceback (most recent call last)" in text and "second line" in text


@given(st.text())
def test_reason_of_any_error_text_is_one_line_or_none(error):
    reason = reason_of(error)
    assert reason is None or (reason and "\n" not in reason and "\r" not in reason and reason in error)
