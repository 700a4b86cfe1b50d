"""GPU workers of a TorchTrainer: which GPU each worker sees (``CUDA_VISIBLE_DEVICES``, ``get_device()``,
the GPU's UUID), two workers sharing one GPU by a fractional request, the process group's backend
(nccl for a GPU each, gloo for a shared GPU), DDP steps on CUDA equal to a CPU reference, a restarted
worker on the same GPU, and ``use_gpu=False`` hiding the GPU from its workers."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

import trainforge
from trainforge import FailureConfig, ScalingConfig, TrainingFailedError
from trainforge.torch import TorchConfig, TorchTrainer


def _where(config: dict[str, Any]) -> None:
    """Report what this worker sees, after an all_reduce of a tensor on its device."""
    import torch.distributed as dist

    from trainforge.torch import get_device

    ctx = trainforge.get_context()
    if config.get("crash_first_attempt") and ctx.get_attempt() == 0 and ctx.get_world_rank() == 0:
        os._exit(3)  # a worker that dies: the group restarts, on the same GPU
    device = get_device()
    x = torch.full((4,), float(ctx.get_world_rank() + 1), device=device)
    dist.all_reduce(x)
    uuid = None
    if device.type == "cuda":
        uuid = "GPU-" + str(torch.cuda.get_device_properties(device).uuid).removeprefix("GPU-")
    trainforge.report({
        "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"), "available": torch.cuda.is_available(),
        "count": torch.cuda.device_count(), "device": str(device), "tensor_device": str(x.device),
        "sum": float(x[0]), "backend": dist.get_backend(), "uuid": uuid, "attempt": ctx.get_attempt(),
    })  # fmt: skip


def _metrics(trainer: TorchTrainer) -> list[dict[str, Any]]:
    reports = list(trainer.fit_iter())
    assert reports, "the run reported nothing"
    return list(reports[-1].all_metrics)


def test_one_gpu_worker_sees_its_gpu_and_the_group_is_nccl(rc, gpu0):
    [m] = _metrics(TorchTrainer(_where, scaling_config=ScalingConfig(num_workers=1, use_gpu=True), run_config=rc("one")))
    assert (m["cvd"], m["count"], m["device"], m["tensor_device"]) == (gpu0["id"], 1, "cuda:0", "cuda:0")
    assert m["uuid"] == gpu0["uuid"]  # the machine's GPU, not another one
    assert m["backend"] == "nccl" and m["sum"] == 1.0


def test_two_workers_share_one_gpu_by_a_fractional_request_over_gloo(rc, gpu0):
    """Two workers on one GPU: NCCL refuses two ranks on one device, so backend=None picks gloo, whose
    all_reduce takes the CUDA tensors."""
    scaling = ScalingConfig(num_workers=2, use_gpu=True, resources_per_worker={"GPU": 0.5})
    m0, m1 = _metrics(TorchTrainer(_where, scaling_config=scaling, run_config=rc("shared")))
    for m in (m0, m1):
        assert (m["cvd"], m["count"], m["device"], m["tensor_device"]) == (gpu0["id"], 1, "cuda:0", "cuda:0")
        assert m["uuid"] == gpu0["uuid"] and m["backend"] == "gloo"
        assert m["sum"] == 3.0  # 1 + 2, reduced over gloo from CUDA tensors


def test_nccl_asked_for_two_workers_on_one_gpu_fails_saying_what_to_do(rc):
    scaling = ScalingConfig(num_workers=2, use_gpu=True, resources_per_worker={"GPU": 0.5})
    trainer = TorchTrainer(_where, scaling_config=scaling, torch_config=TorchConfig(backend="nccl"),
                           run_config=rc("nccl-shared"))  # fmt: skip
    with pytest.raises(TrainingFailedError, match=r"ranks 0 and 1 share GPU GPU-.*TorchConfig\(backend='gloo'\)"):
        trainer.fit()


def test_use_gpu_false_hides_the_gpu_from_its_workers(rc):
    """As on Ray: a worker without a GPU share sees none, so it trains on the CPU over gloo (the
    environment reaches the worker before anything in it initialised CUDA)."""
    m0, m1 = _metrics(TorchTrainer(_where, scaling_config=ScalingConfig(num_workers=2), run_config=rc("cpu")))
    for m in (m0, m1):
        assert (m["cvd"], m["available"], m["count"], m["device"]) == ("", False, 0, "cpu")
        assert m["backend"] == "gloo" and m["sum"] == 3.0


@pytest.mark.parametrize("use_gpu", [True, False], ids=["gpu", "cpu"])
def test_a_restarted_worker_sees_the_same_devices(rc, gpu0, use_gpu):
    """Rank 0 dies in the first attempt; the restarted group (standby workers that imported torch
    before they knew their devices, where the pool had them ready) sees what the first one would."""
    trainer = TorchTrainer(
        _where, train_loop_config={"crash_first_attempt": True},
        scaling_config=ScalingConfig(num_workers=1, use_gpu=use_gpu),
        run_config=rc(f"restart-{use_gpu}", failure_config=FailureConfig(max_failures=1)),
    )  # fmt: skip
    [m] = _metrics(trainer)
    assert m["attempt"] == 1
    if use_gpu:
        assert (m["cvd"], m["count"], m["device"], m["uuid"], m["backend"]) == (gpu0["id"], 1, "cuda:0", gpu0["uuid"], "nccl")
    else:
        assert (m["cvd"], m["available"], m["device"], m["backend"]) == ("", False, "cpu", "gloo")


# -- DDP steps on CUDA, checked against the same steps on the CPU ----------------------------------------
STEPS, LR = 3, 0.1


def _rank_data(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(16, 8, generator=g)
    return x, x.sum(dim=1, keepdim=True)


def _initial_net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(8, 1)


def _ddp_steps(config: dict[str, Any]) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from trainforge.torch import get_device, prepare_model

    rank = trainforge.get_context().get_world_rank()
    device = get_device()
    model = prepare_model(_initial_net())  # DDP on its device when the world has more than one rank
    if not isinstance(model, DistributedDataParallel):  # one rank: wrap it anyway, a DDP step on NCCL
        model = DistributedDataParallel(model, device_ids=[device])
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = (t.to(device) for t in _rank_data(rank))
    for _ in range(STEPS):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    params = torch.cat([p.detach().flatten() for p in model.module.parameters()])
    trainforge.report({"params": params.cpu().tolist(), "param_device": str(params.device),
                       "backend": dist.get_backend(), "world": dist.get_world_size()})  # fmt: skip


def _reference(world: int) -> list[float]:
    """The same steps on the CPU in one process: DDP averages the ranks' gradients."""
    model = _initial_net()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    data = [_rank_data(r) for r in range(world)]
    for _ in range(STEPS):
        opt.zero_grad()
        loss = sum(torch.nn.functional.mse_loss(model(x), y) for x, y in data) / world
        loss.backward()  # type: ignore[union-attr]
        opt.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()


@pytest.mark.parametrize(("workers", "backend"), [(1, "nccl"), (2, "gloo")], ids=["1-rank-nccl", "2-ranks-one-gpu-gloo"])
def test_ddp_steps_on_cuda_equal_the_cpu_reference(rc, workers, backend):
    scaling = ScalingConfig(num_workers=workers, use_gpu=True, resources_per_worker={"GPU": 1 / workers})
    metrics = _metrics(TorchTrainer(_ddp_steps, scaling_config=scaling, run_config=rc(f"ddp-{workers}")))
    expected = _reference(workers)
    for m in metrics:
        assert (m["param_device"], m["backend"], m["world"]) == ("cuda:0", backend, workers)
        assert m["params"] == pytest.approx(expected, rel=1e-4, abs=1e-5)
