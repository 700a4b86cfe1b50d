"""The train server's model registry API (``/api/v1/models``) and serving route (``/api/v1/serve``)
against a real server process (``--registry``) on 127.0.0.1: listings, aliases and their history,
deleting versions, gc, and the errors (404 unknown, 409 aliased, 422 malformed; never a 500).

One server serves the whole module (each test uses model names of its own); the registry is written
by this process, as a user's ``Registry`` would, and read by the server.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import httpx
import pytest

pytest.importorskip("fastapi")

from modelutil import affine_model  # noqa: E402

from trainforge._testing.server import TrainServer  # noqa: E402
from trainforge.server._config import ServerConfig  # noqa: E402

pytestmark = pytest.mark.slow
P = "/api/v1"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("models-server")
    proc = TrainServer(str(root / "state"), extra=("--registry", str(root / "registry"), "--no-warm")).start()
    yield proc
    left = proc.cleanup()
    assert not left, f"job processes left behind: {left}"
    assert "Traceback" not in proc.output, proc.output  # no request ever failed inside the server


@pytest.fixture(scope="module")
def registry(server):
    from trainforge.registry import Registry

    return Registry(os.path.join(os.path.dirname(server.state_dir), "registry"))


@pytest.fixture(scope="module")
def http(server):
    with open(os.path.join(server.state_dir, "token")) as f:
        token = f.read().strip()
    with httpx.Client(base_url=server.url + P, headers={"Authorization": f"Bearer {token}"}, timeout=120) as c:
        yield c


def _dir(tmp_path, name: str, files: dict[str, bytes]) -> str:
    d = tmp_path / name
    d.mkdir()
    for rel, data in files.items():
        (d / rel).write_bytes(data)
    return str(d)


def _ok(r: httpx.Response, status: int = 200) -> Any:
    assert r.status_code == status, (r.status_code, r.text)
    return r.json() if r.content else None


def test_models_and_versions_are_listed_with_metrics_size_and_files(http, registry, tmp_path):
    v1 = _dir(tmp_path, "v1", {"weights.bin": b"\1" * 1000, "config.json": b"{}"})
    v2 = _dir(tmp_path, "v2", {"weights.bin": b"\2" * 2000, "config.json": b"{}"})
    registry.register("listed", v1, metrics={"acc": 0.5, "loss": float("nan")}, tags={"team": "vision"},
                      description="first")  # fmt: skip
    registry.register("listed", v2, metrics={"acc": 0.75})
    models = {m["name"]: m for m in _ok(http.get("/models"))}
    assert models["listed"]["latest_version"] == 2 and models["listed"]["num_versions"] == 2
    model = _ok(http.get("/models/listed"))
    assert model["name"] == "listed" and model["aliases"] == {}
    versions = _ok(http.get("/models/listed/versions"))
    assert [v["version"] for v in versions] == [1, 2]
    first = versions[0]
    assert first["metrics"] == {"acc": 0.5, "loss": "nan"}  # JSON has no NaN: it becomes a string
    assert first["tags"] == {"team": "vision"} and first["description"] == "first"
    assert first["size"] == 1002 and first["num_files"] == 2 and first["files"] is None
    assert first["uri"] == "models:/listed/1" and first["job"] is None and first["aliases"] == []
    one = _ok(http.get("/models/listed/versions/2"))
    assert one["files"]["weights.bin"]["size"] == 2000 and len(one["files"]["weights.bin"]["sha256"]) == 64
    assert one["metrics"] == {"acc": 0.75} and one["created_at"] > 0


def test_alias_set_move_remove_and_its_history(http, registry, tmp_path):
    for i in (1, 2):
        registry.register("aliased", _dir(tmp_path, f"v{i}", {"w": bytes([i]) * 10}))
    move = _ok(http.put("/models/aliased/aliases/production", json={"version": 1, "by": "alice"}))
    # The admin's token records on someone's behalf, saying so; without "by", the admin itself.
    assert (move["alias"], move["from_version"], move["to_version"], move["by"]) == (
        "production", None, 1, "alice (recorded by admin)")  # fmt: skip
    assert _ok(http.put("/models/aliased/aliases/staging", json={"version": 2}))["by"] == "admin"
    move = _ok(http.put("/models/aliased/aliases/production", json={"version": 2, "by": "bob"}))
    assert (move["from_version"], move["to_version"]) == (1, 2)
    assert _ok(http.get("/models/aliased"))["aliases"] == {"production": 2, "staging": 2}
    assert [v["aliases"] for v in _ok(http.get("/models/aliased/versions"))] == [[], ["production", "staging"]]
    assert registry.get("aliased@production").version == 2  # the API's moves are the registry's
    removed = _ok(http.delete("/models/aliased/aliases/staging", params={"by": "carol"}))
    assert (removed["from_version"], removed["to_version"], removed["by"]) == (2, None, "carol (recorded by admin)")
    assert _ok(http.get("/models/aliased"))["aliases"] == {"production": 2}
    history = _ok(http.get("/models/aliased/aliases/history"))
    assert [(h["alias"], h["from_version"], h["to_version"]) for h in history] == [
        ("production", None, 1), ("staging", None, 2), ("production", 1, 2), ("staging", 2, None),
    ]  # fmt: skip
    assert [h["at"] for h in history] == sorted(h["at"] for h in history)
    assert history[0]["by"] == "alice (recorded by admin)" and history[2]["by"] == "bob (recorded by admin)"
    only = _ok(http.get("/models/aliased/aliases/history", params={"alias": "production"}))
    assert [(h["from_version"], h["to_version"]) for h in only] == [(None, 1), (1, 2)]


def test_deleting_an_aliased_version_needs_force_and_gc_frees_what_nothing_uses(http, registry, tmp_path):
    for i in (1, 2, 3):
        registry.register("deleted", _dir(tmp_path, f"v{i}", {"w": bytes([i]) * 5000, "shared": b"same"}))
    _ok(http.put("/models/deleted/aliases/production", json={"version": 2}))
    r = http.delete("/models/deleted/versions/2")
    assert r.status_code == 409 and "production" in r.json()["detail"] and "force" in r.json()["detail"]
    assert _ok(http.delete("/models/deleted/versions/1"), 204) is None
    assert http.get("/models/deleted/versions/1").status_code == 404
    assert [v["version"] for v in _ok(http.get("/models/deleted/versions"))] == [2, 3]
    assert _ok(http.delete("/models/deleted/versions/2", params={"force": "true"}), 204) is None
    assert [v["version"] for v in _ok(http.get("/models/deleted/versions"))] == [3]
    assert "production" not in _ok(http.get("/models/deleted"))["aliases"]
    # Each delete freed its own file at once ("shared" is version 3's too): gc finds nothing more.
    import hashlib

    blobs = os.path.join(registry.url, "blobs", "sha256")
    for i in (1, 2):
        sha = hashlib.sha256(bytes([i]) * 5000).hexdigest()
        assert not os.path.exists(os.path.join(blobs, sha[:2], sha))
    gc = _ok(http.post("/models/gc", json={}))
    assert set(gc) == {"blobs_removed", "bytes_freed"} and gc["blobs_removed"] >= 0 and gc["bytes_freed"] >= 0
    assert gc == {"blobs_removed": 0, "bytes_freed": 0}
    pulled = registry.pull("deleted/3")  # what version 3 needs is still there, "shared" included
    assert open(os.path.join(pulled, "shared"), "rb").read() == b"same"
    assert open(os.path.join(pulled, "w"), "rb").read() == bytes([3]) * 5000
    assert _ok(http.post("/models/gc", json={})) == {"blobs_removed": 0, "bytes_freed": 0}  # nothing left to free


@pytest.mark.parametrize(("method", "path", "body"), [
    ("GET", "/models/nope", None),
    ("GET", "/models/nope/versions", None),
    ("GET", "/models/nope/versions/1", None),
    ("GET", "/models/known/versions/9", None),
    ("DELETE", "/models/known/versions/9", None),
    ("DELETE", "/models/nope/versions/1", None),
    ("PUT", "/models/nope/aliases/production", {"version": 1}),
    ("PUT", "/models/known/aliases/production", {"version": 9}),
    ("DELETE", "/models/known/aliases/production", None),
    ("DELETE", "/models/nope/aliases/production", None),
    ("GET", "/models/nope/aliases/history", None),
])  # fmt: skip
def test_unknown_model_version_or_alias_is_404(http, registry, tmp_path, method, path, body):
    if not any(m.name == "known" for m in registry.list_models()):
        registry.register("known", _dir(tmp_path, "v1", {"w": b"x"}))
    r = http.request(method, path, json=body)
    assert r.status_code == 404, r.text
    assert isinstance(r.json()["detail"], str) and r.json()["detail"]


@pytest.mark.parametrize(("method", "path", "body", "words"), [
    ("PUT", "/models/valid/aliases/123", {"version": 1}, "digits"),
    ("PUT", "/models/valid/aliases/latest", {"version": 1}, "latest"),
    ("PUT", "/models/valid/aliases/-dash", {"version": 1}, "letters"),
    ("PUT", "/models/valid/aliases/has%20space", {"version": 1}, "letters"),
    ("PUT", "/models/valid/aliases/" + "a" * 101, {"version": 1}, "100"),
    ("DELETE", "/models/valid/aliases/7", None, "digits"),
    ("GET", "/models/valid/aliases/history?alias=bad%2Falias", None, "letters"),
    ("PUT", "/models/valid/aliases/prod", {"version": "one"}, "version"),
    ("PUT", "/models/valid/aliases/prod", {"version": 0}, "version"),
    ("PUT", "/models/valid/aliases/prod", {}, "version"),
    ("PUT", "/models/valid/aliases/prod", {"version": 1, "colour": "red"}, "colour"),
    ("PUT", "/models/valid/aliases/prod", "not an object", ""),
    ("GET", "/models/-bad", None, "name"),
    ("GET", "/models/valid/versions/0", None, "version"),
    ("GET", "/models/valid/versions/x", None, "version"),
    ("DELETE", "/models/valid/versions/1?force=perhaps", None, "force"),
])  # fmt: skip
def test_malformed_names_and_bodies_are_422_naming_the_problem(http, registry, tmp_path, method, path, body, words):
    if not any(m.name == "valid" for m in registry.list_models()):
        registry.register("valid", _dir(tmp_path, "v1", {"w": b"x"}), alias="prod")
    r = http.request(method, path, json=body)
    assert r.status_code == 422, r.text
    assert words in r.text
    assert [v.version for v in registry.versions("valid")] == [1]  # nothing changed


def test_a_body_that_is_not_json_is_422(http, registry, tmp_path):
    registry.register("notjson", _dir(tmp_path, "v1", {"w": b"x"}))
    r = http.put("/models/notjson/aliases/prod", content=b"{nope", headers={"Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    assert registry.get_model("notjson").aliases == {}


def test_requests_without_the_token_are_401(server):
    r = httpx.get(server.url + P + "/models")
    assert r.status_code == 401 and "token" in r.json()["detail"]
    r = httpx.post(server.url + P + "/serve/any@prod/predict", json={"inputs": [1]})
    assert r.status_code == 401




def test_the_serving_route_predicts_follows_its_alias_and_refuses_bad_input(http, registry, tmp_path):
    registry.register("affine", affine_model(1.0).save(str(tmp_path / "v1")), alias="prod")
    registry.register("affine", affine_model(2.0).save(str(tmp_path / "v2")))
    out = _ok(http.post("/serve/affine@prod/predict", json={"inputs": [[1, 2], [3, 4]]}))
    assert out == {"outputs": [3.0, 7.0], "model": {"name": "affine", "version": 1, "uri": "models:/affine/1"}}
    out = _ok(http.post("/serve/affine/2/predict", json={"inputs": [[1, 2]]}))
    assert out == {"outputs": [6.0], "model": {"name": "affine", "version": 2, "uri": "models:/affine/2"}}
    _ok(http.put("/models/affine/aliases/prod", json={"version": 2}))
    deadline = time.monotonic() + 60
    seen = []
    while True:  # every request is answered while the new version loads and swaps in
        r = http.post("/serve/affine@prod/predict", json={"inputs": [[1, 1]]})
        assert r.status_code == 200, r.text
        seen.append(r.json()["model"]["version"])
        if seen[-1] == 2:
            break
        assert time.monotonic() < deadline, "the moved alias was not picked up"
    assert r.json()["outputs"] == [4.0] and seen == sorted(seen)
    bad = http.post("/serve/affine@prod/predict", json={"inputs": [[1, 2, 3]]})
    assert bad.status_code == 422 and "shape" in bad.json()["detail"]
    assert http.post("/serve/affine@prod/predict", json={"data": []}).status_code == 422
    assert http.post("/serve/affine@prod/predict", content=b"{x", headers={"Content-Type": "application/json"}).status_code == 400
    assert http.post("/serve/nope@prod/predict", json={"inputs": [[1, 2]]}).status_code == 404
    assert http.post("/serve/affine@gone/predict", json={"inputs": [[1, 2]]}).status_code == 404
    assert http.post("/serve/affine/9/predict", json={"inputs": [[1, 2]]}).status_code == 404
    assert http.post("/serve/affine@123/predict", json={"inputs": [[1, 2]]}).status_code == 422
    served = {s["ref"]: s for s in _ok(http.get("/serve"))}
    assert set(served) == {"affine@prod", "affine/2"}
    assert served["affine@prod"]["stats"]["current_version"] == 2 and served["affine@prod"]["stats"]["swaps"] == 1


def test_a_version_deleted_by_another_process_is_404_everywhere_at_once(http, registry, tmp_path):
    for i in (1, 2, 3):
        registry.register("gone", affine_model(float(i)).save(str(tmp_path / f"v{i}")))
    assert _ok(http.get("/models/gone/versions/3"))["version"] == 3  # the server has read (and cached) it
    registry.delete_version("gone", 3)  # this process, not the server
    assert [v["version"] for v in _ok(http.get("/models/gone/versions"))] == [1, 2]
    r = http.get("/models/gone/versions/3")
    assert r.status_code == 404 and "no version 3" in r.json()["detail"], r.text
    r = http.post("/serve/gone/3/predict", json={"inputs": [[1, 2]]})
    assert r.status_code == 404, r.text
    assert "'gone'" in r.json()["detail"] and "no version 3" in r.json()["detail"]
    r = http.put("/models/gone/aliases/prod", json={"version": 3})
    assert r.status_code == 404, r.text
    assert _ok(http.post("/serve/gone/2/predict", json={"inputs": [[1, 2]]}))["outputs"] == [6.0]


def test_registering_a_source_with_a_symlink_is_422_naming_it(http, tmp_path):
    src = _dir(tmp_path, "linked", {"w": b"w"})
    os.symlink("/etc/passwd", os.path.join(src, "passwd_link"))
    r = http.post("/models/symlinked/versions", json={"source": src})
    assert r.status_code == 422, r.text
    assert "passwd_link" in r.text and "/etc/passwd" in r.text
    assert http.get("/models/symlinked").status_code == 404


def test_deeply_nested_bodies_are_4xx_naming_the_limit_never_a_500(http, registry, tmp_path):
    """Deeper than 100 levels: the predict body (past what json.loads decodes, or just past the limit)
    is a 400 counted in the engine's stats; a version's free-form tags or metrics are refused (a
    version registered with them would make every listing of the model fail)."""
    registry.register("deep", affine_model(1.0).save(str(tmp_path / "v1")), alias="prod")
    json_type = {"Content-Type": "application/json"}

    def nested(depth: int) -> str:
        return "[" * depth + "1" + "]" * depth

    for depth in (3000, 150):
        r = http.post("/serve/deep@prod/predict", content=f'{{"inputs": [{nested(depth)}]}}', headers=json_type)
        assert r.status_code == 400 and "deeper than 100 levels" in r.json()["detail"], r.text
    assert _ok(http.post("/serve/deep@prod/predict", json={"inputs": [[1, 2]]}))["outputs"] == [3.0]
    stats = {s["ref"]: s for s in _ok(http.get("/serve"))}["deep@prod"]["stats"]
    assert stats["errors"] == {"400": 2} and stats["ok"] == 1
    source = json.dumps(_dir(tmp_path, "v2", {"w": b"x"}))
    for field in ("tags", "metrics"):
        for depth in (3000, 500):
            body = f'{{"source": {source}, "{field}": {{"a": {nested(depth)}}}}}'
            r = http.post("/models/deep/versions", content=body, headers=json_type)
            assert r.status_code in (400, 422) and "deeper than 100 levels" in r.text, (field, depth, r.status_code, r.text)
    r = http.put("/models/deep/aliases/prod", content=f'{{"version": {nested(3000)}}}', headers=json_type)
    assert r.status_code == 400 and "deeper than 100 levels" in r.text, r.text
    assert [v["version"] for v in _ok(http.get("/models/deep/versions"))] == [1]  # nothing registered
    assert _ok(http.post("/models/deep/versions", json={"source": json.loads(source), "tags": {"a": [[1]]}},
                         ), 201)["tags"] == {"a": [[1]]}  # fmt: skip


def test_server_config_registry():
    assert ServerConfig(registry=None).registry is None
    assert ServerConfig(registry="s3://bucket/reg").registry == "s3://bucket/reg"
    assert ServerConfig(registry="rel/reg").registry == os.path.abspath("rel/reg")
    for bad in ("", "  ", 3):
        with pytest.raises(ValueError, match="ServerConfig.registry"):
            ServerConfig(registry=bad)  # type: ignore[arg-type]


def _checkpointing_loop(config):
    import tempfile

    import trainforge

    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "weights.txt"), "w") as f:
            f.write("trained")
        trainforge.report({"loss": 0.25, "step": 1}, checkpoint=trainforge.Checkpoint.from_directory(d))


def test_register_a_jobs_checkpoint_over_rest_and_link_back_to_the_job(http, server, tmp_path, monkeypatch):
    from trainforge import DataParallelTrainer, RunConfig, ScalingConfig

    monkeypatch.setenv("TRAINFORGE_SERVER_DIR", server.state_dir)
    job = DataParallelTrainer(
        _checkpointing_loop, scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(name="to-register", storage_path=str(tmp_path / "runs"), verbose=0),
    ).submit()  # fmt: skip
    assert job.result(timeout=120).metrics["loss"] == 0.25
    out = _ok(http.post("/models/from-job/versions", json={"job": job.id, "alias": "production", "by": "ci"}), 201)
    assert out["version"] == 1 and out["aliases"] == ["production"] and out["created_by"] == "ci (recorded by admin)"
    assert out["job"]["id"] == job.id and out["job"]["url"] == f"/jobs/{job.id}"
    assert out["metrics"]["loss"] == 0.25 and set(out["files"]) >= {"weights.txt"}
    # From a path the server can read; then the refusals, each a 4xx naming the problem.
    src = _dir(tmp_path, "plain", {"weights.txt": b"plain"})
    assert _ok(http.post("/models/from-job/versions", json={"source": src}), 201)["version"] == 2
    r = http.post("/models/from-job/versions", json={"job": job.id, "source": src})
    assert r.status_code == 422 and "not both" in r.text
    r = http.post("/models/from-job/versions", json={})
    assert r.status_code == 422 and "either" in r.text
    r = http.post("/models/from-job/versions", json={"job": 99999})
    assert r.status_code == 404 and "no job 99999" in r.text
    r = http.post("/models/from-job/versions", json={"source": str(tmp_path / "missing")})
    assert r.status_code == 422 and "no such directory" in r.text
    r = http.post("/models/from-job/versions", json={"source": src, "extra": 1})
    assert r.status_code == 422
