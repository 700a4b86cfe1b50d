"""Waiting for a condition: the one polling helper of the tests and benchmarks.

    wait_until(lambda: job.status().state == "RUNNING", 60, "the job to run")

Prefer an event to a poll (a line a process prints, a pipe, a ``threading.Event``); poll only where the
thing waited for has no other channel to the waiter (a file another process writes, a server's state).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

POLL_S = 0.02  # between two looks: short against what is waited for, long against a look's cost


def wait_until(predicate: Callable[[], T], timeout: float, what: str, *, interval: float = POLL_S) -> T:
    """Call ``predicate`` every ``interval`` seconds until it returns a true value, and return that value.

    Raises ``TimeoutError`` naming ``what`` (e.g. "the job to start") when ``timeout`` seconds pass
    first; the predicate is asked once more at the deadline, so a slow last look still counts.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)
