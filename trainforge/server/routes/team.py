"""A server a team shares: ``/whoami`` (who the token is), ``/users`` (admins add, change and remove
users and rotate their tokens; everyone may list them), ``/audit`` (every state-changing request:
who, what, when, from where) and ``/shares`` (each user's fair-share usage, factor, holdings and
quota). Who may call which: :mod:`.access`."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query

from trainforge.server._schemas import (
    AuditOut,
    ShareOut,
    UserIn,
    UserOut,
    UserPatchIn,
    UserPath,
    UserRemovedOut,
    UserTokenOut,
    WhoamiOut,
    invalid,
)
from trainforge.server.routes.access import Caller
from trainforge.server.routes.common import Service
from trainforge.server.team.users import User, UserConflictError

router = APIRouter()
NO_USER: dict[int | str, dict[str, Any]] = {404: {"description": "no such user"}}


def _out(user: User) -> UserOut:
    return UserOut(**user.public())


@router.get("/whoami", response_model=WhoamiOut)
def whoami(service: Service, caller: Caller) -> WhoamiOut:
    """Who this request's token signs in as, their quota and what their running jobs hold."""
    return WhoamiOut(name=caller.name, role=caller.role, quota=service.scheduling.quota(caller.name),
                     holds=service.scheduling.holdings().get(caller.name, {}))  # fmt: skip


@router.get("/users", response_model=list[UserOut])
def list_users(service: Service) -> list[UserOut]:
    return [_out(u) for u in service.users.list()]


@router.post("/users", status_code=201, response_model=UserTokenOut,
             responses={409: {"description": "a user of that name exists, or the name is built in"}})  # fmt: skip
def add_user(service: Service, body: UserIn) -> UserTokenOut:
    """A new user and their token: shown once, in this answer (only its hash is kept)."""
    refusal = service.isolation.refusal(1) if body.role != "admin" else None
    if refusal is not None:
        raise HTTPException(409, refusal.replace("this server has 1 user(s) besides the admin", f"adding {body.role} "
                                                 f"{body.name!r} would make this a server with users"))  # fmt: skip
    try:
        user, token = service.users.add(body.name, body.role, shares=body.shares, quota=body.quota,
                                        os_user=body.os_user)  # fmt: skip
    except UserConflictError as exc:
        raise HTTPException(409, str(exc)) from None
    except ValueError as exc:
        raise invalid(("body",), str(exc)) from None
    service.reschedule()  # quotas or shares changed: a waiting job may start now, or come sooner
    return UserTokenOut(user=_out(user), token=token)


@router.patch("/users/{name}", response_model=UserOut, responses=NO_USER)
def change_user(service: Service, name: UserPath, body: UserPatchIn) -> UserOut:
    """Change a user's role, fair-share weight or quota (``quota: {}`` removes it)."""
    try:
        user = service.users.update(name, role=body.role, shares=body.shares, quota=body.quota or None,
                                    clear_quota=body.quota == {}, os_user=body.os_user or None,
                                    clear_os_user=body.os_user == "")  # fmt: skip
    except LookupError as exc:
        raise HTTPException(404, str(exc)) from None
    except ValueError as exc:
        raise invalid(("body",), str(exc)) from None
    service.reschedule()  # quotas or shares changed: a waiting job may start now, or come sooner
    return _out(user)


@router.post("/users/{name}/rotate", response_model=UserTokenOut, responses=NO_USER)
def rotate_token(service: Service, name: UserPath) -> UserTokenOut:
    """A new token for the user (the old one stops working at once), shown once."""
    try:
        user, token = service.users.rotate(name)
    except LookupError as exc:
        raise HTTPException(404, str(exc)) from None
    return UserTokenOut(user=_out(user), token=token)


@router.delete("/users/{name}", response_model=UserRemovedOut, responses=NO_USER)
def remove_user(service: Service, name: UserPath) -> UserRemovedOut:
    """Remove the user: their token stops working at once. Their jobs (and fair-share usage) stay,
    under a name no user can have (``jobs_owner``): a user added later under this name does not
    inherit them; only admins may change them."""
    try:
        owner, jobs = service.remove_user(name)
    except LookupError as exc:
        raise HTTPException(404, str(exc)) from None
    return UserRemovedOut(name=name, jobs_owner=owner, jobs=jobs)


@router.get("/audit", response_model=list[AuditOut])
def audit(
    service: Service,
    user: Annotated[str | None, Query(max_length=64)] = None,
    job: Annotated[int | None, Query(ge=0, le=2**62)] = None,
    before: Annotated[int | None, Query(ge=0, le=2**62)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[AuditOut]:
    """State-changing requests, newest first (of ``user``, on ``job``; ``before``: older than that
    entry's ``seq``): who, what (the rule, method and path), when, from where, and the answer."""
    return [AuditOut(**row) for row in service.audit.query(user=user, job_id=job, before=before, limit=limit)]


@router.get("/shares", response_model=list[ShareOut])
def shares(service: Service) -> list[ShareOut]:
    """Each user's fair share: weight, decayed usage and the fractions of both, the factor
    F = 2^(-U/S) that orders their jobs among equal priorities, holdings and quota."""
    return [ShareOut(**row) for row in service.scheduling.report(time.time())]
