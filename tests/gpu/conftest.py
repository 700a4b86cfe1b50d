"""The GPU layer: tests that run trainforge's GPU paths on a real CUDA device.

Every test in this directory is marked ``gpu`` and, without a CUDA device (CI, a developer's
machine), skipped with the reason, so the suite collects them everywhere and runs them where a GPU
is: ``bash scripts/gpu_check.sh OUTDIR`` on a lent GPU machine (see docs/gpu.md). Select them with
``-m gpu``, leave them out with ``-m "not gpu"``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

GPU_DIR = os.path.dirname(os.path.abspath(__file__))
RUN_IT = "run scripts/gpu_check.sh on a GPU machine"


def cuda_problem() -> str | None:
    """Why this process cannot run the GPU tests (None: it can)."""
    try:
        import torch
    except ImportError:
        return f"no CUDA device: torch is not installed ({RUN_IT})"
    if not torch.cuda.is_available():
        return f"no CUDA device: torch {torch.__version__} sees none ({RUN_IT})"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ours = [item for item in items if str(item.path).startswith(GPU_DIR + os.sep)]
    if not ours:
        return
    problem = cuda_problem()
    for item in ours:
        item.add_marker(pytest.mark.gpu)
        if problem is not None:
            item.add_marker(pytest.mark.skip(reason=problem))


@pytest.fixture
def rc(tmp_path: Any) -> Any:
    """``rc(name)``: a RunConfig under the test's own directory."""
    from trainforge import RunConfig

    def make(name: str, **kw: Any) -> RunConfig:
        return RunConfig(name=name, storage_path=str(tmp_path / "runs"), verbose=0, **kw)

    return make


@pytest.fixture
def gpu0() -> dict[str, Any]:
    """What this process sees as CUDA device 0: name, UUID (nvidia-smi's ``GPU-...`` form) and the id
    a worker given it would get in ``CUDA_VISIBLE_DEVICES`` (trainforge's first visible GPU)."""
    import torch

    from trainforge._internal.devices import local_gpu_ids

    props = torch.cuda.get_device_properties(0)
    return {"name": props.name, "uuid": "GPU-" + str(props.uuid).removeprefix("GPU-"), "id": local_gpu_ids()[0],
            "total_memory": props.total_memory}  # fmt: skip


@pytest.fixture
def gpu_server(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A real train server that grants this machine's GPUs (capacity: 4 CPUs and every visible GPU,
    as the server measures them), found by ``trainer.submit()`` through $TRAINFORGE_SERVER_DIR. Fails
    the test if a job process outlives it or a request failed inside it (as ``train_server``)."""
    pytest.importorskip("fastapi", reason="the train server needs fastapi: carry the wheels (bash scripts/gpu_wheels.sh)")
    from trainforge._internal.devices import local_gpu_ids
    from trainforge._testing.server import TrainServer

    server = TrainServer(str(tmp_path / "server"), capacity=f"CPU=4,GPU={len(local_gpu_ids())}").start()
    monkeypatch.setenv("TRAINFORGE_SERVER_DIR", server.state_dir)
    yield server
    left = server.cleanup()
    assert not left, f"job processes left behind: {left}"
    assert "Traceback" not in server.output, server.output
