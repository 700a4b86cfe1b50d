"""The dashboard's Models pages in a real browser (Debian's Chromium through Playwright) against a real
train server whose registry holds a version a real job of that server produced: the model's
versions, aliases and alias history are shown, and its lineage links to the job's page. The ``page``
fixture fails a test on any console error or uncaught page error. Waits are on what the page shows.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

import trainforge
from trainforge import DataParallelTrainer, RunConfig, ScalingConfig

pytestmark = pytest.mark.slow


def _checkpointing(config):
    for step in range(2):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "weights.bin"), "wb") as f:
                f.write(bytes([step]) * 4096)
            trainforge.report({"step": step, "acc": 0.5 + step / 4}, checkpoint=trainforge.Checkpoint.from_directory(d))


@pytest.fixture
def models_server(tmp_path, monkeypatch):
    pytest.importorskip("fastapi")
    from trainforge._testing.server import TrainServer

    server = TrainServer(str(tmp_path / "server"), extra=("--registry", str(tmp_path / "registry"))).start()
    monkeypatch.setenv("TRAINFORGE_SERVER_DIR", server.state_dir)
    yield server
    left = server.cleanup()
    assert not left, f"job processes left behind: {left}"
    assert "Traceback" not in server.output, server.output


def _dashboard_url(server) -> str:
    out = subprocess.run([sys.executable, "-m", "trainforge", "dashboard", "--state-dir", server.state_dir],
                         capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return out.stdout.strip()


def test_models_page_shows_versions_alias_history_and_links_a_version_to_its_job(models_server, page, tmp_path):
    from trainforge.registry import Registry

    trainer = DataParallelTrainer(
        _checkpointing, scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(name="trained", storage_path=str(tmp_path / "runs"), verbose=0),
    )  # fmt: skip
    job = trainer.submit()
    result = job.result(timeout=120)
    registry = Registry(str(tmp_path / "registry"))
    registry.register("digits", result, tags={"data": "digits"})  # v1: from the job (its Result)
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "weights.bin").write_bytes(b"\7" * 100)
    metrics = {"epoch": 5, "batch_count": 40, "num_samples": 640, "train_loss": 0.31, "last_train_loss": 0.2,
               "val_loss": 0.12, "val_accuracy": 0.97}  # as ModelTrainer reports them: bookkeeping first  # fmt: skip
    registry.register("digits", str(other), metrics=metrics)  # v2: from no job of this server
    registry.set_alias("digits", "production", 1, by="alice")
    registry.set_alias("digits", "production", 2, by="bob")
    registry.set_alias("digits", "staging", 1, by="carol")

    versions = job.client.request("GET", "/models/digits/versions")
    assert versions[0]["job"]["id"] == job.id and versions[1]["job"] is None

    page.goto(_dashboard_url(models_server))
    page.locator("header nav a", has_text="Models").click()
    row = page.locator("#model-digits")
    assert "production → v2" in row.inner_text() and "staging → v1" in row.inner_text()
    row.locator("a", has_text="digits").click()
    page.locator("#versions").wait_for()
    v1, v2 = page.locator("#v-1"), page.locator("#v-2")
    assert "acc=0.75" in v1.locator("td.metrics").inner_text()  # the run's last metrics
    assert "data=digits" in v1.inner_text() and "staging" in v1.locator("td.aliases").inner_text()
    assert "100 B" in v2.inner_text() and "production" in v2.locator("td.aliases").inner_text()
    # The measures first (validation, then training), bookkeeping last: val_accuracy is not cut off.
    shown = v2.locator("td.metrics").inner_text()
    assert shown.startswith("val_loss=0.12 val_accuracy=0.97 train_loss=0.31 last_train_loss=0.2 epoch=5"), shown
    assert "not from a job on this server" in v2.locator("td.produced").inner_text()
    history = page.locator("#history tr")
    assert history.count() == 3
    assert [history.nth(i).inner_text().split("\t")[1:] for i in range(3)] == [
        ["staging", "—", "v1", "carol"], ["production", "v1", "v2", "bob"], ["production", "—", "v1", "alice"],
    ]  # newest first  # fmt: skip
    assert "bob" in page.locator('#aliases tr[data-alias="production"]').inner_text()
    link = v1.locator("a.job-link")
    assert f"job {job.id}" in link.inner_text()
    where = os.environ.get("TRAINFORGE_SCREENSHOTS") or str(tmp_path)
    os.makedirs(where, exist_ok=True)
    page.screenshot(path=os.path.join(where, "model.png"), full_page=True)
    link.click()
    page.wait_for_url(f"**/jobs/{job.id}")
    page.locator("#state.s-SUCCEEDED").wait_for(timeout=30_000)
    assert f"Job {job.id}" in page.locator("h1").inner_text()


def test_models_page_without_models_and_an_unknown_model(models_server, page):
    page.goto(_dashboard_url(models_server))
    page.goto(models_server.url + "/models")
    assert "No models yet" in page.locator("#models").inner_text()
    page.goto(models_server.url + "/models/nothing-here")
    assert "No such model" in page.locator("h1").inner_text()
    page.goto(models_server.url + "/models/bad%20name")
    assert "not a model name" in page.locator("main").inner_text()
