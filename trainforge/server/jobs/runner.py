"""The runner: one process per started job, ``python -m trainforge.server.jobs.runner <job_dir>``.

The server starts it in its own session (so the job outlives a crash of the server) with its output
going to ``<job_dir>/output.log``, and with ``$TRAINFORGE_JOB_ID``, ``$TRAINFORGE_JOB_EVENTS`` and
``$TRAINFORGE_LOCAL_RESOURCES=@<job_dir>/grant.json`` set (plus ``CUDA_VISIBLE_DEVICES`` for a GPU
grant). It runs the job through the same public trainer code as a local ``fit()``: a pickled trainer
(``trainer.submit()``) or one returned by ``module:function`` is fitted with ``fit_iter()``; a script
is run as ``__main__``, and each ``fit()`` it calls is one of the job's runs. Every run appends its
events to the job's events file (:mod:`trainforge._internal.job_events`).

It ends by writing ``<job_dir>/exit.json`` (its outcome: ``status``, ``error``, ``failure_class``; the
file's one writer and reader are :mod:`trainforge._internal.run_outcome`) and, for a trainer job, ``<job_dir>/result.pkl`` (the :class:`~trainforge.Result`
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

from trainforge._internal.constants import ENV_SANDBOX_PLAN
from trainforge._internal.failure_reason import error_text
from trainforge._internal.run_outcome import FailureClass, RunOutcome, write_outcome
from trainforge._internal.state_files import write_atomic

SPEC_FILE = "spec.json"
TRAINER_FILE = "trainer.pkl"
RESULT_FILE = "result.pkl"
EXIT_FILE = "exit.json"
EVENTS_FILE = "events.jsonl"
OUTPUT_FILE = "output.log"
GRANT_FILE = "grant.json"


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


def _run_trainer(job_dir: str, spec: dict[str, Any]) -> RunOutcome:
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
        traceback.print_exception(result.error)  # the whole error in the job's log, as a script's
        return RunOutcome.failed(FailureClass.USER_ERROR, error_text(result.error))
    return RunOutcome.succeeded()


def _run_script(spec: dict[str, Any]) -> RunOutcome:
    path = spec["path"]
    sys.argv = [path, *spec.get("args", [])]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if code != 0:
            return RunOutcome.failed(FailureClass.USER_ERROR, f"exit code {code}", exit_code=code)
    return RunOutcome.succeeded()


class _NotStarted(Exception):
    """The job cannot start (before its own code runs): why, and whose the fault is (``user_error``:
    the job's spec; ``infra``: the server's files)."""

    def __init__(self, message: str, failure_class: FailureClass):
        super().__init__(message)
        self.failure_class = failure_class


def _prepare(job_dir: str, job_id: str | None) -> dict[str, Any]:
    """Read the job's spec, enter its working directory, put its ``sys_path`` first: the job's spec,
    ready to run, or :class:`_NotStarted` saying what is wrong and what to do."""
    path = os.path.join(job_dir, SPEC_FILE)
    try:
        with open(path) as f:
            spec = json.load(f)
        if not isinstance(spec, dict) or spec.get("kind") not in ("script", "trainer", "function"):
            raise ValueError(f"not a job spec: {str(spec)[:200]}")
        with open(os.path.join(job_dir, GRANT_FILE)) as f:
            grant = f.read()
    except (OSError, ValueError) as exc:
        raise _NotStarted(f"cannot read the job's files in {job_dir} ({type(exc).__name__}: {exc}): the server's "
                          "state directory is damaged; submit the job again", FailureClass.INFRA) from None  # fmt: skip
    cwd = spec.get("cwd")
    if cwd:
        try:
            os.chdir(cwd)
        except (OSError, TypeError, ValueError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else str(exc)
            raise _NotStarted(f"cannot run in the job's working directory (cwd) {cwd!r}: {why}. Submit it with a cwd "
                              f"that exists on the server's machine and that {_who()} may enter "
                              "(`trainforge submit` sends the directory it is run in)", FailureClass.USER_ERROR) from None  # fmt: skip
    script = spec.get("path")
    if spec["kind"] == "script" and isinstance(script, str) and not os.access(script, os.R_OK):
        problem = "it is not there" if not os.path.exists(script) else "permission denied"
        raise _NotStarted(f"cannot read the job's script {script!r} ({problem}): it must be readable by {_who()}",
                          FailureClass.USER_ERROR)  # fmt: skip
    sys_path = spec.get("sys_path") or []
    if not isinstance(sys_path, list) or not all(isinstance(e, str) for e in sys_path):
        raise _NotStarted(f"the job's sys_path is {sys_path!r}: give a list of directories", FailureClass.USER_ERROR)
    for entry in reversed(sys_path):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    print(f"trainforge job {job_id}: runner pid {os.getpid()}, grant {grant}", flush=True)
    return spec


def _confine(job_dir: str) -> RunOutcome | None:
    """A runner started fresh with a sandbox plan enters it first, before anything of the job is
    read (:mod:`trainforge._internal.sandbox`), then works in the job's directory. The outcome to
    end with if that fails, else None."""
    if not os.environ.get(ENV_SANDBOX_PLAN):
        return None  # not sandboxed (nothing to import)
    from trainforge._internal.sandbox import enter_from_environment

    try:
        if enter_from_environment():
            os.chdir(job_dir)
    except (OSError, ValueError) as exc:
        return RunOutcome.failed(FailureClass.INFRA, f"could not enter the job's sandbox: {exc}")
    return None


def _who() -> str:
    """Who the job runs as, for an error that says what to change."""
    user = os.environ.get("USER")
    if user and os.environ.get("TRAINFORGE_TOKEN", "").startswith("tfj."):  # in a server's sandbox
        return (f"this job's user (it runs sandboxed, as uid {os.getuid()}, {user}'s: it sees only what any user of "
                "the server's machine may read, or what is its own; an admin can map a user to their own account "
                f"with `trainforge server users set {user} --os-user LOGIN`)")  # fmt: skip
    return "the server's user"


def main(job_dir: str) -> int:
    """Run the job in ``job_dir`` and write its outcome to ``exit.json``: whatever fails, from reading
    its spec to its last line, ends there (a runner that ends without one is *lost*, and retried)."""
    refused = _confine(job_dir)
    if refused is not None:  # still the server's user: say why in the job's log and outcome, run nothing
        print(f"trainforge job {os.environ.get('TRAINFORGE_JOB_ID')}: not started: {refused.error}", flush=True)
        write_outcome(os.path.join(job_dir, EXIT_FILE), refused)
        return refused.exit_code
    job_id = os.environ.get("TRAINFORGE_JOB_ID")
    try:
        spec = _prepare(job_dir, job_id)
        if spec["kind"] == "script":
            outcome = _run_script(spec)
        else:
            outcome = _run_trainer(job_dir, spec)
    except _NotStarted as exc:
        print(f"trainforge job {job_id}: not started: {exc}", flush=True)
        outcome = RunOutcome.failed(exc.failure_class, str(exc))
    except KeyboardInterrupt:
        print(f"trainforge job {job_id}: stopped", flush=True)
        outcome = RunOutcome.stopped()
    except BaseException as exc:  # the job's own code failed before or outside fit()
        traceback.print_exc()
        outcome = RunOutcome.failed(FailureClass.USER_ERROR, error_text(exc))
    sys.stdout.flush()
    sys.stderr.flush()
    write_outcome(os.path.join(job_dir, EXIT_FILE), outcome)
    return outcome.exit_code


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m trainforge.server.jobs.runner JOB_DIR", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
