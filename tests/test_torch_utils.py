"""trainforge.torch without the trainer: TorchConfig, the backend's worker functions, the train-loop helpers.

The two-process test starts a real gloo process group on 127.0.0.1 in two fresh interpreters.
"""

from __future__ import annotations

import gc
import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import trainforge.torch as tt
from trainforge._internal import network
from trainforge._internal.backend import resolve_backend
from trainforge._internal.torch import config as torch_config
from trainforge._internal.torch import train_loop_utils
from trainforge._internal.torch.config import TorchConfig, _TorchBackend

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def single_process_env(monkeypatch):
    """The variables trainforge sets on a worker of a world of one; restored afterwards."""
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(name, value)
    # Set first so that monkeypatch restores (unsets) them after the backend wrote them.
    monkeypatch.setenv("MASTER_ADDR", "unset")
    monkeypatch.setenv("MASTER_PORT", "0")


@pytest.fixture
def no_world_env(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


# -- public surface ---------------------------------------------------------------------------------
def test_public_all():
    assert tt.__all__ == ["TorchTrainer", "TorchConfig", "prepare_model", "prepare_data_loader", "get_device",
                          "accelerate", "prepare_optimizer", "backward"]  # fmt: skip
    for name in tt.__all__:
        assert callable(getattr(tt, name))


def test_import_does_not_import_torch():
    code = (
        "import sys, trainforge.torch, trainforge._internal.torch.config; "
        "assert 'torch' not in sys.modules, 'torch imported'; print('ok')"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# -- TorchConfig --------------------------------------------------------------------------------------
def test_torch_config_defaults_and_backend_cls():
    cfg = TorchConfig()
    assert (cfg.backend, cfg.init_method, cfg.timeout_s) == (None, "env", 1800)
    assert cfg.backend_cls is _TorchBackend
    assert isinstance(resolve_backend(cfg), _TorchBackend)
    assert TorchConfig(backend="gloo", timeout_s=5).to_dict()["backend"] == "gloo"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"backend": "mpi"}, "backend"),
        ({"backend": "NCCL"}, "backend"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"timeout_s": -5}, "timeout_s"),
        ({"timeout_s": True}, "timeout_s"),
        ({"timeout_s": "60"}, "timeout_s"),
        ({"init_method": "file"}, "init_method"),
    ],
)
def test_torch_config_rejects_bad_values(kwargs, field):
    with pytest.raises(ValueError) as info:
        TorchConfig(**kwargs)
    message = str(info.value)
    assert f"TorchConfig.{field}=" in message
    assert repr(next(iter(kwargs.values()))) in message


def test_torch_trainer_rejects_wrong_config_type():
    from trainforge.torch import TorchTrainer

    with pytest.raises(TypeError, match="TorchConfig"):
        TorchTrainer(lambda: None, torch_config={"backend": "gloo"})


def test_resolve_torch_backend_on_cpu():
    if torch.cuda.is_available():
        pytest.skip("CPU-only check")
    assert torch_config._resolve_torch_backend(None) == "gloo"
    assert torch_config._resolve_torch_backend("gloo") == "gloo"
    with pytest.raises(RuntimeError, match="backend='gloo'"):
        torch_config._resolve_torch_backend("nccl")


@dataclass
class _Meta:
    hostname: str


class _InProcessGroup:
    """A fake worker group of one worker: this process."""

    num_workers = 1

    def __init__(self) -> None:
        self.calls: list[str] = []

    @property
    def worker_metadata(self):
        return [_Meta(socket.gethostname())]

    def execute(self, fn, *args, **kwargs):
        self.calls.append(fn.__name__)
        return [fn(*args, **kwargs)]

    def execute_single(self, rank, fn, *args, **kwargs):
        assert rank == 0
        self.calls.append(fn.__name__)
        return fn(*args, **kwargs)


@pytest.mark.parametrize("init_method", ["env", "tcp"])
def test_backend_starts_and_destroys_process_group(single_process_env, init_method):
    assert not dist.is_initialized()
    group = _InProcessGroup()
    backend = _TorchBackend()
    cfg = TorchConfig(backend="gloo", init_method=init_method, timeout_s=30)
    backend.on_start(group, cfg)
    try:
        assert dist.is_initialized()
        assert (dist.get_rank(), dist.get_world_size(), dist.get_backend()) == (0, 1, "gloo")
        assert os.environ["MASTER_ADDR"] == "127.0.0.1"
        assert 0 < int(os.environ["MASTER_PORT"]) < 65536
        t = torch.ones(3)
        dist.all_reduce(t)
        assert t.tolist() == [1.0, 1.0, 1.0]
    finally:
        backend.on_shutdown(group, cfg)
    assert not dist.is_initialized()
    assert group.calls == ["_rank0_address_and_port", "_setup_process_group", "_shutdown"]
    torch_config._shutdown()  # idempotent


def test_rendezvous_uses_node_ip_across_hosts():
    class TwoHosts(_InProcessGroup):
        num_workers = 2

        @property
        def worker_metadata(self):
            return [_Meta(socket.gethostname()), _Meta("some-other-host")]

        def execute(self, fn, *args, **kwargs):
            self.args = args
            return [None, None]

    group = TwoHosts()
    _TorchBackend().on_start(group, TorchConfig(backend="gloo"))
    addr, port, backend, world_size, timeout_s, init_method = group.args
    assert addr == network.node_ip()
    assert (backend, world_size, timeout_s, init_method) == ("gloo", 2, 1800, "env")


# -- world size 1 -------------------------------------------------------------------------------------
def test_get_device_cpu(no_world_env):
    if torch.cuda.is_available():
        pytest.skip("CPU-only check")
    assert tt.get_device() == torch.device("cpu")


def test_prepare_model_world_size_one(single_process_env):
    model = nn.Linear(4, 2)
    prepared = tt.prepare_model(model)
    assert prepared is model  # not wrapped
    assert next(prepared.parameters()).device.type == tt.get_device().type
    assert tt.prepare_model(nn.Linear(2, 2), move_to_device="cpu").weight.device == torch.device("cpu")
    assert tt.prepare_model(nn.Linear(2, 2), move_to_device=False, parallel_strategy=None) is not None


def test_prepare_model_rejects_bad_strategy(single_process_env):
    with pytest.raises(ValueError, match="parallel_strategy='horovod'"):
        tt.prepare_model(nn.Linear(2, 2), parallel_strategy="horovod")


def test_prepare_model_without_process_group_says_how(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="TorchTrainer"):
        tt.prepare_model(nn.Linear(2, 2))


def _dataset(n: int = 10) -> TensorDataset:
    return TensorDataset(torch.arange(n, dtype=torch.float32).unsqueeze(1), torch.arange(n))


def test_prepare_data_loader_world_size_one(single_process_env):
    loader = DataLoader(_dataset(10), batch_size=4, shuffle=True)
    prepared = tt.prepare_data_loader(loader)
    assert len(prepared) == 3
    assert prepared.sampler is loader.sampler  # no DistributedSampler for one worker
    assert prepared.dataset is loader.dataset
    assert prepared.batch_size == 4
    assert prepared.drop_last is False  # other attributes come from the loader
    device = tt.get_device()
    seen = []
    for x, y in prepared:
        assert x.device.type == device.type and y.device.type == device.type
        seen += y.tolist()
    assert sorted(seen) == list(range(10))
    assert tt.prepare_data_loader(loader, move_to_device=False) is loader


def test_to_device_recurses_into_containers():
    from collections import namedtuple

    Pair = namedtuple("Pair", "a b")
    batch = {"x": [torch.zeros(1), (torch.ones(1), 3)], "p": Pair(torch.zeros(1), "s")}
    moved = train_loop_utils._to_device(batch, torch.device("cpu"), False)
    assert isinstance(moved["p"], Pair) and moved["p"].b == "s"
    assert isinstance(moved["x"], list) and isinstance(moved["x"][1], tuple)
    assert moved["x"][1][1] == 3


def test_prepare_data_loader_keeps_settings_when_sharding(monkeypatch):
    # World size from the environment alone: the sampler needs no process group.
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")

    def collate(items):
        return torch.stack([x for x, _ in items])

    def init(worker_id):
        pass

    generator = torch.Generator().manual_seed(0)
    loader = DataLoader(
        _dataset(10),
        batch_size=3,
        shuffle=False,
        collate_fn=collate,
        drop_last=True,
        worker_init_fn=init,
        generator=generator,
    )
    prepared = tt.prepare_data_loader(loader)
    sampler = prepared.sampler
    assert isinstance(sampler, torch.utils.data.DistributedSampler)
    assert (sampler.num_replicas, sampler.rank, sampler.shuffle) == (2, 1, False)
    assert (prepared.batch_size, prepared.drop_last, prepared.collate_fn) == (3, True, collate)
    assert prepared.worker_init_fn is init and prepared.generator is generator
    assert [b.squeeze(1).tolist() for b in prepared] == [[1.0, 3.0, 5.0]]  # 5 rows -> one full batch


def test_prepare_data_loader_leaves_iterable_datasets_alone(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(4))

    loader = DataLoader(Stream(), batch_size=2)
    prepared = tt.prepare_data_loader(loader)
    assert [b.tolist() for b in prepared] == [[0, 1], [2, 3]]
    assert tt.prepare_data_loader(loader, move_to_device=False) is loader


# -- two real processes -------------------------------------------------------------------------------
def _two_rank_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size)
    )
    torch.set_num_threads(1)
    # The backend's worker-side function, as TorchTrainer runs it on every worker.
    torch_config._setup_process_group("127.0.0.1", port, "gloo", world_size, 60, "tcp")
    try:
        data = TensorDataset(torch.arange(20))
        shuffled = tt.prepare_data_loader(DataLoader(data, batch_size=4, shuffle=True))
        epochs = []
        for epoch in (0, 1):
            shuffled.sampler.set_epoch(epoch)
            epochs.append([i for (batch,) in shuffled for i in batch.tolist()])
        ordered = tt.prepare_data_loader(DataLoader(data, batch_size=4))
        in_order = [i for (batch,) in ordered for i in batch.tolist()]

        torch.manual_seed(rank)  # different initial weights: DDP must broadcast rank 0's
        model = tt.prepare_model(nn.Linear(3, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.full((4, 3), float(rank + 1))
        model(x).sum().backward()
        optimizer.step()
        result = {
            "wrapped": type(model).__name__,
            "epochs": epochs,
            "in_order": in_order,
            "len": len(shuffled),
            "grad": model.module.weight.grad.tolist(),
            "params": [p.tolist() for p in model.parameters()],
        }
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
        # A DDP model alive at interpreter exit, after its group was destroyed, makes gloo abort the
        # process ("terminate called without an active exception"): free it first.
        del model, optimizer
        gc.collect()
    finally:
        torch_config._shutdown()


def _run_ranks(world_size: int, out_dir: Path, timeout: float = 120) -> None:
    """Run ``_two_rank_worker`` in ``world_size`` fresh interpreters (plain subprocesses, so nothing
    such as multiprocessing's resource tracker outlives the test)."""
    port = network.free_port()
    pythonpath = os.pathsep.join(filter(None, [str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH")]))
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"import test_torch_utils as t; t._two_rank_worker({rank}, {world_size}, {port}, {str(out_dir)!r})",
            ],
            env={**os.environ, "PYTHONPATH": pythonpath},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(world_size)
    ]
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for rank, (p, out) in enumerate(zip(procs, outputs, strict=True)):
        assert p.returncode == 0, f"rank {rank} exited with {p.returncode}:\n{out}"


@pytest.mark.slow
def test_two_process_sampler_and_ddp(tmp_path):
    _run_ranks(2, tmp_path)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))

    assert r0["wrapped"] == r1["wrapped"] == "DistributedDataParallel"
    for epoch in (0, 1):
        a, b = r0["epochs"][epoch], r1["epochs"][epoch]
        assert len(a) == len(b) == 10
        assert not set(a) & set(b)
        assert sorted(a + b) == list(range(20))
    assert r0["epochs"][0] != r0["epochs"][1]  # set_epoch reshuffles
    assert r0["in_order"] == list(range(0, 20, 2)) and r1["in_order"] == list(range(1, 20, 2))
    assert r0["len"] == r1["len"] == 3

    # d(sum(Wx + b))/dW = sum of the rows of x = 4 * (rank + 1); DDP averages over the ranks.
    assert r0["grad"] == r1["grad"] == [[6.0, 6.0, 6.0]]
    assert r0["params"] == r1["params"]
