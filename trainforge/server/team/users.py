"""The users of a train server a team shares: who may sign in, as which role, with which token.

Roles (what each may do: :mod:`trainforge.server.routes.access`):

- ``admin``: everything, including the users themselves. The state directory's token (``<state-dir>/token``,
  the single-user default) signs in as the built-in user ``admin``.
- ``member``: reads everything; submits jobs and changes (stop, hold, priority, retry, delete) only
  their own; registers models and moves aliases.
- ``viewer``: reads everything, changes nothing.

The scrape token (``<state-dir>/scrape_token``) signs in as ``scraper``, which may only read
``/metrics``.

A removed user's jobs and fair-share usage stay, under a name no user can have
(``bob (removed 2026-11-28 14:03:12 UTC)``, :func:`removed_name`), given them in the transaction
that removes the user: a user added later as ``bob`` owns, may change and is charged for none of them.

A user's token is ``tfu.<key id>.<secret>``: the key id finds the user's row; the secret is stored
only as ``sha256(salt + secret)`` with a salt of the user's own, and compared in constant time. The
token is shown once, when the user is added or their token rotated; losing it means rotating it.
(The secret is 256 random bits, so one salted SHA-256 is enough: a slow hash guards guessable
passwords, not random keys, and authentication runs on every request.)
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import re
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

from trainforge.server.store.database import JobStore
from trainforge.server.store.users import NoSuchUser, UserExists

Role = Literal["admin", "member", "viewer"]
ROLES: tuple[str, ...] = ("admin", "member", "viewer")
ADMIN = "admin"  # the built-in user of the state directory's token
SCRAPER = "scraper"  # the built-in user of the scrape token (role "scraper": /metrics only)
RESERVED = frozenset({ADMIN, SCRAPER})
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$"
_TOKEN_PREFIX = "tfu"
_KEY_ID = re.compile(r"^[0-9a-f]{16}$")


class UnknownUserError(LookupError):
    """No such user (HTTP 404)."""


class UserConflictError(RuntimeError):
    """A user of that name exists, or the name is reserved (HTTP 409)."""


@dataclasses.dataclass(frozen=True)
class Principal:
    """Who sent a request: a user's ``name`` and ``role`` (``admin``, ``member``, ``viewer``, or
    ``scraper`` for the scrape token), and ``key_id``, the token they signed in with ('' for the
    built-in ``admin`` and ``scraper``): whether it still holds is :meth:`UserBook.is_current`."""

    name: str
    role: str
    key_id: str = ""
    job_id: int | None = None  # signed in with job ``job_id``'s credential (on its owner's behalf)

    @property
    def is_admin(self) -> bool:
        return self.role == ADMIN

    def __str__(self) -> str:  # how the dashboard's sign-in page names them
        return f"{self.name} ({self.role})"


ADMIN_PRINCIPAL = Principal(ADMIN, ADMIN)
SCRAPER_PRINCIPAL = Principal(SCRAPER, SCRAPER)


@dataclasses.dataclass(frozen=True)
class User:
    """A user as the server keeps it (never the token): its fair-share weight (``shares``) and
    quota (``{kind: amount}`` held at once by its jobs, None: none)."""

    name: str
    role: str
    shares: float = 1.0
    quota: dict[str, float] | None = None
    created_at: float = 0.0
    rotated_at: float | None = None
    key_id: str = ""
    uid: int | None = None  # the user's number: their jobs' OS uid is uid_base + uid (None: not given yet)
    os_user: str | None = None  # an OS account their jobs run as instead

    def public(self) -> dict[str, Any]:
        return {"name": self.name, "role": self.role, "shares": self.shares, "quota": self.quota,
                "created_at": self.created_at, "rotated_at": self.rotated_at, "os_user": self.os_user}  # fmt: skip


def is_user_name(name: str) -> bool:
    """Whether a user may be called ``name`` (a removed user's jobs are kept under one that may not:
    :func:`removed_name`)."""
    return isinstance(name, str) and re.match(NAME_PATTERN, name) is not None


def check_name(name: str) -> str:
    if not is_user_name(name):
        raise ValueError(f"user name {name!r}: use 1-64 letters, digits and . _ @ - (starting with a letter or digit)")
    return name


def check_role(role: str) -> str:
    if role not in ROLES:
        raise ValueError(f"role {role!r}: choose one of {', '.join(ROLES)}")
    return role


def check_user_fields(shares: float | None, quota: dict[str, float] | None) -> None:
    import math

    if shares is not None and not (isinstance(shares, (int, float)) and math.isfinite(shares) and shares > 0):
        raise ValueError(f"shares={shares!r}: give a number > 0 (a user's weight in fair share; default 1)")
    for kind, amount in (quota or {}).items():
        if not (isinstance(amount, (int, float)) and math.isfinite(amount) and amount >= 0):
            raise ValueError(f"quota[{kind!r}]={amount!r}: give a finite amount >= 0")


def check_os_user(os_user: str | None) -> None:
    """An OS account a user's jobs may run as: one that exists, and not root (uid 0)."""
    if os_user is None:
        return
    import pwd

    try:
        account = pwd.getpwnam(os_user)
    except (KeyError, TypeError):
        raise ValueError(f"os_user={os_user!r}: no such account on this machine (see /etc/passwd)") from None
    if account.pw_uid == 0:
        raise ValueError(f"os_user={os_user!r} is root: a job never runs as root; give the user's own account")


def removed_name(name: str, when: float, taken: Callable[[str], bool] = lambda _: False) -> str:
    """What a removed user's jobs and usage are kept under: ``"bob (removed 2026-11-28 14:03:12 UTC)"``,
    which no user can be called (:data:`NAME_PATTERN` has no spaces or parentheses), made unique with
    a number when ``taken`` says it is."""
    base = f"{name} (removed {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(when))} UTC"
    candidate, n = base + ")", 1
    while taken(candidate):
        n += 1
        candidate = f"{base}, {n})"
    return candidate


def _hash(salt: str, secret: str) -> str:
    return hashlib.sha256(bytes.fromhex(salt) + secret.encode()).hexdigest()


def _parse(token: str) -> tuple[str, str] | None:
    prefix, _, rest = token.partition(".")
    key_id, _, secret = rest.partition(".")
    if prefix != _TOKEN_PREFIX or not _KEY_ID.match(key_id) or not secret:
        return None
    return key_id, secret


def _new_token() -> tuple[str, str, str, str]:
    """A fresh ``(token, key_id, salt, token_hash)``."""
    key_id, secret, salt = secrets.token_hex(8), secrets.token_urlsafe(32), secrets.token_hex(16)
    return f"{_TOKEN_PREFIX}.{key_id}.{secret}", key_id, salt, _hash(salt, secret)


_DUMMY_SALT = "00" * 16


def authenticator(users: UserBook | None, admin_token: str, scrape_token: str | None = None,
                  jobs: Callable[[str], tuple[int, str] | None] | None = None) -> Callable[[str], Principal | None]:  # fmt: skip
    """Who a request's token signs in as (the guard's ``authenticate``): ``admin_token`` (the state
    directory's) is the built-in ``admin``, ``scrape_token`` the built-in ``scraper``, a running
    job's credential (``jobs(token)``: its id and owner, :mod:`trainforge.server.team.job_tokens`) its
    owner as a member at most, any other a user of ``users`` (or nobody: None). Constant-time
    comparisons throughout."""
    admin, scrape = admin_token.encode(), scrape_token.encode() if scrape_token else None

    def authenticate(token: str) -> Principal | None:
        given = token.encode()
        if hmac.compare_digest(given, admin):
            return ADMIN_PRINCIPAL
        if scrape is not None and hmac.compare_digest(given, scrape):
            return SCRAPER_PRINCIPAL
        if jobs is not None and token.startswith("tfj."):
            job = jobs(token)
            return _on_behalf(users, *job) if job is not None else None
        return users.verify(token) if users is not None else None

    return authenticate


def _on_behalf(users: UserBook | None, job_id: int, owner: str) -> Principal | None:
    """The principal of job ``job_id``'s credential: its owner, with their role but never above
    ``member`` (a job never manages users); nobody once the owner is no longer a user."""
    if owner == ADMIN:
        role = ADMIN
    else:
        try:
            role = users.get(owner).role if users is not None else ""
        except UnknownUserError:
            return None
    return Principal(owner, "member" if role == ADMIN else role, job_id=job_id)


class UserBook:
    """The users of the server whose store is ``store``: added, listed, changed, removed, their
    tokens rotated, and a request's token told apart (:meth:`verify`, in memory: the users are
    loaded once and kept as they change here)."""

    def __init__(self, store: JobStore):
        self.store = store
        self._lock = threading.Lock()
        self._users: dict[str, User] = {}
        self._keys: dict[str, tuple[str, str, str]] = {}  # key id -> (name, salt, hash)
        for row in store.users.all():
            self._keep(row)

    def _keep(self, row: dict[str, Any]) -> User:
        user = User(name=row["name"], role=row["role"], shares=float(row["shares"]),
                    quota=json.loads(row["quota"]) if row["quota"] else None, created_at=row["created_at"],
                    rotated_at=row["rotated_at"], key_id=row["key_id"], uid=row["uid"],
                    os_user=row["os_user"])  # fmt: skip
        with self._lock:
            old = self._users.get(user.name)
            if old is not None:
                self._keys.pop(old.key_id, None)
            self._users[user.name] = user
            self._keys[row["key_id"]] = (user.name, row["salt"], row["token_hash"])
        return user

    # -- authentication ---------------------------------------------------------------------------
    def verify(self, token: str) -> Principal | None:
        """The user ``token`` is, or None. A constant-time comparison; an unknown key id costs the
        same hash as a known one."""
        parsed = _parse(token)
        if parsed is None:
            return None
        key_id, secret = parsed
        with self._lock:
            entry = self._keys.get(key_id)
            user = self._users.get(entry[0]) if entry is not None else None
        salt, expected = (entry[1], entry[2]) if entry is not None else (_DUMMY_SALT, "0" * 64)
        if hmac.compare_digest(_hash(salt, secret), expected) and user is not None:
            return Principal(user.name, user.role, key_id)
        return None

    def is_current(self, who: Principal) -> bool:
        """Whether ``who`` (signed in earlier) still holds: the built-in ``admin`` and ``scraper``
        always (their tokens live as long as the server), a user while they exist and their token is
        the one they signed in with (``users remove`` and ``users rotate`` end it). What a request
        that lasts (a stream) asks as it goes, so that it ends with its credential."""
        if who.name in RESERVED and not who.key_id:
            return True
        with self._lock:
            user = self._users.get(who.name)
        return user is not None and user.key_id == who.key_id

    # -- the users --------------------------------------------------------------------------------
    def list(self) -> list[User]:
        with self._lock:
            return [self._users[n] for n in sorted(self._users)]

    def get(self, name: str) -> User:
        with self._lock:
            user = self._users.get(name)
        if user is None:
            raise UnknownUserError(f"no user {name!r} (list them with `trainforge server users list`)")
        return user

    def shares(self) -> dict[str, float]:
        with self._lock:
            return {n: u.shares for n, u in self._users.items() if u.shares != 1.0}

    def quotas(self) -> dict[str, dict[str, float]]:
        with self._lock:
            return {n: dict(u.quota) for n, u in self._users.items() if u.quota}

    def add(self, name: str, role: str, *, shares: float = 1.0, quota: dict[str, float] | None = None,
            os_user: str | None = None) -> tuple[User, str]:  # fmt: skip
        """A new user and their token (shown once: only its hash is kept), with a number never
        given before (their jobs' uid, :mod:`trainforge.server.isolation.mechanism`)."""
        check_name(name)
        check_role(role)
        check_user_fields(shares, quota)
        check_os_user(os_user)
        if name in RESERVED:
            raise UserConflictError(f"{name!r} is a built-in user (the state directory's token is {ADMIN!r}, the "
                                    f"scrape token {SCRAPER!r}): choose another name")  # fmt: skip
        token, key_id, salt, digest = _new_token()
        try:
            row = self.store.users.add(name, role=role, key_id=key_id, salt=salt, token_hash=digest,
                                       shares=float(shares), quota=json.dumps(quota) if quota else None,
                                       created_at=time.time(), os_user=os_user)  # fmt: skip
        except UserExists:
            raise UserConflictError(f"user {name!r} exists: rotate their token (`trainforge server users rotate "
                                    f"{name}`) or remove them first") from None  # fmt: skip
        return self._keep(row), token

    def rotate(self, name: str) -> tuple[User, str]:
        """A new token for ``name`` (the old one stops working at once)."""
        self.get(name)
        token, key_id, salt, digest = _new_token()
        row = self._change(name, key_id=key_id, salt=salt, token_hash=digest, rotated_at=time.time())
        return self._keep(row), token

    def update(self, name: str, *, role: str | None = None, shares: float | None = None,
               quota: dict[str, float] | None = None, clear_quota: bool = False,
               os_user: str | None = None, clear_os_user: bool = False) -> User:  # fmt: skip
        """Change a user's role, shares, quota (``clear_quota``: no quota) or OS account
        (``clear_os_user``: none, their jobs run as their own uid)."""
        user = self.get(name)
        if role is not None:
            check_role(role)
        check_user_fields(shares, quota)
        check_os_user(os_user)
        new_quota = None if clear_quota else (quota if quota is not None else user.quota)
        new_os_user = None if clear_os_user else (os_user if os_user is not None else user.os_user)
        row = self._change(name, role=role or user.role, shares=float(shares if shares is not None else user.shares),
                           quota=json.dumps(new_quota) if new_quota else None, os_user=new_os_user)  # fmt: skip
        return self._keep(row)

    def uid(self, name: str) -> int:
        """``name``'s number (their jobs' uid is ``uid_base`` plus it; the built-in admin's is 0),
        given now to a user from before numbers were (never one given before)."""
        if name == ADMIN:
            return 0
        user = self.get(name)
        if user.uid is not None:
            return user.uid
        try:
            kept = self._keep(self.store.users.give_uid(name))
        except NoSuchUser:
            raise UnknownUserError(f"no user {name!r}") from None
        assert kept.uid is not None
        return kept.uid

    def remove(self, name: str) -> tuple[str, int]:
        """Remove ``name``: their token stops working at once. Their jobs stay, and so does their
        fair-share usage, under the name :func:`removed_name` gives them, which no user can have: a
        user added later under ``name`` owns, may change and is charged for none of them. One
        transaction (a crash leaves the user and their jobs as they were, or all of it done). Returns
        that name and how many jobs it holds."""
        self.get(name)
        try:
            tombstone, jobs = self.store.users.remove(name, lambda taken: removed_name(name, time.time(), taken))
        except NoSuchUser:
            raise UnknownUserError(f"no user {name!r} (list them with `trainforge server users list`)") from None
        with self._lock:
            user = self._users.pop(name, None)
            if user is not None:
                self._keys.pop(user.key_id, None)
        return tombstone, jobs

    def _change(self, name: str, **fields: Any) -> dict[str, Any]:
        try:
            return self.store.users.update(name, **fields)
        except NoSuchUser:
            raise UnknownUserError(f"no user {name!r}") from None
