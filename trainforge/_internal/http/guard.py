"""The one request guard of every trainforge HTTP server (the train server and ``trainforge serve``).

An ASGI middleware that runs before any route, in this order:

1. **Host.** The ``Host`` header must name this server (``allowed_hosts``): a page on another name
   that resolves here (DNS rebinding) gets 403.
2. **Cross-site writes.** A state-changing request (any method but GET, HEAD and OPTIONS) is refused
   with 403 when it comes from another origin: an ``Origin`` header must equal this server's own
   origin *whole* (scheme, host and port, as the browser reached it: ``http://<Host header>``), and
   without one, ``Sec-Fetch-Site`` (if sent) must be ``same-origin`` or ``none``. A page on another
   port of the same host is another origin.
3. **JSON only.** A state-changing request must send ``Content-Type: application/json`` (a DELETE
   may send no body at all), else 415. So no CORS-simple request (a form post, a ``no-cors`` fetch,
   ``text/plain``), the kind a browser sends cross-site without asking, can change anything.
4. **Token.** ``Authorization: Bearer <token>`` (or, where the server has a cookie, its cookie),
   compared in constant time; 401 otherwise. ``open_paths`` need no token. A server with several
   users gives an ``authenticate`` function instead: it tells who a token is (or None: 401), and the
   guard puts them in the request's scope as ``user`` (Starlette's ``request.user``) for the routes'
   own authorisation.

Browser entry (servers with a ``cookie_name``, i.e. the dashboard): ``GET <page>?token=<token>``
answers 303 to the same page *on this server* (a path, never ``//other.host``), with the other query
parameters kept and the token moved into an ``HttpOnly; SameSite=Strict`` cookie named for this
server (two servers on one host keep apart cookies; ``Secure`` with TLS). Pages (paths outside
``api_prefix``) get ``nosniff`` and a strict Content-Security-Policy, and an HTML page instead of a
JSON 401.
"""

from __future__ import annotations

import dataclasses
import hmac
import ipaddress
import json
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, urlencode

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
PAGE_CSP = b"default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
_SAME_SITE_FETCH = frozenset({"same-origin", "none"})


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (``127.0.0.0/8``, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


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


def safe_location(raw_path: str, query_string: str, drop: str) -> str:
    """Where the token entry sends the browser: the same path on this server (leading slashes and
    backslashes collapsed to one ``/``, so ``//evil.example/x`` stays a path here) with the query's
    other parameters (``drop`` removed)."""
    path = "/" + raw_path.lstrip("/\\")
    kept = [(k, v) for k, v in parse_qsl(query_string, keep_blank_values=True) if k != drop]
    return path + (f"?{urlencode(kept)}" if kept else "")


def is_json_type(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


@dataclasses.dataclass(frozen=True)
class GuardPolicy:
    """What a server's guard asks of a request (see the module docstring).

    ``token``: None for no token (``trainforge serve`` on loopback). ``allowed_hosts``: host names of
    the ``Host`` header. ``cookie_name``: accept the token from this cookie and set it at the browser
    entry (None: header only). ``api_prefix``: paths under it are the API (JSON errors); others are
    pages. ``open_paths``: answered without a token. ``tls``: the server speaks HTTPS (the origin's
    scheme, and a ``Secure`` cookie). ``token_hint``: where the 401 says the token is found.
    ``authenticate``: who a token is (any object, set as the scope's ``user``), or None for nobody;
    given, it decides instead of the comparison with ``token`` (it must compare in constant time).
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

    def __post_init__(self) -> None:
        if self.token is not None and not self.token:
            raise ValueError("GuardPolicy.token='': give a token, or None for none")
        object.__setattr__(self, "allowed_hosts", frozenset(h.lower() for h in self.allowed_hosts))


class Guard:
    """ASGI middleware enforcing a :class:`GuardPolicy` before ``app`` sees a request."""

    def __init__(self, app: Any, policy: GuardPolicy):
        self.app = app
        self.policy = policy
        self._token = policy.token.encode() if policy.token is not None else None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        policy = self.policy
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        method = scope["method"]
        path = scope.get("path", "")
        is_api = path.startswith(policy.api_prefix)
        host_header = headers.get("host", "")
        if host_name(host_header) not in policy.allowed_hosts:
            await deny(send, 403, f"Host {host_header!r} is not this server's (allowed: "
                                  f"{sorted(policy.allowed_hosts)}){policy.host_hint}")  # fmt: skip
            return
        if method not in SAFE_METHODS:
            refusal = self._cross_site(headers, host_header)
            if refusal is not None:
                await deny(send, 403, refusal)
                return
            content_type = headers.get("content-type")
            has_body = headers.get("content-length", "0") != "0" or "transfer-encoding" in headers
            if not (content_type is not None and is_json_type(content_type)) and (
                method != "DELETE" or content_type is not None or has_body
            ):
                await deny(send, 415, f"{method} {path} changes state: send its body as JSON, with 'Content-Type: "
                                      f"application/json' (got {content_type or 'no Content-Type'}; an empty body "
                                      "is {})")  # fmt: skip
                return
        if (self._token is None and policy.authenticate is None) or path in policy.open_paths:
            await self._pass(scope, receive, send, is_api)
            return
        query = scope.get("query_string", b"")
        if policy.cookie_name and method == "GET" and not is_api and b"token=" in query:
            given = dict(parse_qsl(query.decode("latin-1"), keep_blank_values=True)).get("token", "")
            if self._identify(given) is not None:
                await self._enter(scope, send, given)
                return
        who = self._identify(self._supplied(headers))
        if who is None:
            if not is_api:
                await _deny_page(send)
                return
            await deny(send, 401, "missing or wrong token: send 'Authorization: Bearer <token>' with "
                                  f"{policy.token_hint}")  # fmt: skip
            return
        if policy.authenticate is not None:
            scope["user"] = who
        await self._pass(scope, receive, send, is_api)

    def _identify(self, token: str) -> Any | None:
        """Who ``token`` is (``authenticate``'s answer; True for the one token), or None."""
        if self.policy.authenticate is not None:
            return self.policy.authenticate(token) if token else None
        if self._token is not None and hmac.compare_digest(token.encode(), self._token):
            return True
        return None

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

    def _supplied(self, headers: dict[str, str]) -> str:
        auth = headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip()
        name = self.policy.cookie_name
        if name and name in headers.get("cookie", ""):
            for part in headers["cookie"].split(";"):
                key, _, value = part.strip().partition("=")
                if key == name:
                    return value
        return ""

    async def _enter(self, scope: dict, send: Any, token: str) -> None:
        """The dashboard's entry (the URL ``trainforge dashboard`` prints): the token becomes a cookie."""
        raw = scope.get("raw_path") or scope.get("path", "/").encode()
        location = safe_location(raw.decode("latin-1"), scope.get("query_string", b"").decode("latin-1"), "token")
        cookie = f"{self.policy.cookie_name}={token}; HttpOnly; SameSite=Strict; Path=/"
        if self.policy.tls:
            cookie += "; Secure"
        await send({"type": "http.response.start", "status": 303,
                    "headers": [(b"location", location.encode("latin-1")), (b"set-cookie", cookie.encode()),
                                (b"content-length", b"0")]})  # fmt: skip
        await send({"type": "http.response.body", "body": b""})

    async def _pass(self, scope: dict, receive: Any, send: Any, is_api: bool) -> None:
        if is_api:
            await self.app(scope, receive, send)
            return

        async def send_with_policy(message: dict) -> None:  # pages and their files
            if message["type"] == "http.response.start":
                names = {k.lower() for k, _ in message.get("headers", [])}
                extra = [(b"x-content-type-options", b"nosniff")]
                if b"content-security-policy" not in names:
                    extra.append((b"content-security-policy", PAGE_CSP))
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_policy)


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
