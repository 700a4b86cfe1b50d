"""Mixed precision helpers (Ray Train's ``accelerate``/``prepare_optimizer``/``backward``): bfloat16
autocast on the CPU with no scaler; float16 with a gradient scaler (forced here with
``amp_dtype="float16"``, as a GPU would use it); full precision unchanged without ``accelerate``."""

from __future__ import annotations

import io
import math

import pytest

torch = pytest.importorskip("torch")

import trainforge  # noqa: E402
from trainforge import RunConfig, ScalingConfig  # noqa: E402
from trainforge._internal.torch import amp  # noqa: E402
from trainforge.torch import TorchTrainer, accelerate, backward, prepare_model, prepare_optimizer  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_amp_state():
    amp.reset()
    yield
    amp.reset()


def test_cpu_amp_is_bfloat16_autocast_with_no_scaler():
    accelerate(amp=True)
    model = prepare_model(torch.nn.Linear(4, 2))
    assert model(torch.randn(3, 4)).dtype == torch.bfloat16
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert prepare_optimizer(opt) is opt  # bfloat16 needs no scaler
    before = model.weight.detach().clone()
    loss = model(torch.randn(3, 4)).float().pow(2).mean()
    backward(loss)
    opt.step()
    assert not torch.equal(before, model.weight.detach())
    torch.save(model, io.BytesIO())  # the autocast forward keeps the model picklable


def test_float16_uses_a_gradient_scaler_that_skips_steps_with_inf_gradients():
    accelerate(amp=True, amp_dtype="float16")
    model = prepare_model(torch.nn.Linear(4, 1))
    assert model(torch.randn(2, 4)).dtype == torch.float16
    opt = prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.01))
    assert type(opt).__name__ == "_ScaledOptimizer" and opt.param_groups[0]["lr"] == 0.01
    scale = amp.current().scaler.get_scale()
    before = model.weight.detach().clone()
    opt.zero_grad()
    backward(model(torch.full((2, 4), math.inf)).float().sum())  # inf gradients
    opt.step()
    assert torch.equal(before, model.weight.detach())  # the step was skipped
    assert amp.current().scaler.get_scale() < scale  # and the scale lowered
    for _ in range(30):  # the scaler lowers its scale until the scaled gradients fit float16
        opt.zero_grad()
        backward(model(torch.randn(2, 4)).float().pow(2).mean())
        opt.step()
        if not torch.equal(before, model.weight.detach()):
            break
    assert not torch.equal(before, model.weight.detach())
    assert opt.state_dict()["param_groups"][0]["lr"] == 0.01


def test_without_accelerate_everything_is_full_precision_and_unchanged():
    model = prepare_model(torch.nn.Linear(4, 2))
    assert model(torch.randn(3, 4)).dtype == torch.float32
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert prepare_optimizer(opt) is opt
    loss = model(torch.randn(3, 4)).pow(2).mean()
    backward(loss)
    assert model.weight.grad is not None


def test_misuse_says_what_to_do():
    with pytest.raises(ValueError, match=r"amp_dtype='int8'\) is not valid"):
        accelerate(amp=True, amp_dtype="int8")
    accelerate(amp=False)
    with pytest.raises(RuntimeError, match="already called"):
        accelerate(amp=True)
    amp.reset()
    prepare_model(torch.nn.Linear(2, 2))
    with pytest.raises(RuntimeError, match="after prepare_model"):
        accelerate(amp=True)
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        prepare_optimizer(object())


def _loop(config):
    accelerate(amp=True, amp_dtype=config["dtype"])
    torch.manual_seed(0)
    model = prepare_model(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
    opt = prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.05))
    rank = trainforge.get_context().get_world_rank()
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(64, 8, generator=g)
    y = x.sum(dim=1, keepdim=True)
    for step in range(30):
        out = model(x)
        loss = torch.nn.functional.mse_loss(out.float(), y)
        opt.zero_grad()
        backward(loss)
        opt.step()
        weights = sum(p.detach().double().sum().item() for p in model.parameters())
        trainforge.report({"loss": loss.item(), "out_dtype": str(out.dtype), "weights": weights, "step": step})


@pytest.mark.slow
@pytest.mark.parametrize("dtype,expected", [(None, "torch.bfloat16"), ("float16", "torch.float16")])
def test_two_worker_amp_run_trains_and_keeps_ranks_in_step(tmp_path, dtype, expected):
    result = TorchTrainer(
        _loop, train_loop_config={"dtype": dtype}, scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name=f"amp-{dtype}", storage_path=str(tmp_path), verbose=0),
    ).fit()  # fmt: skip
    rows = result.metrics_dataframe
    assert set(rows["out_dtype"]) == {expected}
    assert rows["loss"].iloc[-1] < 0.5 * rows["loss"].iloc[0]  # it learns in reduced precision
    run = TorchTrainer(_loop, train_loop_config={"dtype": dtype}, scaling_config=ScalingConfig(num_workers=2),
                       run_config=RunConfig(name=f"amp2-{dtype}", storage_path=str(tmp_path), verbose=0)).fit_iter()  # fmt: skip
    for report in run:  # DDP averaged the (scaled, unscaled) gradients: both ranks hold the same weights
        ranks = [m["weights"] for m in report.all_metrics]
        assert ranks[0] == pytest.approx(ranks[1], rel=1e-6)
