"""The train server's door with a real server process (``--max-body 16Mi``): bodies over the limit,
and bodies under it that the caller's role refuses, are answered without being read, so the server's
memory does not grow with them, whoever sends them (admin, member, viewer, scrape token, no token);
and an open ``GET /api/v1/events`` stream closes by itself once ``trainforge server users remove``
(or ``rotate``) ends its caller's token. The in-process half is test_server_door.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import psutil
import pytest

pytest.importorskip("fastapi")

from trainforge._testing.server import TrainServer  # noqa: E402

pytestmark = pytest.mark.slow
P = "/api/v1"
LIMIT = 16 * 2**20


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("door-server")
    proc = TrainServer(str(root / "state"), extra=("--max-body", "16Mi", "--no-warm")).start(require_url=True)
    yield proc
    left = proc.cleanup()
    assert not left, f"job processes left behind: {left}"
    assert "Traceback" not in proc.output, proc.output  # no request failed inside the server


@pytest.fixture(scope="module")
def tokens(server):
    """A token of each kind: the admin's, members ann and bob, viewer val, the scrape token, none."""
    out = {"admin": server.token, "none": ""}
    with open(os.path.join(server.state_dir, "scrape_token")) as f:
        out["scraper"] = f.read().strip()
    with httpx.Client(base_url=server.url + P, headers={"Authorization": f"Bearer {server.token}"}) as http:
        for name, role in (("ann", "member"), ("bob", "member"), ("val", "viewer"), ("rob", "member")):
            r = http.post("/users", json={"name": name, "role": role})
            assert r.status_code == 201, r.text
            out[name] = r.json()["token"]
    return out


def _post(url: str, token: str, path: str, body: bytes) -> int:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    with httpx.Client(base_url=url, timeout=120) as http:  # a connection of its own
        return http.post(path, content=body, headers=headers).status_code


def test_over_limit_and_role_refused_bodies_never_grow_the_servers_memory(server, tokens):
    rss = psutil.Process(server.proc.pid).memory_info
    with httpx.Client(base_url=server.url + P, headers={"Authorization": f"Bearer {tokens['ann']}"}) as http:
        anns = http.post("/jobs", json={"kind": "script", "path": "t.py", "hold": True}).json()["id"]
    for token in tokens.values():  # the first of each kind's requests, so that what it loads is loaded
        _post(server.url, token, f"{P}/jobs/{anns}/stop", b"{}")
    before = rss().rss
    over = b" " * (LIMIT + 8 * 2**20)  # 24 MiB: refused on its Content-Length, whoever sends it
    kinds = ("admin", "ann", "val", "scraper", "none")
    for _ in range(2):
        assert [_post(server.url, tokens[k], f"{P}/jobs", over) for k in kinds] == [413] * 5
    under = b" " * (LIMIT - 2**20)  # 15 MiB: under the limit, refused by the caller's role before it is read
    refused = [("val", f"{P}/jobs", 403), ("scraper", f"{P}/jobs", 403), ("none", f"{P}/jobs", 401),
               ("bob", f"{P}/jobs/{anns}/stop", 403), ("val", f"{P}/models/m/aliases/prod", 403)]  # fmt: skip
    for _ in range(2):
        assert [_post(server.url, tokens[k], path, under) for k, path, _ in refused] == [s for _, _, s in refused]
    growth = rss().rss - before
    print(f"server RSS {before / 2**20:.0f} MiB -> {(before + growth) / 2**20:.0f} MiB after "
          f"{2 * len(kinds)} POSTs of 24 MiB and {2 * len(refused)} refused POSTs of 15 MiB")  # fmt: skip
    assert growth < LIMIT // 2, f"the server grew by {growth / 2**20:.1f} MiB"


def _users_cli(server: TrainServer, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "trainforge.server", "users", *args, "--state-dir", server.state_dir],
                   check=True, capture_output=True, timeout=60)  # fmt: skip


@pytest.mark.parametrize(("command", "user"), [("remove", "bob"), ("rotate", "rob")])
def test_an_open_event_stream_closes_once_its_users_token_is_ended(server, tokens, command, user):
    timeout = httpx.Timeout(30.0, read=20.0)  # a stream that never closes fails on its read timeout
    with httpx.Client(base_url=server.url + P, timeout=timeout) as http, \
            http.stream("GET", "/events", headers={"Authorization": f"Bearer {tokens[user]}"}) as stream:  # fmt: skip
        assert stream.status_code == 200  # open (nothing happens: it sends nothing)
        _users_cli(server, command, user)
        ended_at = time.monotonic()
        for _ in stream.iter_raw():
            pass  # what was in flight; the stream ends once the server ends it
        print(f"the stream of {user} closed {time.monotonic() - ended_at:.2f} s after `users {command}` returned")
    r = httpx.get(server.url + P + "/events", headers={"Authorization": f"Bearer {tokens[user]}"}, timeout=30)
    assert r.status_code == 401  # and the token opens no other
