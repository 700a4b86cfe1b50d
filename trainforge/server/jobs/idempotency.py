"""A submission's idempotency: the digest of what it asked for (:func:`submission_digest`), so that a
submission retried with its ``submission_id`` is recognised (:func:`resubmitted`) and a key reused for
another job is refused; and the job service's two refusals (:class:`NotFoundError`,
:class:`ConflictError`), re-exported by :mod:`trainforge.server.jobs.service`."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from trainforge.server.store.database import JobRow


class NotFoundError(LookupError):
    """No such job (HTTP 404)."""


class ConflictError(RuntimeError):
    """The job is not in a state that allows this (HTTP 409)."""


def submission_digest(*, name: str, spec: dict[str, Any], trainer_blob: bytes | None, priority: int, hold: bool,
                      max_retries: int) -> str:  # fmt: skip
    """What a submission asked for, as a digest: the same request retried has the same one."""
    h = hashlib.sha256(json.dumps([name, spec, priority, hold, max_retries], sort_keys=True, default=str).encode())
    h.update(hashlib.sha256(trainer_blob).digest() if trainer_blob is not None else b"-")
    return h.hexdigest()


def resubmitted(job: JobRow, submission_id: str | None, digest: str) -> JobRow:
    """``job``, the one an earlier try of this submission queued; ConflictError if that key was used
    for a submission that asked for something else."""
    if job.submission_digest is not None and job.submission_digest != digest:
        raise ConflictError(
            f"submission_id {submission_id!r} was used for job {job.id} ({job.name}), which asked for something "
            "else: a new job needs a new submission_id (the same one is only for retrying the same submission)"
        )
    return job
