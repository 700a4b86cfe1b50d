"""``trainforge serve --ray``: the model server's engine as a Ray Serve deployment of 2 replicas on the
test session's one-node Ray instance (conftest ``ray_single``: 4 CPUs, every process on 127.0.0.1):
both replicas answer, an alias moved under load is followed by each with 0 failed requests, bad input
gets 4xx."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray.serve")
xgboost = pytest.importorskip("xgboost")
httpx = pytest.importorskip("httpx")

REPO = Path(__file__).resolve().parents[1]


def scaled_model(directory: str, scale: float) -> str:
    """An XGBoost model saved in ``directory``: [a, b] -> about scale * (a + b). Its class is defined
    in this function, so it is saved by value and the replicas need no import path for it."""
    import numpy as np

    from trainforge.model import XGBoostModel

    class Scaled(XGBoostModel):
        def setup(self, config: dict[str, Any]) -> None:
            self.register(params={"objective": "reg:squarederror", "max_depth": 3}, num_boost_round=30)

    x = np.random.default_rng(0).random((400, 2)).astype(np.float32)
    model = Scaled({})
    model.booster = xgboost.train(model.params, xgboost.DMatrix(x, label=scale * x.sum(1)), num_boost_round=30)
    return model.save(directory)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def load_until_moved(url: str, move: Any, clients: int = 8) -> list[tuple[int, int, int | None, str | None]]:
    """``clients`` loops of one-instance requests; after 40 answers ``move()`` runs; they stop once every
    replica has answered version 2 ten times in a row (or after 60 s). Returns every answer's
    (client, status, version, replica)."""
    answers: list[tuple[int, int, int | None, str | None]] = []
    moved = asyncio.Event()
    streak: dict[str, int] = {}
    done = asyncio.Event()
    replicas: set[str] = set()

    async def client(i: int, http: httpx.AsyncClient) -> None:
        while not done.is_set():
            r = await http.post(f"{url}/v1/predict", json={"inputs": [[0.5, 0.5]]})
            replica = r.headers.get("x-trainforge-replica")
            version = r.json()["model"]["version"] if r.status_code == 200 else None
            answers.append((i, r.status_code, version, replica))
            replicas.add(replica or "")
            if len(answers) == 40 and not moved.is_set():
                await asyncio.to_thread(move)
                moved.set()
            if moved.is_set() and replica is not None:
                streak[replica] = streak.get(replica, 0) + 1 if version == 2 else 0
                if len(replicas) >= 2 and all(streak.get(r, 0) >= 10 for r in replicas):
                    done.set()

    async with httpx.AsyncClient(timeout=30) as http:
        await asyncio.wait_for(asyncio.gather(*(client(i, http) for i in range(clients))), 60)
    return answers


def test_two_replicas_serve_follow_a_moved_alias_under_load_and_refuse_bad_input(ray_single, tmp_path):
    from ray import serve

    from trainforge.registry import Registry
    from trainforge.serve import ServeConfig
    from trainforge.serve._ray import RayServing

    reg = Registry(str(tmp_path / "registry"))
    reg.register("scaled", scaled_model(str(tmp_path / "v1"), 1.0), alias="prod")
    reg.register("scaled", scaled_model(str(tmp_path / "v2"), 10.0))
    config = ServeConfig(model="models:/scaled@prod", registry=reg.url, port=free_port(), poll_s=0.2,
                         max_batch_size=8)  # fmt: skip
    serving = RayServing(config, replicas=2, num_cpus=0.5)
    try:
        serving.start()
        answers = asyncio.run(load_until_moved(serving.url, lambda: reg.set_alias("scaled", "prod", 2)))
        failed = [a for a in answers if a[1] != 200]
        assert not failed, failed[:5]
        assert {a[2] for a in answers} == {1, 2}
        assert len({a[3] for a in answers}) == 2  # both replicas answered
        for replica in {a[3] for a in answers}:  # each replica: version 1, then version 2 only
            versions = [a[2] for a in answers if a[3] == replica]
            assert versions == sorted(versions), replica
        r = httpx.post(f"{serving.url}/v1/predict", json={"inputs": [[0.5, 0.5]]})
        assert r.json()["outputs"][0] == pytest.approx(10.0, abs=1.5) and r.json()["model"]["uri"] == "models:/scaled/2"
        bad = httpx.post(f"{serving.url}/v1/predict", content=b"{", headers={"content-type": "application/json"})
        assert bad.status_code == 400 and "not JSON" in bad.json()["detail"]
        bad = httpx.post(f"{serving.url}/v1/predict", json={"inputs": [["a", "b"]]})
        assert bad.status_code == 422 and "not a numeric table" in bad.json()["detail"]
        assert httpx.post(f"{serving.url}/v1/predict", json={"rows": []}).status_code == 422
        assert httpx.post(f"{serving.url}/v1/predict", content=b"{}", headers={"content-type": "text/plain"}).status_code == 415
        assert httpx.get(f"{serving.url}/healthz").json()["model"]["version"] == 2
        assert serving.status().status == "RUNNING"
    finally:
        serving.stop()
        serve.shutdown()  # the session's Ray instance stays; Serve's controller and proxy go with this test


@pytest.mark.slow
def test_replicas_need_ray():
    proc = subprocess.run([sys.executable, "-m", "trainforge", "serve", "models:/x@prod", "--replicas", "2"],
                          capture_output=True, text=True, timeout=60, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    assert proc.returncode == 2 and "--replicas needs --ray" in proc.stderr
