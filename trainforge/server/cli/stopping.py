"""Stopping a job from the CLI (``trainforge stop ID``, ``server stop --stop-jobs``): the request
blocks until the job's processes are gone, so "stopping job 1 ..." is said while it waits, and only
once the server took the stop (the job is STOPPING): a refusal (403 for another member's job, 409
for an ended one) comes back with nothing said before it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from trainforge.client import JobState

POLL_S = 0.25  # how often the job's state is read while the stop request waits


def stop_saying(job: Any, line: str, *, force: bool = False, grace_s: float | None = None,
                say: Callable[[str], None] = lambda text: print(text, flush=True)) -> Any:  # fmt: skip
    """``job.stop(...)``'s JobStatus; ``line`` is said once: when the job is STOPPING (or ended)
    while the request is still out, else when it returns. A refused request (``ServerError``) is
    raised as is, with nothing said."""
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def request() -> None:
        try:
            outcome["status"] = job.stop(grace_s=grace_s, force=force)
        except BaseException as exc:  # handed to the caller's thread
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=request, name=f"stop-job-{job.id}", daemon=True).start()
    said = False
    while not done.wait(POLL_S):
        if not said:
            status = job.status()
            if status.state == JobState.STOPPING or status.ended:
                say(line)
                said = True
    if "error" in outcome:
        raise outcome["error"]
    if not said:  # taken and done within one poll: said now, still never before a refusal
        say(line)
    return outcome["status"]
