"""The dashboard's GPU readings without a GPU: NVML faked at its boundary (tests/fake_nvml/pynvml.py,
first on the server's PYTHONPATH), so a job's per-process GPU memory and utilisation flow through the
real usage sampler into ``GET /jobs/{id}/usage``; and what the sampler says when NVML is missing,
fails, or loses a device."""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("fastapi")

import trainforge  # noqa: E402
from trainforge import DataParallelTrainer, RunConfig, ScalingConfig  # noqa: E402
from trainforge._testing.wait import wait_until

FAKE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_nvml")
MIB = 2**20


def _fake_nvml() -> Any:
    spec = importlib.util.spec_from_file_location("pynvml", os.path.join(FAKE_DIR, "pynvml.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_nvml_or_a_driver_the_reading_says_why(monkeypatch):
    from trainforge.server.jobs.usage import _Gpus

    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    gpus = _Gpus()
    assert gpus.problem == "no GPU readings: nvidia-ml-py is not installed (pip install 'trainforge[server]')"
    assert gpus.sample() == {}
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml())
    monkeypatch.setenv("FAKE_NVML_FAIL", "1")
    gpus = _Gpus()
    assert gpus.problem == "no GPU: Driver Not Loaded" and gpus.sample() == {}


def test_a_device_that_fails_is_skipped_and_the_others_still_read(monkeypatch):
    from trainforge.server.jobs.usage import _Gpus

    fake = _fake_nvml()
    fake._gpu_pids = lambda: [10, 11]

    def util(handle: int) -> Any:
        if handle == 1:
            raise fake.NVMLError("GPU is lost")
        return SimpleNamespace(gpu=30)

    fake.nvmlDeviceGetUtilizationRates = util
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    gpus = _Gpus()
    assert gpus.problem is None
    assert gpus.sample() == {10: {"gpu_memory": 100.0 * MIB, "gpu_util": 30.0},
                             11: {"gpu_memory": 100.0 * MIB, "gpu_util": 30.0}}  # fmt: skip


def _gated(config: dict[str, Any]) -> None:
    trainforge.report({"pid": os.getpid()})
    while not os.path.exists(config["gate"]):  # the test reads the usage meanwhile
        time.sleep(0.02)


@pytest.mark.slow
def test_per_process_gpu_memory_and_utilisation_reach_the_usage_api(tmp_path, monkeypatch):
    """Two workers: each holds 100 MiB on device 0 (30 %), the one of even pid 50 MiB more on device 1
    (70 %): a process's memory is summed over devices, its utilisation is its busiest device's, the
    job's totals are the sum and the maximum."""
    from trainforge._testing.server import TrainServer

    path = os.pathsep.join(p for p in (FAKE_DIR, os.environ.get("PYTHONPATH")) if p)
    server = TrainServer(str(tmp_path / "server"), env={"PYTHONPATH": path}).start()
    gate = tmp_path / "gate"
    try:
        monkeypatch.setenv("TRAINFORGE_SERVER_DIR", server.state_dir)
        job = DataParallelTrainer(_gated, train_loop_config={"gate": str(gate)}, scaling_config=ScalingConfig(num_workers=2),
                                  run_config=RunConfig(name="nvml", storage_path=str(tmp_path / "runs"), verbose=0)).submit()  # fmt: skip
        got: list[Any] = []
        reader = threading.Thread(target=lambda: got.append(next(iter(job.reports()), None)), daemon=True)
        reader.start()
        reader.join(120)
        assert got and got[0] is not None, job.status()
        pids = sorted(m["pid"] for m in got[0].all_metrics)

        def usage() -> dict[str, Any]:
            return job.client.request("GET", f"/jobs/{job.id}/usage")

        def workers() -> dict[int, dict[str, Any]]:
            return {p["pid"]: p for p in usage()["processes"] if p["role"] == "worker" and p.get("gpu_memory")}

        wait_until(lambda: sorted(workers()) == pids, 60, "both workers' GPU readings")
        reading = usage()
        rows = {p["pid"]: p for p in reading["processes"] if p["role"] == "worker"}
        expected = {pid: ((150 if pid % 2 == 0 else 100) * MIB, 70.0 if pid % 2 == 0 else 30.0) for pid in pids}
        assert {pid: (r["gpu_memory"], r["gpu_util"]) for pid, r in rows.items()} == expected
        assert reading["gpu"] == "ok"
        assert reading["total"]["gpu_memory"] == sum(m for m, _ in expected.values())
        assert reading["total"]["gpu_util"] == max(u for _, u in expected.values())
        runner = [p for p in reading["processes"] if p["role"] == "runner"]
        assert runner and "gpu_memory" not in runner[0]  # NVML does not list it: no GPU numbers
        assert reading["history"][-1]["gpu_memory"] == reading["total"]["gpu_memory"]
    finally:
        gate.touch()
    try:
        assert job.wait(timeout=120).state == "SUCCEEDED"
    finally:
        left = server.cleanup()
    assert not left and "Traceback" not in server.output, server.output
