"""The one request guard of trainforge's servers (``trainforge._internal.http.guard``), on a bare ASGI
app that records what reaches it: Host, the whole origin (scheme, host, port), JSON-only state
changes (and a Bearer request's empty ones), the body limit (by Content-Length, and counted as a
chunked body is read), every refusal told with who sent it, the token (header or the server's own
cookie), the dashboard's entry redirect and its question before switching who is signed in."""

from __future__ import annotations

import asyncio
import html
import re
from typing import Any
from urllib.parse import parse_qsl

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainforge._internal.http import Guard, GuardPolicy, origin_of, safe_location

TOKEN = "guard-token-0123456789abcdef"
COOKIE = "trainforge_token_abc123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class Recorder:
    """An ASGI app answering 200 ``ok`` and remembering every request that reached it."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        self.seen.append((scope["method"], scope["path"]))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"ok"})


def call(app: Any, method: str, url: str, **kwargs: Any) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8270") as client:
            return await client.request(method, url, **kwargs)

    return asyncio.run(go())


def raw_get(app: Any, target: str) -> tuple[int, dict[str, str]]:
    """A GET of ``target`` exactly as written (an HTTP client would read ``//host/x`` as a URL)."""
    path, _, query = target.partition("?")
    scope = {"type": "http", "method": "GET", "path": path, "raw_path": path.encode(), "query_string": query.encode(),
             "headers": [(b"host", b"127.0.0.1:8270")]}  # fmt: skip
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent[0]["status"], {k.decode(): v.decode() for k, v in sent[0].get("headers", [])}


def dashboard(**overrides: Any) -> tuple[Guard, Recorder]:
    inner = Recorder()
    policy = GuardPolicy(token=TOKEN, allowed_hosts=frozenset({"127.0.0.1", "localhost"}), cookie_name=COOKIE,
                         api_prefix="/api/v1/", **overrides)  # fmt: skip
    return Guard(inner, policy), inner


# -- origins ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "origin",
    [
        "http://127.0.0.1:9999",  # another port of the same host: another origin (the reported hole)
        "https://127.0.0.1:8270",  # another scheme
        "http://127.0.0.1",  # port 80, not 8270
        "http://localhost:8270",  # another name: another origin, though an allowed Host
        "http://evil.example",
        "http://127.0.0.1.evil.example:8270",
        "null",
    ],
)
def test_a_state_change_from_another_origin_is_403_and_never_reaches_the_app(origin):
    guard, inner = dashboard()
    form = {"Content-Type": "application/x-www-form-urlencoded", "Origin": origin, "Cookie": f"{COOKIE}={TOKEN}"}
    r = call(guard, "POST", "/api/v1/jobs/1/stop", headers=form)
    assert r.status_code == 403 and origin in r.json()["detail"], r.text
    r = call(guard, "POST", "/api/v1/jobs/1/stop", json={}, headers={"Origin": origin, **AUTH})
    assert r.status_code == 403, r.text
    assert inner.seen == []


def test_the_servers_own_origin_may_change_state_and_reads_pass_from_anywhere():
    guard, inner = dashboard()
    own = {"Origin": "http://127.0.0.1:8270", "Cookie": f"{COOKIE}={TOKEN}"}
    assert call(guard, "POST", "/api/v1/jobs/1/stop", json={}, headers=own).status_code == 200
    assert call(guard, "GET", "/api/v1/jobs/1", headers={"Origin": "http://evil.example", **AUTH}).status_code == 200
    assert inner.seen == [("POST", "/api/v1/jobs/1/stop"), ("GET", "/api/v1/jobs/1")]


def test_tls_makes_https_the_own_origin():
    guard, _ = dashboard(tls=True)
    assert call(guard, "POST", "/api/v1/x", json={}, headers={"Origin": "https://127.0.0.1:8270", **AUTH}).status_code == 200
    assert call(guard, "POST", "/api/v1/x", json={}, headers={"Origin": "http://127.0.0.1:8270", **AUTH}).status_code == 403


@pytest.mark.parametrize(("site", "status"), [("cross-site", 403), ("same-site", 403), ("same-origin", 200), ("none", 200)])
def test_without_an_origin_sec_fetch_site_decides(site, status):
    guard, _ = dashboard()
    r = call(guard, "POST", "/api/v1/x", json={}, headers={"Sec-Fetch-Site": site, **AUTH})
    assert r.status_code == status, r.text


def test_origin_of_drops_default_ports_only():
    assert origin_of("http", "LocalHost:80") == "http://localhost"
    assert origin_of("https", "a.example:443") == "https://a.example"
    assert origin_of("http", "a.example:443") == "http://a.example:443"
    assert origin_of("http", "[::1]:8270") == "http://[::1]:8270"


# -- JSON only -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "headers",
    [
        {},  # a no-cors fetch with no body: a CORS-simple request
        {"Content-Type": "application/x-www-form-urlencoded"},
        {"Content-Type": "multipart/form-data; boundary=x"},
        {"Content-Type": "text/plain"},
        {"Content-Type": "application/jsonp"},
    ],
)
@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH"])
def test_a_state_change_whose_body_is_not_json_is_415(method, headers):
    guard, inner = dashboard()
    body = b"" if not headers else b"x=1"
    for auth in ({"Cookie": f"{COOKIE}={TOKEN}"}, AUTH):  # what a browser sends; a Bearer client
        if not headers and auth is AUTH:
            continue  # a Bearer request with no body at all passes: below
        r = call(guard, method, "/api/v1/models/gc", headers={**headers, **auth}, content=body)
        assert r.status_code == 415, r.text
        assert "application/json" in r.json()["detail"]
    assert inner.seen == []


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH"])
def test_a_bearer_request_with_no_body_changes_state_but_not_with_a_body_that_is_not_json(method):
    """Ray's REST clients send ``POST .../stop`` with nothing: no other site can make a browser send
    an Authorization header, so a Bearer request needs no JSON type when it has no body at all."""
    guard, inner = dashboard()
    assert call(guard, method, "/api/v1/jobs/1/stop", headers=AUTH).status_code == 200
    assert call(guard, method, "/api/v1/jobs/1/stop", headers={**AUTH, "Content-Length": "0"}).status_code == 200
    assert inner.seen == [(method, "/api/v1/jobs/1/stop")] * 2
    for headers, body in (({"Content-Type": "text/plain"}, b"{}"), ({}, b"{}"), ({"Content-Type": "text/plain"}, b"")):
        r = call(guard, method, "/api/v1/jobs/1/stop", headers={**AUTH, **headers}, content=body)
        assert r.status_code == 415, (headers, body, r.text)
    r = call(guard, method, "/api/v1/jobs/1/stop", headers={"Cookie": f"{COOKIE}={TOKEN}"})  # a cookie's: no
    assert r.status_code == 415 and "Bearer" in r.json()["detail"]
    assert len(inner.seen) == 2


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8", "application/merge-patch+json"])
def test_json_bodies_pass(content_type):
    guard, inner = dashboard()
    assert call(guard, "POST", "/api/v1/x", content=b"{}", headers={"Content-Type": content_type, **AUTH}).status_code == 200
    assert inner.seen == [("POST", "/api/v1/x")]


def test_a_delete_without_a_body_passes_but_not_with_a_form_body():
    guard, _ = dashboard()
    assert call(guard, "DELETE", "/api/v1/jobs/1", headers=AUTH).status_code == 200
    form = {"Content-Type": "application/x-www-form-urlencoded", **AUTH}
    assert call(guard, "DELETE", "/api/v1/jobs/1", headers=form, content=b"a=1").status_code == 415


# -- token and cookie ------------------------------------------------------------------------------
def test_the_token_cookie_is_the_servers_own():
    guard, _ = dashboard()
    assert call(guard, "GET", "/api/v1/health", headers={"Cookie": f"theme=dark; {COOKIE}={TOKEN}"}).status_code == 200
    for cookie in (f"trainforge_token={TOKEN}", f"trainforge_token_other={TOKEN}", f"{COOKIE}={TOKEN}0"):
        assert call(guard, "GET", "/api/v1/health", headers={"Cookie": cookie}).status_code == 401, cookie
    page = call(guard, "GET", "/jobs/1")
    assert page.status_code == 401 and "text/html" in page.headers["content-type"]


def test_open_paths_need_no_token_and_no_token_policy_passes_everything():
    inner = Recorder()
    guard = Guard(inner, GuardPolicy(token=TOKEN, allowed_hosts=frozenset({"127.0.0.1"}), open_paths=frozenset({"/healthz"})))
    assert call(guard, "GET", "/healthz").status_code == 200
    assert call(guard, "GET", "/v1/stats").status_code == 401
    open_guard = Guard(inner, GuardPolicy(token=None, allowed_hosts=frozenset({"127.0.0.1"})))
    assert call(open_guard, "GET", "/v1/stats").status_code == 200
    assert call(open_guard, "POST", "/v1/predict", content=b"{}", headers={"Content-Type": "text/plain"}).status_code == 415
    assert call(open_guard, "GET", "/v1/stats", headers={"Host": "evil.example"}).status_code == 403


# -- the dashboard's entry -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("target", "location"),
    [
        (f"//evil.example/x?token={TOKEN}", "/evil.example/x"),  # the reported open redirect
        (f"/\\evil.example/x?token={TOKEN}", "/evil.example/x"),  # a browser reads /\ as //
        (f"///evil.example?token={TOKEN}", "/evil.example"),
        (f"/compare?name=a&group=lr&token={TOKEN}", "/compare?name=a&group=lr"),  # the other parameters stay
        (f"/?token={TOKEN}", "/"),
        (f"/jobs/3?token={TOKEN}&tab=logs&empty=", "/jobs/3?tab=logs&empty="),
    ],
)
def test_the_token_entry_redirects_to_a_path_on_this_server(target, location):
    guard, inner = dashboard()
    status, headers = raw_get(guard, target)
    assert status == 303
    assert headers["location"] == location
    cookie = headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}={TOKEN};") and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert "Secure" not in cookie
    assert inner.seen == []


def test_the_entry_cookie_is_secure_with_tls_and_a_wrong_token_is_no_entry():
    guard, _ = dashboard(tls=True)
    assert "Secure" in call(guard, "GET", f"/?token={TOKEN}", follow_redirects=False).headers["set-cookie"]
    r = call(guard, "GET", "/?token=wrong", follow_redirects=False)
    assert r.status_code == 401 and "set-cookie" not in r.headers


@given(st.text(alphabet="/\\.:@?#%abcdefghij", max_size=30), st.text(alphabet="=&abc%tokenx", max_size=30))
def test_a_location_is_always_a_path_here(raw_path, query):
    location = safe_location(raw_path, query, "token")
    assert location.startswith("/") and not location.startswith("//") and not location.startswith("/\\")
    assert "token" not in dict(parse_qsl(location.partition("?")[2]))


# -- the body limit --------------------------------------------------------------------------------
class BodyReader:
    """An ASGI app that reads its request's whole body (until it ends, or the client "leaves"), then
    answers 200: how much reached it, and whether it was told the client left."""

    def __init__(self) -> None:
        self.got = 0
        self.disconnected = False
        self.calls = 0

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        self.calls += 1
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.disconnected = True
                raise RuntimeError("the client left")  # as Starlette's ClientDisconnect: the guard answered
            self.got += len(message.get("body", b""))
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"read"})


def limited(limit: int, inner: Any, **overrides: Any) -> Guard:
    return Guard(inner, GuardPolicy(token=TOKEN, allowed_hosts=frozenset({"127.0.0.1"}), max_body=limit,
                                    api_prefix="/api/v1/", **overrides))  # fmt: skip


def test_a_body_over_the_limit_by_its_content_length_is_413_before_a_byte_is_read():
    inner = BodyReader()
    guard = limited(1000, inner)
    r = call(guard, "POST", "/api/v1/jobs", content=b"[" + b"0," * 1000 + b"0]", headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 413
    detail = r.json()["detail"]
    assert "POST /api/v1/jobs is 2003 bytes" in detail and "limit of 1000 bytes" in detail
    assert "by reference" in detail and "--max-body" in detail
    assert inner.calls == 0
    # The guard never asks for the body: a receive that fails proves it.
    scope = {"type": "http", "method": "PUT", "path": "/api/v1/x", "query_string": b"",
             "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                         (b"content-length", str(10**12).encode()), (b"authorization", f"Bearer {TOKEN}".encode())]}  # fmt: skip
    sent: list[dict] = []

    async def receive() -> dict:
        raise AssertionError("the guard read the body")

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(guard(scope, receive, send))
    assert sent[0]["status"] == 413 and b"1000000000000 bytes" in sent[1]["body"]
    assert call(guard, "POST", "/api/v1/jobs", content=b"[" + b"0," * 400 + b"0]", headers={**AUTH, "Content-Type": "application/json"}).status_code == 200
    assert inner.got == 803


def test_a_chunked_body_is_cut_at_the_limit_and_answered_413_never_read_past_it():
    inner = BodyReader()
    guard = limited(1000, inner)
    produced = 0

    async def chunks():  # 50 chunks of 100 bytes, sent without a Content-Length
        nonlocal produced
        for _ in range(50):
            produced += 100
            yield b"x" * 100

    r = call(guard, "POST", "/api/v1/x", content=chunks(), headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 413, r.text  # the guard's answer, not the app's
    assert "sent without a Content-Length" in r.json()["detail"] and "1000 bytes" in r.json()["detail"]
    assert inner.got <= 1000 and inner.disconnected  # the app got at most the limit, then "the client left"
    assert produced <= 1100  # and nothing past the chunk that crossed it was taken from the client

    async def small():
        yield b"x" * 600
        yield b"y" * 400  # exactly the limit: fine

    inner.got = 0
    assert call(guard, "POST", "/api/v1/x", content=small(), headers={**AUTH, "Content-Type": "application/json"}).status_code == 200
    assert inner.got == 1000


def test_the_limit_is_validated():
    for bad in (0, -1, 1.5, True, "64M"):
        with pytest.raises(ValueError, match="GuardPolicy.max_body="):
            GuardPolicy(token=TOKEN, allowed_hosts=frozenset({"127.0.0.1"}), max_body=bad)  # type: ignore[arg-type]
    assert GuardPolicy(token=TOKEN, allowed_hosts=frozenset()).max_body == 64 * 2**20


# -- who is known before a refusal, and every refusal is told ---------------------------------------
def test_every_refusal_goes_to_on_refusal_with_who_sent_it_known_before_the_checks():
    refused: list[tuple[Any, int, str, Any]] = []

    def on_refusal(who: Any, scope: dict, status: int, detail: str) -> None:
        refused.append((who, status, scope["path"], scope.get("user")))

    users = {TOKEN: "ann"}
    guard = limited(1000, BodyReader(), authenticate=users.get, on_refusal=on_refusal, cookie_name=COOKIE)
    json_type = {"Content-Type": "application/json"}

    async def chunks():
        for _ in range(20):
            yield b"x" * 100

    cases = [
        ({**AUTH, **json_type, "Origin": "http://evil.example"}, b"{}", 403),  # another site
        ({**AUTH, "Content-Type": "text/plain"}, b"{}", 415),  # not JSON
        ({"Cookie": f"{COOKIE}={TOKEN}"}, b"", 415),  # a cookie's empty POST
        ({**AUTH, **json_type}, b"[" + b"0," * 1000 + b"0]", 413),  # too large (Content-Length)
        ({**AUTH, **json_type}, chunks(), 413),  # too large (chunked, cut as it is read)
        ({**AUTH, **json_type, "Host": "evil.example"}, b"{}", 403),  # DNS rebinding
        (json_type, b"{}", 401),  # no token: nobody known
    ]
    for headers, body, status in cases:
        r = call(guard, "POST", "/api/v1/jobs/1/stop", headers=headers, content=body)
        assert r.status_code == status, (headers, r.text)
    who = [(w, s, u) for w, s, _, u in refused]
    assert who == [("ann", 403, "ann"), ("ann", 415, "ann"), ("ann", 415, "ann"), ("ann", 413, "ann"),
                   ("ann", 413, "ann"), ("ann", 403, "ann"), (None, 401, None)]  # fmt: skip


# -- no silent switch of who is signed in (login CSRF) ---------------------------------------------
ADMIN_T, BOB_T, CAROL_T = "admin-token-0123456789", "bob-token-0123456789", "carol-token-0123456789"
PEOPLE = {ADMIN_T: "admin (admin)", BOB_T: "bob (member)", CAROL_T: "carol (viewer)"}


def _links(page: str) -> dict[str, str]:
    return {m.group(1): html.unescape(m.group(2)) for m in re.finditer(r'<a id=(\w+) href="([^"]*)"', page)}


def test_a_token_link_that_would_switch_a_valid_session_to_someone_else_asks_first():
    guard, inner = dashboard(authenticate=PEOPLE.get)
    as_admin = {"Cookie": f"{COOKIE}={ADMIN_T}", "Sec-Fetch-Site": "none"}
    r = call(guard, "GET", f"/jobs/1?tab=logs&token={BOB_T}", headers=as_admin)
    assert r.status_code == 200 and "set-cookie" not in r.headers  # nothing switched
    assert "admin (admin)" in r.text and "bob (member)" in r.text and "<script" not in r.text
    assert r.headers["content-security-policy"].startswith("default-src 'self'")
    assert r.headers["referrer-policy"] == "no-referrer" and r.headers["cache-control"] == "no-store"
    links = _links(r.text)
    assert links["stay"] == "/jobs/1?tab=logs"
    switch = links["switch"]
    assert switch.startswith(f"/jobs/1?tab=logs&token={BOB_T}&confirm=")
    # Followed from the page (same origin, the admin's cookie): signed in as bob, back on the page.
    r = call(guard, "GET", switch, headers={**as_admin, "Sec-Fetch-Site": "same-origin"})
    assert r.status_code == 303 and r.headers["set-cookie"].startswith(f"{COOKIE}={BOB_T};")
    assert r.headers["location"] == "/jobs/1?tab=logs"
    # The code holds for that session only, from this server's pages only, and cannot be guessed.
    as_carol = {"Cookie": f"{COOKIE}={CAROL_T}", "Sec-Fetch-Site": "same-origin"}
    for url, headers in ((switch, as_carol), (switch, {**as_admin, "Sec-Fetch-Site": "cross-site"}),
                         (switch.rsplit("=", 1)[0] + "=" + "0" * 64, {**as_admin, "Sec-Fetch-Site": "same-origin"})):  # fmt: skip
        r = call(guard, "GET", url, headers=headers)
        assert r.status_code == 200 and "set-cookie" not in r.headers, (url, headers)
    assert inner.seen == []


def test_a_token_link_signs_in_at_once_without_a_session_or_as_the_same_user():
    guard, _ = dashboard(authenticate=PEOPLE.get)
    for cookie in ("", f"{COOKIE}={BOB_T}", f"{COOKIE}=stale-or-rotated-token"):
        r = call(guard, "GET", f"/?token={BOB_T}", headers={"Cookie": cookie, "Sec-Fetch-Site": "none"} if cookie else {})
        assert r.status_code == 303 and r.headers["set-cookie"].startswith(f"{COOKIE}={BOB_T};"), cookie


def test_a_token_link_from_another_site_cannot_see_the_session_it_would_replace_so_it_asks():
    """A cross-site navigation does not carry the SameSite=Strict cookie: the guard cannot tell
    whether someone is signed in, so it asks; the link on its page, followed from this server,
    carries the cookie and decides as above."""
    guard, _ = dashboard(authenticate=PEOPLE.get)
    r = call(guard, "GET", f"/jobs/1?token={BOB_T}", headers={"Sec-Fetch-Site": "cross-site"})
    assert r.status_code == 200 and "set-cookie" not in r.headers and "another site" in r.text
    switch = _links(r.text)["switch"]
    r = call(guard, "GET", switch, headers={"Sec-Fetch-Site": "same-origin"})  # nobody signed in: at once
    assert r.status_code == 303 and r.headers["set-cookie"].startswith(f"{COOKIE}={BOB_T};")
    r = call(guard, "GET", switch, headers={"Cookie": f"{COOKIE}={ADMIN_T}", "Sec-Fetch-Site": "same-origin"})
    assert r.status_code == 200 and "set-cookie" not in r.headers and "admin (admin)" in r.text  # asks, naming who


def test_safe_location_drops_every_parameter_named():
    assert safe_location("/jobs/1", "a=1&token=x&confirm=y&b=", "token", "confirm") == "/jobs/1?a=1&b="
