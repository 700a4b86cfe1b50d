"""Mixed precision on a GPU: ``accelerate(amp=True)`` (float16 autocast with a gradient scaler that skips
a step with inf gradients; bfloat16 on request), a TorchTrainer AMP run on a GPU worker, and
``ModelTrainer`` with ``LoopConfig(use_fp16=...)``: float16 forward, the scaler's state in the
checkpoint, two optimizers stepped through one scaler update, and the model loaded back on the CPU."""

from __future__ import annotations

import copy
import math
import os
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import trainforge
from trainforge import ScalingConfig
from trainforge._internal.torch import amp
from trainforge.model import BATCH_SIZE, LoopConfig, Model, ModelTrainer
from trainforge.torch import TorchTrainer, accelerate, backward, prepare_model, prepare_optimizer

GPU = ScalingConfig(num_workers=1, use_gpu=True)


@pytest.fixture(autouse=True)
def _fresh_amp_state():
    amp.reset()
    yield
    amp.reset()


def test_amp_on_cuda_is_float16_with_a_scaler_that_skips_an_inf_step():
    accelerate(amp=True)
    model = prepare_model(torch.nn.Linear(4, 1))
    assert next(model.parameters()).device.type == "cuda"
    assert model(torch.randn(2, 4, device="cuda")).dtype == torch.float16  # the GPU default
    opt = prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.01))
    scaler = amp.current().scaler
    assert scaler is not None and scaler.is_enabled()
    scale = scaler.get_scale()
    before = model.weight.detach().clone()
    opt.zero_grad()
    backward(model(torch.full((2, 4), math.inf, device="cuda")).float().sum())  # inf gradients
    opt.step()
    assert torch.equal(before, model.weight.detach())  # the step was skipped
    assert scaler.get_scale() < scale  # and the scale lowered
    x = torch.randn(64, 4, device="cuda")
    y = x.sum(dim=1, keepdim=True)
    losses = []
    for _ in range(200):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
        backward(loss)
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses) and losses[-1] < 0.1 * losses[0]  # it learns in float16


def test_amp_bfloat16_on_cuda_needs_no_scaler():
    accelerate(amp=True, amp_dtype="bfloat16")
    model = prepare_model(torch.nn.Linear(4, 2))
    assert model(torch.randn(3, 4, device="cuda")).dtype == torch.bfloat16
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert prepare_optimizer(opt) is opt and amp.current().scaler is None


def _amp_loop(config: dict[str, Any]) -> None:
    from trainforge.torch import get_device

    accelerate(amp=True)
    torch.manual_seed(0)
    model = prepare_model(torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
    opt = prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.05))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=g).to(get_device())
    y = x.sum(dim=1, keepdim=True)
    scaler = amp.current().scaler
    for step in range(40):
        out = model(x)
        loss = torch.nn.functional.mse_loss(out.float(), y)
        opt.zero_grad()
        backward(loss)
        opt.step()
        trainforge.report({"loss": loss.item(), "dtype": str(out.dtype), "device": str(out.device), "step": step,
                           "scale": scaler.get_scale() if scaler is not None else 0.0})  # fmt: skip


def test_a_gpu_worker_trains_in_float16_through_the_scaler(rc):
    result = TorchTrainer(_amp_loop, scaling_config=GPU, run_config=rc("amp")).fit()
    rows = result.metrics_dataframe
    assert set(rows["dtype"]) == {"torch.float16"} and set(rows["device"]) == {"cuda:0"}
    assert rows["loss"].iloc[-1] < 0.5 * rows["loss"].iloc[0]
    assert rows["scale"].iloc[-1] > 1.0  # a working scaler, not one that collapsed to nothing


# -- the managed loop ------------------------------------------------------------------------------------
def _data(n: int) -> TensorDataset:
    """4 features, 3 classes a linear map separates (learnable, so the loss must fall)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, (x @ torch.randn(4, 3, generator=g)).argmax(dim=1))


class Half(Model):
    """A 3-class linear classifier; each train step reports its forward's dtype and device."""

    def setup(self, config: dict[str, Any]) -> None:
        torch.manual_seed(0)
        net = torch.nn.Linear(4, 3)
        self.register(models=net, optimizers=torch.optim.SGD(net.parameters(), lr=0.1),
                      criterion=torch.nn.CrossEntropyLoss())  # fmt: skip

    def setup_data(self, config: dict[str, Any]) -> None:
        self.register_data(train_loader=DataLoader(_data(40), batch_size=config[BATCH_SIZE], shuffle=True),
                           validation_loader=DataLoader(_data(40), batch_size=20))  # fmt: skip

    def train_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        out = self.forward(x)
        return {"loss": self._loss(out, y), "half": float(out.dtype == torch.float16),
                "bf16": float(out.dtype == torch.bfloat16), "on_cuda": float(out.is_cuda)}  # fmt: skip


@pytest.mark.parametrize(("use_fp16", "dtype_metric", "scaled"), [(True, "half", True), ("bf16", "bf16", False)])
def test_model_trainer_with_use_fp16_on_a_gpu(rc, use_fp16, dtype_metric, scaled):
    result = ModelTrainer(Half, config={BATCH_SIZE: 10}, loop_config=LoopConfig(num_epochs=3, use_fp16=use_fp16),
                          scaling_config=GPU, run_config=rc(f"fp16-{use_fp16}")).fit()  # fmt: skip
    first, last = result.metrics_history[0], result.metrics
    assert last[f"train_{dtype_metric}"] == 1.0 and last["train_on_cuda"] == 1.0
    assert math.isfinite(last["train_loss"]) and last["train_loss"] < first["train_loss"]
    assert "val_accuracy" in last
    with result.checkpoint.as_directory() as d:
        state = torch.load(os.path.join(d, "training_state.pt"), weights_only=False)
    assert (state["scaler"] is not None) == scaled
    loaded = Half.from_checkpoint(result.checkpoint)  # trained on the GPU, loaded on the CPU
    assert loaded.model.weight.device.type == "cpu" and loaded.model.weight.dtype == torch.float32
    assert loaded(torch.zeros(2, 4)).shape == (2, 3)


class TwoNets(Model):
    """Two copies of one network, each with its own optimizer, trained on the same loss: with one
    scaler update per step (after both optimizers stepped) they stay equal."""

    def setup(self, config: dict[str, Any]) -> None:
        torch.manual_seed(0)
        a = torch.nn.Linear(4, 1)
        b = copy.deepcopy(a)
        self.register(models=[a, b], optimizers=[torch.optim.SGD(a.parameters(), lr=0.05),
                                                 torch.optim.SGD(b.parameters(), lr=0.05)])  # fmt: skip

    def setup_data(self, config: dict[str, Any]) -> None:
        g = torch.Generator().manual_seed(2)
        x = torch.randn(32, 4, generator=g) * 0.1
        self.register_data(train_loader=DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8))

    def train_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        a, b = self.models
        out_a, out_b = a(x), b(x)
        loss = torch.nn.functional.mse_loss(out_a.float(), y) + torch.nn.functional.mse_loss(out_b.float(), y)
        return {"loss": loss, "half": float(out_a.dtype == torch.float16)}


def test_two_optimizers_share_one_scaler_update_per_step_on_a_gpu(rc):
    result = ModelTrainer(TwoNets, loop_config=LoopConfig(num_epochs=2, use_fp16=True, grad_clip_norm=100.0),
                          scaling_config=GPU, run_config=rc("two-opts")).fit()  # fmt: skip
    assert result.metrics["train_half"] == 1.0
    a, b = TwoNets.from_checkpoint(result.checkpoint).models
    torch.manual_seed(0)
    initial = torch.nn.Linear(4, 1)
    assert not torch.allclose(a.weight, initial.weight)  # it trained
    assert torch.allclose(a.weight, b.weight, rtol=1e-3, atol=1e-6) and torch.allclose(a.bias, b.bias, rtol=1e-3, atol=1e-6)
    with result.checkpoint.as_directory() as d:
        state = torch.load(os.path.join(d, "training_state.pt"), weights_only=False)
    assert state["scaler"]["_growth_tracker"] <= 8  # 8 optimizer steps: at most one update each
