"""The train server's HTTP API in-process: schemathesis against its OpenAPI schema, and the security
and error contract (token, Host, Origin, 401/403/404/409/422), paging, the queue's reasons, logs and
the server-sent events.

No job process is ever started here. :class:`NoRunner` replaces the ``_start`` method of each
``JobService`` (on the instance, before ``recover()``): it records the call and admits the job as the
real ``_start`` does up to the point where it would spawn the runner (the request leaves the queue,
the grant is held, the job is RUNNING in the store), and spawns nothing. So the scheduler, the store,
the validation, the handlers and the SSE code are the real ones, and a "running" job holds its grant
until it is stopped (``stop`` of a job without a runner kills what the job's environment names, which
is nothing, and records it STOPPED). A stub that did nothing at all would leave every admitted job
QUEUED with no grant, so no job could ever wait for resources ("needs N CPU, M free").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import threading
import time
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import rule
from hypothesis_profiles import examples

schemathesis = pytest.importorskip("schemathesis")
pytest.importorskip("fastapi")

from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from trainforge._internal.key_values import parse_resources  # noqa: E402
from trainforge.client import JobState  # noqa: E402
from trainforge.server._app import cookie_name, make_app  # noqa: E402
from trainforge.server._config import ServerConfig  # noqa: E402
from trainforge.server.jobs.runner import EVENTS_FILE, OUTPUT_FILE  # noqa: E402
from trainforge.server.jobs.service import JobService  # noqa: E402
from trainforge.server.pages import dashboard as _dashboard  # noqa: E402

TOKEN = "test-token-0123456789abcdef"
HOST = "127.0.0.1"
BASE = f"http://{HOST}"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
P = "/api/v1"
TIMEOUT_S = 20.0  # no request of this file may take longer (a hang fails instead of blocking the run)


class NoRunner:
    """``JobService._start`` without the process (see the module docstring)."""

    def __init__(self, service: JobService):
        self.service = service
        self.calls: list[tuple[int, int, dict[str, float]]] = []

    def __call__(self, job_id: int, workers: int, grant: dict[str, float]) -> None:
        # Called by _schedule under the service's lock.
        self.calls.append((job_id, workers, dict(grant)))
        s = self.service
        job = s.get(job_id)
        s._waiting.pop(job_id)  # as _start: the job no longer waits, and holds its grant
        s.scheduling.hold(job, grant, time.time())
        s.store.update(
            job_id, "running", {"workers": workers, "grant": grant, "fake": True}, state=JobState.RUNNING, grant=grant,
            workers=workers, attempt=job.attempt + 1, started_at=time.time(), ended_at=None, pid=None,
        )  # fmt: skip


class Api:
    """A JobService (runner-less) behind the guarded ASGI app, and a synchronous client for it."""

    def __init__(self, state_dir: str, capacity: dict[str, float]):
        self.service = JobService(state_dir, capacity, stop_grace_s=1.0, warm=False)
        self.starts = NoRunner(self.service)
        self.service._start = self.starts  # type: ignore[method-assign]
        self.service.recover()
        self.service.start()
        self.app, self.fastapi_app = make_app(self.service, token=TOKEN, allowed_hosts={HOST, "localhost"})

    def request(self, method: str, path: str, *, auth: bool = True, **kwargs: Any) -> httpx.Response:
        headers = {**(AUTH if auth else {}), **kwargs.pop("headers", {})}

        async def go() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url=BASE) as client:
                return await asyncio.wait_for(
                    client.request(method, path, headers=headers, **kwargs), TIMEOUT_S
                )

        return asyncio.run(go())

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        """A POST as the JSON clients send it: no body is ``{}`` (state changes are JSON only)."""
        if "json" not in kwargs and "content" not in kwargs:
            kwargs["json"] = {}
        return self.request("POST", path, **kwargs)

    def patch(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("PATCH", path, **kwargs)

    def submit(self, **spec: Any) -> dict[str, Any]:
        r = self.post(f"{P}/jobs", json={"kind": "script", "path": "train.py", **spec})
        assert r.status_code == 201, r.text
        return r.json()

    def close(self) -> None:
        self.service.close()


@pytest.fixture
def make_api(tmp_path):
    made: list[Api] = []

    def make(capacity: dict[str, float] | None = None) -> Api:
        api = Api(str(tmp_path / f"state{len(made)}"), capacity if capacity is not None else {"CPU": 4.0})
        made.append(api)
        return api

    yield make
    for api in made:
        api.close()


@pytest.fixture
def api(make_api) -> Api:
    return make_api()


# -- server-sent events over the raw ASGI interface (a stream may never end by itself) -------------


def _parse_sse(raw: bytes) -> list[dict[str, str]]:
    events = []
    for block in raw.decode().replace("\r\n", "\n").split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            fields[name] = fields[name] + "\n" + value if name in fields else value
        if "data" in fields or "event" in fields:
            events.append(fields)
    return events


class SseReply:
    def __init__(self) -> None:
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.body = b""
        self.complete = False  # the app ended the response itself
        self.error: BaseException | None = None

    @property
    def events(self) -> list[dict[str, str]]:
        return _parse_sse(self.body)


def read_sse(
    app: Any, path: str, *, query: dict[str, Any] | None = None, headers: dict[str, str] | None = None,
    max_events: int = 100, on_event: Any = None, timeout: float = TIMEOUT_S,
) -> SseReply:  # fmt: skip
    """GET ``path`` and read until the app ends the response or ``max_events`` events have come; then
    the client disconnects, and the app must end within ``timeout`` (else TimeoutError)."""
    reply = SseReply()
    all_headers = {
        "host": HOST,
        **{k.lower(): v for k, v in AUTH.items()},
        **{k.lower(): v for k, v in (headers or {}).items()},
    }
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
        "path": path, "raw_path": path.encode(), "root_path": "", "query_string": urlencode(query or {}).encode(),
        "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in all_headers.items()],
        "client": ("127.0.0.1", 50000), "server": (HOST, 8270),
    }  # fmt: skip

    async def run() -> None:
        disconnect = asyncio.Event()
        sent_request = False
        seen = 0

        async def receive() -> dict[str, Any]:
            nonlocal sent_request
            if not sent_request:
                sent_request = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await disconnect.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            nonlocal seen
            if message["type"] == "http.response.start":
                reply.status = message["status"]
                reply.headers = {k.decode().lower(): v.decode() for k, v in message.get("headers", [])}
            elif message["type"] == "http.response.body":
                reply.body += message.get("body", b"")
                if not message.get("more_body", False):
                    reply.complete = True
                    disconnect.set()
                    return
                events = reply.events
                for event in events[seen:]:
                    if on_event is not None:
                        on_event(event)
                seen = len(events)
                if seen >= max_events:
                    disconnect.set()

        try:
            await app(scope, receive, send)
        except Exception as exc:  # what escaped the app (a server error after the response began)
            reply.error = exc

    asyncio.run(asyncio.wait_for(run(), timeout))
    return reply


# -- 1. schemathesis -------------------------------------------------------------------------------

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]
FUZZ_SETTINGS = settings(
    max_examples=examples(30),
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
# The server-sent event streams are fuzzed apart: /events never ends (left out: its contract is tested
# below with a reader that disconnects), and a job's /stream and /logs/stream end only once the job
# has ended, so they are fuzzed on a server whose every job has ended.
GLOBAL_STREAM = r"^/api/v1/events$"
JOB_STREAMS = r"^/api/v1/jobs/\{job_id\}(/logs)?/stream$"


def _schema() -> Any:
    """The API's OpenAPI document (it depends on no service: the handlers are never called here)."""
    _, app = make_app(None, token=TOKEN, allowed_hosts={HOST})  # type: ignore[arg-type]
    return schemathesis.openapi.from_dict(app.openapi()).exclude(path_regex=GLOBAL_STREAM)


SCHEMA = _schema()
SCHEMA_NO_STREAMS = SCHEMA.exclude(path_regex=JOB_STREAMS)
SCHEMA_JOB_STREAMS = SCHEMA.include(path_regex=JOB_STREAMS)
# The job routes' state machine: the registry's routes (fuzzed above, and walked in
# test_server_models.py) would take most of its steps without ever reaching a job's id; so would the
# team's (/users, /audit, /whoami, /shares: fuzzed above, tested in test_server_access.py).
SCHEMA_JOBS = SCHEMA_NO_STREAMS.exclude(path_regex=r"/(models|serve|users|audit|whoami|shares)(/|$)")
# An experiment's stream follows it while a trial of it is queued or runs (a "running" job never ends
# here): fuzzed above on the seeded experiment, whose trial has ended.
SCHEMA_JOBS = SCHEMA_JOBS.exclude(path_regex=r"^/api/v1/experiments/\{experiment_id\}/stream$")


def _seed(api: Api, ended: bool) -> Api:
    """Something to find: a held job, a "running" one and a stopped one (or all three stopped)."""
    for i in range(3):
        api.submit(name=f"seed{i}", hold=i == 0, per_worker={"CPU": 1.0})
    for jid in (1, 2, 3) if ended else (3,):
        assert api.post(f"{P}/jobs/{jid}/stop").status_code == 200
    _write_log(api, 1, b"first\nsecond\n")
    with open(os.path.join(api.service.job_dir(2), EVENTS_FILE), "w") as f:
        f.write(json.dumps({"type": "report", "index": 0, "metrics": {"loss": 1.0}}) + "\n")
    # A Tune experiment (/experiments/1): a trial job with a report, the tuner's decision on it, stopped.
    tag = {"path": "/seed/experiment", "name": "seed-exp", "trial_id": "t0", "metric": "loss", "mode": "min"}
    trial = api.submit(name="seed-exp/t0", config={"x": 0.5}, experiment=tag)["id"]
    with open(os.path.join(api.service.job_dir(trial), EVENTS_FILE), "w") as f:
        f.write(json.dumps({"type": "report", "index": 0, "metrics": {"loss": 0.5}}) + "\n")
    assert api.post(f"{P}/jobs/{trial}/decisions", json={"kind": "pruned", "iteration": 1}).status_code == 201
    assert api.post(f"{P}/jobs/{trial}/stop").status_code == 200
    return api


@pytest.fixture
def fuzz_api(make_api) -> Api:
    return _seed(make_api({"CPU": 4.0, "GPU": 1.0, "memory": 8e9}), ended=False)


@pytest.fixture
def ended_api(make_api) -> Api:
    return _seed(make_api({"CPU": 4.0}), ended=True)


@FUZZ_SETTINGS
@SCHEMA_NO_STREAMS.parametrize()
def test_every_operation_answers_within_its_schema(case, fuzz_api):
    """Every operation, valid and invalid input: never a 5xx, and every response (status, content type,
    body) is one the schema declares."""
    case.call_and_validate(app=fuzz_api.app, base_url=BASE, headers={"Host": HOST, **AUTH}, checks=CHECKS)


@FUZZ_SETTINGS
@SCHEMA_JOB_STREAMS.parametrize()
def test_job_streams_answer_within_their_schema(case, ended_api):
    """A job's event and log streams (every job has ended, so every stream ends): no 5xx, and the
    status and content type the schema declares (timeout: a stream that does not end fails)."""
    case.call_and_validate(
        app=ended_api.app, base_url=BASE, headers={"Host": HOST, **AUTH}, checks=CHECKS, timeout=TIMEOUT_S
    )


def test_stateful_sequences_follow_the_schema(tmp_path):
    """Sequences of calls linked by the schema (a job's id from a listing, the queue or a submission,
    then get/patch/stop/retry/delete/logs... by that id): no 5xx and every response within the
    schema. The machine's own entry points are listings, so a rule of this test submits valid jobs
    (schemathesis rarely draws a valid submission: which field is required depends on ``kind``).
    Each scenario has a server of its own (a replayed scenario must meet the same state)."""
    calls: list[tuple[str, str, int]] = []
    scenarios = iter(range(10**6))

    class Workflow(SCHEMA_JOBS.as_state_machine()):  # type: ignore[misc]
        def setup(self):
            super().setup()
            self.api = Api(str(tmp_path / f"scenario{next(scenarios)}"), {"CPU": 2.0})
            for i in range(3):  # jobs 1-3 exist from the start: small ids drawn for a path hit one
                self.api.submit(name=f"seed{i}", hold=i == 0, per_worker={"CPU": 1.0})

        def teardown(self):
            self.api.close()
            super().teardown()

        def get_call_kwargs(self, case):
            return {"app": self.api.app, "base_url": BASE, "headers": {"Host": HOST, **AUTH}}

        def after_call(self, response, case):
            super().after_call(response, case)
            calls.append((case.method, case.operation.path, response.status_code))

        def validate_response(self, response, case, additional_checks=None, **kwargs):
            case.validate_response(response, checks=CHECKS, transport_kwargs=kwargs or None)

        @rule(hold=st.booleans(), cpus=st.sampled_from([0.0, 0.5, 1.0, 2.0]), priority=st.integers(-2, 2))
        def submit_a_valid_job(self, hold, cpus, priority):
            self.api.submit(hold=hold, per_worker={"CPU": cpus}, priority=priority)
            calls.append(("POST", f"{P}/jobs", 201))

    # derandomize: the walk is a function of the schema (and of the jobs' states as they change): jobs
    # 1-3 exist in every scenario, so the walk meets existing jobs whatever the draw.
    Workflow.run(
        settings=settings(
            max_examples=examples(60), stateful_step_count=8, deadline=None, derandomize=True, database=None,
            suppress_health_check=list(HealthCheck),
        )
    )  # fmt: skip
    # It did follow the links: linked calls on jobs that exist succeeded.
    reached = {(method, path) for method, path, status in calls if "{job_id}" in path and status < 300}
    assert len(reached) >= 3, sorted({c for c in calls if "{job_id}" in c[1]})


# -- 2. security -----------------------------------------------------------------------------------


def test_no_token_is_401_naming_what_to_send(api):
    r = api.get(f"{P}/health", auth=False)
    assert r.status_code == 401
    detail = r.json()["detail"]
    assert "Authorization: Bearer" in detail and "token" in detail


@pytest.mark.parametrize(
    "authorization",
    [
        "Bearer wrong-token-0123456789abcdef",
        f"Bearer {TOKEN}x",
        f"Bearer {TOKEN[:-1]}",
        "Bearer ",
        f"Basic {TOKEN}",
    ],
)
def test_wrong_token_is_401(api, authorization):
    r = api.get(f"{P}/health", auth=False, headers={"Authorization": authorization})
    assert r.status_code == 401, r.text


def test_token_in_the_servers_own_cookie_is_accepted(api, make_api):
    name = cookie_name(api.service.server_id)
    r = api.get(f"{P}/health", auth=False, headers={"Cookie": f"theme=dark; {name}={TOKEN}"})
    assert r.status_code == 200, r.text
    wrong = api.get(f"{P}/health", auth=False, headers={"Cookie": f"{name}={TOKEN}0"})
    assert wrong.status_code == 401
    for other in ("trainforge_token", f"x_{name}"):  # the old shared name, a lookalike
        assert api.get(f"{P}/health", auth=False, headers={"Cookie": f"{other}={TOKEN}"}).status_code == 401
    # Two servers on one host (cookies ignore the port) keep apart cookies.
    assert cookie_name(make_api({"CPU": 1.0}).service.server_id) != name


def test_the_dashboard_entry_redirects_only_to_a_path_here_keeping_the_query(api):
    async def entry(target: str) -> tuple[int, dict[str, str]]:
        path, _, query = target.partition("?")
        scope = {"type": "http", "method": "GET", "path": path, "raw_path": path.encode(),
                 "query_string": query.encode(), "headers": [(b"host", HOST.encode())]}  # fmt: skip
        sent: list[dict] = []

        async def receive() -> dict:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict) -> None:
            sent.append(message)

        await api.app(scope, receive, send)
        return sent[0]["status"], {k.decode(): v.decode() for k, v in sent[0]["headers"]}

    status, headers = asyncio.run(entry(f"//evil.example/x?token={TOKEN}"))
    assert status == 303 and headers["location"] == "/evil.example/x"  # a path here, not //evil.example
    status, headers = asyncio.run(entry(f"/compare?name=a&group=lr&token={TOKEN}"))
    assert status == 303 and headers["location"] == "/compare?name=a&group=lr"
    assert headers["set-cookie"].startswith(f"{cookie_name(api.service.server_id)}={TOKEN};")


@pytest.mark.parametrize("host", ["evil.example:8270", "evil.example", "127.0.0.1.evil.example", ""])
def test_foreign_host_is_403_even_with_the_token(api, host):
    r = api.get(f"{P}/health", headers={"Host": host})
    assert r.status_code == 403, r.text
    assert "Host" in r.json()["detail"]


@pytest.mark.parametrize("host", ["127.0.0.1:8270", "localhost:1234", "LOCALHOST"])
def test_own_host_with_a_port_passes(api, host):
    assert api.get(f"{P}/health", headers={"Host": host}).status_code == 200


def test_cross_origin_post_is_403_and_cross_origin_get_passes(api):
    job = api.submit(hold=True)
    stop = f"{P}/jobs/{job['id']}/stop"
    r = api.post(stop, headers={"Origin": "http://evil.example"})
    assert r.status_code == 403, r.text
    assert "evil.example" in r.json()["detail"]
    assert api.get(f"{P}/jobs/{job['id']}").json()["state"] == "HELD"  # nothing happened
    for origin in ("http://127.0.0.1.evil.example", "null", "http://127.0.0.1:8270", "https://127.0.0.1"):
        assert api.post(stop, headers={"Origin": origin}).status_code == 403, origin
    assert (
        api.patch(
            f"{P}/jobs/{job['id']}", json={"priority": 1}, headers={"Origin": "http://evil.example"}
        ).status_code
        == 403
    )
    get = api.get(f"{P}/jobs/{job['id']}", headers={"Origin": "http://evil.example"})
    assert get.status_code == 200 and get.json()["state"] == "HELD"
    own = api.post(stop, headers={"Origin": BASE})  # the whole origin the client reached: http://127.0.0.1
    assert own.status_code == 200 and own.json()["state"] == "STOPPED"


def test_a_form_post_from_another_port_with_the_cookie_changes_nothing(api):
    """The reported attack: a page on another port of the same host posts a form (a CORS-simple
    request, which a browser sends with the SameSite=Strict cookie: same site) to stop, retry and gc."""
    running = api.submit()["id"]
    ended = api.submit()["id"]
    assert api.post(f"{P}/jobs/{ended}/stop").json()["state"] == "STOPPED"
    cookie = {"Cookie": f"{cookie_name(api.service.server_id)}={TOKEN}"}
    form = {"Content-Type": "application/x-www-form-urlencoded", **cookie}
    for path in (f"/jobs/{running}/stop", f"/jobs/{ended}/retry", "/models/gc"):
        r = api.request("POST", P + path, auth=False, headers={"Origin": "http://127.0.0.1:9999", **form})
        assert r.status_code == 403, (path, r.text)
        # Without an Origin (an old browser, a proxy that strips it): the body is not JSON.
        r = api.request("POST", P + path, auth=False, headers=form, content=b"")
        assert r.status_code == 415, (path, r.text)
        r = api.request("POST", P + path, auth=False, headers={"Content-Type": "text/plain", **cookie}, content=b"{}")
        assert r.status_code == 415, (path, r.text)
    assert api.get(f"{P}/jobs/{running}").json()["state"] == "RUNNING"
    assert api.get(f"{P}/jobs/{ended}").json()["state"] == "STOPPED"
    # The dashboard itself (same origin, JSON) still can.
    own = api.request("POST", f"{P}/jobs/{running}/stop", auth=False, json={}, headers={"Origin": BASE, **cookie})
    assert own.status_code == 200 and own.json()["state"] == "STOPPED"


def test_non_loopback_host_needs_a_token(tmp_path):
    for host in ("0.0.0.0", "192.168.1.10", "example.com", "::"):
        with pytest.raises(ValueError, match="not a loopback address"):
            ServerConfig(state_dir=str(tmp_path), host=host)
    assert ServerConfig(state_dir=str(tmp_path), host="0.0.0.0", token="t" * 16).host == "0.0.0.0"
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        assert ServerConfig(state_dir=str(tmp_path), host=host).host == host
    with pytest.raises(ValueError, match="at least 16"):
        ServerConfig(state_dir=str(tmp_path), host="0.0.0.0", token="short")


# -- 3. submissions and the error contract ---------------------------------------------------------


def _error_text(r: httpx.Response) -> str:
    return json.dumps(r.json()["detail"])


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"kind": "script"}, "path", "kind='script' needs the field 'path'"),
        ({"kind": "function"}, "target", "needs the field 'target'"),
        ({"kind": "script", "path": "a.py", "bogus": 1}, "bogus", "Extra inputs are not permitted"),
        ({"kind": "script", "path": "a.py", "workers": -1}, "workers", "greater than or equal to 1"),
        ({"kind": "script", "path": "a.py", "workers": 0}, "workers", "greater than or equal to 1"),
        (
            {"kind": "script", "path": "a.py", "workers": 3, "max_workers": 2},
            "max_workers",
            "max_workers=2 is less than num_workers=3",  # an older client's "workers" is num_workers
        ),
        ({"kind": "script", "path": "a.py", "per_worker": {"CPU": -1}}, "CPU", "greater than or equal to 0"),
        ({"kind": "script", "path": "a.py", "per_worker": {"bad kind!": 1}}, "per_worker", "pattern"),
        ({"kind": "script", "path": "a\u0000.py"}, "path", "NUL"),
        ({"kind": "script", "path": "a.py", "env": {"1BAD": "x"}}, "env", "pattern"),
        ({"kind": "rocket", "path": "a.py"}, "kind", "'trainer', 'script' or 'function'"),
        ({"kind": "function", "target": "no_colon"}, "target", "pattern"),
        ({"kind": "script", "path": "a.py", "config": {"lr": [1, 2]}}, "config", "lr"),
        ({"kind": "script", "path": "a.py", "config": {"": 1}}, "config", "at least 1 character"),
    ],
)
def test_malformed_submission_is_422_naming_the_field(api, body, field, words):
    r = api.post(f"{P}/jobs", json=body)
    assert r.status_code == 422, r.text
    text = _error_text(r)
    assert field in text and words in text, text
    assert api.service.store.count() == 0


@pytest.mark.parametrize("literal", ["NaN", "-Infinity"])
def test_non_finite_amount_is_422_naming_the_field(api, literal):
    """Python's JSON reader accepts NaN and Infinity: the schema must refuse them, and the error
    response must still be JSON (it cannot echo the value back as a number)."""
    body = '{"kind": "script", "path": "a.py", "per_worker": {"CPU": LITERAL}}'.replace("LITERAL", literal)
    r = api.post(f"{P}/jobs", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    text = _error_text(r)
    assert "per_worker" in text and "CPU" in text and "finite" in text
    assert api.service.store.count() == 0


def test_lone_surrogate_in_a_string_is_422(api):
    """JSON may carry a lone UTF-16 surrogate (\\ud800), which is no valid text: a 422, not a 500."""
    body = '{"kind": "script", "path": "a.py", "name": "x\\ud800"}'
    r = api.post(f"{P}/jobs", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    assert "name" in _error_text(r)
    assert api.service.store.count() == 0


@pytest.mark.parametrize(("method", "path"), [("POST", "/jobs"), ("PATCH", "/jobs/1")])
@pytest.mark.parametrize(
    "body", [b"{not json", b'{"kind": "script", "path": "\xff\xfe.py"}'], ids=["malformed", "not-utf8"]
)
def test_body_that_is_not_json_is_a_documented_4xx(api, method, path, body):
    """A body that is not JSON (or not UTF-8) is refused with a status the schema declares for the
    operation (FastAPI answers 400 "There was an error parsing the body" to bytes that are not UTF-8)."""
    api.submit(hold=True)
    r = api.request(method, f"{P}{path}", content=body, headers={"Content-Type": "application/json"})
    template = {"/jobs": "/jobs", "/jobs/1": "/jobs/{job_id}"}[path]
    documented = api.fastapi_app.openapi()["paths"][f"{P}{template}"][method.lower()]["responses"]
    assert 400 <= r.status_code < 500 and str(r.status_code) in documented, (
        r.status_code,
        r.text,
        sorted(documented),
    )
    assert api.service.store.count() == 1 and api.get(f"{P}/jobs/1").json()["state"] == "HELD"


@pytest.mark.parametrize(
    ("path", "method", "case"),
    [
        ("/jobs", "POST", {"body": {"kind": "script", "path": "a.py", "per_worker": {"GPU": 1}}}),
        ("/jobs", "POST", {"body": {"kind": "trainer", "trainer_b64": "not base64!"}}),
        (
            "/jobs/{job_id}/logs/stream",
            "GET",
            {"path_parameters": {"job_id": 1}, "headers": {"Last-Event-ID": "x"}},
        ),
        (
            "/jobs/{job_id}/stream",
            "GET",
            {"path_parameters": {"job_id": 1}, "headers": {"Last-Event-ID": ""}},
        ),
    ],
    ids=["never-fits", "bad-base64", "logs-stream-last-event-id", "stream-last-event-id"],
)
def test_every_422_has_the_documented_422_body(api, path, method, case):
    """The schema documents a 422 body as FastAPI's validation error (``detail``: a list of
    ``{loc, msg, type}``); the server's own 422s must have that shape too (or the schema must say
    otherwise). Found by schemathesis on the log stream's Last-Event-ID."""
    jid = api.submit(hold=True)["id"]
    api.post(f"{P}/jobs/{jid}/stop")  # ended: its streams end by themselves
    response = SCHEMA[f"{P}{path}"][method].Case(**case).call_and_validate(
        app=api.app, base_url=BASE, headers={"Host": HOST, **AUTH}, checks=[response_schema_conformance],
        timeout=TIMEOUT_S,
    )  # fmt: skip
    assert response.status_code == 422


def test_trainer_b64_must_be_base64(api):
    r = api.post(f"{P}/jobs", json={"kind": "trainer", "trainer_b64": "not base64!"})
    assert r.status_code == 422
    assert "trainer_b64" in _error_text(r)


@pytest.mark.parametrize(
    ("spec", "numbers"),
    [
        ({"workers": 3, "per_worker": {"CPU": 2}}, ["6 CPU (capacity 4)", "3 worker(s)"]),
        ({"per_worker": {"GPU": 1}}, ["1 GPU (capacity 0)"]),
        ({"per_worker": {"CPU": 1}, "driver": {"CPU": 4}}, ["5 CPU (capacity 4)"]),
    ],
)
def test_request_that_can_never_fit_is_422_with_the_numbers(api, spec, numbers):
    r = api.post(f"{P}/jobs", json={"kind": "script", "path": "a.py", **spec})
    assert r.status_code == 422, r.text
    detail = _error_text(r)
    for words in numbers:
        assert words in detail, detail
    assert api.service.store.count() == 0
    assert not os.listdir(api.service.jobs_dir)  # no staging directory left behind


def test_elastic_job_fits_by_its_minimum(api):
    job = api.submit(workers=2, max_workers=10, per_worker={"CPU": 1})
    assert job["job"]["state"] == "RUNNING"
    assert api.starts.calls == [(job["id"], 4, {"CPU": 4.0})]  # as many as fit, up to max_workers
    assert job["job"]["request"] == {
        "num_workers": 2,  # Ray's name for the user's number
        "max_workers": 10,
        "per_worker": {"CPU": 1.0},
        "driver": {},
    }


@pytest.mark.parametrize(
    ("method", "suffix", "body"),
    [
        ("GET", "", None),
        ("PATCH", "", {"priority": 1}),
        ("POST", "/stop", {}),
        ("POST", "/retry", {}),
        ("DELETE", "", None),
        ("GET", "/logs", None),
        ("GET", "/result", None),
        ("GET", "/metrics", None),
        ("GET", "/checkpoints", None),
        ("GET", "/events", None),
    ],
)
def test_unknown_job_is_404(api, method, suffix, body):
    api.submit(hold=True)  # job 1 exists; 999 does not
    r = api.request(method, f"{P}/jobs/999{suffix}", json=body)
    assert r.status_code == 404, r.text
    assert "no job 999" in r.json()["detail"]


@pytest.mark.parametrize("suffix", ["/stream", "/logs/stream"])
def test_stream_of_unknown_job_is_404(api, suffix):
    reply = read_sse(api.app, f"{P}/jobs/999{suffix}")
    assert reply.status == 404, (reply.status, reply.body, reply.error)
    assert "no job 999" in json.loads(reply.body)["detail"]


@pytest.mark.parametrize("path", [f"{P}/events", f"{P}/jobs/1/stream", f"{P}/jobs/1/logs/stream"])
def test_stream_with_a_malformed_last_event_id_is_422(api, path):
    job = api.submit(hold=True)
    api.post(f"{P}/jobs/{job['id']}/stop")  # ended: its streams would end by themselves
    reply = read_sse(api.app, path, headers={"Last-Event-ID": "abc"}, max_events=1)
    assert reply.status == 422, (reply.status, reply.body, reply.error)
    assert "Last-Event-ID" in json.dumps(json.loads(reply.body)["detail"])


def test_stop_of_an_ended_job_is_409(api):
    job = api.submit(hold=True)
    first = api.post(f"{P}/jobs/{job['id']}/stop")
    assert first.status_code == 200 and first.json()["state"] == "STOPPED"
    assert first.json()["failure_class"] == "stopped"
    again = api.post(f"{P}/jobs/{job['id']}/stop", json={"force": True})
    assert again.status_code == 409, again.text
    assert "already ended" in again.json()["detail"]


def test_running_job_cannot_be_patched_deleted_or_retried_but_can_be_stopped(api):
    job = api.submit(per_worker={"CPU": 2})
    jid = job["id"]
    assert job["job"]["state"] == "RUNNING" and job["job"]["grant"] == {"CPU": 2.0}
    r = api.patch(f"{P}/jobs/{jid}", json={"priority": 5})
    assert r.status_code == 409, r.text
    assert "RUNNING" in r.json()["detail"]
    assert api.get(f"{P}/jobs/{jid}").json()["priority"] == 0
    assert api.request("DELETE", f"{P}/jobs/{jid}").status_code == 409
    assert api.post(f"{P}/jobs/{jid}/retry").status_code == 409
    assert api.get(f"{P}/jobs/{jid}/result").status_code == 409
    stopped = api.post(f"{P}/jobs/{jid}/stop", json={"grace_s": 0})
    assert stopped.status_code == 200 and stopped.json()["state"] == "STOPPED"
    assert api.get(f"{P}/resources").json()["free"] == {"CPU": 4.0}
    assert api.get(f"{P}/jobs/{jid}/result").status_code == 404  # ended, but a script leaves no Result
    retried = api.post(f"{P}/jobs/{jid}/retry")
    assert retried.status_code == 200 and retried.json()["state"] == "RUNNING"
    assert [c[0] for c in api.starts.calls] == [jid, jid]


def test_config_is_kept_and_returned_and_retry_from_a_checkpoint_is_checked(api, tmp_path):
    job = api.submit(hold=True, config={"lr": 0.1, "model/depth": 3, "opt": "adam", "warm": True})
    jid = job["id"]
    assert job["job"]["config"] == {"lr": 0.1, "model/depth": 3, "opt": "adam", "warm": True}
    assert api.get(f"{P}/jobs/{jid}").json()["config"]["opt"] == "adam"
    api.post(f"{P}/jobs/{jid}/stop")
    missing = api.post(f"{P}/jobs/{jid}/retry", json={"checkpoint": str(tmp_path / "nope")})
    assert missing.status_code == 422 and "not a directory" in _error_text(missing)
    script = api.post(f"{P}/jobs/{jid}/retry", json={"checkpoint": str(tmp_path)})
    assert script.status_code == 409 and "resume_from_checkpoint" in script.json()["detail"]  # a script: say how
    assert api.post(f"{P}/jobs/{jid}/retry", json={"checkpoint": ""}).status_code == 422
    assert api.post(f"{P}/jobs/{jid}/retry", json={"bogus": 1}).status_code == 422


@pytest.mark.parametrize("value", [0, 1, -1, 2**70, 1.5, 1.0, 0.0, True, False, "0", "1", "true", "", None])
def test_config_values_keep_their_json_type(api, value):
    """A config value comes back as the JSON type it was sent as: 0 is not False, "0" is not 0."""
    job = api.submit(hold=True, config={"v": value})
    for got in (job["job"]["config"]["v"], api.get(f"{P}/jobs/{job['id']}").json()["config"]["v"]):
        assert type(got) is type(value) and got == value, (value, got)


def test_a_deeply_nested_body_is_a_4xx_naming_the_problem(api):
    """Python's JSON decoder gives up past ~1000 levels (RecursionError): a 400 that says why."""
    jid = api.submit(hold=True)["id"]
    deep = b"[" * 3000 + b"]" * 3000
    for method, path, body in [("POST", "/jobs", b'{"kind": "script", "path": "a.py", "args": ' + deep + b"}"),
                               ("POST", "/jobs", deep), ("PATCH", f"/jobs/{jid}", b'{"priority": ' + deep + b"}"),
                               ("POST", f"/jobs/{jid}/retry", b'{"checkpoint": ' + deep + b"}")]:  # fmt: skip
        r = api.request(method, P + path, content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and "deeper than 100 levels" in r.json()["detail"], (path, r.status_code, r.text)
    assert api.service.store.count() == 1 and api.get(f"{P}/jobs/{jid}").json()["priority"] == 0


def test_series_range_and_its_errors(api):
    jid = api.submit(hold=True)["id"]
    with open(os.path.join(api.service.job_dir(jid), "events.jsonl"), "w") as f:
        for i in range(1000):
            f.write(json.dumps({"type": "report", "t": float(i), "metrics": {"x": float(i)}}) + "\n")
    whole = api.get(f"{P}/jobs/{jid}/series", params={"points": 10}).json()
    assert whole["n"] == 1000 and whole["series"]["x"]["i"][:2] == [99, 199]
    part = api.get(f"{P}/jobs/{jid}/series", params={"points": 10, "start": 500, "end": 509}).json()
    assert part["series"]["x"]["i"] == list(range(500, 510)) and part["series"]["x"]["last"][0] == 500.0
    assert part["series"]["x"]["t"][-1] == 509.0 and (part["start"], part["end"]) == (500, 509)
    bad = api.get(f"{P}/jobs/{jid}/series", params={"start": 10, "end": 5})
    assert bad.status_code == 422 and "end=5 is before start=10" in _error_text(bad)
    assert bad.json()["detail"][0]["loc"] == ["query", "end"]  # the schema's shape of a 422, as every other 422


def test_series_and_metrics_say_which_attempt_each_report_is_of(api):
    """A runner lost without a checkpoint: the next attempt reports steps 0-4 again. The series cuts
    its buckets at the attempt and says which one each is of; /metrics says it per report."""
    jid = api.submit(hold=True)["id"]
    with open(os.path.join(api.service.job_dir(jid), "events.jsonl"), "w") as f:
        for attempt in (1, 2):
            f.write(json.dumps({"type": "run_start", "name": "r", "job_attempt": attempt, "t": 0.0}) + "\n")
            for step in range(5):
                f.write(json.dumps({"type": "report", "index": step, "attempt": 0, "t": float(step),
                                    "metrics": {"step": step}}) + "\n")  # fmt: skip
    s = api.get(f"{P}/jobs/{jid}/series", params={"points": 3}).json()
    assert [(g["job_attempt"], g["start"], g["end"]) for g in s["segments"]] == [(1, 0, 4), (2, 5, 9)]
    step = s["series"]["step"]
    assert step["segment"] == [0, 0, 1, 1] and step["i"] == [2, 4, 7, 9] and step["last"] == [2, 4, 2, 4]
    rows = api.get(f"{P}/jobs/{jid}/metrics").json()["reports"]
    assert [(r["job_attempt"], r["index"]) for r in rows] == [(a, i) for a in (1, 2) for i in range(5)]


def test_patch_of_a_waiting_job(api):
    job = api.submit(hold=True)
    jid = job["id"]
    assert job["job"]["pending"]["reason"] == "held"
    r = api.patch(f"{P}/jobs/{jid}", json={"priority": 7})
    assert r.status_code == 200 and r.json()["priority"] == 7 and r.json()["state"] == "HELD"
    for bad in ({"priority": 10**7}, {"state": "QUEUED"}, {"hold": "maybe"}):
        assert api.patch(f"{P}/jobs/{jid}", json=bad).status_code == 422
    released = api.patch(f"{P}/jobs/{jid}", json={"hold": False})
    assert released.status_code == 200 and released.json()["state"] == "RUNNING"


def test_delete_of_an_ended_job(api):
    jid = api.submit(hold=True)["id"]
    api.post(f"{P}/jobs/{jid}/stop")
    r = api.request("DELETE", f"{P}/jobs/{jid}")
    assert r.status_code == 204 and r.content == b""
    assert api.get(f"{P}/jobs/{jid}").status_code == 404
    assert not os.path.exists(api.service.job_dir(jid))


def test_submission_id_makes_submit_idempotent(api):
    spec = {"kind": "script", "path": "a.py", "hold": True, "submission_id": "abc-1"}
    first = api.post(f"{P}/jobs", json=spec)
    assert first.status_code == 201 and first.json()["created"] is True
    again = api.post(f"{P}/jobs", json=spec)  # the same submission retried: the job it queued
    assert again.status_code == 201 and again.json()["created"] is False
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["job"]["name"] == "a.py" and again.json()["job"]["state"] == "HELD"
    # The same key for something else is refused, naming the job it belongs to: never silently the first.
    reused = api.post(f"{P}/jobs", json={**spec, "path": "b.py", "priority": 9})
    assert reused.status_code == 409, reused.text
    assert "abc-1" in reused.json()["detail"] and f"job {first.json()['id']}" in reused.json()["detail"]
    other = api.post(f"{P}/jobs", json={**spec, "submission_id": "abc-2"})
    assert other.json()["created"] is True and other.json()["id"] != first.json()["id"]
    assert api.service.store.count() == 2
    assert sorted(os.listdir(api.service.jobs_dir)) == sorted(
        [str(first.json()["id"]), str(other.json()["id"])]
    )


# -- 4. listing, queue, resources -----------------------------------------------------------------


@pytest.mark.parametrize("limit", [10, 5, 1000])
def test_jobs_are_paged_newest_first_by_keyset(api, limit):
    ids = [api.submit(hold=True, name=f"job{i}")["id"] for i in range(25)]
    pages, before = [], None
    while True:
        params: dict[str, Any] = {"limit": limit}
        if before is not None:
            params["before"] = before
        r = api.get(f"{P}/jobs", params=params)
        assert r.status_code == 200
        body = r.json()
        page = [j["id"] for j in body["jobs"]]
        assert len(page) <= limit
        pages.append(page)
        if body["next_before"] is None:
            break
        assert body["next_before"] == page[-1]
        before = body["next_before"]
        assert len(pages) <= 30
    assert [len(p) for p in pages] == [min(limit, 25 - i * limit) for i in range(math.ceil(25 / limit))]
    assert sum(pages, []) == sorted(ids, reverse=True)


def test_jobs_filter_by_state_and_name(api):
    held = api.submit(hold=True, name="alpha")["id"]
    running = api.submit(name="beta")["id"]
    stopped = api.submit(hold=True, name="alphabet")["id"]
    api.post(f"{P}/jobs/{stopped}/stop")

    def ids(**params):
        r = api.get(f"{P}/jobs", params=params)
        assert r.status_code == 200, r.text
        return [j["id"] for j in r.json()["jobs"]]

    assert ids(state="HELD") == [held]
    assert ids(state=["RUNNING", "STOPPED"]) == [stopped, running]
    assert ids(name="alpha") == [stopped, held]
    assert ids(name="alpha", state="STOPPED") == [stopped]
    assert api.get(f"{P}/jobs", params={"state": "DONE"}).status_code == 422
    assert api.get(f"{P}/jobs", params={"limit": 0}).status_code == 422


def test_jobs_name_filter_is_a_plain_substring(api):
    """``?name=`` finds the jobs whose name contains the text: ``_`` and ``%`` are characters, not
    SQL LIKE wildcards (``train_a`` must not find ``trainXa``)."""
    wanted = api.submit(hold=True, name="train_a")["id"]
    api.submit(hold=True, name="trainXa")
    api.submit(hold=True, name="plain")
    percent = api.submit(hold=True, name="100% done")["id"]

    def names(text):
        return [j["id"] for j in api.get(f"{P}/jobs", params={"name": text}).json()["jobs"]]

    assert names("train_a") == [wanted]
    assert names("%") == [percent]
    assert names("_") == [wanted]


def test_queue_order_and_reasons(make_api):
    api = make_api({"CPU": 4.0, "GPU": 1.0})
    big = api.submit(per_worker={"CPU": 3})["id"]  # runs: 1 CPU left
    held = api.submit(hold=True)["id"]
    lacking = api.submit(per_worker={"CPU": 2})["id"]  # needs 2 CPU, 1 free: reserves CPU
    small = api.submit(per_worker={"CPU": 1})["id"]  # would fit, but CPU is reserved
    urgent = api.submit(per_worker={"CPU": 2}, priority=10)["id"]  # ahead of every other
    # Asks for no CPU, but every worker is charged 0.1 CPU (rule 0), and the CPUs are reserved: it
    # does not backfill (a job needing none of the reserved kinds would: test_server_scheduler.py).
    gpu = api.submit(per_worker={"GPU": 1})["id"]
    assert [c[0] for c in api.starts.calls] == [big]

    r = api.get(f"{P}/queue")
    assert r.status_code == 200
    assert (r.json()["total"], r.json()["next_offset"]) == (5, None)
    entries = r.json()["entries"]
    queue = [
        (e["job_id"], e["pending"]["reason"], e["pending"]["position"], e["pending"]["text"])
        for e in entries
    ]
    assert queue == [
        (urgent, "resources", 1, "needs 2 CPU, 1 free"),
        (held, "held", None, "held"),
        (lacking, "resources", 2, "needs 2 CPU, 1 free"),
        (small, "reserved", 3, f"behind job {urgent}"),
        (gpu, "reserved", 4, f"behind job {urgent}"),
    ]
    first = entries[0]["pending"]
    assert first["need"] == {"CPU": 2.0} and first["free"] == {"CPU": 1.0}
    assert entries[3]["pending"]["behind"] == urgent
    assert api.get(f"{P}/jobs/{small}").json()["pending"]["text"] == f"behind job {urgent}"
    res = api.get(f"{P}/resources").json()
    assert res["granted"] == {"CPU": 3.0} and res["free"] == {"CPU": 1.0, "GPU": 1.0}
    assert set(res["jobs"]) == {str(big)}

    # The big job ends: the urgent one and then the lacking one start, the small one and the GPU job
    # (its 0.1 CPU) now lack CPU.
    api.post(f"{P}/jobs/{big}/stop")
    assert [c[0] for c in api.starts.calls] == [big, urgent, lacking]
    queue = [(e["job_id"], e["pending"]["text"]) for e in api.get(f"{P}/queue").json()["entries"]]
    assert queue == [(held, "held"), (small, "needs 1 CPU, 0 free"), (gpu, "needs 0.1 CPU, 0 free")]
    health = api.get(f"{P}/health").json()
    assert health["jobs"] == {"QUEUED": 2, "HELD": 1, "STARTING": 0, "RUNNING": 2, "STOPPING": 0}


def test_the_queue_comes_a_page_at_a_time_and_the_pages_make_the_whole_queue(make_api):
    api = make_api({"CPU": 2.0})
    api.submit(per_worker={"CPU": 2})  # runs: everything after it waits
    ids = [api.submit(per_worker={"CPU": 1}, hold=i % 3 == 0, priority=i % 2, name=f"w{i}")["id"] for i in range(9)]
    whole = api.service.queue()
    assert sorted(p.job_id for p in whole) == sorted(ids)
    entries, offset = [], 0
    while offset is not None:
        page = api.get(f"{P}/queue", params={"offset": offset, "limit": 4}).json()
        assert page["total"] == 9 and len(page["entries"]) <= 4
        entries += page["entries"]
        offset = page["next_offset"]
    assert len(entries) == 9
    assert [(e["job_id"], e["pending"]["position"], e["pending"]["text"]) for e in entries] == [
        (p.job_id, p.position, p.describe()) for p in whole
    ]
    names = {j: f"w{i}" for i, j in enumerate(ids)}
    assert all(e["name"] == names[e["job_id"]] for e in entries)
    assert api.get(f"{P}/queue", params={"offset": 9}).json() == {"entries": [], "next_offset": None, "total": 9}
    assert api.get(f"{P}/queue", params={"limit": 0}).status_code == 422


def test_the_dashboards_queue_page_shows_a_page_and_links_the_others(make_api, monkeypatch):
    monkeypatch.setattr(_dashboard, "QUEUE_PAGE", 2)
    api = make_api({"CPU": 1.0})
    api.submit()  # runs
    ids = [api.submit(name=f"w{i}")["id"] for i in range(5)]

    def shown(offset: int) -> tuple[list[int], str]:
        html = api.get("/queue", params={"offset": offset}).text
        rows = re.findall(r'<tr><td>\d+</td><td><a href="/jobs/(\d+)">', html)
        return [int(r) for r in rows], re.search(r"<p class=pages>(.*?)</p>", html).group(1)

    jobs, pages = shown(0)
    assert jobs == ids[:2] and pages.startswith("1-2 of 5 waiting jobs") and "next" in pages and "previous" not in pages
    jobs, pages = shown(2)
    assert jobs == ids[2:4] and "offset=0" in pages and "offset=4" in pages
    jobs, pages = shown(4)
    assert jobs == ids[4:] and pages.startswith("5-5 of 5") and "next" not in pages


# -- 5. logs ---------------------------------------------------------------------------------------


def _expected_tail(data: bytes, n: int) -> int:
    """Reference: byte offset where the last ``n`` lines begin (a last line may lack its newline)."""
    if n == 0:
        return len(data)
    starts = [0] + [i + 1 for i, b in enumerate(data) if b == 0x0A and i + 1 < len(data)]
    return starts[-n] if n <= len(starts) else 0


def _write_log(api: Api, jid: int, data: bytes) -> None:
    with open(os.path.join(api.service.job_dir(jid), OUTPUT_FILE), "wb") as f:
        f.write(data)


def test_logs_offset_and_tail_on_a_small_file(api):
    jid = api.submit(hold=True)["id"]
    empty = api.get(f"{P}/jobs/{jid}/logs").json()
    assert (empty["text"], empty["offset"], empty["next_offset"], empty["size"]) == ("", 0, 0, 0)
    data = b"".join(f"line {i}\n".encode() for i in range(10))
    _write_log(api, jid, data)

    def logs(**params):
        r = api.get(f"{P}/jobs/{jid}/logs", params=params)
        assert r.status_code == 200, r.text
        return r.json()

    whole = logs()
    assert (
        whole["text"] == data.decode()
        and whole["offset"] == 0
        and whole["next_offset"] == whole["size"] == len(data)
    )
    assert whole["path"] == os.path.join(api.service.job_dir(jid), OUTPUT_FILE)
    tail3 = logs(tail=3)
    assert tail3["text"] == "line 7\nline 8\nline 9\n"
    assert tail3["offset"] == len(data) - len(tail3["text"]) and tail3["next_offset"] == len(data)
    assert logs(tail=0)["text"] == "" and logs(tail=0)["offset"] == len(data)
    assert logs(tail=100)["text"] == data.decode()
    assert logs(offset=7)["text"] == data[7:].decode()
    assert logs(offset=7, tail=1)["offset"] == 7  # an explicit offset wins
    beyond = logs(offset=10**6)
    assert beyond["text"] == "" and beyond["offset"] == beyond["next_offset"] == len(data)
    _write_log(api, jid, b"a\nb\nc")
    assert logs(tail=2)["text"] == "b\nc"
    assert logs(tail=1)["text"] == "c"
    _write_log(api, jid, b"\n\n")
    assert logs(tail=1)["text"] == "\n" and logs(tail=2)["text"] == "\n\n"
    assert logs(rank=0)["text"] == "" and logs(rank=0)["path"] is None  # no run yet: no worker logs
    for bad in ({"tail": -1}, {"offset": -1}, {"rank": -1}):
        assert api.get(f"{P}/jobs/{jid}/logs", params=bad).status_code == 422


@pytest.mark.parametrize("trailing_newline", [True, False])
def test_logs_tail_on_a_file_larger_than_a_block(api, trailing_newline):
    jid = api.submit(hold=True)["id"]
    lines = [f"{i:06d} ".encode() + b"x" * (i % 97) + b"\n" for i in range(1500)]
    lines.insert(700, b"L" * 70_000 + b"\n")  # one line longer than the 64 KiB block
    data = b"".join(lines)
    if not trailing_newline:
        data = data[:-1]
    assert len(data) > 2 * 65536
    _write_log(api, jid, data)
    for n in (1, 2, 3, 500, 799, 800, 801, 802, 1500, 1501, 1502, 5000):
        r = api.get(f"{P}/jobs/{jid}/logs", params={"tail": n}).json()
        want = _expected_tail(data, n)
        assert r["offset"] == want, (n, r["offset"], want)
        assert r["text"] == data[want:].decode() and r["next_offset"] == r["size"] == len(data)


def test_logs_are_read_in_chunks_of_at_most_a_mebibyte(api):
    jid = api.submit(hold=True)["id"]
    data = b"y" * 1023 + b"\n"
    data = data * 1500  # 1.5 MiB
    _write_log(api, jid, data)
    first = api.get(f"{P}/jobs/{jid}/logs").json()
    assert first["offset"] == 0 and first["next_offset"] == len(first["text"]) == 1 << 20
    rest = api.get(f"{P}/jobs/{jid}/logs", params={"offset": first["next_offset"]}).json()
    assert rest["next_offset"] == rest["size"] == len(data)
    assert (first["text"] + rest["text"]).encode() == data


# -- 6. server-sent events -------------------------------------------------------------------------


def test_events_stream_from_after_and_last_event_id(api):
    ids = [api.submit(hold=True, name=f"e{i}")["id"] for i in range(3)]
    reply = read_sse(api.app, f"{P}/events", query={"after": 0}, max_events=3)
    assert reply.error is None and reply.status == 200
    assert reply.headers["content-type"].startswith("text/event-stream")
    events = reply.events
    assert [e["id"] for e in events] == ["1", "2", "3"]
    assert [e["event"] for e in events] == ["submitted"] * 3
    data = [json.loads(e["data"]) for e in events]
    assert [d["job_id"] for d in data] == ids and [d["seq"] for d in data] == [1, 2, 3]
    assert data[0]["payload"] == {"state": "HELD", "name": "e0", "priority": 0}

    resumed = read_sse(
        api.app, f"{P}/events", query={"after": 0}, headers={"Last-Event-ID": "2"}, max_events=1
    )
    assert [e["id"] for e in resumed.events] == ["3"]  # Last-Event-ID wins over ?after=


def test_events_stream_follows_new_events(api):
    first = api.submit(hold=True)["id"]
    made: list[int] = []

    def on_event(event: dict[str, str]) -> None:
        if not made:  # the stream is open and has sent the first event: make another
            job, _ = api.service.submit(name="live", spec={"kind": "script", "path": "a.py"}, hold=True)
            made.append(job.id)

    reply = read_sse(api.app, f"{P}/events", query={"after": 0}, max_events=2, on_event=on_event)
    data = [json.loads(e["data"]) for e in reply.events]
    assert [(d["job_id"], d["type"]) for d in data] == [(first, "submitted"), (made[0], "submitted")]
    assert not reply.complete  # it ended because the client went away


def test_streams_read_the_store_off_the_event_loop(api):
    """The store lends a few reader connections to whichever thread reads: an SSE stream's polls run
    on the event loop, so they must read in a thread (the loop never waits for a connection that the
    HTTP threads hold)."""
    jid = api.submit(hold=True)["id"]
    assert api.post(f"{P}/jobs/{jid}/stop").status_code == 200  # ended: its streams end by themselves
    readers = api.service.store.readers
    lend, borrowers = readers.lend, []

    @contextlib.contextmanager
    def recording_lend() -> Any:
        borrowers.append(threading.current_thread())
        with lend() as conn:
            yield conn

    readers.lend = recording_lend  # type: ignore[method-assign]
    for path, query in ((f"{P}/events", {"after": 0}), (f"{P}/jobs/{jid}/stream", None),
                        (f"{P}/jobs/{jid}/logs/stream", None)):  # fmt: skip
        reply = read_sse(api.app, path, query=query, max_events=2)  # its event loop runs in this thread
        assert reply.status == 200 and reply.events, path
    assert borrowers and threading.current_thread() not in borrowers


def test_job_stream_of_an_ended_job_replays_its_events_and_ends(api):
    jid = api.submit(hold=True)["id"]
    lines = [
        {"type": "run_start", "name": "r", "run_path": "/tmp/r"},
        {"type": "report", "index": 0, "metrics": {"loss": 0.5}},
        {"type": "report", "index": 1, "metrics": {"loss": float("nan")}},
    ]
    with open(os.path.join(api.service.job_dir(jid), EVENTS_FILE), "w") as f:
        f.write("".join(json.dumps(e) + "\n" for e in lines) + "not json\n" + '{"type": "partial"')
    api.post(f"{P}/jobs/{jid}/stop")
    reply = read_sse(api.app, f"{P}/jobs/{jid}/stream")
    assert reply.error is None and reply.complete and reply.status == 200
    events = reply.events
    assert [e["event"] for e in events] == ["run_start", "report", "report", "end"]
    assert json.loads(events[2]["data"])["metrics"] == {"loss": "nan"}
    assert json.loads(events[-1]["data"])["state"] == "STOPPED"
    sizes = [len((json.dumps(e) + "\n").encode()) for e in lines]
    assert [int(e["id"]) for e in events[:3]] == [sum(sizes[:1]), sum(sizes[:2]), sum(sizes[:3])]
    resumed = read_sse(api.app, f"{P}/jobs/{jid}/stream", headers={"Last-Event-ID": events[0]["id"]})
    assert [e["event"] for e in resumed.events] == ["report", "report", "end"]
    metrics = api.get(f"{P}/jobs/{jid}/metrics", params={"after": 0}).json()
    assert [(r["seq"], r["run"], r["metrics"]) for r in metrics["reports"]] == [(1, "r", {"loss": "nan"})]


def test_log_stream_of_an_ended_job_sends_the_text_and_ends(api):
    jid = api.submit(hold=True)["id"]
    _write_log(api, jid, b"one\ntwo\nthree\n")
    api.post(f"{P}/jobs/{jid}/stop")
    reply = read_sse(api.app, f"{P}/jobs/{jid}/logs/stream", query={"tail": 2})
    assert reply.error is None and reply.complete and reply.status == 200
    events = reply.events
    assert [e["event"] for e in events] == ["log", "end"]
    assert json.loads(events[0]["data"]) == {"text": "two\nthree\n"} and events[0]["id"] == "14"
    assert json.loads(events[1]["data"])["state"] == "STOPPED"


# -- 7. parse_resources ----------------------------------------------------------------------------


def test_parse_resources():
    assert parse_resources("CPU=8,GPU=2,memory=32G") == {"CPU": 8.0, "GPU": 2.0, "memory": 32e9}
    assert parse_resources(" CPU = 0.5 , memory=1Gi,disk=2TB ,") == {
        "CPU": 0.5,
        "memory": 2.0**30,
        "disk": 2e12,
    }
    assert parse_resources("memory=512Mi,x=3k") == {"memory": 512 * 2.0**20, "x": 3e3}
    assert parse_resources("") == {}


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("CPU", "KIND=AMOUNT"),
        ("=4", "KIND=AMOUNT"),
        ("CPU=eight", "is not a number"),
        ("CPU=", "is not a number"),
        ("CPU=-1", "finite number >= 0"),
        ("CPU=inf", "finite number >= 0"),
        ("CPU=nan", "finite number >= 0"),
        ("memory=1e400", "finite number >= 0"),
    ],
)
def test_parse_resources_errors(text, words):
    with pytest.raises(ValueError, match=words):
        parse_resources(text)
