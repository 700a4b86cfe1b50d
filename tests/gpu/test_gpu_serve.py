"""A model trained on a GPU, registered, then loaded and served: ``Registry.load`` rebuilds it on the
CPU; a registry loader that moves it to ``cuda`` serves it from the GPU through ``trainforge serve``'s
HTTP app, with the CPU model's answers."""

from __future__ import annotations

from typing import Any

import gpuutil
import httpx
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainforge import ScalingConfig
from trainforge.model import BATCH_SIZE, LoopConfig, Model, ModelTrainer

pytest.importorskip("fastapi", reason="trainforge serve needs fastapi: carry the wheels (bash scripts/gpu_wheels.sh)")


class Regressor(Model):
    """y = sum(x) on 4 features; ``preprocess`` puts the inputs where the weights are (``self.device``)."""

    def setup(self, config: dict[str, Any]) -> None:
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        self.register(models=net, optimizers=torch.optim.Adam(net.parameters(), lr=0.01),
                      criterion=torch.nn.MSELoss())  # fmt: skip

    def setup_data(self, config: dict[str, Any]) -> None:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(1024, 4, generator=g)
        self.register_data(train_loader=DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)),
                                                   batch_size=config[BATCH_SIZE], shuffle=True))  # fmt: skip

    def preprocess(self, data: Any) -> Any:
        return torch.as_tensor(data, dtype=torch.float32, device=self.device).reshape(-1, 4)

    def postprocess(self, output: Any) -> Any:
        return output.squeeze(-1)


@pytest.fixture
def registered(tmp_path, rc) -> Any:
    """Version 1 of "regressor" (alias prod), trained on the GPU, loaded on the GPU by gpuutil's loader."""
    from trainforge.registry import Registry

    result = ModelTrainer(Regressor, config={BATCH_SIZE: 64}, loop_config=LoopConfig(num_epochs=10),
                          scaling_config=ScalingConfig(num_workers=1, use_gpu=True), run_config=rc("reg")).fit()  # fmt: skip
    registry = Registry(str(tmp_path / "registry"))
    registry.register("regressor", result, model_cls=Regressor, alias="prod")
    registry.register("regressor", result, loader="gpuutil:load_on_cuda", alias="gpu")
    return registry


INPUTS = [[1.0, 0.5, -0.2, 0.3], [0.5, -0.5, 0.25, 0.0], [-1.0, -1.0, 2.0, 0.0]]  # sums 1.6, 0.25, 0


def test_a_gpu_trained_model_loads_on_the_cpu_by_default(registered):
    model = registered.load("models:/regressor@prod")
    assert model.device == torch.device("cpu")
    out = model(INPUTS)
    assert out.device.type == "cpu" and out.tolist() == pytest.approx([1.6, 0.25, 0.0], abs=0.3)  # it learned


def test_a_registered_model_served_on_cuda_answers_as_on_the_cpu(registered):
    from trainforge.serve import ModelServer, ServeConfig

    expected = registered.load("models:/regressor@prod")(INPUTS).tolist()
    gpuutil.LOADED.clear()
    config = ServeConfig(model="models:/regressor@gpu", registry=registered.uri, port=0, max_batch_size=8)
    with ModelServer(config) as server:
        r = httpx.post(f"{server.url}/v1/predict", json={"inputs": INPUTS}, timeout=60)
        assert r.status_code == 200, r.text
        single = [httpx.post(f"{server.url}/v1/predict", json={"inputs": [x]}, timeout=60).json()["outputs"][0]
                  for x in INPUTS]  # fmt: skip
    [served] = gpuutil.LOADED
    assert served.device == torch.device("cuda", 0) and next(served.model.parameters()).is_cuda
    assert r.json()["outputs"] == pytest.approx(expected, rel=1e-4, abs=1e-5)
    assert single == pytest.approx(expected, rel=1e-4, abs=1e-5)
    assert r.json()["model"]["version"] == 2
