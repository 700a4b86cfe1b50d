"""The train server on a GPU machine: a job granted ``gpu_ids`` sees exactly those (a fractional
request included) and a job granted none sees no GPU; the dashboard's usage sampler reads a job's GPU
memory per process through NVML, in process and through the usage API."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
import torch
from gpuutil import gpu_job

from trainforge import DataParallelTrainer, ScalingConfig
from trainforge._testing.wait import wait_until

MIB = 2**20


def _first_report(job: Any, timeout: float = 180.0) -> Any:
    got: list[Any] = []
    reader = threading.Thread(target=lambda: got.append(next(iter(job.reports()), None)), daemon=True)
    reader.start()
    reader.join(timeout)
    assert got and got[0] is not None, f"no report from job {job.id} within {timeout} s: {job.status()}"
    return got[0]


def test_nvml_reads_this_processes_gpu_memory():
    pytest.importorskip("pynvml")
    pytest.importorskip("fastapi", reason="the train server needs fastapi: carry the wheels (bash scripts/gpu_wheels.sh)")
    from trainforge.server.jobs.usage import _Gpus

    gpus = _Gpus()
    assert gpus.problem is None, gpus.problem
    held = torch.ones(512 * MIB, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    mine = gpus.sample().get(os.getpid())
    assert mine is not None, f"NVML lists no GPU process with this pid ({os.getpid()}): {gpus.sample()}"
    assert mine["gpu_memory"] >= 512 * MIB and 0.0 <= mine["gpu_util"] <= 100.0
    del held


def _trainer(rc: Any, name: str, gate: str, **scaling: Any) -> DataParallelTrainer:
    return DataParallelTrainer(
        gpu_job, train_loop_config={"mib": 256, "gate": gate},
        scaling_config=ScalingConfig(num_workers=1, **scaling), run_config=rc(name),
    )  # fmt: skip


@pytest.mark.parametrize("gpu_share", [1.0, 0.5], ids=["whole", "fraction"])
def test_a_job_granted_a_gpu_sees_only_it_and_its_gpu_memory_reaches_the_usage_api(gpu_server, rc, tmp_path, gpu0,
                                                                                    gpu_share):  # fmt: skip
    gate = str(tmp_path / "gate")
    job = _trainer(rc, "gpu", gate, use_gpu=True, resources_per_worker={"GPU": gpu_share}).submit()
    other = _trainer(rc, "cpu", gate).submit()  # no GPU asked: it must see none
    try:
        first = _first_report(job).metrics
        assert job.status().raw["gpu_ids"] == [gpu0["id"]]
        assert (first["cvd"], first["count"], first["device"], first["uuid"]) == (gpu0["id"], 1, "cuda:0", gpu0["uuid"])
        assert first["held"] == 256 * MIB
        seen = _first_report(other).metrics
        assert (seen["cvd"], seen["available"], seen["count"], seen["device"]) == ("", False, 0, "cpu")
        assert not other.status().raw["gpu_ids"]

        def worker_row() -> dict[str, Any] | None:
            usage = job.client.request("GET", f"/jobs/{job.id}/usage")
            rows = [p for p in usage["processes"] if p["pid"] == first["pid"] and p.get("gpu_memory")]
            return rows[0] if rows else None

        wait_until(lambda: worker_row() is not None, 60, "the worker's GPU memory in the job's usage")
        usage = job.client.request("GET", f"/jobs/{job.id}/usage")
        row = worker_row()
        assert usage["gpu"] == "ok" and row is not None and row["role"] == "worker"
        assert row["gpu_memory"] >= 256 * MIB and usage["total"]["gpu_memory"] >= row["gpu_memory"]
        assert usage["history"][-1]["gpu_memory"] > 0
    finally:
        open(gate, "w").close()
    for j in (job, other):
        status = j.wait(timeout=180)
        assert status.state == "SUCCEEDED", status.raw
