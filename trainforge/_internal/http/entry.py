"""The dashboard's browser entry, for servers whose guard keeps the token in a cookie:
``GET <page>?token=<token>`` (the URL ``trainforge dashboard`` prints) turns the token into the
server's cookie and answers 303 to the same page *on this server* (a path, never ``//other.host``),
with the other query parameters kept. The cookie is ``HttpOnly; SameSite=Strict``, named for this
server (two servers on one host keep apart cookies), ``Secure`` with TLS.

**No silent switch of who is signed in** (login CSRF: a page that sends the browser to
``/jobs/1?token=<someone else's token>`` must not sign its victim in as someone else). The link
signs in at once only when it cannot replace a session:

- the browser is signed in here as nobody (no cookie of this server, or one whose token no longer
  holds), or as the same user the link signs in as; and
- the navigation did not come from another site (``Sec-Fetch-Site`` is ``same-origin``, ``none``, as
  for a URL typed or opened from a terminal, or absent): a cross-site navigation does not carry the
  ``SameSite=Strict`` cookie, so the guard could not see a session it would replace.

Otherwise the answer is a small page (no cookie set) saying who is signed in now (when the guard can
see it) and who the link signs in as, with two plain links: *stay* (the page without the token) and
*sign in as ...*, the same URL with ``confirm=<code>``: an HMAC, under a key of this process, of the
current cookie's value and the new token. Only a browser holding that cookie can be shown the code
(another site can neither compute it nor read the page, which no frame may hold), and the code is
taken only on a navigation from this server's own pages.
"""

from __future__ import annotations

import hashlib
import hmac
import html
import secrets
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, urlencode

CONFIRM = "confirm"  # the query parameter of the switch's confirmation code
PAGE_CSP = b"default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
_FOREIGN_FETCH = frozenset({"cross-site", "same-site"})


def safe_location(raw_path: str, query_string: str, *drop: str) -> str:
    """Where the token entry sends the browser: the same path on this server (leading slashes and
    backslashes collapsed to one ``/``, so ``//evil.example/x`` stays a path here) with the query's
    other parameters (those named in ``drop`` removed)."""
    path = "/" + raw_path.lstrip("/\\")
    kept = [(k, v) for k, v in parse_qsl(query_string, keep_blank_values=True) if k not in drop]
    return path + (f"?{urlencode(kept)}" if kept else "")


class Entry:
    """The browser entry of one guard (see the module docstring): ``cookie_name`` set with ``tls``
    (``Secure``); ``describe`` tells a signed-in identity as a person reads it."""

    def __init__(self, cookie_name: str, tls: bool, describe: Callable[[Any], str] = str):
        self.cookie_name = cookie_name
        self.tls = tls
        self.describe = describe
        self._key = secrets.token_bytes(32)  # a restarted server asks again: its old codes do not hold

    def code(self, current_token: str, token: str) -> str:
        """The confirmation of a switch from the session of ``current_token`` ('' none seen) to ``token``."""
        return hmac.new(self._key, current_token.encode() + b"\0" + token.encode(), hashlib.sha256).hexdigest()

    async def answer(self, scope: dict, send: Any, headers: dict[str, str], token: str, new: Any,
                     current_token: str, current: Any) -> None:  # fmt: skip
        """Answer ``GET <page>?token=<token>`` (``token`` signs in as ``new``; the browser's cookie
        holds ``current_token``, signed in as ``current``, None for nobody): sign in, or ask first."""
        raw = (scope.get("raw_path") or scope.get("path", "/").encode()).decode("latin-1")
        query = scope.get("query_string", b"").decode("latin-1")
        foreign = headers.get("sec-fetch-site", "").lower() in _FOREIGN_FETCH
        if not foreign:
            confirm = dict(parse_qsl(query, keep_blank_values=True)).get(CONFIRM, "")
            confirmed = bool(confirm) and hmac.compare_digest(confirm, self.code(current_token, token))
            if current is None or current == new or confirmed:
                await self._sign_in(send, safe_location(raw, query, "token", CONFIRM), token)
                return
        stay = safe_location(raw, query, "token", CONFIRM)
        go = safe_location(raw, query, CONFIRM)
        go += ("&" if "?" in go else "?") + urlencode({CONFIRM: self.code(current_token, token)})
        await self._ask(send, self.describe(new), None if foreign else self.describe(current), go, stay)

    async def _sign_in(self, send: Any, location: str, token: str) -> None:
        cookie = f"{self.cookie_name}={token}; HttpOnly; SameSite=Strict; Path=/"
        if self.tls:
            cookie += "; Secure"
        await send({"type": "http.response.start", "status": 303,
                    "headers": [(b"location", location.encode("latin-1")), (b"set-cookie", cookie.encode()),
                                (b"content-length", b"0")]})  # fmt: skip
        await send({"type": "http.response.body", "body": b""})

    async def _ask(self, send: Any, new: str, current: str | None, go: str, stay: str) -> None:
        new_h = html.escape(new)
        if current is not None:
            now = (f"<p>This browser is signed in here as <b>{html.escape(current)}</b>. The link you followed signs "
                   f"it in as <b>{new_h}</b> instead, in every tab of this server.</p>")  # fmt: skip
        else:
            now = (f"<p>The link you followed came from another site. It signs this browser in as <b>{new_h}</b>, "
                   "replacing whoever is signed in here now, in every tab of this server.</p>")  # fmt: skip
        body = (
            "<!doctype html><meta charset=utf-8><title>trainforge: sign in as someone else?</title>"
            f"<h1>Sign in as {new_h}?</h1>{now}<p>Follow it only if you meant to.</p>"
            f'<p><a id=switch href="{html.escape(go)}">Sign in as {new_h}</a></p>'
            f'<p><a id=stay href="{html.escape(stay)}">Stay as you are</a></p>'
        ).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/html; charset=utf-8"),
                                (b"content-length", str(len(body)).encode()), (b"content-security-policy", PAGE_CSP),
                                (b"x-content-type-options", b"nosniff"), (b"cache-control", b"no-store"),
                                (b"referrer-policy", b"no-referrer")]})  # fmt: skip
        await send({"type": "http.response.body", "body": body})
