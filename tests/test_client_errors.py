"""The client's exception tree: every error it raises is a ClientError that keeps its built-in base,
and each foreign exception (``http.client``'s, ``socket``'s, ``json``'s) is translated where the
client meets it, the original as ``__cause__``. A tiny HTTP server on 127.0.0.1 plays each failure:
a server that closes the connection, one that answers something else than the API's JSON, one that
never answers."""

from __future__ import annotations

import http.client
import json
import socket
import threading
from collections.abc import Callable, Iterator

import pytest

import trainforge.client as tfc
import trainforge.server
from trainforge.client import (
    BadResponseError,
    Client,
    ClientConfigError,
    ClientError,
    InvalidJobError,
    JobConflictError,
    JobNotFoundError,
    JobStatus,
    JobTimeoutError,
    ServerError,
    ServerNotFoundError,
    ServerTimeoutError,
)

CLOSE = b""  # read the request, answer nothing, close the connection
HANG = None  # read the request, answer nothing until the test ends
Answer = Callable[[str, str], "bytes | None | Callable[[socket.socket, threading.Event], None]"]


def reply(status: int, body: bytes | str, content_type: str = "application/json") -> bytes:
    data = body.encode() if isinstance(body, str) else body
    return (f"HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\nContent-Length: {len(data)}\r\n"
            f"Connection: close\r\n\r\n").encode() + data  # fmt: skip


def job_json(state: str = "RUNNING") -> dict:
    return {"id": 1, "name": "j", "state": state, "priority": 0}


class TinyServer:
    """An HTTP server of one behaviour on 127.0.0.1, a thread per connection: ``answer(method,
    path)`` gives the raw bytes to send (``CLOSE``: none), ``HANG`` (keep the connection open,
    silent, until the test ends) or a function of the socket and the end-of-test event."""

    def __init__(self, answer: Answer):
        self.answer = answer
        self.requests: list[tuple[str, str]] = []
        self.done = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # closed at the end of the test
                return
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            length = next((int(line.split(":")[1]) for line in lines if line.lower().startswith("content-length")), 0)
            while len(body) < length:
                body += conn.recv(65536)
            method, path, _ = lines[0].split(" ", 2)
            self.requests.append((method, path))
            answer = self.answer(method, path)
            if answer is HANG:
                self.done.wait(60)
            elif callable(answer):
                answer(conn, self.done)
            else:
                conn.sendall(answer)

    def close(self) -> None:
        self.done.set()
        self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() (Linux)
        self._listener.close()
        for thread in self._threads:
            thread.join(30)
        assert not any(t.is_alive() for t in self._threads)


@pytest.fixture
def tiny() -> Iterator[Callable[[Answer], TinyServer]]:
    servers: list[TinyServer] = []

    def start(answer: Answer) -> TinyServer:
        servers.append(TinyServer(answer))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def test_the_tree_has_one_root_and_keeps_the_builtin_bases():
    builtin = {ServerNotFoundError: ConnectionError, ServerTimeoutError: TimeoutError, ClientConfigError: ValueError,
               JobTimeoutError: TimeoutError, ServerError: RuntimeError, JobNotFoundError: LookupError,
               InvalidJobError: ValueError}  # fmt: skip
    for cls, base in builtin.items():
        assert issubclass(cls, ClientError) and issubclass(cls, base), cls
    assert issubclass(ServerTimeoutError, ServerNotFoundError)  # submit() retries it as a lost connection
    assert issubclass(BadResponseError, ClientError)
    for cls in (JobNotFoundError, JobConflictError, InvalidJobError):
        assert issubclass(cls, ServerError)
    # every exception class the client exports is in the tree
    exported = [getattr(tfc, n) for n in tfc.__all__ if isinstance(getattr(tfc, n), type)]
    errors = [c for c in exported if issubclass(c, BaseException)]
    assert errors and all(issubclass(c, ClientError) for c in errors)
    # the server's re-exports are the same classes
    assert trainforge.server.ServerError is ServerError and trainforge.server.ServerNotFoundError is ServerNotFoundError


def test_nothing_listening_is_server_not_found_before_sending():
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there any more
    client = Client(f"http://127.0.0.1:{port}", token="t", timeout=5)
    with pytest.raises(ServerNotFoundError, match=r"no train server answers at .* is it running") as info:
        client.health()
    assert info.value.sent is False and not isinstance(info.value, ServerTimeoutError)
    assert isinstance(info.value.__cause__, ConnectionRefusedError)


def test_a_server_that_closes_the_connection_is_server_not_found_after_sending(tiny):
    server = tiny(lambda method, path: CLOSE)
    client = Client(server.address, token="t", timeout=30)
    with pytest.raises(ServerNotFoundError, match="closed the connection before it answered") as info:
        client.job(1).status()
    assert info.value.sent is True and not isinstance(info.value, ServerTimeoutError)
    assert isinstance(info.value.__cause__, (http.client.RemoteDisconnected, ConnectionResetError))
    assert server.requests == [("GET", "/api/v1/jobs/1")]


def test_a_server_that_never_answers_times_out(tiny):
    server = tiny(lambda method, path: HANG)
    client = Client(server.address, token="t", timeout=0.5)
    with pytest.raises(ServerTimeoutError, match=r"did not answer within 0.5 s.*Client\(timeout=") as info:
        client.jobs()
    assert info.value.sent is True
    assert isinstance(info.value, TimeoutError) and isinstance(info.value, ServerNotFoundError)
    assert isinstance(info.value.__cause__, TimeoutError)


@pytest.mark.parametrize(
    "answer, call",
    [
        (reply(200, "<html>hello</html>", "text/html"), lambda c: c.jobs()),
        (reply(200, "<html>hello</html>", "text/html"), lambda c: c.health()),
        (reply(200, json.dumps({"other": 1})), lambda c: c.queue()),
        (reply(200, json.dumps([1, 2])), lambda c: c.submit({"entrypoint": "x"})),
        (reply(200, json.dumps({"id": 1})), lambda c: c.job(1).status()),
        (reply(200, json.dumps({**job_json(), "state": "NEWFANGLED"})), lambda c: c.job(1).status()),
        (reply(200, json.dumps({"text": "x"})), lambda c: list(c.job(1).logs())),
    ],
    ids=["html-jobs", "html-health", "no-entries", "a-list", "no-fields", "unknown-state", "no-log-offsets"],
)
def test_an_answer_that_is_not_the_apis_json_is_a_bad_response(tiny, answer, call):
    server = tiny(lambda method, path: answer)
    with pytest.raises(BadResponseError, match="train server"):
        call(Client(server.address, token="t", timeout=30))


def test_json_that_does_not_parse_is_a_bad_response_caused_by_the_decoder(tiny):
    server = tiny(lambda method, path: reply(200, "{not json"))
    with pytest.raises(BadResponseError, match="is not") as info:
        Client(server.address, token="t", timeout=30).request("GET", "/health")
    assert isinstance(info.value.__cause__, json.JSONDecodeError)


def test_an_answer_that_is_not_http_is_a_bad_response(tiny):
    server = tiny(lambda method, path: b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
    with pytest.raises(BadResponseError, match="not in HTTP") as info:
        Client(server.address, token="t", timeout=30).health()
    assert isinstance(info.value.__cause__, http.client.HTTPException)


def test_an_event_whose_data_is_not_json_is_a_bad_response(tiny):
    stream = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
              b"event: report\ndata: {cut\n\n")  # fmt: skip
    server = tiny(lambda method, path: stream)
    with pytest.raises(BadResponseError, match="an event's data") as info:
        list(Client(server.address, token="t", timeout=30).stream("/jobs/1/stream"))
    assert isinstance(info.value.__cause__, json.JSONDecodeError)


def test_a_report_that_is_not_one_is_a_bad_response(tiny):
    stream = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
              b"event: report\ndata: {\"no\": \"fields\"}\n\n")  # fmt: skip
    server = tiny(lambda method, path: stream)
    with pytest.raises(BadResponseError, match="a report the server sent is not one"):
        list(Client(server.address, token="t", timeout=30).job(1).reports())


@pytest.mark.parametrize(
    "status, cls", [(404, JobNotFoundError), (409, JobConflictError), (422, InvalidJobError), (500, ServerError)]
)
def test_refusals_are_server_errors_naming_the_reason(tiny, status, cls):
    detail = [{"loc": ["body", "priority"], "msg": "too big"}] if status == 422 else "no such thing"
    server = tiny(lambda method, path: reply(status, json.dumps({"detail": detail})))
    with pytest.raises(cls) as info:
        Client(server.address, token="t", timeout=30).job(1).stop()
    assert type(info.value) is cls and info.value.status == status
    assert info.value.detail == ("priority: too big" if status == 422 else "no such thing")


def test_a_refused_request_names_each_field_and_its_problem(tiny):
    # The fields apart from their messages, so a CLI can name its own option; a model validator's
    # pydantic prefix ("Value error, ") and an empty field (the request as a whole) are not shown.
    detail = [{"loc": ["body", "num_workers"], "msg": "Input should be greater than or equal to 1"},
              {"loc": ["body"], "msg": "Value error, max_workers=1 is less than num_workers=2"}]  # fmt: skip
    server = tiny(lambda method, path: reply(422, json.dumps({"detail": detail})))
    with pytest.raises(InvalidJobError) as info:
        Client(server.address, token="t", timeout=30).job(1).stop()
    assert info.value.problems == (("num_workers", "Input should be greater than or equal to 1"),
                                   ("", "max_workers=1 is less than num_workers=2"))  # fmt: skip
    assert info.value.detail == ("num_workers: Input should be greater than or equal to 1; "
                                 "max_workers=1 is less than num_workers=2")  # fmt: skip


@pytest.mark.parametrize(
    "address, token, words",
    [
        ("ftp://127.0.0.1:1", "t", "give an http:// or https:// URL"),
        ("127.0.0.1:8270", "t", "give an http:// or https:// URL"),
        ("http://127.0.0.1:99999", "t", "give a port from 1 to 65535"),
        ("http://127.0.0.1:1", "tok\nen", "characters a token never has"),
    ],
)
def test_a_bad_address_or_token_is_a_config_error(address, token, words):
    with pytest.raises(ClientConfigError, match=words) as info:
        Client(address, token=token)
    assert isinstance(info.value, ValueError)  # what it raised before the tree


def test_waiting_past_the_timeout_is_a_job_timeout(tiny):
    def answer(method: str, path: str):
        if path.startswith("/api/v1/jobs/1/stream"):
            def stream(conn: socket.socket, done: threading.Event) -> None:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
                done.wait(60)  # the job ends when the test does
                conn.sendall(f"event: end\ndata: {json.dumps(job_json('SUCCEEDED'))}\n\n".encode())

            return stream
        return reply(200, json.dumps(job_json()))

    server = tiny(answer)
    with pytest.raises(JobTimeoutError, match=r"job 1 is still RUNNING after 0.3 s") as info:
        Client(server.address, token="t", timeout=30).job(1).wait(timeout=0.3)
    assert isinstance(info.value, TimeoutError)


def test_an_error_while_waiting_with_a_timeout_is_raised_to_the_caller(tiny):
    def answer(method: str, path: str):
        if path.startswith("/api/v1/jobs/1/stream"):
            return reply(404, json.dumps({"detail": "job 1 was deleted"}))
        return reply(200, json.dumps(job_json()))

    server = tiny(answer)
    with pytest.raises(JobNotFoundError, match="job 1 was deleted"):
        Client(server.address, token="t", timeout=30).job(1).wait(timeout=60)


def test_job_status_from_json_names_what_is_missing():
    with pytest.raises(BadResponseError, match="KeyError"):
        JobStatus.from_json({"id": 1})
    assert JobStatus.from_json(job_json()).state == "RUNNING"
