"""The runner: one process per started job, ``python -m trainforge.server._runner <job_dir>``.

The server starts it in its own session (so the job outlives a crash of the server) with its output
going to ``<job_dir>/output.log``, and with ``$TRAINFORGE_JOB_ID``, ``$TRAINFORGE_JOB_EVENTS`` and
``$TRAINFORGE_LOCAL_RESOURCES=@<job_dir>/grant.json`` set (plus ``CUDA_VISIBLE_DEVICES`` for a GPU
grant). It runs the job through the same public trainer code as a local ``fit()``: a pickled trainer
(``trainer.submit()``) or one returned by ``module:function`` is fitted with ``fit_iter()``; a script
is run as ``__main__``, and each ``fit()`` it calls is one of the job's runs. Every run appends its
events to the job's events file (:mod:`trainforge._internal.job_events`).

It ends by writing ``<job_dir>/exit.json`` (``status``: succeeded | failed | stopped, ``error``,
``failure_class``) and, for a trainer job, ``<job_dir>/result.pkl`` (the :class:`~trainforge.Result`
that ``fit()`` would return, pickled). Ctrl-C (SIGINT, which the server sends to stop a job) stops
the workers as in a terminal; the latest committed checkpoint stays. A runner killed before it
wrote ``exit.json`` is what the server calls *lost*.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys
import traceback
from typing import Any

SPEC_FILE = "spec.json"
TRAINER_FILE = "trainer.pkl"
RESULT_FILE = "result.pkl"
EXIT_FILE = "exit.json"
EVENTS_FILE = "events.jsonl"
OUTPUT_FILE = "output.log"
GRANT_FILE = "grant.json"


def write_atomic(path: str, data: bytes | str, *, mode: int = 0o666, fsync: bool = False) -> None:
    """Write a file of the server's (or the runner's) so that readers see the old or the new one
    whole, never a part: a temporary name, then a rename. ``mode`` applies before anything is written."""
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    os.chmod(tmp, mode)  # the umask may have taken bits off; what was asked for is what we get
    os.replace(tmp, path)


def _load_trainer(job_dir: str, spec: dict[str, Any]) -> Any:
    import cloudpickle

    if spec["kind"] == "trainer":
        with open(os.path.join(job_dir, TRAINER_FILE), "rb") as f:
            trainer = cloudpickle.load(f)
    else:  # "function": "pkg.module:make_trainer"
        module_name, _, attr = spec["target"].partition(":")
        trainer = getattr(importlib.import_module(module_name), attr)(*spec.get("args", []))
        if not hasattr(trainer, "fit_iter"):
            raise TypeError(
                f"{spec['target']}() returned {trainer!r}, not a trainer: return a DataParallelTrainer "
                "(or TorchTrainer, ...) without calling fit() on it."
            )
    if spec.get("resume_checkpoint"):
        # Retried from a chosen checkpoint: a new run (a run directory of its own: one that exists would
        # continue from its own latest checkpoint) that starts from it.
        import dataclasses
        import time

        from trainforge import Checkpoint

        base = trainer.run_config.name or type(trainer).__name__
        name = f"{base}-from-{os.path.basename(spec['resume_checkpoint'].rstrip('/'))}-{time.strftime('%Y%m%d-%H%M%S')}"
        trainer.run_config = dataclasses.replace(trainer.run_config, name=name)
        trainer.resume_from_checkpoint = Checkpoint(spec["resume_checkpoint"])
        print(f"trainforge job {os.environ.get('TRAINFORGE_JOB_ID')}: new run {name} starting from checkpoint "
              f"{spec['resume_checkpoint']}", flush=True)  # fmt: skip
        return trainer
    resume = spec.get("resume_run_path")
    if resume and type(trainer).can_restore(resume):
        # A requeued job (its runner was lost): continue the interrupted run from its latest checkpoint.
        print(f"trainforge job {os.environ.get('TRAINFORGE_JOB_ID')}: resuming run {resume}", flush=True)
        overrides = {"datasets": trainer.datasets} if getattr(trainer, "datasets", None) else {}
        trainer = type(trainer).restore(resume, **overrides)
    return trainer


def _run_trainer(job_dir: str, spec: dict[str, Any]) -> dict[str, Any]:
    import cloudpickle

    trainer = _load_trainer(job_dir, spec)
    run = trainer.fit_iter()
    for _ in run:
        pass
    result = run.result
    try:
        blob = cloudpickle.dumps(result)
    except Exception as exc:  # an error object that does not pickle: keep the rest
        print(f"trainforge: the run's result cannot be pickled ({exc}); its error is kept as text", flush=True)
        result.error = RuntimeError(str(result.error))
        blob = cloudpickle.dumps(result)
    write_atomic(os.path.join(job_dir, RESULT_FILE), blob)
    if result.error is not None:
        return {"status": "failed", "failure_class": "user_error", "error": str(result.error), "exit_code": 1}
    return {"status": "succeeded", "exit_code": 0}


def _run_script(spec: dict[str, Any]) -> dict[str, Any]:
    path = spec["path"]
    sys.argv = [path, *spec.get("args", [])]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if code != 0:
            return {"status": "failed", "failure_class": "user_error", "error": f"exit code {code}", "exit_code": code}
    return {"status": "succeeded", "exit_code": 0}


def main(job_dir: str) -> int:
    with open(os.path.join(job_dir, SPEC_FILE)) as f:
        spec = json.load(f)
    if spec.get("cwd"):
        os.chdir(spec["cwd"])
    for entry in reversed(spec.get("sys_path", [])):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    job_id = os.environ.get("TRAINFORGE_JOB_ID")
    with open(os.path.join(job_dir, GRANT_FILE)) as f:
        print(f"trainforge job {job_id}: runner pid {os.getpid()}, grant {f.read()}", flush=True)
    try:
        if spec["kind"] == "script":
            outcome = _run_script(spec)
        else:
            outcome = _run_trainer(job_dir, spec)
    except KeyboardInterrupt:
        print(f"trainforge job {job_id}: stopped", flush=True)
        outcome = {"status": "stopped", "exit_code": 130}
    except BaseException as exc:  # the job's own code failed before or outside fit()
        traceback.print_exc()
        outcome = {
            "status": "failed",
            "failure_class": "user_error",
            "error": f"{type(exc).__name__}: {exc}",
            "exit_code": 1,
        }
    sys.stdout.flush()
    sys.stderr.flush()
    write_atomic(os.path.join(job_dir, EXIT_FILE), json.dumps(outcome), fsync=True)
    return int(outcome["exit_code"])


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m trainforge.server._runner JOB_DIR", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
