"""``JobFiles``: each job's directory, ``<state_dir>/jobs/<id>/``, and what the server writes and
reads there: the spec and trainer (staged at submission, put in place inside the transaction that
commits the job's row, swept at start if that never committed), the grant file, and the outcome
(``exit.json``) the job's runner leaves. The names of the files are the runner's
(:mod:`trainforge.server.jobs.runner`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from typing import Any

from trainforge._internal import state_files
from trainforge._internal.run_outcome import RunOutcome, read_outcome
from trainforge._internal.state_files import write_atomic
from trainforge.server.jobs.runner import (
    EVENTS_FILE,
    EXIT_FILE,
    GRANT_FILE,
    OUTPUT_FILE,
    RESULT_FILE,
    SPEC_FILE,
    TRAINER_FILE,
)
from trainforge.server.scheduling.rule import JobRequest
from trainforge.server.store.database import JobRow

STAGING_PREFIX = ".new-"  # jobs/.new-<hex>: a submission's files before its row is committed


class JobFiles:
    """The job directories under ``jobs_dir`` (made 0700, as each job's: they hold specs,
    environments, logs)."""

    def __init__(self, jobs_dir: str):
        self.jobs_dir = jobs_dir
        state_files.make_dir(jobs_dir)

    def dir(self, job_id: int) -> str:
        return os.path.join(self.jobs_dir, str(job_id))

    def events(self, job_id: int) -> str:
        """The job's events file (:mod:`trainforge._internal.job_events`)."""
        return os.path.join(self.dir(job_id), EVENTS_FILE)

    def output(self, job_id: int) -> str:
        """The job's output: its runner's, with every rank's lines."""
        return os.path.join(self.dir(job_id), OUTPUT_FILE)

    def result(self, job_id: int) -> str:
        """The pickled :class:`~trainforge.Result` a trainer job's runner leaves."""
        return os.path.join(self.dir(job_id), RESULT_FILE)

    # -- submission -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def staged(self, spec: dict[str, Any], trainer_blob: bytes | None) -> Iterator[str]:
        """A staging directory holding the submission's spec and trainer, removed on leaving (gone
        already once :meth:`place` moved it to the job's directory)."""
        staging = os.path.join(self.jobs_dir, f"{STAGING_PREFIX}{uuid.uuid4().hex}")
        state_files.make_dir(staging)
        try:
            if trainer_blob is not None:
                write_atomic(os.path.join(staging, TRAINER_FILE), trainer_blob)
            write_atomic(os.path.join(staging, SPEC_FILE), json.dumps(spec))
            yield staging
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def place(self, staging: str, job_id: int) -> None:
        """Move a staged submission to job ``job_id``'s directory (replacing one left by a job whose
        row was never committed: not this one's)."""
        final = self.dir(job_id)
        if os.path.lexists(final):
            shutil.rmtree(final, ignore_errors=True)
        os.replace(staging, final)

    def sweep(self, ids: set[int]) -> int:
        """Remove what submissions that never committed left (staging directories, each of which may
        hold a large trainer, and directories of jobs not in ``ids``: a crash between the move and
        the commit, or between a delete's commit and its removal). Returns how many were removed."""
        removed = 0
        for entry in os.listdir(self.jobs_dir):
            if entry.startswith(STAGING_PREFIX) or (entry.isdigit() and int(entry) not in ids):
                shutil.rmtree(os.path.join(self.jobs_dir, entry), ignore_errors=True)
                removed += 1
        return removed

    def missing(self, job: JobRow) -> str | None:
        """What of the job's files is missing (its directory, spec, trainer), or None if whole."""
        need = [SPEC_FILE] + ([TRAINER_FILE] if job.kind == "trainer" else [])
        missing = [name for name in need if not os.path.isfile(os.path.join(self.dir(job.id), name))]
        return ", ".join(os.path.join("jobs", str(job.id), name) for name in missing) or None

    def write_spec(self, job: JobRow) -> None:
        if os.path.isdir(self.dir(job.id)):  # else the job fails at its start, naming what is missing
            self._write(job.id, SPEC_FILE, json.dumps(job.spec))

    def remove(self, job_id: int) -> None:
        shutil.rmtree(self.dir(job_id), ignore_errors=True)

    # -- a run ------------------------------------------------------------------------------------
    def write_grant(self, job_id: int, request: JobRequest, workers: int) -> None:
        """The job's grant file: what its workers may use (the driver's share is not theirs), re-read
        by the core at every sizing decision, so an elastic job sizes itself to its grant."""
        share = {k: workers * v for k, v in request.per_worker.items()}
        self._write(job_id, GRANT_FILE, json.dumps(share))

    def _write(self, job_id: int, name: str, data: str) -> None:
        """A file of the server's in the job's directory, atomically; the directory's owner's, when
        that is not the server (a sandboxed job reads its grant and spec as its own uid)."""
        directory = self.dir(job_id)
        st = os.stat(directory)
        owner = (st.st_uid, st.st_gid) if st.st_uid != os.geteuid() else None
        write_atomic(os.path.join(directory, name), data, owner=owner)

    def clear_outcome(self, job_id: int) -> None:
        """Remove a previous run's outcome and result (before the job starts again)."""
        for stale in (EXIT_FILE, RESULT_FILE):
            try:
                os.remove(os.path.join(self.dir(job_id), stale))
            except FileNotFoundError:
                pass

    def has_outcome(self, job_id: int) -> bool:
        return os.path.exists(os.path.join(self.dir(job_id), EXIT_FILE))

    def outcome(self, job_id: int) -> RunOutcome | None:
        """What the job's runner wrote on its way out (``exit.json``), or None (it was lost)."""
        return read_outcome(os.path.join(self.dir(job_id), EXIT_FILE))
