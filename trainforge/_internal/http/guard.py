"""The one request guard of every trainforge HTTP server (the train server and ``trainforge serve``).

An ASGI middleware that runs before any route. It first tells who sent the request (its token, when
it has one: below), so that a refusal of someone known can be recorded by the layers around it; then,
in this order:

1. **Host.** The ``Host`` header must name this server (``allowed_hosts``): a page on another name
   that resolves here (DNS rebinding) gets 403.
2. **Cross-site writes.** A state-changing request (any method but GET, HEAD and OPTIONS) is refused
   with 403 when it comes from another origin: an ``Origin`` header must equal this server's own
   origin *whole* (scheme, host and port, as the browser reached it: ``http://<Host header>``), and
   without one, ``Sec-Fetch-Site`` (if sent) must be ``same-origin`` or ``none``. A page on another
   port of the same host is another origin.
3. **JSON only.** A state-changing request must send ``Content-Type: application/json``, else 415.
   So no CORS-simple request (a form post, a ``no-cors`` fetch, ``text/plain``), the kind a browser
   sends cross-site without asking, can change anything. A request with no body at all passes when
   it is a DELETE or carries ``Authorization: Bearer`` (a header no other site can make a browser
   send: ``POST .../stop`` with nothing, as Ray's REST clients send it); a body that is not JSON is
   415 either way, and so is a cookie's empty POST.
4. **Body size.** A body over ``max_body`` bytes is 413, naming its size and the limit: refused on
   its ``Content-Length`` before a byte of it is read; one sent without (chunked) is counted as the
   app reads it and cut at the limit (the app is told the client left; the guard answers 413), so
   no layer ever holds more than the limit of it.
5. **Token.** ``Authorization: Bearer <token>`` (or, where the server has a cookie, its cookie),
   compared in constant time; 401 otherwise. ``open_paths`` need no token. A server with several
   users gives an ``authenticate`` function instead: it tells who a token is (or None: 401), and the
   guard puts them in the request's scope as ``user`` (Starlette's ``request.user``) for the routes'
   own authorisation, as soon as it knows (before the checks above).

Every refusal goes to ``on_refusal(who, scope, status, detail)`` when given (``who``: the token's
identity, None when unknown). Browser entry (servers with a ``cookie_name``, i.e. the dashboard):
``GET <page>?token=<token>`` sets the cookie, or asks first when it would switch who is signed in
(:mod:`trainforge._internal.http.entry`). Pages (paths outside ``api_prefix``) get ``nosniff`` and a
strict Content-Security-Policy, and an HTML page instead of a JSON 401.
"""

from __future__ import annotations

import dataclasses
import hmac
import ipaddress
import json
import logging
import socket
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qsl

from trainforge._internal.amounts import size_text
from trainforge._internal.http.entry import PAGE_CSP, Entry

logger = logging.getLogger(__name__)

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})  # change nothing: every server's one rule (its guard, roles, audit)
DEFAULT_MAX_BODY = 64 * 2**20  # bytes: a job's code and config fit many times over; data goes by reference
_SAME_SITE_FETCH = frozenset({"same-origin", "none"})


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (``127.0.0.0/8``, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
WILDCARDS = frozenset({"0.0.0.0", "::", ""})


def allowed_hosts(bind_host: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """The names a server bound on ``bind_host`` answers to in a ``Host`` header (its
    ``GuardPolicy.allowed_hosts``), one rule for every trainforge server: the loopback names, the
    bound host, the ``extra`` names its operator gives (a name in front of it), and, bound on every
    interface (``0.0.0.0``, ``::``), this machine's names and addresses. Lower case."""
    hosts = {*LOOPBACK_NAMES, bind_host.lower(), *(h.lower() for h in extra)}
    if bind_host in WILDCARDS:
        hosts |= {n.lower() for n in (socket.gethostname(), socket.getfqdn()) if n}
        try:
            import psutil

            for addrs in psutil.net_if_addrs().values():
                hosts |= {a.address.split("%", 1)[0].lower() for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6)}
        except ImportError:
            pass
    return frozenset(hosts)


def host_name(hostport: str) -> str:
    """The host of a ``Host`` header (``name:port``, ``[v6]:port``), lower case."""
    hostport = hostport.strip().lower()
    if hostport.startswith("["):
        return hostport[1 : hostport.find("]")] if "]" in hostport else hostport
    return hostport.rsplit(":", 1)[0] if hostport.count(":") == 1 else hostport


def origin_of(scheme: str, hostport: str) -> str:
    """The origin a browser sends for a page at ``scheme://hostport``: lower case, default port left out."""
    hostport = hostport.strip().lower()
    default = {"http": ":80", "https": ":443"}.get(scheme)
    if default and hostport.endswith(default) and not hostport.endswith("]"):
        hostport = hostport[: -len(default)]
    return f"{scheme}://{hostport}"


def json_detail(detail: str) -> bytes:
    """``{"detail": detail}`` as the body of an error answer."""
    return json.dumps({"detail": detail}, ensure_ascii=True).encode()


async def deny(send: Any, status: int, detail: str) -> None:
    """Answer an ASGI request with ``status`` and ``{"detail": detail}``."""
    body = json_detail(detail)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


def is_json_type(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _too_large(method: str, path: str, limit: int, size: int | None) -> str:
    told = f"is {size} bytes" if size is not None else "was sent without a Content-Length and passed"
    return (f"the body of {method} {path} {told}, over this server's limit of {size_text(limit)}: send large data "
            "by reference (a path or URL the server can read) rather than in the body, or start the server with "
            "a larger --max-body")  # fmt: skip


@dataclasses.dataclass(frozen=True)
class GuardPolicy:
    """What a server's guard asks of a request (see the module docstring).

    ``token``: None for no token (``trainforge serve`` on loopback). ``allowed_hosts``: host names of
    the ``Host`` header. ``cookie_name``: accept the token from this cookie and set it at the browser
    entry (None: header only). ``api_prefix``: paths under it are the API (JSON errors); others are
    pages. ``open_paths``: answered without a token. ``tls``: the server speaks HTTPS (the origin's
    scheme, and a ``Secure`` cookie). ``token_hint``: where the 401 says the token is found.
    ``authenticate``: who a token is (any object, set as the scope's ``user``; ``str()`` of it is how
    the browser entry names it), or None for nobody; given, it decides instead of the comparison with
    ``token`` (it must compare in constant time). ``max_body``: the most bytes a request's body may
    have (413 beyond). ``on_refusal``: called with ``(who, scope, status, detail)`` for each request
    the guard refuses (``who``: None when the token is unknown or missing).
    """

    token: str | None
    allowed_hosts: frozenset[str]
    cookie_name: str | None = None
    api_prefix: str = "/"
    open_paths: frozenset[str] = frozenset()
    tls: bool = False
    token_hint: str = "the token the server was started with"
    host_hint: str = ""
    authenticate: Callable[[str], Any] | None = None
    max_body: int = DEFAULT_MAX_BODY
    on_refusal: Callable[[Any, dict, int, str], None] | None = None

    def __post_init__(self) -> None:
        if self.token is not None and not self.token:
            raise ValueError("GuardPolicy.token='': give a token, or None for none")
        if isinstance(self.max_body, bool) or not isinstance(self.max_body, int) or self.max_body < 1:
            raise ValueError(f"GuardPolicy.max_body={self.max_body!r}: give a number of bytes >= 1 (default "
                             f"{size_text(DEFAULT_MAX_BODY)})")  # fmt: skip
        object.__setattr__(self, "allowed_hosts", frozenset(h.lower() for h in self.allowed_hosts))


class Guard:
    """ASGI middleware enforcing a :class:`GuardPolicy` before ``app`` sees a request."""

    def __init__(self, app: Any, policy: GuardPolicy):
        self.app = app
        self.policy = policy
        self._token = policy.token.encode() if policy.token is not None else None
        self._entry = Entry(policy.cookie_name, policy.tls) if policy.cookie_name else None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        policy = self.policy
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        method = scope["method"]
        path = scope.get("path", "")
        is_api = path.startswith(policy.api_prefix)
        bearer = _bearer(headers)
        cookie = self._cookie(headers)
        token = bearer if bearer is not None else cookie
        who = self._identify(token)
        if who is not None and policy.authenticate is not None:
            scope["user"] = who  # known before any refusal: the layers around the guard may record it
        refusal = self._refusal(headers, method, path, bearer is not None)
        if refusal is not None:
            await self._refuse(scope, send, who, *refusal)
            return
        if (self._token is None and policy.authenticate is None) or path in policy.open_paths:
            await self._pass(scope, receive, send, is_api)
            return
        query = scope.get("query_string", b"")
        if self._entry is not None and method == "GET" and not is_api and b"token=" in query:
            given = dict(parse_qsl(query.decode("latin-1"), keep_blank_values=True)).get("token", "")
            new = self._identify(given)
            if new is not None:
                current = who if bearer is None else self._identify(cookie)
                await self._entry.answer(scope, send, headers, given, new, cookie if current is not None else "",
                                         current)  # fmt: skip
                return
        if who is None:
            if policy.on_refusal is not None:
                policy.on_refusal(None, scope, 401, "missing or wrong token")
            if not is_api:
                await _deny_page(send)
                return
            await deny(send, 401, "missing or wrong token: send 'Authorization: Bearer <token>' with "
                                  f"{policy.token_hint}")  # fmt: skip
            return
        await self._pass(scope, receive, send, is_api)

    def _identify(self, token: str) -> Any | None:
        """Who ``token`` is (``authenticate``'s answer; True for the one token), or None."""
        if not token:
            return None
        if self.policy.authenticate is not None:
            return self.policy.authenticate(token)
        if self._token is not None and hmac.compare_digest(token.encode(), self._token):
            return True
        return None

    def _refusal(self, headers: dict[str, str], method: str, path: str, bearer: bool) -> tuple[int, str] | None:
        """Why the request is refused before its token matters (status, detail), or None."""
        policy = self.policy
        host_header = headers.get("host", "")
        if host_name(host_header) not in policy.allowed_hosts:
            return 403, (f"Host {host_header!r} is not this server's (allowed: {sorted(policy.allowed_hosts)})"
                         f"{policy.host_hint}")  # fmt: skip
        if method not in SAFE_METHODS:
            cross_site = self._cross_site(headers, host_header)
            if cross_site is not None:
                return 403, cross_site
            content_type = headers.get("content-type")
            has_body = headers.get("content-length", "0") != "0" or "transfer-encoding" in headers
            no_body_allowed = content_type is None and not has_body and (method == "DELETE" or bearer)
            if not (content_type is not None and is_json_type(content_type)) and not no_body_allowed:
                return 415, (f"{method} {path} changes state: send its body as JSON, with 'Content-Type: "
                             f"application/json' (got {content_type or 'no Content-Type'}; an empty body is {{}}, "
                             "and a request with an 'Authorization: Bearer' token may send none at all)")  # fmt: skip
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > policy.max_body:
            return 413, _too_large(method, path, policy.max_body, int(length))
        return None

    async def _refuse(self, scope: dict, send: Any, who: Any, status: int, detail: str) -> None:
        if self.policy.on_refusal is not None:
            self.policy.on_refusal(who, scope, status, detail)
        await deny(send, status, detail)

    def _cross_site(self, headers: dict[str, str], host_header: str) -> str | None:
        """Why a state-changing request is refused as cross-site, or None."""
        origin = headers.get("origin")
        if origin is not None:
            own = origin_of("https" if self.policy.tls else "http", host_header)
            if origin_of(*_split_origin(origin)) != own:
                return (f"cross-origin request from {origin!r} refused: only pages of this server ({own}) may "
                        "change its state")  # fmt: skip
            return None
        fetch_site = headers.get("sec-fetch-site")
        if fetch_site is not None and fetch_site.lower() not in _SAME_SITE_FETCH:
            return f"a {fetch_site} request (Sec-Fetch-Site) refused: only pages of this server may change its state"
        return None

    def _cookie(self, headers: dict[str, str]) -> str:
        """The token in this server's own cookie, or ''."""
        name = self.policy.cookie_name
        if name and name in headers.get("cookie", ""):
            for part in headers["cookie"].split(";"):
                key, _, value = part.strip().partition("=")
                if key == name:
                    return value
        return ""

    async def _pass(self, scope: dict, receive: Any, send: Any, is_api: bool) -> None:
        body = _LimitedBody(self, scope, receive, send if is_api else _with_page_policy(send))
        try:
            await self.app(scope, body.receive, body.send)
        except Exception:
            if not body.cut:
                raise
            # The app failed to read the body the guard cut (the client "left"): answered 413 already.
            logger.debug("%s %s: the app's error after its body was cut at the limit", scope["method"],
                         scope.get("path"), exc_info=True)  # fmt: skip


def _with_page_policy(send: Any) -> Any:
    """``send`` adding ``nosniff`` and (unless the page sets its own) the strict CSP to a page's answer."""

    async def send_with_policy(message: dict) -> None:
        if message["type"] == "http.response.start":
            names = {k.lower() for k, _ in message.get("headers", [])}
            extra = [(b"x-content-type-options", b"nosniff")]
            if b"content-security-policy" not in names:
                extra.append((b"content-security-policy", PAGE_CSP))
            message = {**message, "headers": [*message.get("headers", []), *extra]}
        await send(message)

    return send_with_policy


class _LimitedBody:
    """A request's ``receive`` and ``send`` as the app gets them: the body counted as it is read and cut
    past the guard's ``max_body``. The app then gets ``http.disconnect``, and the client a 413 in the
    app's place (what the app sends after it is dropped), unless the app's own answer had begun."""

    def __init__(self, guard: Guard, scope: dict, receive: Any, send: Any):
        self._guard, self._scope, self._receive, self._send = guard, scope, receive, send
        self._size = 0
        self.cut = False  # the body passed the limit
        self._answered = False  # the guard answered 413 in the app's place
        self._started = False

    async def receive(self) -> dict:
        if self.cut:
            return {"type": "http.disconnect"}
        message: dict = await self._receive()
        if message["type"] == "http.request":
            self._size += len(message.get("body", b""))
            limit = self._guard.policy.max_body
            if self._size > limit:
                self.cut = True
                if not self._started:
                    self._answered = self._started = True
                    scope = self._scope
                    detail = _too_large(scope["method"], scope.get("path", ""), limit, None)
                    await self._guard._refuse(scope, self._send, scope.get("user"), 413, detail)
                return {"type": "http.disconnect"}
        return message

    async def send(self, message: dict) -> None:
        if self._answered:
            return
        if message["type"] == "http.response.start":
            self._started = True
        await self._send(message)


def _bearer(headers: dict[str, str]) -> str | None:
    """The token of an ``Authorization: Bearer`` header, or None without one."""
    auth = headers.get("authorization", "")
    return auth[7:].strip() if auth.lower().startswith("bearer ") else None


def _split_origin(origin: str) -> tuple[str, str]:
    scheme, sep, rest = origin.strip().partition("://")
    if not sep:  # "null" (a sandboxed frame, a file: page) and other opaque origins
        return "opaque", origin
    return scheme.lower(), rest


async def _deny_page(send: Any) -> None:
    body = (
        b"<!doctype html><meta charset=utf-8><title>trainforge: token needed</title>"
        b"<h1>This train server needs its token</h1><p>Open the URL that <code>trainforge dashboard</code> prints "
        b"(it carries the token from the server's state directory, <code>&lt;state-dir&gt;/token</code>).</p>"
    )
    await send({"type": "http.response.start", "status": 401,
                "headers": [(b"content-type", b"text/html; charset=utf-8"), (b"content-length", str(len(body)).encode()),
                            (b"content-security-policy", PAGE_CSP)]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})
