"""Who may do what on the train server: every route's rule, every role's rules, in one place.

The guard (:mod:`trainforge._internal.http.guard`) says *who* sends a request (its token: a user of
:mod:`trainforge.server.team.users`, the state directory's ``admin``, or the scrape token's ``scraper``,
put in the request's scope as ``user``); :class:`Access`, the ASGI layer right inside it, says
whether they may, *before the app reads a byte of the body*: it finds the route that takes the
request in the app's route table (as the app's router will), its rule in :data:`RULES` (a route
that reads and is not listed is ``read``; one that changes state and is not listed is ``unlisted``,
which only admins pass, so a new route is never open by mistake: ``tests/test_server_access.py``
walks the route table and fails on it) and answers 403 naming the rule when the role does not allow
it (:func:`authorize`). The route table is the app's own (:class:`RouteTable` includes each router
in the app and in the table at once); a request it does not find has the rule of its bare path, so
that a miss is never an opening (a change: ``unlisted``).

| rule              | admin | member            | viewer | scraper |
|-------------------|-------|-------------------|--------|---------|
| read              | yes   | yes               | yes    | no      |
| metrics.scrape    | yes   | yes               | yes    | yes     |
| job.submit        | yes   | yes               | no     | no      |
| job.change        | yes   | their own jobs    | no     | no      |
| experiment.write  | yes   | yes               | no     | no      |
| model.write       | yes   | yes               | no     | no      |
| serve.predict     | yes   | yes               | no     | no      |
| model.admin       | yes   | no                | no     | no      |
| user.admin        | yes   | no                | no     | no      |
| job.result        | their own jobs | their own jobs | their own jobs | no |
| unlisted          | yes   | no                | no     | no      |

``job.result`` (``GET /jobs/{id}/result``, the pickled ``Result``) is the owner's alone, admins
included (:data:`OWNER_ONLY`): the pickle is what the job's code wrote, and unpickling it runs code,
so no one's client is handed another user's; the job's metrics and checkpoints are ``read``.

Beyond the table, ``job.priority``: a member may give a job (at submission or later) a priority of
at most ``TeamPolicy.member_max_priority`` (:func:`check_priority`), so that priority, and with it
preemption, stays the admins' to hand out; and ``record.on_behalf``: who registered a model version
or moved an alias is the caller, and only an admin may record it for someone else
(:func:`recorded_by`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any

import anyio
from fastapi import Depends, HTTPException, Request
from starlette.routing import compile_path

from trainforge._internal.constants import API_PREFIX
from trainforge._internal.http import SAFE_METHODS, deny
from trainforge.server.team.users import ADMIN_PRINCIPAL, Principal, is_user_name

P = API_PREFIX
UNLISTED = "unlisted"

# (method, route path) -> rule, for every route that changes state, and the reads that are not "read".
RULES: dict[tuple[str, str], str] = {
    ("POST", f"{P}/jobs"): "job.submit",
    ("PATCH", f"{P}/jobs/{{job_id}}"): "job.change",
    ("POST", f"{P}/jobs/{{job_id}}/stop"): "job.change",
    ("POST", f"{P}/jobs/{{job_id}}/retry"): "job.change",
    ("DELETE", f"{P}/jobs/{{job_id}}"): "job.change",
    ("POST", f"{P}/jobs/{{job_id}}/decisions"): "job.change",
    ("POST", f"{P}/experiments/import"): "experiment.write",
    ("POST", f"{P}/models/{{name}}/versions"): "model.write",
    ("PUT", f"{P}/models/{{name}}/aliases/{{alias}}"): "model.write",
    ("DELETE", f"{P}/models/{{name}}/aliases/{{alias}}"): "model.write",
    ("DELETE", f"{P}/models/{{name}}/versions/{{version}}"): "model.admin",
    ("POST", f"{P}/models/gc"): "model.admin",
    ("POST", f"{P}/serve/{{name}}@{{alias}}/predict"): "serve.predict",
    ("POST", f"{P}/serve/{{name}}/{{version}}/predict"): "serve.predict",
    ("POST", f"{P}/users"): "user.admin",
    ("PATCH", f"{P}/users/{{name}}"): "user.admin",
    ("POST", f"{P}/users/{{name}}/rotate"): "user.admin",
    ("DELETE", f"{P}/users/{{name}}"): "user.admin",
    ("GET", "/metrics"): "metrics.scrape",
    ("GET", f"{P}/jobs/{{job_id}}/result"): "job.result",
}
# What each role may do (admins: everything). Rules in OWN_ONLY a member may use on their own jobs only.
ROLE_RULES: dict[str, frozenset[str]] = {
    "member": frozenset({"read", "metrics.scrape", "job.submit", "job.change", "experiment.write", "model.write",
                         "serve.predict", "job.result"}),  # fmt: skip
    "viewer": frozenset({"read", "metrics.scrape", "job.result"}),
    "scraper": frozenset({"metrics.scrape"}),
}
OWN_ONLY = frozenset({"job.change"})
OWNER_ONLY = frozenset({"job.result"})  # their own jobs only, whatever the role (admins too)
# The same, by the path below the API's prefix: how a route sees its own path depends on FastAPI's version
# (included with a prefix, a route's ``path`` has it or not), and pages and the API share no state-changing path.
_BY_TAIL = {(method, path.removeprefix(P)): rule for (method, path), rule in RULES.items()}
# Rules whose requests are not written to the audit log (predictions: reads with a body, many a second).
UNAUDITED = frozenset({"serve.predict"})
WHAT = {
    "job.submit": "submit jobs", "job.change": "change jobs", "experiment.write": "import experiments",
    "model.write": "register models and move aliases", "model.admin": "delete model versions or collect garbage",
    "serve.predict": "ask for predictions", "user.admin": "manage users", "read": "read",
    "job.result": "fetch a job's Result",
    UNLISTED: "use this route (it has no rule of its own yet)",
}  # fmt: skip


def rule_for(method: str, path: str) -> str:
    """The rule of the route ``method path`` (``path`` as the route declares it, with or without
    the API's prefix)."""
    rule = _BY_TAIL.get((method, path.removeprefix(P)))
    if rule is not None:
        return rule
    return "read" if method in SAFE_METHODS else UNLISTED


def refusal(who: Principal, rule: str, *, owner: str | None = None, job_id: int | None = None) -> str | None:
    """Why ``who`` may not act under ``rule`` (on a job of ``owner``), or None if they may."""
    if rule in OWNER_ONLY and owner is not None and owner != who.name and who.role != "scraper":
        return (f"forbidden by rule {rule!r}: job {job_id} belongs to {owner!r}, and its Result is a pickle its code "
                f"wrote; unpickling it runs code: only {owner!r} may fetch it (its metrics and checkpoints are in "
                f"GET /jobs/{job_id})")  # fmt: skip
    if who.role == "admin":
        return None
    allowed = ROLE_RULES.get(who.role, frozenset())
    if rule in allowed:
        if rule in OWN_ONLY and owner is not None and owner != who.name:
            ask = f"ask {owner!r} or an admin" if is_user_name(owner) else "its user was removed: ask an admin"
            return (f"forbidden by rule {rule!r}: member {who.name!r} may change only their own jobs, and job "
                    f"{job_id} belongs to {owner!r}: {ask}")  # fmt: skip
        return None
    if who.role == "scraper":
        return f"forbidden by rule {rule!r}: the scrape token may only read /metrics"
    if who.role == "viewer":
        return (f"forbidden by rule {rule!r}: {who.name!r} is a viewer, who may only read: ask an admin for the "
                "member role")  # fmt: skip
    return f"forbidden by rule {rule!r}: only admins may {WHAT.get(rule, rule)}; {who.name!r} is a {who.role}"


def can(who: Principal, rule: str, owner: str | None = None) -> bool:
    """Whether ``who`` may act under ``rule`` (on a job of ``owner``): what the dashboard shows."""
    return refusal(who, rule, owner=owner) is None


def caller_of(request: Request) -> Principal:
    """Who sent ``request`` (the guard put them in its scope; without users, the token's holder is
    the admin)."""
    return principal_of(request.scope)


def principal_of(scope: Mapping[str, Any]) -> Principal:
    """Who sent the request of ``scope`` (see :func:`caller_of`)."""
    who = scope.get("user")
    return who if isinstance(who, Principal) else ADMIN_PRINCIPAL


Caller = Annotated[Principal, Depends(caller_of)]


class RouteTable:
    """The app's routes as its router tries them, in order: (path template, methods), from the
    routers the app includes (:meth:`include`, which includes each in the app too, so that the two
    cannot differ). What :class:`Access` resolves a request by, before the app has seen it."""

    def __init__(self) -> None:
        self._routes: list[tuple[str, frozenset[str], re.Pattern[str]]] = []

    def include(self, app: Any, router: Any, prefix: str = "") -> None:
        """``app.include_router(router, prefix=prefix)``, and its routes into the table."""
        app.include_router(router, prefix=prefix)
        for route in router.routes:
            path, methods = getattr(route, "path", None), getattr(route, "methods", None)
            if not isinstance(path, str) or not methods:
                raise TypeError(f"the access table cannot read route {route!r} of {router!r}: include only "
                                "routers of plain routes (each with a path and methods)")  # fmt: skip
            self._routes.append((prefix + path, frozenset(methods), compile_path(prefix + path)[0]))

    def resolve(self, method: str, path: str) -> tuple[str, dict[str, str]] | None:
        """The template and path parameters of the route that takes ``method path``, or None."""
        for template, methods, regex in self._routes:
            if method in methods:
                match = regex.match(path)
                if match is not None:
                    return template, match.groupdict()
        return None


def describe(table: RouteTable, scope: Mapping[str, Any]) -> tuple[str, int | None]:
    """The rule of the request of ``scope`` and the job it names (None: none, or not a valid job id:
    the route's own validation answers 422). A request no route of ``table`` takes gets the rule of
    its bare path (a read ``read``, a change ``unlisted``: only admins), so nothing is open by a miss."""
    method, path = scope["method"], scope.get("path", "")
    found = table.resolve(method, path)
    if found is None:
        return rule_for(method, path), None
    template, params = found
    job_id: int | None = None
    try:
        job_id = int(params["job_id"]) if "job_id" in params else None
    except ValueError:
        job_id = None
    if job_id is not None and not 0 <= job_id <= 2**62:
        job_id = None
    return rule_for(method, template), job_id


async def authorize(app: Any, table: RouteTable, scope: dict) -> str | None:
    """Why the caller of ``scope`` may not do what it asks of ``app`` (403's detail), or None.
    Records the rule and the job in the scope (``trainforge.access``) for the audit log. The owner
    of a job a member would change is read from the store (never the request's body)."""
    rule, job_id = scope["trainforge.access"] = describe(table, scope)
    who = principal_of(scope)
    owner = None
    if job_id is not None and (rule in OWN_ONLY and who.role == "member" or rule in OWNER_ONLY):
        owner = await anyio.to_thread.run_sync(app.state.api.service.store.owner_of, job_id)
        if owner is None:
            return None  # no such job: the route answers 404
    return refusal(who, rule, owner=owner, job_id=job_id)


class Access:
    """The ASGI layer between the guard and ``app`` (whose routes are ``table``'s) that refuses, with
    403 naming the rule, what the caller's role does not allow (:func:`authorize`), before ``app``
    reads the request's body."""

    def __init__(self, app: Any, table: RouteTable):
        self.app = app
        self.table = table

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            why = await authorize(self.app, self.table, scope)
            if why is not None:
                await deny(send, 403, why)
                return
        await self.app(scope, receive, send)


def check_priority(who: Principal, priority: int | None, limit: int) -> None:
    """403 (rule ``job.priority``) if ``who``, not an admin, asks for a priority above ``limit``."""
    if priority is not None and priority > limit and not who.is_admin:
        raise HTTPException(403, f"forbidden by rule 'job.priority': a {who.role} may give a job a priority of at most "
                                 f"{limit}, not {priority}: ask an admin to raise it")  # fmt: skip


def recorded_by(who: Principal, by: str | None) -> str:
    """Who a registry change is recorded as (a version's ``created_by``, an alias move's ``by``):
    the caller; an admin's ``by`` naming someone else as ``"<by> (recorded by <admin>)"``. 403 (rule
    ``record.on_behalf``) when anyone else names another in ``by``."""
    if by is None or by == who.name:
        return who.name
    if who.is_admin:
        return f"{by} (recorded by {who.name})"
    raise HTTPException(403, f"forbidden by rule 'record.on_behalf': only admins may record a change in someone "
                             f"else's name, and {who.name!r} is a {who.role} who gave by={by!r}: leave 'by' out "
                             f"(you are recorded as {who.name!r})")  # fmt: skip
