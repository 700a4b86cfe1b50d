"""End-to-end: run each example script as a user would, in a fresh interpreter."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"


def run_example(script: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    # The script's own directory is sys.path[0]; make the checkout importable as if installed.
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": pythonpath},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, (
        f"{script} exited with {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    )
    return proc


@pytest.mark.slow
def test_digits_reaches_95_percent(tmp_path):
    proc = run_example("digits.py", "--storage-path", str(tmp_path))
    matches = re.findall(r"test_accuracy['\"]?\s*[:=]\s*([0-9.]+)", proc.stdout)
    assert matches, proc.stdout
    assert float(matches[-1]) >= 0.95, proc.stdout
    match = re.search(r"^checkpoint: (.+)$", proc.stdout, re.MULTILINE)
    assert match and match.group(1) != "None", proc.stdout
    assert Path(match.group(1), "model.pt").is_file()


@pytest.mark.slow
def test_plain_data_parallel_sees_every_item_once(tmp_path):
    proc = run_example("plain_data_parallel.py", "--storage-path", str(tmp_path))
    assert "every item seen exactly once: [1, 2, 3]" in proc.stdout, proc.stdout


@pytest.mark.slow
def test_registry_example_registers_loads_serves_and_moves_the_alias(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("fastapi")
    registry = str(tmp_path / "registry")
    proc = run_example("registry_digits.py", "--registry", registry, "--storage-path", str(tmp_path / "runs"),
                       "--epochs", "3", "--num-workers", "1")  # fmt: skip
    assert "registered models:/digits/1" in proc.stdout and "registered models:/digits/2" in proc.stdout
    assert "served by models:/digits/1" in proc.stdout, proc.stdout
    assert "after the alias moved, served by models:/digits/2" in proc.stdout, proc.stdout
    assert "production's history: None->1, 1->2" in proc.stdout, proc.stdout
    from trainforge.registry import Registry

    assert Registry(registry).get("digits@production").version == 2


@pytest.mark.slow
def test_model_lifecycle_defines_puts_trains_on_the_server_tunes_serves_and_moves_the_alias(tmp_path):
    for module in ("torch", "xgboost", "fastapi", "sklearn"):
        pytest.importorskip(module)
    registry = str(tmp_path / "registry")
    proc = run_example("model_lifecycle.py", "--registry", registry, "--storage-path", str(tmp_path / "runs"),
                       "--state-dir", str(tmp_path / "server"))  # fmt: skip
    out = proc.stdout
    for kind, name in (("torch", "digits-net"), ("xgboost", "cancer-xgb")):
        assert f"[{kind}] put models:/{name}/1 (a definition" in out, out
        assert f"[{kind}] submitted models:/{name}/1 as job " in out, out
        assert f"[{kind}] tuned 2 trials; registered the best as models:/{name}/2" in out, out
        assert f"lineage: definition models:/{name}/1" in out, out
        assert re.search(rf"\[{kind}\] job \d+ done: registered models:/{name}/3", out), out
        assert f"[{kind}] served by models:/{name}/2" in out, out
        assert f"[{kind}] after the alias moved, served by models:/{name}/3" in out, out
        assert f"[{kind}] lineage: models:/{name}/1 -> 2 run(s)" in out, out
    from trainforge.registry import Registry

    reg = Registry(registry)
    assert reg.get("digits-net@prod").version == 3 and reg.get("cancer-xgb@prod").version == 3
    assert reg.get("cancer-xgb/3").lineage["definition"] == "models:/cancer-xgb/1"
    assert [v.kind for v in reg.versions("digits-net")] == ["definition", "trained", "trained"]
