"""The train server's door, in-process (the runner-less team server of test_server_access.py: ann and
bob are members, val a viewer, and the admin and scrape tokens): the role is checked before a byte of
a body is read; the access layer resolves every route of the app to itself and a miss is never an
opening; the guard's refusals of a known caller are in the audit log; a Bearer change may send no
body; every stream ends once its caller is removed or their token rotated; who registered a model
or moved an alias is the caller; and the dashboard's entry asks before it switches who is signed in.

The real-server half (memory under over-limit bodies, a stream closing after ``users remove``) is
test_server_door_process.py.
"""

from __future__ import annotations

import asyncio
import html
import json
import os
import re
from typing import Any

import pytest

pytest.importorskip("fastapi")

from test_server_access import OPERATIONS, SCRAPE, TeamApi, _fill  # noqa: E402
from test_server_api import HOST, TOKEN, P, read_sse  # noqa: E402

from trainforge.server._app import cookie_name, make_app  # noqa: E402
from trainforge.server._models import Models  # noqa: E402
from trainforge.server.jobs.runner import EVENTS_FILE, OUTPUT_FILE  # noqa: E402
from trainforge.server.routes import access  # noqa: E402

JSON = {"Content-Type": "application/json"}


@pytest.fixture
def team(tmp_path):
    made: list[TeamApi] = []

    def make(max_body: int | None = None) -> TeamApi:
        api = TeamApi(str(tmp_path / f"state{len(made)}"), {"CPU": 4.0})
        if max_body is not None:  # the same server, behind a guard with this limit
            api.app, api.fastapi_app = make_app(api.service, token=TOKEN, allowed_hosts={HOST, "localhost"},
                                                scrape_token=SCRAPE, max_body=max_body)  # fmt: skip
        made.append(api)
        return api

    yield make
    for api in made:
        api.close()


def raw(app: Any, method: str, path: str, headers: dict[str, str], chunks: list[bytes] | None = None) -> tuple[int, dict]:
    """``method path`` on the ASGI ``app``: with ``chunks`` None its ``receive`` fails (the body must
    not be read), else it gives them one by one. The status and the JSON answer."""
    all_headers = {"host": HOST, **{k.lower(): v for k, v in headers.items()}}
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
             "headers": [(k.encode(), v.encode()) for k, v in all_headers.items()], "client": ("127.0.0.1", 50000),
             "server": (HOST, 8270)}  # fmt: skip
    sent: list[dict] = []
    left = list(chunks) if chunks is not None else None

    async def receive() -> dict:
        if left is None:
            raise AssertionError(f"{method} {path}: the body was read")
        if not left:
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": left.pop(0), "more_body": bool(left)}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], json.loads(body) if body else {}


def audit(api: TeamApi) -> list[tuple[Any, ...]]:
    entries = api.as_("admin", "GET", f"{P}/audit", params={"limit": 1000}).json()
    return [(e["user"], e["action"], e["method"], e["path"], e["status"]) for e in reversed(entries)]


# -- 1. the role before the body -------------------------------------------------------------------
def test_the_role_is_checked_before_a_byte_of_the_body_is_read_with_the_rule_named(team):
    api = team()
    anns = api.submit_as("owner", hold=True)["id"]
    cases = [  # (token of, method, path, rule)
        ("scraper", "POST", f"{P}/jobs", "job.submit"),
        ("viewer", "POST", f"{P}/jobs", "job.submit"),
        ("viewer", "PUT", f"{P}/models/m1/aliases/prod", "model.write"),
        ("member", "POST", f"{P}/jobs/{anns}/stop", "job.change"),  # bob on ann's job: the owner from the store
        ("member", "PATCH", f"{P}/jobs/{anns}", "job.change"),
        ("member", "POST", f"{P}/users", "user.admin"),
        ("scraper", "GET", f"{P}/jobs", "read"),
    ]
    for role, method, path, rule in cases:
        for body in ({"Content-Length": str(50 * 2**20)}, {"Transfer-Encoding": "chunked"}):  # never read
            headers = {"Authorization": f"Bearer {api.tokens[role]}", **JSON, **body}
            status, reply = raw(api.app, method, path, headers)
            assert status == 403 and f"forbidden by rule '{rule}'" in reply["detail"], (role, method, path, reply)
    # The same message as the route would have given (the rule table's).
    _, reply = raw(api.app, "POST", f"{P}/jobs/{anns}/stop", {"Authorization": f"Bearer {api.tokens['member']}", **JSON,
                                                                 "Content-Length": "2"})  # fmt: skip
    assert reply["detail"] == (f"forbidden by rule 'job.change': member 'bob' may change only their own jobs, and job "
                               f"{anns} belongs to 'ann': ask 'ann' or an admin")  # fmt: skip
    refused = [e for e in audit(api) if e[4] == 403]
    assert ("bob", "job.change", "POST", f"{P}/jobs/{anns}/stop", 403) in refused
    assert ("val", "model.write", "PUT", f"{P}/models/m1/aliases/prod", 403) in refused
    # What the role allows still reads its body.
    status, reply = raw(api.app, "POST", f"{P}/jobs/{anns}/stop", {"Authorization": f"Bearer {api.tokens['owner']}",
                                                                   **JSON, "Content-Length": "2"}, [b"{}"])  # fmt: skip
    assert status == 200 and reply["state"] == "STOPPED"


def test_the_access_table_resolves_every_route_of_the_app_to_itself():
    _, app = make_app(None, token=TOKEN, allowed_hosts={HOST})  # type: ignore[arg-type]
    table: access.RouteTable = app.state.routes
    for method, path in OPERATIONS:
        found = table.resolve(method, _fill(path, 1))
        assert found is not None and found[0] == path, (method, path, found)
    assert table.resolve("POST", f"{P}/jobs/1/stop") == (f"{P}/jobs/{{job_id}}/stop", {"job_id": "1"})
    assert table.resolve("POST", f"{P}/nothing/here") is None


def test_a_change_no_route_takes_is_for_admins_only_and_a_read_is_read(team):
    api = team()
    r = api.as_("member", "POST", f"{P}/no/such/route", json={})
    assert r.status_code == 403 and "rule 'unlisted'" in r.json()["detail"]
    assert api.as_("admin", "POST", f"{P}/no/such/route", json={}).status_code == 404
    assert api.as_("scraper", "GET", f"{P}/openapi.json").status_code == 403  # the scrape token: /metrics only
    assert api.as_("viewer", "GET", f"{P}/openapi.json").status_code == 200


# -- 6. the guard's refusals in the audit log ------------------------------------------------------
def test_the_guards_refusals_of_a_known_caller_are_in_the_audit_log(team):
    api = team(max_body=4096)
    job = api.submit_as("owner", hold=True)["id"]
    stop = f"{P}/jobs/{job}/stop"
    ann = {"Authorization": f"Bearer {api.tokens['owner']}"}
    assert api.as_("owner", "POST", stop, json={}, headers={"Origin": "http://evil.example"}).status_code == 403
    assert api.as_("owner", "POST", stop, content=b"a=1", headers={"Content-Type": "application/x-www-form-urlencoded"}).status_code == 415
    assert raw(api.app, "POST", f"{P}/jobs", {**ann, **JSON, "Content-Length": str(10**9)})[0] == 413
    chunks = [b" " * 1000] * 10  # 10 kB sent without a Content-Length: cut at 4 kB
    status, reply = raw(api.app, "POST", f"{P}/jobs", {**ann, **JSON, "Transfer-Encoding": "chunked"}, chunks)
    assert status == 413 and "4 KiB (4096 bytes)" in reply["detail"]
    assert api.request("POST", stop, auth=False, json={}).status_code == 401  # nobody known: not recorded
    assert audit(api)[-4:] == [
        ("ann", "job.change", "POST", stop, 403),
        ("ann", "job.change", "POST", stop, 415),
        ("ann", "job.submit", "POST", f"{P}/jobs", 413),
        ("ann", "job.submit", "POST", f"{P}/jobs", 413),
    ]
    details = [e["detail"] for e in api.as_("admin", "GET", f"{P}/audit", params={"limit": 4}).json()]
    assert "cross-origin" in details[3] and "application/json" in details[2] and "--max-body" in details[0]


# -- 7. a Bearer change with no body ---------------------------------------------------------------
def test_a_bearer_stop_with_no_body_stops_and_a_cookies_needs_json(team):
    api = team()
    job = api.submit_as("owner", hold=True)["id"]
    assert api.as_("admin", "POST", f"{P}/jobs/999/stop").status_code == 404  # no body, no Content-Type
    assert api.as_("member", "POST", f"{P}/jobs/{job}/stop").status_code == 403  # bob: not his
    cookie = {"Cookie": f"{cookie_name(api.service.server_id)}={api.tokens['owner']}"}
    r = api.request("POST", f"{P}/jobs/{job}/stop", auth=False, headers=cookie)
    assert r.status_code == 415 and "application/json" in r.json()["detail"]
    r = api.as_("owner", "POST", f"{P}/jobs/{job}/stop")
    assert r.status_code == 200 and r.json()["state"] == "STOPPED"


# -- 3. a stream ends with its caller's credential --------------------------------------------------
def _bobs_live_job(api: TeamApi) -> int:
    """A job of bob's that runs (and so never ends by itself), with log text and a run event to send."""
    job = api.submit_as("member", experiment={"path": "/runs/x", "name": "x", "metric": "loss", "mode": "min",
                                              "trial_id": "t1"})["id"]  # fmt: skip
    with open(os.path.join(api.service.job_dir(job), OUTPUT_FILE), "wb") as f:
        f.write(b"step 1\n")
    path = os.path.join(api.service.job_dir(job), EVENTS_FILE)
    with open(path, "w") as f:
        f.write(json.dumps({"type": "report", "index": 0, "t": 1.0, "metrics": {"loss": 1.0}}) + "\n")
    api.service.store.update(job, events_offset=os.path.getsize(path))
    return job


@pytest.mark.parametrize("end", ["remove", "rotate"])
@pytest.mark.parametrize("stream", ["events", "job", "logs", "experiment"])
def test_a_stream_ends_once_its_callers_user_is_removed_or_their_token_rotated(team, stream, end):
    api = team()
    job = _bobs_live_job(api)
    path, query = {"events": (f"{P}/events", {"after": 0}), "job": (f"{P}/jobs/{job}/stream", None),
                   "logs": (f"{P}/jobs/{job}/logs/stream", None),
                   "experiment": (f"{P}/experiments/1/stream", {"after": 0})}[stream]  # fmt: skip
    ended: list[str] = []

    def on_event(event: dict[str, str]) -> None:
        if not ended:  # the stream is open and delivering: end bob's token
            api.service.users.remove("bob") if end == "remove" else api.service.users.rotate("bob")
            ended.append(event["event"])

    bob = {"Authorization": f"Bearer {api.tokens['member']}"}
    reply = read_sse(api.app, path, query=query, headers=bob, max_events=1000, on_event=on_event, timeout=15)
    assert ended and reply.status == 200 and reply.error is None
    assert reply.complete  # the server ended it (bob's job still runs: it would go on for ever)
    assert api.service.get(job).state == "RUNNING"
    assert "end" not in [e["event"] for e in reply.events] and "idle" not in [e["event"] for e in reply.events]
    # Someone else's stream goes on: ann's is ended by her client, not by the server.
    api.service.users.rotate("val")  # another user's change is not ann's
    other = read_sse(api.app, path, query=query, headers={"Authorization": f"Bearer {api.tokens['owner']}"},
                     max_events=1)  # fmt: skip
    assert other.status == 200 and other.events and not other.complete


def test_is_current_holds_for_the_builtins_and_a_user_until_removed_or_rotated(team):
    api = team()
    users = api.service.users
    bob = users.verify(api.tokens["member"])
    assert bob is not None and bob.key_id and users.is_current(bob)
    assert users.is_current(access.ADMIN_PRINCIPAL)
    users.update("bob", role="viewer")  # a new role: the same token still signs in
    assert users.is_current(bob)
    users.rotate("bob")
    assert not users.is_current(bob)
    ann = users.verify(api.tokens["owner"])
    assert ann is not None and users.is_current(ann)
    users.remove("ann")
    assert not users.is_current(ann)


# -- 4. who is recorded in the registry ------------------------------------------------------------
def test_who_registered_a_version_or_moved_an_alias_is_the_caller(team, tmp_path):
    api = team()
    api.fastapi_app.state.models = Models(api.service, str(tmp_path / "registry"))
    source = tmp_path / "ckpt"
    source.mkdir()
    (source / "weights.bin").write_bytes(b"\1" * 100)

    def register(role: str, **body: Any) -> Any:
        return api.as_(role, "POST", f"{P}/models/m1/versions", json={"source": str(source), **body})

    assert register("owner").json()["created_by"] == "ann"  # no 'by': the caller, not the server's OS user
    assert register("owner", by="ann").json()["created_by"] == "ann"
    r = register("member", by="admin")
    assert r.status_code == 403 and "rule 'record.on_behalf'" in r.json()["detail"] and "'bob'" in r.json()["detail"]
    v3 = register("admin", by="bob", alias="prod").json()
    assert v3["created_by"] == "bob (recorded by admin)"
    assert api.as_("member", "PUT", f"{P}/models/m1/aliases/prod", json={"version": 1}).json()["by"] == "bob"
    r = api.as_("member", "PUT", f"{P}/models/m1/aliases/prod", json={"version": 2, "by": "admin"})
    assert r.status_code == 403 and "rule 'record.on_behalf'" in r.json()["detail"]
    assert api.as_("admin", "PUT", f"{P}/models/m1/aliases/staging", json={"version": 2}).json()["by"] == "admin"
    r = api.as_("member", "DELETE", f"{P}/models/m1/aliases/staging", params={"by": "ann"})
    assert r.status_code == 403
    assert api.as_("admin", "DELETE", f"{P}/models/m1/aliases/staging", params={"by": "ann"}).json()["by"] == (
        "ann (recorded by admin)")  # fmt: skip
    history = api.as_("viewer", "GET", f"{P}/models/m1/aliases/history").json()
    assert [(h["alias"], h["to_version"], h["by"]) for h in history] == [
        ("prod", 3, "bob (recorded by admin)"), ("prod", 1, "bob"), ("staging", 2, "admin"),
        ("staging", None, "ann (recorded by admin)"),
    ]  # fmt: skip
    assert api.as_("viewer", "GET", f"{P}/models/m1").json()["aliases"] == {"prod": 1}  # bob's refused move: none


# -- 5. the dashboard's entry names who is signed in and who the link signs in as ------------------
def test_a_members_token_link_does_not_replace_an_admins_dashboard_session(team):
    api = team()
    name = cookie_name(api.service.server_id)
    admin = {"Cookie": f"{name}={TOKEN}", "Sec-Fetch-Site": "none"}
    r = api.request("GET", f"/jobs/1?token={api.tokens['member']}", auth=False, headers=admin)
    assert r.status_code == 200 and "set-cookie" not in r.headers
    assert "admin (admin)" in r.text and "bob (member)" in r.text
    switch = html.unescape(re.search(r'<a id=switch href="([^"]*)"', r.text).group(1))  # type: ignore[union-attr]
    r = api.request("GET", switch, auth=False, headers={**admin, "Sec-Fetch-Site": "same-origin"})
    assert r.status_code == 303 and r.headers["set-cookie"].startswith(f"{name}={api.tokens['member']};")
    r = api.request("GET", f"/jobs/1?token={TOKEN}", auth=False, headers=admin)  # the same user: at once
    assert r.status_code == 303


# -- 2. the limit's configuration ------------------------------------------------------------------
def test_max_body_is_a_validated_config_field_and_a_cli_size(monkeypatch, capsys, tmp_path):
    from trainforge._cli import main
    from trainforge._internal.key_values import parse_size
    from trainforge.server._config import ServerConfig

    assert ServerConfig(state_dir=str(tmp_path)).max_body == 64 * 2**20
    for bad in (0, 1023, -5, 1.5, True, "64M"):
        with pytest.raises(ValueError, match=r"ServerConfig.max_body=.*bytes >= 1024"):
            ServerConfig(state_dir=str(tmp_path), max_body=bad)  # type: ignore[arg-type]
    assert [parse_size(t) for t in ("64Mi", "1G", "1048576", "2KiB", "1.5Ki")] == [64 * 2**20, 10**9, 2**20, 2048, 1536]
    for bad in ("", "0", "-1M", "1.5", "inf", "nan", "lots", "64Q"):
        with pytest.raises(ValueError, match=f"size {bad!r}: give a whole number of bytes"):
            parse_size(bad)
    started: list[ServerConfig] = []
    monkeypatch.setattr("trainforge.server._main.serve", lambda config: started.append(config))
    assert main(["server", "start", "--state-dir", str(tmp_path), "--max-body", "1Gi"]) == 0
    assert started[0].max_body == 2**30
    with pytest.raises(SystemExit):
        main(["server", "start", "--state-dir", str(tmp_path), "--max-body", "big"])
    assert "--max-body: size 'big'" in capsys.readouterr().err
