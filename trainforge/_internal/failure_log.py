"""The run's record of worker failures, those it recovered from included.

Every failure the controller handles is kept:

- in ``run_state.json`` as ``"failures"``: one JSON object per failed rank and attempt, oldest first
  (attempt, rank, pid, kind, exit code and its description, exception type, message, traceback,
  last output, time), rewritten at every failure, so it is on disk while the run goes on;
- in the failed rank's ``logs/rank_N.log``: a marker line naming the attempt and the failure, then
  the traceback (or, for a hung rank, its stacks);
- in :attr:`Result.failures` (also rebuilt by ``Result.from_path``).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from typing import Any

from trainforge._internal.exceptions import WorkerFailure
from trainforge._internal.state_files import create, data_modes

_FIELDS = {f.name for f in dataclasses.fields(WorkerFailure)}
_ORDER = ("attempt", "rank", "pid", "kind", "exit_code", "exc_type", "message", "time", "traceback", "log_tail")


def failure_to_json(failure: WorkerFailure) -> dict[str, Any]:
    out: dict[str, Any] = {name: getattr(failure, name) for name in _ORDER}
    out["exit"] = failure.exit_description() if failure.kind == "died" else None  # e.g. "killed by SIGKILL"
    return out


def failure_from_json(data: dict[str, Any]) -> WorkerFailure:
    return WorkerFailure(**{k: v for k, v in data.items() if k in _FIELDS})


def failures_to_json(attempts: list[list[WorkerFailure]]) -> list[dict[str, Any]]:
    """Every attempt's failures, flattened, oldest first (each record names its attempt)."""
    return [failure_to_json(f) for failures in attempts for f in sorted(failures, key=lambda f: (f.time, f.rank))]


def group_by_attempt(failures: list[WorkerFailure]) -> list[list[WorkerFailure]]:
    """The flat list back as one list per attempt (as ``TrainingFailedError.failures``)."""
    groups: dict[Any, list[WorkerFailure]] = {}
    for f in failures:
        groups.setdefault(f.attempt, []).append(f)
    return list(groups.values())


def marker(failure: WorkerFailure) -> str:
    """What is appended to the failed rank's log: one marker line, then the traceback or stacks."""
    when = datetime.datetime.fromtimestamp(failure.time).isoformat(sep=" ", timespec="seconds")
    attempt = "" if failure.attempt is None else f"attempt {failure.attempt}: "
    text = f"----- trainforge: {attempt}rank {failure.rank} (pid {failure.pid}) failed at {when}: {failure.headline()}\n"
    if failure.traceback:
        text += failure.traceback.rstrip("\n") + "\n"
    return text


def mark_rank_logs(log_dir: str | None, failures: list[WorkerFailure]) -> None:
    """Append each failure's marker to ``{log_dir}/rank_{rank}.log`` (not for rank -1: a group that
    could not start)."""
    if log_dir is None:
        return
    for f in failures:
        if f.rank < 0:
            continue
        try:
            with create(os.path.join(log_dir, f"rank_{f.rank}.log"), "a", data_modes().file, "utf-8") as log:
                log.write(marker(f))
        except OSError:
            pass  # the record in run_state.json stays
