"""The one request guard of trainforge's servers (``trainforge._internal.http.guard``), on a bare ASGI
app that records what reaches it: Host, the whole origin (scheme, host, port), JSON-only state
changes, the token (header or the server's own cookie), the dashboard's entry redirect."""

from __future__ import annotations

import asyncio
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
    r = call(guard, method, "/api/v1/models/gc", headers={**headers, **AUTH}, content=b"" if not headers else b"x=1")
    assert r.status_code == 415, r.text
    assert "application/json" in r.json()["detail"]
    assert inner.seen == []


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
