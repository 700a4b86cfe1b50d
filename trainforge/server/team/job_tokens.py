"""Job credentials: what a job's processes use to talk to the server (reports go through its files;
Tune trials it submits, models it registers and reads of the API go through HTTP), scoped to that
job and its owner, and valid only while the job runs.

A job's token is ``tfj.<job id>.<secret>`` (256 random bits), in its environment as
``$TRAINFORGE_TOKEN`` (with ``$TRAINFORGE_ADDRESS``), made when the job starts and forgotten when it
ends; only ``sha256(secret)`` is kept (in ``job_tokens``, so a job reattached after a server
restart keeps its credential). It signs in as the job's owner with the role ``member`` at most
(an admin's job cannot manage users or delete model versions), and the principal says which job
it is (the audit log records it). The admin's token is never in a job's reach.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
import time

from trainforge.server.store.database import JobStore

PREFIX = "tfj"
_TOKEN = re.compile(r"^tfj\.([0-9]{1,19})\.([A-Za-z0-9_-]{20,100})$")


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class JobTokens:
    """The credentials of the running jobs of the server whose store is ``store`` (thread-safe)."""

    def __init__(self, store: JobStore):
        self.store = store
        self._lock = threading.Lock()
        self._live: dict[int, tuple[str, str]] = {}  # job id -> (owner, token hash)
        self._live.update(store.job_tokens.all())

    def issue(self, job_id: int, owner: str) -> str:
        """A new credential for job ``job_id`` of ``owner`` (any earlier one of the job ends)."""
        secret = secrets.token_urlsafe(32)
        digest = _hash(secret)
        self.store.job_tokens.put(job_id, owner, digest, time.time())
        with self._lock:
            self._live[job_id] = (owner, digest)
        return f"{PREFIX}.{job_id}.{secret}"

    def revoke(self, job_id: int) -> None:
        """The job ended: its credential stops working at once."""
        with self._lock:
            known = self._live.pop(job_id, None)
        if known is not None:
            self.store.job_tokens.delete(job_id)

    def verify(self, token: str) -> tuple[int, str] | None:
        """``(job id, owner)`` of a live job's credential, or None. Constant-time comparison."""
        match = _TOKEN.match(token)
        if match is None:
            return None
        job_id = int(match.group(1))
        with self._lock:
            known = self._live.get(job_id)
        expected = known[1] if known is not None else "0" * 64
        if hmac.compare_digest(_hash(match.group(2)), expected) and known is not None:
            return job_id, known[0]
        return None

    def live(self, job_id: int) -> bool:
        with self._lock:
            return job_id in self._live
