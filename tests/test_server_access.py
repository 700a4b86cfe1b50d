"""A server a team shares, in-process (the runner-less ``Api`` of test_server_api.py): every role
against every route of the app (generated from its route table, so a new route without a rule fails
here), tokens never stored in clear, the audit log of every change, the dashboard's view of who is
signed in and what they may do, and ``/metrics`` for the scrape token.

Roles: ``admin`` (the state directory's token), ``owner`` (a member, on the member's own job),
``member`` (a member, on someone else's job), ``viewer``, ``scraper`` (the scrape token). What each
may do is written out here again (:data:`ALLOWED`), not read from the access module, so a change of
the rules shows up as a failing test.
"""

from __future__ import annotations

import hashlib
import os
import re
import sqlite3
import time

import pytest

pytest.importorskip("fastapi")

from test_server_api import HOST, TOKEN, Api  # noqa: E402

from trainforge.server._app import make_app  # noqa: E402
from trainforge.server.routes import access  # noqa: E402
from trainforge.server.scheduling.team_policy import TeamPolicy  # noqa: E402
from trainforge.server.store.database import JobStore  # noqa: E402
from trainforge.server.store.migrations import MIGRATIONS  # noqa: E402

P = "/api/v1"
SCRAPE = "scrape-token-0123456789abcdef"
ROLES = ("owner", "member", "viewer", "scraper", "admin")  # admin last: its changes may end the job
MEMBER = {"read", "metrics.scrape", "job.submit", "job.change", "experiment.write", "model.write", "serve.predict",
          "job.result"}  # job.result: on their own jobs (test_a_jobs_result_is_its_owners_alone_whatever_the_role)
ALLOWED: dict[str, set[str] | None] = {  # None: every rule
    "admin": None,
    "owner": MEMBER,
    "member": MEMBER - {"job.change"},
    "viewer": {"read", "metrics.scrape", "job.result"},
    "scraper": {"metrics.scrape"},
}
STREAMS = re.compile(r"/(events|stream)$")


class TeamApi(Api):
    """The runner-less server with users: ann (member, owns job 1), bob (member), val (viewer)."""

    def __init__(self, state_dir: str, capacity: dict[str, float], policy: TeamPolicy | None = None):
        super().__init__(state_dir, capacity)
        if policy is not None:
            self.service.scheduling.policy = policy
        self.app, self.fastapi_app = make_app(self.service, token=TOKEN, allowed_hosts={HOST, "localhost"},
                                              scrape_token=SCRAPE)  # fmt: skip
        self.tokens = {"admin": TOKEN, "scraper": SCRAPE}
        for name, role, key in (("ann", "member", "owner"), ("bob", "member", "member"), ("val", "viewer", "viewer")):
            r = self.as_("admin", "POST", f"{P}/users", json={"name": name, "role": role})
            assert r.status_code == 201, r.text
            self.tokens[key] = r.json()["token"]

    def as_(self, role: str, method: str, path: str, **kwargs):
        headers = {"Authorization": f"Bearer {self.tokens[role]}", **kwargs.pop("headers", {})}
        return self.request(method, path, auth=False, headers=headers, **kwargs)

    def submit_as(self, role: str, **spec) -> dict:
        r = self.as_(role, "POST", f"{P}/jobs", json={"kind": "script", "path": "train.py", **spec})
        assert r.status_code == 201, r.text
        return r.json()["job"]


@pytest.fixture
def team(tmp_path):
    made: list[TeamApi] = []

    def make(capacity: dict[str, float] | None = None, policy: TeamPolicy | None = None) -> TeamApi:
        api = TeamApi(str(tmp_path / f"state{len(made)}"), capacity or {"CPU": 4.0}, policy)
        made.append(api)
        return api

    yield make
    for api in made:
        api.close()


def _operations() -> list[tuple[str, str]]:
    """Every operation of the app: the API's (from its OpenAPI document) and /metrics."""
    _, app = make_app(None, token=TOKEN, allowed_hosts={HOST})  # type: ignore[arg-type]
    ops = [(method.upper(), path) for path, item in app.openapi()["paths"].items() for method in item]
    return sorted(ops) + [("GET", "/metrics")]


OPERATIONS = _operations()
CHANGES = [(m, p) for m, p in OPERATIONS if m not in access.SAFE_METHODS]
READS = [(m, p) for m, p in OPERATIONS if m in access.SAFE_METHODS and not STREAMS.search(p)
         and access.rule_for(m, p) == "read"]


def test_every_state_changing_route_has_a_rule_of_its_own():
    """A new route that changes state fails here until access.RULES names its rule (until then only
    admins may use it)."""
    assert CHANGES, "no state-changing route found"
    unlisted = [op for op in CHANGES if access.rule_for(*op) == access.UNLISTED]
    assert not unlisted, f"routes without a rule in trainforge/server/routes/access.py RULES: {unlisted}"


def _fill(path: str, job_id: int) -> str:
    values = {"job_id": str(job_id), "name": "zed", "version": "1", "alias": "prod", "experiment_id": "1"}
    return re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), "1"), path)


@pytest.mark.parametrize("method, path", CHANGES, ids=[f"{m} {p}" for m, p in CHANGES])
def test_every_role_on_every_state_changing_route_is_allowed_or_403_naming_the_rule(team, method, path):
    api = team()
    api.as_("admin", "POST", f"{P}/users", json={"name": "zed", "role": "viewer"})  # /users/{name}'s user
    job = api.submit_as("owner", hold=True)  # ann's (the owner's), held: nothing runs
    rule = access.rule_for(method, path)
    for role in ROLES:
        kwargs = {} if method == "DELETE" else {"json": {}}
        r = api.as_(role, method, _fill(path, job["id"]), **kwargs)
        allowed = ALLOWED[role] is None or rule in ALLOWED[role]  # type: ignore[operator]
        if allowed:
            assert r.status_code not in (401, 403), (role, method, path, r.status_code, r.text)
        else:
            assert r.status_code == 403, (role, method, path, r.status_code, r.text)
            assert f"rule '{rule}'" in r.json()["detail"], r.text


@pytest.mark.parametrize("method, path", READS, ids=[f"{m} {p}" for m, p in READS])
def test_every_role_reads_every_route_but_the_scrape_token_reads_only_metrics(team, method, path):
    api = team()
    job = api.submit_as("owner", hold=True)
    for role in ("viewer", "scraper"):
        r = api.as_(role, method, _fill(path, job["id"]))
        if role == "viewer" or path == "/metrics":
            assert r.status_code not in (401, 403), (role, path, r.text)
        else:
            assert r.status_code == 403 and "rule 'read'" in r.json()["detail"], (role, path, r.text)


def test_a_jobs_result_is_its_owners_alone_whatever_the_role(team):
    """A Result is a pickle the job's code wrote: nobody but its owner is handed one (an admin
    neither), and the refusal comes before the job's state is even looked at."""
    api = team()
    job = api.submit_as("owner", hold=True)  # ann's
    path = f"{P}/jobs/{job['id']}/result"
    assert api.as_("owner", "GET", path).status_code == 409  # hers: not ended yet, so no Result yet
    for role in ("admin", "member", "viewer"):
        r = api.as_(role, "GET", path)
        assert r.status_code == 403 and "rule 'job.result'" in r.json()["detail"], (role, r.text)
    r = api.as_("scraper", "GET", path)
    assert r.status_code == 403 and "scrape token" in r.json()["detail"], r.text


def test_jobs_have_owners_members_change_only_their_own_and_the_403_names_the_rule(team):
    api = team()
    anns = api.submit_as("owner")
    bobs = api.submit_as("member")
    assert (anns["owner"], bobs["owner"]) == ("ann", "bob")
    listed = api.as_("owner", "GET", f"{P}/jobs").json()["jobs"]
    assert {j["owner"] for j in listed} == {"ann", "bob"}  # members see every job
    r = api.as_("owner", "POST", f"{P}/jobs/{bobs['id']}/stop", json={})
    assert r.status_code == 403
    assert r.json()["detail"] == (f"forbidden by rule 'job.change': member 'ann' may change only their own jobs, and job "
                                  f"{bobs['id']} belongs to 'bob': ask 'bob' or an admin")  # fmt: skip
    assert api.as_("owner", "POST", f"{P}/jobs/{anns['id']}/stop", json={}).json()["state"] == "STOPPED"
    assert api.as_("admin", "POST", f"{P}/jobs/{bobs['id']}/stop", json={}).json()["state"] == "STOPPED"
    # priority is the admins' to hand out: a member stays at or below member_max_priority (0)
    r = api.as_("owner", "POST", f"{P}/jobs", json={"kind": "script", "path": "t.py", "priority": 3})
    assert r.status_code == 403 and "rule 'job.priority'" in r.json()["detail"]
    held = api.submit_as("owner", hold=True)
    assert api.as_("owner", "PATCH", f"{P}/jobs/{held['id']}", json={"priority": 1}).status_code == 403
    assert api.as_("owner", "PATCH", f"{P}/jobs/{held['id']}", json={"priority": -1}).json()["priority"] == -1
    assert api.as_("admin", "PATCH", f"{P}/jobs/{held['id']}", json={"priority": 7}).json()["priority"] == 7
    assert api.as_("viewer", "GET", f"{P}/whoami").json() == {"name": "val", "role": "viewer", "quota": None, "holds": {}}


def _state_bytes(state_dir: str) -> bytes:
    out = b""
    for name in os.listdir(state_dir):
        path = os.path.join(state_dir, name)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                out += f.read()
    return out


def test_tokens_are_never_stored_in_clear_and_rotating_or_removing_takes_effect_at_once(team):
    api = team()
    old = api.tokens["owner"]
    r = api.as_("admin", "POST", f"{P}/users/ann/rotate", json={})
    new = r.json()["token"]
    assert new != old and "token" not in r.json()["user"]
    state = _state_bytes(api.service.state_dir)
    for token in (old, new, api.tokens["member"], api.tokens["viewer"]):
        secret = token.rsplit(".", 1)[1]
        assert secret.encode() not in state and token.encode() not in state
    rows = {r["name"]: r for r in api.service.store.query("SELECT * FROM users")}
    key_id, secret = new.split(".")[1:]
    ann = rows["ann"]
    assert ann["key_id"] == key_id and ann["token_hash"] == hashlib.sha256(bytes.fromhex(ann["salt"]) + secret.encode()).hexdigest()
    assert len({r["salt"] for r in rows.values()}) == len(rows)  # a salt per user
    api.tokens["old"], api.tokens["owner"] = old, new
    assert api.as_("old", "GET", f"{P}/jobs").status_code == 401
    assert api.as_("owner", "GET", f"{P}/jobs").status_code == 200
    assert api.as_("admin", "DELETE", f"{P}/users/ann").status_code == 200
    assert api.as_("owner", "GET", f"{P}/jobs").status_code == 401
    api.tokens["forged"] = f"tfu.{key_id}.{'x' * len(secret)}"
    assert api.as_("forged", "GET", f"{P}/jobs").status_code == 401
    assert api.as_("admin", "POST", f"{P}/users", json={"name": "admin", "role": "member"}).status_code == 409
    assert api.as_("admin", "POST", f"{P}/users", json={"name": "bob", "role": "member"}).status_code == 409
    assert api.as_("admin", "POST", f"{P}/users", json={"name": "x y", "role": "member"}).status_code == 422


def test_a_user_added_again_under_a_removed_users_name_inherits_none_of_their_jobs(team):
    api = team({"CPU": 4.0})
    running = api.submit_as("member", per_worker={"CPU": 2})  # "member" is bob
    waiting = api.submit_as("member", hold=True)
    before = api.service.ledger.usage(time.time() + 100.0)["bob"]
    assert before > 0
    r = api.as_("admin", "DELETE", f"{P}/users/bob")
    assert r.status_code == 200, r.text
    gone = r.json()
    tombstone = gone["jobs_owner"]
    assert re.fullmatch(r"bob \(removed \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\)", tombstone), tombstone
    assert gone == {"name": "bob", "jobs_owner": tombstone, "jobs": 2}
    listed = {j["id"]: j["owner"] for j in api.as_("viewer", "GET", f"{P}/jobs").json()["jobs"]}
    assert listed[running["id"]] == listed[waiting["id"]] == tombstone
    assert api.as_("admin", "POST", f"{P}/users", json={"name": tombstone, "role": "member"}).status_code == 422

    r = api.as_("admin", "POST", f"{P}/users", json={"name": "bob", "role": "member", "quota": {"CPU": 2}})
    assert r.status_code == 201, r.text
    api.tokens["bob2"] = r.json()["token"]
    for method, path, body in (("POST", f"/jobs/{running['id']}/stop", {}), ("PATCH", f"/jobs/{waiting['id']}", {"hold": False}),
                               ("DELETE", f"/jobs/{waiting['id']}", None)):  # fmt: skip
        r = api.as_("bob2", method, f"{P}{path}", **({"json": body} if body is not None else {}))
        assert r.status_code == 403, (path, r.text)
        assert r.json()["detail"].endswith(f"belongs to {tombstone!r}: its user was removed: ask an admin"), r.text
    assert api.service.get(running["id"]).state == "RUNNING"
    # The new bob holds nothing, has used nothing, and his quota counts none of the old bob's 2 CPUs.
    assert api.as_("bob2", "GET", f"{P}/whoami").json()["holds"] == {}
    usage = api.service.ledger.usage(time.time() + 100.0)
    assert "bob" not in usage and usage[tombstone] >= before
    mine = api.submit_as("bob2", per_worker={"CPU": 2})
    assert mine["state"] == "RUNNING" and mine["owner"] == "bob"
    shares = {row["user"]: row for row in api.as_("bob2", "GET", f"{P}/shares").json()}
    assert shares["bob"]["holds"] == {"CPU": 2.0} and shares[tombstone]["holds"] == {"CPU": 2.0}
    assert api.service.store.counts() == {(tombstone, "RUNNING"): 1, (tombstone, "HELD"): 1, ("bob", "RUNNING"): 1}
    assert api.as_("admin", "POST", f"{P}/jobs/{running['id']}/stop", json={}).json()["state"] == "STOPPED"
    # After a restart the store says the same (the removal and the new names were one transaction).
    rows = api.service.store.query("SELECT owner, COUNT(*) AS n FROM jobs GROUP BY owner ORDER BY owner")
    assert [(r["owner"], r["n"]) for r in rows] == [("bob", 1), (tombstone, 2)]
    api.service.ledger.accounting.persist(time.time())
    assert {r["user"] for r in api.service.store.query("SELECT user FROM usage")} >= {tombstone}


def test_removing_a_user_is_one_transaction(team, monkeypatch):
    """A failure while their jobs change hands leaves the user and their jobs as they were."""
    api = team()
    job = api.submit_as("member")

    def fail(conn, old, new):
        conn.execute("UPDATE jobs SET owner=? WHERE owner=?", (new, old))  # half done, then the crash
        raise RuntimeError("crash")

    monkeypatch.setattr(api.service.store, "rename_owner", fail)
    with pytest.raises(RuntimeError):
        api.service.remove_user("bob")
    assert api.service.store.query("SELECT owner FROM jobs WHERE id=?", (job["id"],))[0][0] == "bob"
    assert [r["name"] for r in api.service.store.query("SELECT name FROM users WHERE name='bob'")] == ["bob"]
    assert api.as_("member", "GET", f"{P}/whoami").json()["name"] == "bob"  # his token still works


def test_an_imported_experiment_is_its_importers_and_another_members_import_of_it_is_409(team):
    from test_server_experiments import _imported

    api = team()
    r = api.as_("owner", "POST", f"{P}/experiments/import", json=_imported("/runs/ann"))  # "owner" is ann
    assert r.status_code == 201, r.text
    first = r.json()
    assert (first["owner"], first["trials"]) == ("ann", 4)
    r = api.as_("member", "POST", f"{P}/experiments/import", json=_imported("/runs/ann", name="bob's"))
    assert r.status_code == 409, r.text
    assert r.json()["detail"] == (f"the experiment at '/runs/ann' is experiment {first['id']} here, imported by 'ann': "
                                  f"only they or an admin may import it again. See /experiments/{first['id']}, or copy "
                                  "the directory elsewhere and import the copy to have one of your own")  # fmt: skip
    kept = api.as_("member", "GET", f"{P}/experiments/{first['id']}").json()
    assert (kept["name"], kept["trials"], kept["owner"]) == ("local", 4, "ann")  # untouched
    body = _imported("/runs/ann")
    body["trials"] = body["trials"][:2]
    mine = api.as_("owner", "POST", f"{P}/experiments/import", json=body).json()  # her own: refreshed
    assert (mine["id"], mine["trials"], mine["owner"]) == (first["id"], 2, "ann")
    body["trials"] = body["trials"][:1]
    admins = api.as_("admin", "POST", f"{P}/experiments/import", json=body).json()  # an admin may refresh any
    assert (admins["id"], admins["trials"], admins["owner"]) == (first["id"], 1, "ann")
    bobs = api.as_("member", "POST", f"{P}/experiments/import", json=_imported("/runs/bob")).json()
    assert bobs["owner"] == "bob"
    # ann removed, then added again: the new ann does not own the old one's import.
    tombstone = api.as_("admin", "DELETE", f"{P}/users/ann").json()["jobs_owner"]
    assert api.as_("admin", "GET", f"{P}/experiments/{first['id']}").json()["owner"] == tombstone
    api.tokens["ann2"] = api.as_("admin", "POST", f"{P}/users", json={"name": "ann", "role": "member"}).json()["token"]
    r = api.as_("ann2", "POST", f"{P}/experiments/import", json=_imported("/runs/ann"))
    assert r.status_code == 409 and f"imported by {tombstone!r}" in r.text


def test_every_change_is_in_the_audit_log_with_who_what_when_and_from_where(team):
    api = team()
    job = api.submit_as("owner", hold=True)
    api.as_("owner", "PATCH", f"{P}/jobs/{job['id']}", json={"hold": False})
    api.as_("member", "POST", f"{P}/jobs/{job['id']}/stop", json={})  # refused: recorded too
    api.as_("admin", "POST", f"{P}/jobs/{job['id']}/stop", json={})
    api.as_("admin", "PATCH", f"{P}/users/bob", json={"quota": {"CPU": 2}})
    api.as_("owner", "GET", f"{P}/jobs")  # a read: not recorded
    entries = api.as_("viewer", "GET", f"{P}/audit").json()
    got = [(e["user"], e["role"], e["action"], e["method"], e["path"], e["job_id"], e["status"]) for e in reversed(entries)]
    jp = f"{P}/jobs/{job['id']}"
    assert got[-5:] == [
        ("ann", "member", "job.submit", "POST", f"{P}/jobs", job["id"], 201),
        ("ann", "member", "job.change", "PATCH", jp, job["id"], 200),
        ("bob", "member", "job.change", "POST", f"{jp}/stop", job["id"], 403),
        ("admin", "admin", "job.change", "POST", f"{jp}/stop", job["id"], 200),
        ("admin", "admin", "user.admin", "PATCH", f"{P}/users/bob", None, 200),
    ]
    assert all(e["client"] == "127.0.0.1" and e["ts"] > 0 for e in entries)
    assert "job.change" in [e for e in entries if e["status"] == 403][0]["detail"]
    anns = api.as_("viewer", "GET", f"{P}/audit", params={"user": "ann"}).json()  # `trainforge events --user ann`
    assert {e["user"] for e in anns} == {"ann"} and len(anns) == 2
    page = api.as_("viewer", "GET", f"/jobs/{job['id']}").text  # the job page's audit table
    assert "<h2>Audit</h2>" in page and page.count("job.change") == 3


def test_the_dashboard_shows_who_is_signed_in_each_jobs_owner_and_hides_what_the_role_forbids(team):
    api = team()
    anns = api.submit_as("owner", hold=True)
    bobs = api.submit_as("member", hold=True)

    def buttons(role: str, job_id: int) -> list[str]:
        row = api.as_(role, "GET", f"/rows/{job_id}").text
        return re.findall(r'data-act="(\w+)"', row)

    jobs_page = api.as_("owner", "GET", "/").text
    assert 'id=whoami data-role="member">ann · member<' in jobs_page
    assert '<td class="owner">ann</td>' in jobs_page and '<td class="owner">bob</td>' in jobs_page
    assert buttons("owner", anns["id"]) == ["stop", "release", "priority"]
    assert buttons("owner", bobs["id"]) == []  # bob's job: nothing ann may do
    assert buttons("viewer", anns["id"]) == [] and buttons("admin", bobs["id"]) == ["stop", "release", "priority"]
    job_page = api.as_("viewer", "GET", f"/jobs/{anns['id']}").text
    assert "val · viewer" in job_page and "owner <span id=owner>ann</span>" in job_page and "data-act" not in job_page
    assert "Fair share" in api.as_("viewer", "GET", "/queue").text


def test_metrics_for_the_scrape_token_in_the_prometheus_format(team):
    from prometheus_client.parser import text_string_to_metric_families

    api = team({"CPU": 2.0})
    api.submit_as("owner", per_worker={"CPU": 1.0})
    api.submit_as("owner", per_worker={"CPU": 1.0}, hold=True)
    api.submit_as("admin", per_worker={"CPU": 2.0})  # waits: needs 2 CPU, 1 free
    r = api.as_("scraper", "GET", "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=")
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert samples[("trainforge_jobs", (("state", "RUNNING"), ("user", "ann")))] == 1
    assert samples[("trainforge_jobs", (("state", "HELD"), ("user", "ann")))] == 1
    assert samples[("trainforge_queue_pending_jobs", (("reason", "resources"),))] == 1
    assert samples[("trainforge_resource_allocated", (("resource", "CPU"),))] == 1
    assert samples[("trainforge_user_allocated", (("resource", "CPU"), ("user", "ann")))] == 1
    assert samples[("trainforge_job_submissions_total", (("user", "ann"),))] == 2
    assert samples[("trainforge_scheduler_decision_duration_seconds_count", ())] >= 3
    assert not any("job" in dict(labels) for _, labels in samples)  # no series per job by default
    assert api.as_("scraper", "GET", f"{P}/jobs").status_code == 403  # the scrape token reads only /metrics
    api.service.scheduling.policy = TeamPolicy(metrics_per_job=True)
    families = {f.name for f in text_string_to_metric_families(api.as_("scraper", "GET", "/metrics").text)}
    assert "trainforge_job_cpu_used_cores" in families


def test_a_database_from_before_users_is_migrated_and_its_jobs_and_imports_are_the_admins(tmp_path):
    path = str(tmp_path / "state.db")
    conn = sqlite3.connect(path)
    for version in (1, 2, 3):
        conn.executescript(MIGRATIONS[version])
    conn.execute("INSERT INTO jobs(name, kind, state, spec, submitted_at) VALUES ('old', 'script', 'SUCCEEDED', '{}', 1)")
    conn.execute("INSERT INTO experiments(path, name, source, created_at) VALUES ('/runs/old', 'old', 'import', 1)")
    conn.execute("PRAGMA user_version=3")
    conn.commit()
    conn.close()
    store = JobStore(path)
    try:
        job = store.get(1)
        assert job is not None and (job.owner, job.preemptible, job.preemptions) == ("admin", False, 0)
        assert store.counts() == {("admin", "SUCCEEDED"): 1}
        assert store.query("SELECT COUNT(*) FROM users")[0][0] == 0
        assert store.query("SELECT owner FROM experiments")[0][0] == "admin"  # an import from before users: the admin's
    finally:
        store.close()
