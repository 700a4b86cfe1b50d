"""Who may do what on the train server: every route's rule, every role's rules, in one place.

The guard (:mod:`trainforge._internal.http.guard`) says *who* sends a request (its token: a user of
:mod:`trainforge.server._users`, the state directory's ``admin``, or the scrape token's ``scraper``,
put in the request's scope as ``user``); :func:`authorize`, a dependency of every route of the app,
says whether they may: it finds the route's rule in :data:`RULES` (a route that reads and is not
listed is ``read``; one that changes state and is not listed is ``unlisted``, which only admins
pass, so a new route is never open by mistake: ``tests/test_server_access.py`` walks the route
table and fails on it) and answers 403 naming the rule when the role does not allow it.

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
| unlisted          | yes   | no                | no     | no      |

Beyond the table, ``job.priority``: a member may give a job (at submission or later) a priority of
at most ``TeamPolicy.member_max_priority`` (:func:`check_priority`), so that priority, and with it
preemption, stays the admins' to hand out.
"""

from __future__ import annotations

from typing import Annotated

import anyio
from fastapi import Depends, HTTPException, Request

from trainforge.server._users import ADMIN_PRINCIPAL, Principal, is_user_name

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
P = "/api/v1"
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
}
# What each role may do (admins: everything). Rules in OWN_ONLY a member may use on their own jobs only.
ROLE_RULES: dict[str, frozenset[str]] = {
    "member": frozenset({"read", "metrics.scrape", "job.submit", "job.change", "experiment.write", "model.write",
                         "serve.predict"}),  # fmt: skip
    "viewer": frozenset({"read", "metrics.scrape"}),
    "scraper": frozenset({"metrics.scrape"}),
}
OWN_ONLY = frozenset({"job.change"})
# The same, by the path below the API's prefix: how a route sees its own path depends on FastAPI's version
# (included with a prefix, a route's ``path`` has it or not), and pages and the API share no state-changing path.
_BY_TAIL = {(method, path.removeprefix(P)): rule for (method, path), rule in RULES.items()}
# Rules whose requests are not written to the audit log (predictions: reads with a body, many a second).
UNAUDITED = frozenset({"serve.predict"})
WHAT = {
    "job.submit": "submit jobs", "job.change": "change jobs", "experiment.write": "import experiments",
    "model.write": "register models and move aliases", "model.admin": "delete model versions or collect garbage",
    "serve.predict": "ask for predictions", "user.admin": "manage users", "read": "read",
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
    if who.role == "admin":
        return None
    allowed = ROLE_RULES.get(who.role, frozenset())
    if rule in allowed:
        if rule in OWN_ONLY and owner is not None and owner != who.name:
            ask = f"ask {owner!r} or an admin" if is_user_name(owner) else "its user was removed: ask an admin"
            return (f"forbidden by rule {rule!r}: member {who.name!r} may change only their own jobs, and job "
                    f"{job_id} is {owner!r}'s: {ask}")  # fmt: skip
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
    who = request.scope.get("user")
    return who if isinstance(who, Principal) else ADMIN_PRINCIPAL


Caller = Annotated[Principal, Depends(caller_of)]


async def authorize(request: Request) -> None:
    """The dependency of every route: 403, naming the rule, unless the caller's role allows it.
    Records the rule (and the job, for a job's route) in the scope for the audit log."""
    route = request.scope.get("route")
    path = getattr(route, "path", request.url.path)
    rule = rule_for(request.method, path)
    who = caller_of(request)
    job_id: int | None = None
    try:
        job_id = int(request.path_params["job_id"]) if "job_id" in request.path_params else None
    except ValueError:
        job_id = None  # not a job id: the route's own validation answers 422
    if job_id is not None and not 0 <= job_id <= 2**62:
        job_id = None  # out of range: 422 too
    request.scope["trainforge.access"] = (rule, job_id)
    owner = None
    if rule in OWN_ONLY and job_id is not None and who.role == "member":
        store = request.app.state.api.service.store
        rows = await anyio.to_thread.run_sync(store.query, "SELECT owner FROM jobs WHERE id=?", (job_id,))
        if not rows:
            return  # no such job: the route answers 404
        owner = rows[0][0]
    why = refusal(who, rule, owner=owner, job_id=job_id)
    if why is not None:
        raise HTTPException(403, why)


def check_priority(who: Principal, priority: int | None, limit: int) -> None:
    """403 (rule ``job.priority``) if ``who``, not an admin, asks for a priority above ``limit``."""
    if priority is not None and priority > limit and not who.is_admin:
        raise HTTPException(403, f"forbidden by rule 'job.priority': a {who.role} may give a job a priority of at most "
                                 f"{limit}, not {priority}: ask an admin to raise it")  # fmt: skip
