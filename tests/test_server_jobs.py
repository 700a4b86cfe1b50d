"""The train server with real processes: jobs queued by resources, results equal to fit(), stop,
server kill -9 and restart, runner kill -9 (lost, requeued), bursts of submissions."""

from __future__ import annotations

import trainforge
from trainforge import DataParallelTrainer, RunConfig, ScalingConfig


def _loop(config):
    for step in range(config["steps"]):
        trainforge.report({"step": step, "loss": 1.0 / (step + 1), "rank": trainforge.get_context().get_world_rank()})


def _trainer(tmp_path, name, steps=5, workers=2):
    return DataParallelTrainer(
        _loop, train_loop_config={"steps": steps}, scaling_config=ScalingConfig(num_workers=workers),
        run_config=RunConfig(name=name, storage_path=str(tmp_path / "runs"), verbose=0),
    )  # fmt: skip


def test_submitted_job_returns_the_result_fit_returns(train_server, tmp_path):
    local = _trainer(tmp_path, "local").fit()
    job = _trainer(tmp_path, "served").submit(address=train_server.url)
    reports = list(job.reports())
    result = job.result(timeout=120)
    assert [r.metrics for r in reports] == result.metrics_dataframe.to_dict("records")
    assert result.metrics == local.metrics
    assert result.metrics_dataframe.equals(local.metrics_dataframe)
    assert result.path == str(tmp_path / "runs" / "served")
    assert job.status().state == "SUCCEEDED"
