"""Model serving (trainforge.serve): the engine's batching, errors and swaps with in-memory sources; the
HTTP app through a real uvicorn on 127.0.0.1; a registry-served model whose alias moves under load; the
``trainforge serve`` command in a subprocess."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import threading
from typing import Any

import httpx
import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st
from modelutil import affine_model

from trainforge.serve import ModelServer, ServeConfig
from trainforge.serve._encode import split_outputs
from trainforge.serve._engine import ServeEngine, ServeError
from trainforge.serve._source import ModelInfo, ModelSource, RegistrySource, StaticSource, split_registry

TOKEN = "s3cret-token-0123456789"


class Scale:
    """model(xs) = [x * factor]; raises on a negative instance; records each call's batch size."""

    def __init__(self, factor: float, gate: threading.Event | None = None):
        self.factor = factor
        self.calls: list[int] = []
        self.gate = gate  # a call waits for it (to hold a batch in flight)
        self.entered = threading.Event()

    def __call__(self, xs: list[Any]) -> list[Any]:
        self.calls.append(len(xs))
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(30), "the test never opened the gate"
        if any(x < 0 for x in xs):
            raise ValueError(f"negative input in {xs}")
        return [x * self.factor for x in xs]


class MovingSource(ModelSource):
    """Versions of an in-memory model; ``move(v)`` is an alias move; ``load_gate`` holds loads."""

    def __init__(self, models: dict[int, Any], version: int = 1):
        self.models = models
        self.version = version
        self.loads: list[int] = []
        self.load_gate: threading.Event | None = None
        self.loading = threading.Event()
        self.fail_load: set[int] = set()

    def describe(self) -> str:
        return "m@prod (fake)"

    def move(self, version: int) -> None:
        self.version = version

    def resolve(self) -> ModelInfo:
        return ModelInfo("m", self.version, f"models:/m/{self.version}")

    def load(self, info: ModelInfo) -> Any:
        self.loads.append(info.version)
        self.loading.set()
        if self.load_gate is not None:
            assert self.load_gate.wait(30)
        if info.version in self.fail_load:
            raise OSError(f"blob of version {info.version} is corrupt")
        return self.models[info.version]


def _engine(source: ModelSource, **kw: Any) -> ServeEngine:
    kw.setdefault("poll_s", 0)
    return ServeEngine(source, **kw)


async def _post(engine: ServeEngine, inputs: Any) -> tuple[int, dict[str, Any]]:
    status, body = await engine.handle(json.dumps({"inputs": inputs}).encode())
    return status, json.loads(body)


def _nested(depth: int) -> bytes:
    """A predict body whose one instance nests ``depth - 2`` lists (``depth`` levels with the body's
    object and its "inputs" list)."""
    return b'{"inputs": [' + b"[" * (depth - 2) + b"1" + b"]" * (depth - 2) + b"]}"


# -- configuration ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"port": -1}, "port"),
        ({"port": True}, "port"),
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"max_batch_size": 2.5}, "max_batch_size"),
        ({"max_batch_wait_ms": -1}, "max_batch_wait_ms"),
        ({"max_batch_wait_ms": float("nan")}, "max_batch_wait_ms"),
        ({"poll_s": -0.5}, "poll_s"),
        ({"max_request_instances": 0}, "max_request_instances"),
        ({"stats_window_s": 0}, "stats_window_s"),
        ({"host": "0.0.0.0"}, "host"),
        ({"token": "short"}, "token"),
        ({"model": ""}, "model"),
        ({"allowed_hosts": "example.com"}, "allowed_hosts"),
        ({"max_body_bytes": 0}, "max_body_bytes"),
    ],
)
def test_config_rejects_bad_values(kwargs, field):
    with pytest.raises(ValueError, match=f"ServeConfig.{field}"):
        ServeConfig(**kwargs)


def test_config_non_loopback_with_token_and_sources():
    assert ServeConfig(host="0.0.0.0", token=TOKEN).token == TOKEN
    with pytest.raises(ValueError, match="ServeEngine.max_batch_size"):
        ServeEngine(StaticSource(Scale(1)), max_batch_size=0)
    with pytest.raises(TypeError, match="callable"):
        StaticSource(42)  # type: ignore[arg-type]
    assert split_registry("models:/m@prod?registry=/tmp/r", None) == ("models:/m@prod", "/tmp/r")
    with pytest.raises(ValueError, match="registry"):
        split_registry("models:/m@prod?registry=/tmp/r", "/other")
    assert RegistrySource("models:/m@prod").follows and RegistrySource("models:/m").follows
    assert not RegistrySource("models:/m/3").follows


# -- the engine -------------------------------------------------------------------------------------
def test_batches_are_split_back_per_request():
    model = Scale(2)

    async def main() -> list[tuple[int, dict[str, Any]]]:
        engine = _engine(StaticSource(model, name="m", version=7), max_batch_size=4, max_batch_wait_ms=200)
        await engine.start()
        try:
            return await asyncio.gather(*(_post(engine, [i]) for i in range(10)))
        finally:
            await engine.stop()

    results = asyncio.run(main())
    assert [r for r in results] == [(200, {"outputs": [2 * i], "model": {"name": "m", "version": 7,
                                                                          "uri": "models:/m/7"}}) for i in range(10)]  # fmt: skip
    assert sum(model.calls) == 10 and max(model.calls) <= 4 and len(model.calls) < 10, model.calls


def test_large_request_runs_alone_in_chunks_and_limits():
    model = Scale(1)

    async def main() -> None:
        engine = _engine(StaticSource(model), max_batch_size=4, max_batch_wait_ms=0, max_request_instances=10)
        await engine.start()
        try:
            status, out = await _post(engine, list(range(10)))
            assert status == 200 and out["outputs"] == list(range(10))
            assert model.calls == [4, 4, 2]
            status, out = await _post(engine, list(range(11)))
            assert status == 413 and "11 instances" in out["detail"] and "(10)" in out["detail"]
            assert (await engine.predict([3]))["outputs"] == [3]
            with pytest.raises(ServeError) as err:
                await engine.predict("nope")  # type: ignore[arg-type]
            assert err.value.status == 422
        finally:
            await engine.stop()

    asyncio.run(main())


def test_one_bad_instance_fails_only_its_own_request():
    gate = threading.Event()
    model = Scale(3, gate)

    async def main() -> None:
        engine = _engine(StaticSource(model), max_batch_size=64, max_batch_wait_ms=0)
        await engine.start()
        try:
            first = asyncio.ensure_future(_post(engine, [100]))  # holds the worker: the rest queue up behind it
            await asyncio.get_running_loop().run_in_executor(None, model.entered.wait, 30)
            rest = [asyncio.ensure_future(_post(engine, [x])) for x in (1, 2, -5, 4)]
            await asyncio.sleep(0)  # let them queue (they are already scheduled: no waiting on time)
            gate.set()
            assert await first == (200, {"outputs": [300], "model": {"name": "model", "version": 1,
                                                                    "uri": "models:/model/1"}})  # fmt: skip
            answers = await asyncio.gather(*rest)
            assert [a[0] for a in answers] == [200, 200, 422, 200]
            assert [a[1]["outputs"] for i, a in enumerate(answers) if i != 2] == [[3], [6], [12]]
            assert "ValueError: negative input in [-5]" in answers[2][1]["detail"]
            stats = engine.stats()
            assert stats["retried_batches"] == 1 and stats["errors"] == {"422": 1} and stats["ok"] == 4
            assert model.calls == [1, 4, 1, 1, 1, 1]  # the batch of four, then each request alone
        finally:
            await engine.stop()

    asyncio.run(main())


@pytest.mark.parametrize(
    "body, status, reason",
    [
        (b"not json", 400, "not JSON"),
        (b"\xff\xfe", 400, "not JSON"),
        (b"[1, 2]", 422, "JSON array"),
        (b'{"instances": [1]}', 422, 'no "inputs"'),
        (b'{"inputs": 3}', 422, '"inputs" is a JSON number'),
        (b'{"inputs": {"a": 1}}', 422, '"inputs" is a JSON object'),
        (b'{"inputs": []}', 422, "empty"),
        (b'{"inputs": ["x"]}', 422, "TypeError"),  # the model raises on a string
        (_nested(3000), 400, "deeper than 100 levels"),  # past what json.loads can decode
        (_nested(150), 400, "deeper than 100 levels"),  # decodes, but no walk of it should have to recurse so far
        (b'{"inputs": ["' + b"[" * 3000 + b'"]}', 422, "TypeError"),  # brackets in a string are text
        (_nested(100), 422, "TypeError"),  # at the limit: the model gets it (and raises on a list)
    ],
)
def test_bad_bodies_get_4xx_with_the_reason(body, status, reason):
    async def main() -> tuple[int, bytes]:
        engine = _engine(StaticSource(Scale(1)))
        await engine.start()
        try:
            return await engine.handle(body)
        finally:
            await engine.stop()

    got, out = asyncio.run(main())
    assert got == status and reason in json.loads(out)["detail"]


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab,:'),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(alphabet='[]{}"\\a'), inner, max_size=3),
    max_leaves=30,
)


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    return 0


@given(_json_values, st.integers(0, 8), st.booleans())
def test_the_depth_of_a_body_is_measured_as_decoding_it_would(value, limit, ascii_only):
    """Brackets inside strings (escaped quotes and backslashes included) are text, not levels."""
    from trainforge._internal.json_depth import body_too_deep, value_too_deep

    body = json.dumps(value, ensure_ascii=ascii_only).encode()
    assert body_too_deep(body, limit) == value_too_deep(value, limit) == (_depth(value) > limit)


def test_outputs_become_json():
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    assert split_outputs(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), 2) == [[1.0, 2.0], [3.0, 4.0]]
    assert split_outputs(np.array([1, 2]), 2) == [1, 2]
    assert split_outputs({"label": torch.tensor([1, 0]), "p": np.array([0.5, 0.25])}, 2) == [
        {"label": 1, "p": 0.5}, {"label": 0, "p": 0.25}]  # fmt: skip
    assert split_outputs([np.float32(1.5), torch.tensor(2)], 2) == [1.5, 2]
    for bad, n in ((torch.tensor(1.0), 1), (torch.zeros(3, 2), 2), ([1], 2), ("x", 1)):
        with pytest.raises(ValueError, match="one output per instance"):
            split_outputs(bad, n)

    class Odd:
        def __call__(self, xs: list[Any]) -> Any:
            return [float("nan") if x == 0 else (object() if x == 1 else x) for x in xs]

    async def main() -> list[tuple[int, dict[str, Any]]]:
        engine = _engine(StaticSource(Odd()))
        await engine.start()
        try:
            return [await _post(engine, [0, 2]), await _post(engine, [1])]
        finally:
            await engine.stop()

    nan, obj = asyncio.run(main())
    assert nan == (200, {"outputs": [None, 2], "model": {"name": "model", "version": 1, "uri": "models:/model/1"}})
    assert obj[0] == 422 and "not JSON" in obj[1]["detail"]


def test_trainforge_model_without_preprocess_gets_a_tensor():
    torch = pytest.importorskip("torch")
    from trainforge.model import Model

    class Lin(Model):
        def setup(self, config):
            net = torch.nn.Linear(2, 1)
            with torch.no_grad():
                net.weight.copy_(torch.tensor([[1.0, 10.0]]))
                net.bias.zero_()
            self.register(models=net)

    async def main() -> list[tuple[int, dict[str, Any]]]:
        engine = _engine(StaticSource(Lin()))
        await engine.start()
        try:
            return [await _post(engine, [[1, 2], [3, 4]]), await _post(engine, [[1, 2, 3]]), await _post(engine, [[1], [2, 3]])]
        finally:
            await engine.stop()

    ok, wrong_shape, ragged = asyncio.run(main())
    assert ok[0] == 200 and ok[1]["outputs"] == [[21.0], [43.0]]
    assert wrong_shape[0] == 422 and "shapes cannot be multiplied" in wrong_shape[1]["detail"]
    assert ragged[0] == 422 and "has no preprocess()" in ragged[1]["detail"]


def test_swap_between_batches_the_old_version_finishes_its_batch():
    gate = threading.Event()
    v1, v2 = Scale(1, gate), Scale(100)
    source = MovingSource({1: v1, 2: v2})

    async def main() -> None:
        engine = _engine(source, max_batch_wait_ms=0)
        await engine.start()
        try:
            held = asyncio.ensure_future(_post(engine, [5]))  # in flight on version 1
            await asyncio.get_running_loop().run_in_executor(None, v1.entered.wait, 30)
            queued = asyncio.ensure_future(_post(engine, [6]))
            source.move(2)
            assert await engine.refresh() is True  # loaded and swapped while version 1's batch runs
            assert engine.current is not None and engine.current.version == 2
            gate.set()
            s1, out1 = await held
            s2, out2 = await queued
            assert (s1, out1["outputs"], out1["model"]["version"]) == (200, [5], 1)
            assert (s2, out2["outputs"], out2["model"]["version"]) == (200, [600], 2)
            assert await engine.refresh() is False  # nothing new
            stats = engine.stats()
            assert stats["swaps"] == 1 and stats["current_version"] == 2 and stats["errors"] == {}
            assert stats["swap_history"][0]["from"] == 1 and stats["swap_history"][0]["to"] == 2
        finally:
            await engine.stop()

    asyncio.run(main())


def test_requests_are_answered_while_the_new_version_loads_and_a_failed_load_keeps_the_old():
    source = MovingSource({1: Scale(1), 2: Scale(2), 3: Scale(3)})
    source.fail_load.add(2)
    events: list[str] = []

    async def main() -> None:
        engine = _engine(source, on_event=events.append)
        await engine.start()
        try:
            source.move(2)
            assert await engine.refresh() is False
            assert "cannot load models:/m/2: OSError: blob of version 2 is corrupt" in engine.stats()["last_error"]
            assert (await _post(engine, [1]))[1]["model"]["version"] == 1
            assert await engine.refresh() is False and source.loads == [1, 2]  # backing off: not retried at once
            source.move(3)
            source.load_gate = threading.Event()
            source.loading.clear()
            refreshing = asyncio.ensure_future(engine.refresh())
            await asyncio.get_running_loop().run_in_executor(None, source.loading.wait, 30)
            assert engine.stats()["loading"] == "models:/m/3"
            for i in range(5):  # version 1 answers while version 3 loads
                assert await _post(engine, [i]) == (200, {"outputs": [i], "model": {"name": "m", "version": 1,
                                                                                    "uri": "models:/m/1"}})  # fmt: skip
            source.load_gate.set()
            assert await refreshing is True
            assert (await _post(engine, [2]))[1] == {"outputs": [6], "model": {"name": "m", "version": 3,
                                                                               "uri": "models:/m/3"}}  # fmt: skip
            assert engine.stats()["last_error"] is None
        finally:
            await engine.stop()

    asyncio.run(main())
    assert any("now serving models:/m/3" in e for e in events), events


def test_start_fails_with_503_when_the_model_cannot_load():
    source = MovingSource({1: Scale(1)})
    source.fail_load.add(1)

    async def main() -> None:
        engine = _engine(source)
        with pytest.raises(ServeError, match="cannot load m@prod .fake.: OSError") as err:
            await engine.start()
        assert err.value.status == 503
        status, body = await engine.handle(b'{"inputs": [1]}')
        assert status == 503 and "not running" in json.loads(body)["detail"]

    asyncio.run(main())


# -- over HTTP (uvicorn on 127.0.0.1) --------------------------------------------------------------
def test_http_predict_model_stats_health_and_limits():
    config = ServeConfig(port=0, max_batch_wait_ms=1, max_body_bytes=2000, max_request_instances=50)
    with ModelServer(config, source=StaticSource(Scale(2), name="digits", version=3)) as server:
        assert server.url is not None and server.url.startswith("http://127.0.0.1:")
        with httpx.Client(base_url=server.url) as c:
            r = c.post("/v1/predict", json={"inputs": [1, 2]})
            assert r.status_code == 200
            assert r.json() == {"outputs": [2, 4], "model": {"name": "digits", "version": 3, "uri": "models:/digits/3"}}
            r = c.post("/v1/predict", content=b"{", headers={"Content-Type": "application/json"})
            assert r.status_code == 400 and "not JSON" in r.json()["detail"]
            r = c.post("/v1/predict", json={"inputs": [0] * 1000})
            assert r.status_code == 413 and "2000 bytes" in r.json()["detail"]
            r = c.post("/v1/predict", json={"inputs": [-1]})
            assert r.status_code == 422 and "negative input" in r.json()["detail"]
            r = c.get("/v1/model")
            assert r.json()["version"] == 3 and r.json()["max_batch_size"] == 32
            stats = c.get("/v1/stats").json()
            assert stats["requests"] == 4 and stats["ok"] == 1 and stats["errors"] == {"400": 1, "413": 1, "422": 1}
            assert stats["latency_ms"]["p50"] is not None and stats["throughput_rps"] > 0
            assert stats["current_version"] == 3 and stats["batch_sizes"] == {"1": 1, "2": 1}
            assert c.get("/healthz").json() == {"status": "ok", "model": {"name": "digits", "version": 3,
                                                                          "uri": "models:/digits/3"}}  # fmt: skip
            r = c.get("/v1/stats", headers={"Host": "evil.example:80"})
            assert r.status_code == 403 and "evil.example" in r.json()["detail"]
            assert c.get("/v1/openapi.json").json()["paths"]["/v1/predict"]["post"]["responses"]["413"]


def test_http_a_deeply_nested_body_is_a_400_counted_in_the_stats():
    with ModelServer(ServeConfig(port=0), source=StaticSource(Scale(2))) as server, \
            httpx.Client(base_url=server.url) as c:  # fmt: skip
        for depth in (3000, 150):
            r = c.post("/v1/predict", content=_nested(depth), headers={"Content-Type": "application/json"})
            assert r.status_code == 400 and "deeper than 100 levels" in r.json()["detail"], r.text
        assert c.post("/v1/predict", json={"inputs": [1]}).json()["outputs"] == [2]  # and it goes on serving
        stats = c.get("/v1/stats").json()
        assert stats["requests"] == 3 and stats["errors"] == {"400": 2} and stats["ok"] == 1


def test_http_token():
    config = ServeConfig(port=0, token=TOKEN)
    with ModelServer(config, source=StaticSource(Scale(1))) as server, httpx.Client(base_url=server.url) as c:
        r = c.post("/v1/predict", json={"inputs": [1]})
        assert r.status_code == 401 and "Authorization: Bearer" in r.json()["detail"]
        r = c.post("/v1/predict", json={"inputs": [1]}, headers={"Authorization": "Bearer " + "x" * len(TOKEN)})
        assert r.status_code == 401
        r = c.post("/v1/predict", json={"inputs": [1]}, headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200 and r.json()["outputs"] == [1]
        assert c.get("/healthz").status_code == 200  # probes need no token


def test_http_posts_are_json_from_no_other_origin():
    """The train server's guard: a CORS-simple POST (text/plain, a form) or one from another origin
    (another port of this host included) never reaches the model."""
    with ModelServer(ServeConfig(port=0), source=StaticSource(Scale(1))) as server, \
            httpx.Client(base_url=server.url) as c:  # fmt: skip
        for content_type in ("text/plain", "application/x-www-form-urlencoded"):
            r = c.post("/v1/predict", content=b'{"inputs": [1]}', headers={"Content-Type": content_type})
            assert r.status_code == 415 and "application/json" in r.json()["detail"], r.text
        r = c.post("/v1/predict", json={"inputs": [1]}, headers={"Origin": "http://127.0.0.1:9999"})
        assert r.status_code == 403 and "127.0.0.1:9999" in r.json()["detail"]
        r = c.post("/v1/predict", json={"inputs": [1]}, headers={"Origin": server.url})
        assert r.status_code == 200 and r.json()["outputs"] == [1]
        assert c.get("/v1/stats").json()["requests"] == 1  # the refused ones never reached the engine


def test_cli_takes_the_token_from_a_file_or_the_environment_never_argv(tmp_path, capsys, monkeypatch):
    from trainforge._cli import main
    from trainforge.serve._config import ENV_SERVE_TOKEN

    assert main(["serve", "models:/m@prod", "--token", TOKEN, "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "--token is not taken" in err and "ps" in err and "--token-file" in err and TOKEN not in err
    assert main(["serve", "models:/m@prod", "--host", "0.0.0.0", "--token-file", str(tmp_path / "none")]) == 2
    assert "cannot read --token-file" in capsys.readouterr().err
    # From the environment: a non-loopback host is accepted (the config got the token), then the
    # missing model is what stops it.
    monkeypatch.setenv(ENV_SERVE_TOKEN, TOKEN)
    assert main(["serve", "models:/m@prod", "--host", "0.0.0.0", "--port", "0",
                 "--registry", str(tmp_path / "empty")]) == 1  # fmt: skip
    err = capsys.readouterr().err
    assert "not a loopback address" not in err and "cannot serve models:/m@prod" in err


def test_cli_max_body_sets_the_guards_limit_in_sizes_with_units(capsys, monkeypatch):
    from trainforge._cli import main

    served: list[ServeConfig] = []
    monkeypatch.setattr("trainforge.serve._server.serve", lambda config, announce: served.append(config))
    assert main(["serve", "models:/m@prod", "--max-body", "1Mi"]) == 0
    assert main(["serve", "models:/m@prod"]) == 0
    assert [c.max_body_bytes for c in served] == [2**20, 64 * 2**20]  # the train server's default too
    with pytest.raises(SystemExit):
        main(["serve", "models:/m@prod", "--max-body", "lots"])
    assert "size 'lots'" in capsys.readouterr().err


def test_http_a_chunked_body_over_the_limit_is_cut_and_counted():
    config = ServeConfig(port=0, max_batch_wait_ms=1, max_body_bytes=2000)

    def chunks():
        yield b'{"inputs": ['
        for _ in range(100):
            yield b"1, " * 30
        yield b"1]}"

    with ModelServer(config, source=StaticSource(Scale(2))) as server, httpx.Client(base_url=server.url) as c:
        r = c.post("/v1/predict", content=chunks(), headers={"Content-Type": "application/json"})
        assert r.status_code == 413 and "2000 bytes" in r.json()["detail"] and "Content-Length" in r.json()["detail"]
        assert c.post("/v1/predict", json={"inputs": [1]}).json()["outputs"] == [2]  # and it goes on serving
        assert c.get("/v1/stats").json()["errors"] == {"413": 1}


def test_http_alias_move_under_load_loses_no_request():
    """Concurrent clients; the source moves to version 2 while they send; the poller picks it up:
    every request is answered 200, and each client's answers switch from version 1 to 2 for good."""
    source = MovingSource({1: Scale(1), 2: Scale(-1)})
    config = ServeConfig(port=0, poll_s=0.05, max_batch_wait_ms=1)
    clients = 6
    running = threading.Barrier(clients + 1, timeout=60)  # every client has had answers: move the alias
    answers: dict[int, list[tuple[int, int]]] = {k: [] for k in range(clients)}  # (status, version)

    def client(url: str, k: int) -> None:
        with httpx.Client(base_url=url) as c:
            for i in range(1, 100_000):
                r = c.post("/v1/predict", json={"inputs": [i]})
                version = r.json()["model"]["version"] if r.status_code == 200 else -1
                answers[k].append((r.status_code, version))
                if r.status_code == 200:
                    assert r.json()["outputs"] == [i if version == 1 else -i]
                if i == 10:
                    running.wait()
                if sum(v == 2 for _, v in answers[k]) >= 10 or r.status_code != 200:
                    return

    with ModelServer(config, source=source) as server:
        threads = [threading.Thread(target=client, args=(server.url, k)) for k in range(clients)]
        for t in threads:
            t.start()
        running.wait()
        source.move(2)
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
        stats = httpx.get(f"{server.url}/v1/stats").json()
    for k, got in answers.items():
        assert {s for s, _ in got} == {200}, (k, [a for a in got if a[0] != 200][:5])
        versions = [v for _, v in got]
        assert versions[:10] == [1] * 10 and versions[-1] == 2 and versions == sorted(versions), (k, versions)
    assert source.loads == [1, 2]
    assert stats["swaps"] == 1 and stats["errors"] == {} and stats["ok"] == sum(len(a) for a in answers.values())


# -- a registered model (trainforge.registry) ------------------------------------------------------


@pytest.fixture
def registry(tmp_path):
    """A registry with model "affine": version 1 (scale 1, alias prod) and version 2 (scale 2)."""
    from trainforge.registry import Registry

    reg = Registry(str(tmp_path / "registry"))
    reg.register("affine", affine_model(1.0).save(str(tmp_path / "v1")), alias="prod")
    reg.register("affine", affine_model(2.0).save(str(tmp_path / "v2")))
    return reg


def test_registry_alias_moved_under_load_no_request_fails(registry):
    config = ServeConfig(model="models:/affine@prod", registry=registry.uri, port=0, poll_s=0.05)
    clients = 6
    running = threading.Barrier(clients + 1, timeout=60)
    answers: dict[int, list[tuple[int, int]]] = {k: [] for k in range(clients)}

    def client(url: str, k: int) -> None:
        with httpx.Client(base_url=url) as c:
            for i in range(1, 100_000):
                r = c.post("/v1/predict", json={"inputs": [[i, 1]]})
                out = r.json()
                version = out["model"]["version"] if r.status_code == 200 else -1
                answers[k].append((r.status_code, version))
                if r.status_code != 200:
                    return
                assert out["outputs"] == [version * (i + 1.0)]
                assert out["model"] == {"name": "affine", "version": version, "uri": f"models:/affine/{version}"}
                if i == 10:
                    running.wait()
                if sum(v == 2 for _, v in answers[k]) >= 10:
                    return

    with ModelServer(config) as server:
        assert httpx.get(f"{server.url}/v1/model").json()["version"] == 1
        threads = [threading.Thread(target=client, args=(server.url, k)) for k in range(clients)]
        for t in threads:
            t.start()
        running.wait()
        registry.set_alias("affine", "prod", 2, by="test")
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
        stats = httpx.get(f"{server.url}/v1/stats").json()
    for k, got in answers.items():
        assert {s for s, _ in got} == {200}, (k, [a for a in got if a[0] != 200][:5])
        versions = [v for _, v in got]
        assert versions[:10] == [1] * 10 and versions[-1] == 2 and versions == sorted(versions), (k, versions)
    assert stats["swaps"] == 1 and stats["current_version"] == 2 and stats["errors"] == {}


def test_registry_pinned_version_and_unknown_model(registry):
    config = ServeConfig(model="models:/affine/2", registry=registry.uri, port=0, poll_s=0.05)
    with ModelServer(config) as server:
        r = httpx.post(f"{server.url}/v1/predict", json={"inputs": [[1, 2], [3, 4]]})
        assert r.json() == {"outputs": [6.0, 14.0], "model": {"name": "affine", "version": 2, "uri": "models:/affine/2"}}
        r = httpx.post(f"{server.url}/v1/predict", json={"inputs": [[1, 2, 3]]})
        assert r.status_code == 422 and "shape" in r.json()["detail"]
        assert httpx.get(f"{server.url}/v1/model").json()["follows"] is False
    with pytest.raises(RuntimeError, match="cannot load models:/nope@prod"):
        ModelServer(ServeConfig(model="models:/nope@prod", registry=registry.uri, port=0)).start()


def test_a_served_version_deleted_elsewhere_answers_404_at_the_next_poll(registry):
    """A fixed version is watched too: deleted by another process's Registry, it is not found here
    either (404 naming it, counted), within one poll; the model in memory is not served on."""
    from trainforge.registry import Registry

    gone = threading.Event()
    config = ServeConfig(model="models:/affine/2", registry=registry.uri, port=0, poll_s=0.05)
    with ModelServer(config, on_event=lambda line: gone.set() if "gone" in line else None) as server:
        assert httpx.post(f"{server.url}/v1/predict", json={"inputs": [[1, 2]]}).status_code == 200
        Registry(registry.uri).delete_version("affine", 2)  # another Registry object: its own caches
        assert gone.wait(10), "the engine never noticed the deletion"
        r = httpx.post(f"{server.url}/v1/predict", json={"inputs": [[1, 2]]})
        assert r.status_code == 404 and "models:/affine/2" in r.json()["detail"], r.text
        stats = httpx.get(f"{server.url}/v1/stats").json()
        assert stats["errors"] == {"404": 1} and "no longer in the registry" in stats["gone"]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_cli_serves_and_stops_on_a_signal(registry, sig):
    cmd = [sys.executable, "-m", "trainforge", "serve", "models:/affine@prod", "--registry", registry.uri,
           "--port", "0", "--max-batch-size", "8"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    url: list[str] = []
    serving = threading.Event()

    def drain() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            m = re.search(r"serving (http://\S+)", line)
            if m:
                url.append(m.group(1))
                serving.set()
        serving.set()

    drainer = threading.Thread(target=drain, daemon=True)
    drainer.start()
    try:
        assert serving.wait(120) and url, "".join(lines)
        r = httpx.post(f"{url[0]}/v1/predict", json={"inputs": [[1, 2]]})
        assert r.json() == {"outputs": [3.0], "model": {"name": "affine", "version": 1, "uri": "models:/affine/1"}}
        assert httpx.get(f"{url[0]}/v1/model").json()["max_batch_size"] == 8
        children = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        proc.send_signal(sig)  # SIGINT: Ctrl-C
        assert proc.wait(30) == 0, "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    drainer.join(10)
    out = "".join(lines)
    assert "resolving models:/affine@prod" in out and "loading models:/affine/1" in out, out
    assert out.rstrip().endswith("trainforge serve: stopped"), out
    assert not [pid for pid in children if psutil.pid_exists(pid)]


def test_cli_reports_a_missing_model_in_one_line(tmp_path, capsys):
    from trainforge._cli import main

    assert main(["serve", "models:/nope@prod", "--registry", str(tmp_path / "empty"), "--port", "0"]) == 1
    err = capsys.readouterr().err
    assert "trainforge serve: cannot serve models:/nope@prod" in err and "Traceback" not in err
    assert main(["serve", "models:/m@prod", "--host", "0.0.0.0"]) == 1
    assert "ServeConfig.host='0.0.0.0' is not a loopback address" in capsys.readouterr().err


def test_stop_answers_what_is_queued_and_refuses_new_requests():
    gate = threading.Event()
    model = Scale(1, gate)

    async def main() -> None:
        engine = _engine(StaticSource(model), max_batch_size=2, max_batch_wait_ms=0)
        await engine.start()
        running = asyncio.ensure_future(_post(engine, [1]))
        await asyncio.get_running_loop().run_in_executor(None, model.entered.wait, 30)
        queued = [asyncio.ensure_future(_post(engine, [x])) for x in (2, 3, 4)]
        await asyncio.sleep(0)  # they queue behind the running batch
        stopping = asyncio.ensure_future(engine.stop())
        await asyncio.sleep(0)
        assert await _post(engine, [5]) == (503, {"detail": "the model server is not running (starting or stopping)"})
        gate.set()
        await stopping
        assert [(await r)[1]["outputs"] for r in (running, *queued)] == [[1], [2], [3], [4]]

    asyncio.run(main())


def test_public_api_and_a_light_import():
    import trainforge.serve

    assert trainforge.serve.__all__ == ["ModelServer", "ServeConfig", "serve"]
    code = ("import sys, trainforge.serve, trainforge._cli as c; c.build_parser()\n"
            "print(sorted(m for m in ('torch', 'fastapi', 'uvicorn', 'ray', 'numpy') if m in sys.modules))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_allowed_hosts():
    import socket

    from trainforge.serve._server import allowed_hosts

    assert allowed_hosts(ServeConfig()) == {"127.0.0.1", "localhost", "::1"}
    assert "models.example" in allowed_hosts(ServeConfig(host="10.1.2.3", token=TOKEN, allowed_hosts=("Models.Example",)))
    wild = allowed_hosts(ServeConfig(host="0.0.0.0", token=TOKEN))
    assert socket.gethostname().lower() in wild and "0.0.0.0" in wild


def test_cli_finds_its_port_taken_before_it_looks_for_the_model(tmp_path, capsys):
    import socket

    from trainforge._cli import main

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        # The registry is empty: a server that looked for the model first would say there is none.
        assert main(["serve", "models:/m@prod", "--port", str(port), "--registry", str(tmp_path / "empty")]) == 1
    out, err = capsys.readouterr()
    assert "resolving" not in out and "loading" not in out, out  # nothing was looked up or loaded
    assert f"127.0.0.1:{port}" in err and "in use" in err, err
