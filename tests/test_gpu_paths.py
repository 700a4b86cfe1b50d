"""The parts of trainforge's GPU paths that run without a GPU (tests/gpu/ runs the rest on one): the
process group's backend choice from the GPU each rank would use, workers without a GPU share seeing
no GPU, two optimizers under one float16 gradient scaler (float16 forced on the CPU), a loaded
``Model``'s device following its weights, and the train server's GPU grants (its GPUs named by
``CUDA_VISIBLE_DEVICES``, as on a GPU machine)."""

from __future__ import annotations

import copy
import os
import re
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import trainforge  # noqa: E402
from trainforge import RunConfig, ScalingConfig  # noqa: E402
from trainforge._internal.torch.config import choose_backend  # noqa: E402
from trainforge.model import LoopConfig, Model, ModelTrainer  # noqa: E402


# -- the backend -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("gpus", "backend", "why"),
    [
        ([("h", None), ("h", None)], "gloo", ""),
        ([("h", "GPU-a"), ("h", "GPU-b")], "nccl", ""),
        ([("h", "GPU-a"), ("g", "GPU-a")], "nccl", ""),  # the same id on two machines is two GPUs
        ([("h", "GPU-a"), ("h", "GPU-a")], "gloo", "ranks 0 and 1 share GPU GPU-a"),
        ([("h", "GPU-a"), ("h", None)], "gloo", "rank(s) [1] have no GPU"),
        ([], "gloo", ""),
    ],
    ids=["cpu", "a-gpu-each", "two-hosts", "shared", "mixed", "empty"],
)
def test_backend_none_picks_nccl_only_when_every_rank_has_a_gpu_of_its_own(gpus, backend, why):
    chosen, reason = choose_backend(None, gpus)
    assert chosen == backend and why in reason and (reason == "") == (why == "")


def test_backend_nccl_that_cannot_work_says_what_to_change():
    assert choose_backend("nccl", [("h", "GPU-a"), ("h", "GPU-b")]) == ("nccl", "")
    with pytest.raises(RuntimeError, match=r"ranks 1 and 2 share GPU GPU-b .*TorchConfig\(backend='gloo'\)"):
        choose_backend("nccl", [("h", "GPU-a"), ("h", "GPU-b"), ("h", "GPU-b")])
    with pytest.raises(RuntimeError, match=r"rank\(s\) \[0\] see none.*use_gpu=True"):
        choose_backend("nccl", [("h", None), ("h", "GPU-b")])


def _seen(config: dict[str, Any]) -> None:
    import torch.distributed as dist

    from trainforge.torch import get_device

    trainforge.report({"cvd": os.environ.get("CUDA_VISIBLE_DEVICES"), "device": str(get_device()),
                       "backend": dist.get_backend()})  # fmt: skip


@pytest.mark.slow
def test_workers_without_a_gpu_share_see_no_gpu(tmp_path, monkeypatch):
    """The driver sees two GPUs; use_gpu=False workers get an empty CUDA_VISIBLE_DEVICES (as a Ray
    actor without GPUs does), so on a GPU machine they train on the CPU over gloo."""
    from trainforge.torch import TorchTrainer

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    result = TorchTrainer(_seen, scaling_config=ScalingConfig(num_workers=2),
                          run_config=RunConfig(storage_path=str(tmp_path), name="cpu", verbose=0)).fit_iter()  # fmt: skip
    [report] = list(result)
    assert [(m["cvd"], m["device"], m["backend"]) for m in report.all_metrics] == [("", "cpu", "gloo")] * 2


# -- two optimizers, one scaler --------------------------------------------------------------------------
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


@pytest.mark.slow
def test_two_optimizers_under_a_float16_scaler_step_alike_with_one_update_per_step(tmp_path):
    """float16 with a scaler, as on a GPU: both optimizers step through the scaler, then the scale is
    updated once. (Updating it after each optimizer unscaled the second one's gradients twice when
    clipping, leaving its network behind, and counted every step twice.)"""
    result = ModelTrainer(TwoNets, loop_config=LoopConfig(num_epochs=2, use_fp16="fp16", grad_clip_norm=100.0),
                          run_config=RunConfig(storage_path=str(tmp_path), name="two", verbose=0)).fit()  # fmt: skip
    assert result.metrics["train_half"] == 1.0
    a, b = TwoNets.from_checkpoint(result.checkpoint).models
    torch.manual_seed(0)
    assert not torch.allclose(a.weight, torch.nn.Linear(4, 1).weight)  # it trained
    assert torch.allclose(a.weight, b.weight, rtol=1e-3, atol=1e-6) and torch.allclose(a.bias, b.bias, rtol=1e-3, atol=1e-6)
    with result.checkpoint.as_directory() as d:
        state = torch.load(os.path.join(d, "training_state.pt"), weights_only=False)
    assert state["scaler"]["_growth_tracker"] == 8  # 2 epochs of 4 steps, no inf: one update each


# -- a loaded model's device -----------------------------------------------------------------------------
def test_a_loaded_models_device_follows_its_weights(tmp_path):
    """Outside the loop ``Model.device`` is where the weights are, so a ``preprocess`` that puts its
    inputs on ``self.device`` serves a model moved to ``cuda`` (here: the meta device)."""
    from modelutil import affine_model

    model = affine_model(2.0)
    model.save(str(tmp_path / "m"))
    loaded = type(model).load(str(tmp_path / "m"))
    assert loaded.device == torch.device("cpu") and not loaded.use_gpu
    loaded.model.to("meta")
    assert loaded.device == torch.device("meta")


# -- the train server's GPU grants -------------------------------------------------------------------------
@pytest.mark.slow
def test_server_jobs_see_only_their_granted_gpus_a_fractional_grant_included(tmp_path):
    """A server whose machine shows GPUs 3 and 5 (``CUDA_VISIBLE_DEVICES``, as nvidia-smi would list
    them): a job of one worker with half a GPU is granted a GPU and sees it alone (a fractional grant
    rounded to no GPU hid every GPU from it); a job asking for none sees none."""
    pytest.importorskip("fastapi")
    from trainforge._testing.server import TrainServer

    script = tmp_path / "where.py"
    script.write_text("import os\nprint('CVD=' + repr(os.environ.get('CUDA_VISIBLE_DEVICES')))\n")
    server = TrainServer(str(tmp_path / "server"), capacity="CPU=2,GPU=2", env={"CUDA_VISIBLE_DEVICES": "3,5"}).start()
    try:
        client = server.client()
        seen = {}
        for name, per_worker in [("half", {"CPU": 1, "GPU": 0.5}), ("two", {"CPU": 1, "GPU": 2}), ("none", {"CPU": 1})]:
            job = client.submit({"kind": "script", "path": str(script), "per_worker": per_worker, "name": name})
            status = job.wait(timeout=120)
            assert status.state == "SUCCEEDED", status.raw
            cvd = re.findall(r"^CVD=(.*)$", "".join(job.logs()), re.MULTILINE)
            seen[name] = (status.raw["gpu_ids"] or [], cvd)
        assert seen == {"half": (["3"], ["'3'"]), "two": (["3", "5"], ["'3,5'"]), "none": ([], ["''"])}
    finally:
        left = server.cleanup()
    assert not left and "Traceback" not in server.output, server.output
