"""The audit log: every state-changing request to the train server, with who sent it, what it asked,
when, from where and what it was answered (allowed or not), in the store's ``audit`` table
(:mod:`trainforge.server.store.team_tables`).

:class:`AuditMiddleware` sits around the guard (which tells who, and puts them in the request's scope
before it refuses anything) and the access layer and app inside it (whose rule says what:
:mod:`trainforge.server.routes.access`), and records each state-changing request of a known caller
once its answer has gone out, with the status that went out: the app's, the access layer's 403, or
the guard's own refusal (another site's page, a body that is not JSON, one over the size limit).
Predictions (many a second, and reads at heart) are not recorded, nor requests whose token is
unknown or missing (the 401s). Records are written by
:class:`AuditLog` a moment later, many in one transaction, so auditing adds no write to a request's
own path; a read of the log (:meth:`AuditLog.query`) writes what is pending first, so whoever just
made a change finds it there. A server killed at once can lose the last quarter second of records.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from trainforge._internal.constants import API_PREFIX
from trainforge._internal.http import SAFE_METHODS
from trainforge.server.store.audit import AuditRowsRefused
from trainforge.server.store.database import JobStore
from trainforge.server.team.users import Principal

logger = logging.getLogger(__name__)

FLUSH_S = 0.25
_SUBMIT_PATH = API_PREFIX + "/jobs"
_DETAIL_MAX = 500


@dataclasses.dataclass(frozen=True)
class AuditEntry:
    ts: float
    user: str
    role: str
    action: str
    method: str
    path: str
    job_id: int | None
    status: int
    client: str | None
    detail: str | None = None


class AuditLog:
    """Audit entries of the server with ``store``: :meth:`record` (kept, written within
    ``FLUSH_S``), :meth:`query` (newest first), :meth:`close` (writes what is pending)."""

    def __init__(self, store: JobStore):
        self.store = store
        self._pending: list[AuditEntry] = []
        self._cond = threading.Condition()
        self._closed = False
        self._writer: threading.Thread | None = None

    def record(self, entry: AuditEntry) -> None:
        with self._cond:
            if self._closed:
                return
            self._pending.append(entry)
            if self._writer is None:
                self._writer = threading.Thread(target=self._loop, daemon=True, name="tf-audit")
                self._writer.start()
            self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
            time.sleep(FLUSH_S)  # gather the burst this entry came in: one transaction for all of it
            self.flush()

    def flush(self) -> None:
        """Write every pending entry now."""
        with self._cond:
            entries, self._pending = self._pending, []
        if not entries:
            return
        rows = [(e.ts, e.user, e.role, e.action, e.method, e.path, e.job_id, e.status, e.client, e.detail)
                for e in entries]  # fmt: skip
        try:
            self.store.audit.add(rows)  # dropped once the store is closed (the server is stopping)
        except AuditRowsRefused:  # never let one bad entry stop the log
            logger.exception("writing %d audit entries", len(rows))

    def query(self, *, user: str | None = None, job_id: int | None = None, before: int | None = None,
              limit: int = 100) -> list[dict[str, Any]]:  # fmt: skip
        """Entries, newest first: of ``user``, of ``job_id``, older than the entry ``before``."""
        self.flush()
        return self.store.audit.newest(user=user, job_id=job_id, before=before, limit=limit)

    def close(self) -> None:
        """Write what is pending; later entries are dropped."""
        self.flush()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._writer is not None:
            self._writer.join(timeout=5)
        self.flush()


class AuditMiddleware:
    """ASGI middleware recording each state-changing request of ``app`` in ``log()`` (None: nothing
    is recorded) once its answer has gone out (see the module docstring), but for those under an
    access rule in ``skip``. The rule and job of a request are what the access layer put in its scope
    (``trainforge.access``), else (refused before it) ``describe(scope)``'s (no ``describe``:
    ``("none", None)``)."""

    def __init__(self, app: Any, log: Any, skip: frozenset[str] = frozenset(),
                 describe: Callable[[dict], tuple[str, int | None]] | None = None):  # fmt: skip
        self.app = app
        self._log = log
        self._skip = skip
        self._describe = describe

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] in SAFE_METHODS:
            await self.app(scope, receive, send)
            return
        answer: dict[str, Any] = {"status": 500, "body": bytearray()}

        async def watch(message: dict) -> None:
            if message["type"] == "http.response.start":
                answer["status"] = message["status"]
            elif message["type"] == "http.response.body" and len(answer["body"]) < 65536:
                answer["body"] += message.get("body", b"")
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            self._record(scope, answer["status"], bytes(answer["body"]))

    def _record(self, scope: dict, status: int, body: bytes) -> None:
        log = self._log()
        who = scope.get("user")
        if log is None or not isinstance(who, Principal):
            return
        described = self._describe(scope) if self._describe is not None else ("none", None)
        rule, job_id = scope.get("trainforge.access") or described
        if rule in self._skip:
            return
        detail = None
        try:
            reply = json.loads(body) if body else None
        except ValueError:
            reply = None
        if isinstance(reply, dict):
            if scope.get("path") == _SUBMIT_PATH and status == 201:
                job_id = reply.get("id")
            elif status >= 400:
                detail = json.dumps(reply.get("detail"), default=str)[:_DETAIL_MAX]
        if who.job_id is not None:  # a job acting on its owner's behalf: say which
            detail = f"with job {who.job_id}'s credential" + (f": {detail}" if detail else "")
        client = scope.get("client")
        log.record(AuditEntry(ts=time.time(), user=who.name, role=who.role, action=rule, method=scope["method"],
                              path=scope.get("path", ""), job_id=job_id, status=status,
                              client=client[0] if client else None, detail=detail))  # fmt: skip
