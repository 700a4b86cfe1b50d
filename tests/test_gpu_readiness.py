"""The GPU layer's CPU side: tests/gpu/ collected and skipped with its reason (and selectable by the
``gpu`` marker); the wheels carried to a GPU machine against the project's dependencies and the GPU
image's packages; scripts/gpu_check.sh's dry run; its summary of a run; bench/bench_gpu.py without a
GPU (and a smoke run of it on the CPU)."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import zipfile
from typing import Any

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "scripts"))

import gpu_check  # noqa: E402

NO_GPU = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # as on a GPU machine with its GPUs hidden, too


def _run(cmd: list[str], timeout: float = 300, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=REPO, env=kw.pop("env", NO_GPU), capture_output=True, text=True,
                          timeout=timeout, **kw)  # fmt: skip


@functools.lru_cache(maxsize=1)
def _gpu_test_ids() -> list[str]:
    out = _run([sys.executable, "-m", "pytest", "tests/gpu", "--collect-only", "-q", "-p", "no:cacheprovider"])
    assert out.returncode == 0, out.stdout + out.stderr
    return [line for line in out.stdout.splitlines() if line.startswith("tests/gpu/")]


def test_the_gpu_tests_are_collected_and_skipped_without_cuda_with_the_reason():
    ids = _gpu_test_ids()
    assert len(ids) >= 15 and {i.split("::")[0] for i in ids} == {
        "tests/gpu/test_gpu_amp.py", "tests/gpu/test_gpu_serve.py", "tests/gpu/test_gpu_server.py",
        "tests/gpu/test_gpu_workers.py"}  # fmt: skip
    out = _run([sys.executable, "-m", "pytest", "tests/gpu", "-q", "-rs", "-p", "no:cacheprovider"])
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(rf"^{len(ids)} skipped in ", out.stdout, re.MULTILINE), out.stdout
    reasons = [line for line in out.stdout.splitlines() if line.startswith("SKIPPED")]
    assert reasons and all("no CUDA device" in r and "run scripts/gpu_check.sh on a GPU machine" in r for r in reasons)
    deselected = _run([sys.executable, "-m", "pytest", "tests/gpu", "-q", "-m", "not gpu", "-p", "no:cacheprovider"])
    assert deselected.returncode == 5 and f"{len(ids)} deselected" in deselected.stdout  # every one is marked gpu


# -- the wheels --------------------------------------------------------------------------------------------
def test_every_runtime_dependency_of_the_server_and_serve_path_is_in_the_image_or_the_wheels():
    pins, image = gpu_check.read_wheel_list(), gpu_check.read_image_list()
    closure = gpu_check.runtime_closure(("torch", "server", "serve"))
    assert {"fastapi", "uvicorn", "pydantic", "torch", "numpy", "nvidia-ml-py"} <= set(closure)  # it walked
    missing = sorted(name for name in closure if name not in pins and name not in image)
    assert not missing, f"add these to scripts/gpu_wheels.txt (the GPU image lacks them): {missing}"
    for name, version in pins.items():  # the versions this environment (requirements-dev.txt) installs
        assert closure.get(name, version) == version, f"scripts/gpu_wheels.txt pins {name}=={version}, .venv has {closure[name]}"
    assert not [n for n in pins if n not in closure], "scripts/gpu_wheels.txt lists a package nothing needs"


def test_the_wheel_list_checks_out_against_this_environment(tmp_path):
    report = gpu_check.check_wheels(str(tmp_path))  # no wheels here: the list against what is installed
    assert report["problems"] == [] and report["wheels"] == 0
    assert any("gpu_wheels.sh" in n for n in report["notes"])


def _fake_wheel(folder: Any, filename: str, requires: list[str]) -> None:
    name, version = filename.split("-")[:2]
    with zipfile.ZipFile(folder / filename, "w") as z:
        meta = "Metadata-Version: 2.1\nName: {}\nVersion: {}\n{}".format(
            name, version, "".join(f"Requires-Dist: {r}\n" for r in requires))  # fmt: skip
        z.writestr(f"{name}-{version}.dist-info/METADATA", meta)


def test_a_wrong_wheel_folder_is_refused_naming_each_problem(tmp_path):
    pins = gpu_check.read_wheel_list()
    for name, version in pins.items():
        if name != "uvicorn":  # left out: listed but missing
            _fake_wheel(tmp_path, f"{name.replace('-', '_')}-{version}-py3-none-any.whl", [])
    _fake_wheel(tmp_path, "fastapi-0.1.0-py3-none-any.whl", [])  # a second version
    _fake_wheel(tmp_path, "leftpad-1.0-cp311-cp311-win_amd64.whl", ["no-such-dependency>=1", "colorama; sys_platform == 'win32'"])
    problems = "\n".join(gpu_check.check_wheels(str(tmp_path))["problems"])
    assert "two versions of fastapi" in problems
    assert "leftpad-1.0-cp311-cp311-win_amd64.whl is not in scripts/gpu_wheels.txt" in problems
    assert "is not for CPython 3.12 on x86-64 Linux (tags cp311-cp311-win_amd64)" in problems
    assert "leftpad needs no-such-dependency>=1, which neither the GPU image nor scripts/gpu_wheels.txt has" in problems
    assert "colorama" not in problems  # a Windows-only requirement does not apply there
    assert f"uvicorn=={pins['uvicorn']} is listed but not in .whl/" in problems


# -- scripts/gpu_check.sh ----------------------------------------------------------------------------------
def test_gpu_check_dry_run_checks_what_needs_no_gpu_and_says_what_it_would_run(tmp_path):
    out = _run(["bash", "scripts/gpu_check.sh", str(tmp_path / "out"), "--dry-run"], env={**NO_GPU, "PYTHON": sys.executable})
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert f"would run: timeout 330 {sys.executable} -m pytest tests/gpu" in text and "--junitxml=" in text
    assert "bench/bench_gpu.py --quick --require-gpu" in text and "bench_gpu: no CUDA device" in text
    assert re.search(rf"^{len(_gpu_test_ids())} tests collected", text, re.MULTILINE), text
    assert "# GPU check (dry run): OK" in text and "wheels:" in text
    files = sorted(os.listdir(tmp_path / "out"))
    assert files == ["gpu_check.json", "gpu_check.log", "gpu_check.md", "gpu_env.json", "gpu_wheels.json"]
    summary = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert summary["dry_run"] and summary["ok"] and summary["environment"]["cuda_available"] is False
    assert "would run:" in (tmp_path / "out" / "gpu_check.log").read_text()  # the log is whole
    usage = _run(["bash", "scripts/gpu_check.sh"])
    assert usage.returncode == 2 and "usage: bash scripts/gpu_check.sh OUTDIR [--dry-run]" in usage.stderr


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="3">
<testcase classname="tests.gpu.test_gpu_workers" name="test_one" time="4.5"/>
<testcase classname="tests.gpu.test_gpu_amp" name="test_two" time="2.0"><failure message="AssertionError: assert 'gloo' == 'nccl'">long trace</failure></testcase>
<testcase classname="tests.gpu.test_gpu_server" name="test_three" time="0.1"><skipped message="no fastapi"/></testcase>
</testsuite></testsuites>"""


def test_the_summary_of_a_run_names_each_test_and_the_benchmark(tmp_path):
    (tmp_path / "gpu_tests.xml").write_text(JUNIT)
    (tmp_path / "gpu_env.json").write_text(json.dumps({"python": "3.12.3", "torch": "2.11.0+cu130", "torch_cuda": "13.0",
                                                       "cuda_available": True, "devices": [{"name": "NVIDIA H100 80GB HBM3"}],
                                                       "nvidia_smi": ["0, NVIDIA H100 80GB HBM3, 580.159.04, 81559 MiB"]}))  # fmt: skip
    bench = {"summary": {"step_ms": {"raw": 7.0, "trainforge": 7.05}, "step_ratio": 0.993, "amp_speedup_fp16": 3.1,
                         "amp_speedup_bf16": 3.2, "first_step_s": {"raw": 2.0, "trainforge": 4.5}, "sampler_ms": 0.4}}  # fmt: skip
    (tmp_path / "gpu_bench.json").write_text(json.dumps(bench))
    result = gpu_check.summary(str(tmp_path), dry_run=False)
    assert not result["ok"] and result["gpu"] == "NVIDIA H100 80GB HBM3"
    tests = result["tests"]
    assert (tests["passed"], tests["failed"], tests["skipped"], tests["total"]) == (1, 1, 1, 3)
    md = (tmp_path / "gpu_check.md").read_text()
    assert md.startswith("# GPU check: NOT OK")
    assert "| test_gpu_amp::test_two | failed | 2.0 | AssertionError: assert 'gloo' == 'nccl' |" in md
    assert "| speed vs raw (goal >= 0.98) | 0.993 |" in md
    assert re.search(r"^\| \d{4}-\d\d-\d\d \| NVIDIA H100 80GB HBM3 \| .* \| 1/3 \| 0.993 \| 3.10 / 3.20 \| 4.5 \| 0.40 \|$", md, re.MULTILINE)
    (tmp_path / "gpu_tests.xml").write_text(JUNIT.replace('<failure message="AssertionError', '<skipped message="x').replace(
        "long trace</failure>", "</skipped>"))  # fmt: skip
    assert gpu_check.summary(str(tmp_path), dry_run=False)["ok"]
    assert json.loads((tmp_path / "gpu_check.json").read_text())["bench"]["summary"]["step_ratio"] == 0.993


# -- bench/bench_gpu.py ------------------------------------------------------------------------------------
def test_the_gpu_benchmark_without_a_gpu_says_so_and_writes_nothing(tmp_path):
    target = tmp_path / "gpu.json"
    out = _run([sys.executable, "bench/bench_gpu.py", "--quick", "--json-out", str(target)])
    assert out.returncode == 0 and "bench_gpu: no CUDA device" in out.stdout and not target.exists()
    out = _run([sys.executable, "bench/bench_gpu.py", "--quick", "--require-gpu", "--json-out", str(target)])
    assert out.returncode == 2 and "Run it on a GPU machine" in out.stdout


@pytest.mark.slow
def test_the_gpu_benchmark_runs_end_to_end_on_the_cpu_as_a_smoke_test(tmp_path):
    target = tmp_path / "gpu.json"
    out = _run([sys.executable, "bench/bench_gpu.py", "--smoke-on-cpu", "--quick", "--width", "32", "--depth", "2",
                "--batch", "8", "--warmup", "1", "--steps", "3", "--samples", "3", "--json-out", str(target)])  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    data = json.loads(target.read_text())
    summary = data["summary"]
    assert set(summary["step_ms"]) == {"raw", "trainforge", "trainforge-fp16", "trainforge-bf16"}
    assert all(v > 0 for v in summary["step_ms"].values()) and summary["step_ratio"] > 0
    assert summary["first_step_s"]["trainforge"] > 0 and summary["amp_speedup_bf16"] > 0
    assert "speed vs raw (raw/trainforge)" in out.stdout and data["config"]["steps"] == 3


def test_a_checkout_without_installed_metadata_finds_the_platform_through_its_pyproject(monkeypatch):
    """On the lent GPU machine trainforge runs from the checkout on PYTHONPATH, with no installed
    metadata: ``trainer.submit()`` still finds the server's client, from the checkout's pyproject."""
    import importlib.metadata

    from trainforge._internal import extensions

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **kw: ())
    monkeypatch.setattr(extensions, "_registered", {})
    extensions._checkout_entry_points.cache_clear()
    try:
        submit = extensions.lookup(extensions.SUBMITTERS, "server")
        scheme = extensions.lookup(extensions.CHECKPOINT_SCHEMES, "models")
        assert extensions.lookup(extensions.SUBMITTERS, "nope") is None
    finally:
        extensions._checkout_entry_points.cache_clear()
    from trainforge.registry._entry import checkpoint_from_uri
    from trainforge.server._entry import submit as server_submit

    assert submit is server_submit and scheme is checkpoint_from_uri


def test_an_installed_trainforge_reads_entry_points_from_its_metadata_alone():
    from trainforge._internal import extensions

    extensions._checkout_entry_points.cache_clear()
    assert extensions._checkout_entry_points(extensions.SUBMITTERS) == ()
