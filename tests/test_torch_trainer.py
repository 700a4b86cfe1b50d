"""TorchTrainer end to end on real workers (gloo on CPU): tests taking ``executor`` run on local
processes and on Ray actors (conftest.py)."""

from __future__ import annotations

import os

import pytest

import trainforge as train
from trainforge import Checkpoint, DataParallelTrainer, RunConfig, ScalingConfig
from trainforge.torch import TorchConfig, TorchTrainer

pytestmark = pytest.mark.slow


def _rc(tmp_path):
    return RunConfig(storage_path=str(tmp_path), name="torch", verbose=0)


def test_ddp_gradients_are_averaged_and_sampler_splits(tmp_path, executor):
    def loop(config):
        import tempfile

        import torch
        import torch.distributed as dist
        from torch.utils.data import DataLoader, TensorDataset

        from trainforge.torch import get_device, prepare_data_loader, prepare_model

        rank = train.get_context().get_world_rank()
        torch.manual_seed(rank)  # different init per rank: DDP must broadcast rank 0's weights
        model = prepare_model(torch.nn.Linear(4, 1))
        assert isinstance(model, torch.nn.parallel.DistributedDataParallel)
        data = TensorDataset(torch.arange(16).float().unsqueeze(1).repeat(1, 4), torch.arange(16).float())
        loader = prepare_data_loader(DataLoader(data, batch_size=4, shuffle=True))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        seen = {}
        for epoch in range(2):
            loader.sampler.set_epoch(epoch)
            seen[epoch] = []
            for x, y in loader:
                assert x.device == get_device()
                seen[epoch] += [int(v) for v in y]
                loss = ((model(x).squeeze(1) - y) ** 2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
        weights = model.module.weight.detach().clone()
        gathered = [torch.zeros_like(weights) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, weights)
        with tempfile.TemporaryDirectory() as d:
            if rank == 0:
                torch.save(model.module.state_dict(), os.path.join(d, "model.pt"))
            train.report(
                {
                    "epoch0": seen[0],
                    "epoch1": seen[1],
                    "same_weights": all(torch.equal(gathered[0], g) for g in gathered),
                    "backend": dist.get_backend(),
                    "device": str(get_device()),
                },
                checkpoint=Checkpoint.from_directory(d) if rank == 0 else None,
            )

    trainer = TorchTrainer(
        loop, scaling_config=ScalingConfig(num_workers=2, executor=executor), run_config=_rc(tmp_path)
    )
    run = trainer.fit_iter()
    [report] = list(run)
    m0, m1 = report.all_metrics
    assert sorted(m0["epoch0"] + m1["epoch0"]) == list(range(16))  # disjoint halves, all rows
    assert len(m0["epoch0"]) == len(m1["epoch0"]) == 8
    assert m0["epoch0"] != m0["epoch1"]  # set_epoch reshuffles
    assert m0["same_weights"] and m1["same_weights"]
    assert m0["backend"] == "gloo" and m0["device"] == "cpu"
    import torch

    with run.result.checkpoint.as_directory() as d:
        state = torch.load(os.path.join(d, "model.pt"))
    assert set(state) == {"weight", "bias"}


def test_torch_config_backend_and_single_worker(tmp_path, executor):
    def loop():
        import torch.distributed as dist

        # ACCELERATE_TORCH_DEVICE: where Hugging Face Accelerate puts the model (the worker's device)
        train.report({"init": dist.is_initialized(), "world": dist.get_world_size(),
                      "accelerate": os.environ.get("ACCELERATE_TORCH_DEVICE")})  # fmt: skip

    result = TorchTrainer(
        loop,
        torch_config=TorchConfig(backend="gloo", timeout_s=60),
        scaling_config=ScalingConfig(num_workers=1, executor=executor),
        run_config=_rc(tmp_path),
    ).fit()
    assert result.metrics == {"init": True, "world": 1, "accelerate": "cpu"}


def test_torch_trainer_rejects_wrong_config_type():
    with pytest.raises(TypeError, match="TorchConfig"):
        TorchTrainer(lambda: None, torch_config={"backend": "gloo"})


@pytest.mark.parametrize(
    "scaling, expected",
    [
        (ScalingConfig(num_workers=2, use_gpu=True), ["0", "1"]),
        (ScalingConfig(num_workers=2, use_gpu=True, resources_per_worker={"GPU": 0.5}), ["0", "0"]),
        (ScalingConfig(num_workers=2, use_gpu=True, resources_per_worker={"GPU": 2}), ["0,1", "2,3"]),
    ],
)
def test_each_worker_gets_its_own_cuda_visible_devices(tmp_path, monkeypatch, scaling, expected):
    """No GPU here: pretend four are visible and check each worker's assignment."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")

    def loop():
        train.report({"cvd": os.environ["CUDA_VISIBLE_DEVICES"]})

    trainer = DataParallelTrainer(loop, scaling_config=scaling, run_config=_rc(tmp_path))
    [report] = list(trainer.fit_iter())
    assert [m["cvd"] for m in report.all_metrics] == expected
