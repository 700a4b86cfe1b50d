"""Runs against a real S3-compatible server: moto's server mode on 127.0.0.1 (an ephemeral port),
reached through s3fs by the driver and by real worker processes. Credentials and the endpoint come
from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL); each test gets a
fresh bucket."""

from __future__ import annotations

import json
import logging
import os
import socket
import tempfile
from pathlib import Path

import pytest

import trainforge as train
from trainforge import CheckpointConfig, DataParallelTrainer, Result, RunConfig, ScalingConfig
from trainforge._internal.exceptions import StorageError
from trainforge._internal.storage import COMMIT_MARKER, StorageContext, resolve_filesystem

s3fs = pytest.importorskip("s3fs")
boto3 = pytest.importorskip("boto3")
# The moto server (moto_endpoint) and a fresh bucket per test (bucket) are fixtures of conftest.py.


def keys(bucket: str, prefix: str = "") -> list[str]:
    """Every object key in the bucket under ``prefix``, straight from the server."""
    pages = boto3.client("s3").get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(obj["Key"] for page in pages for obj in page.get("Contents", []))


def get(bucket: str, key: str) -> str:
    return boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read().decode()


def _loop(config):
    """Each rank writes its own file and a shared one; rank r's shared copy says r."""
    ctx = train.get_context()
    rank = ctx.get_world_rank()
    print(f"rank {rank} says hello to the log", flush=True)
    start = 0
    resumed = train.get_checkpoint()
    if resumed is not None:
        with resumed.as_directory() as d:
            start = int(Path(d, "step.txt").read_text()) + 1
    for step in range(start, start + len(config["scores"])):
        with tempfile.TemporaryDirectory() as d:
            Path(d, f"rank_{rank}.txt").write_text(f"step {step}")
            Path(d, "shared.txt").write_text(f"rank {rank}")
            Path(d, "step.txt").write_text(str(step))
            Path(d, "sub").mkdir()
            Path(d, "sub", f"deep_{rank}.bin").write_bytes(bytes([rank, step]))
            score = config["scores"][step - start]
            train.report(
                {"step": step, "score": score, "resumed": resumed is not None},
                checkpoint=train.Checkpoint.from_directory(d),
            )


def _trainer(bucket: str, scores: list[int], **run_kwargs) -> DataParallelTrainer:
    run_kwargs.setdefault("storage_path", f"s3://{bucket}/prefix")
    return DataParallelTrainer(
        _loop,
        train_loop_config={"scores": scores},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name="run",
            checkpoint_config=CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="score"),
            verbose=0,
            **run_kwargs,
        ),
    )


def test_fit_on_s3_merges_ranks_keeps_top_k_and_uploads_logs(bucket):
    result = _trainer(bucket, scores=[5, 1, 3, 2]).fit()
    run = "prefix/run/"
    stored = keys(bucket, run)

    # top-2 by score (steps 0 and 2) plus the latest (step 3); step 1 was deleted from the bucket
    ckpts = sorted({k[len(run):].split("/")[0] for k in stored if k[len(run):].startswith("checkpoint_")})
    assert ckpts == ["checkpoint_000000", "checkpoint_000002", "checkpoint_000003"]
    assert [k for k in stored if "/.staging/" in k] == []
    expected = [COMMIT_MARKER, "rank_0.txt", "rank_1.txt", "shared.txt", "step.txt", "sub/deep_0.bin", "sub/deep_1.bin"]
    for name in ckpts:
        assert sorted(k[len(run) + len(name) + 1:] for k in stored if k.startswith(run + name + "/")) == expected
    marker = json.loads(get(bucket, f"{run}checkpoint_000002/{COMMIT_MARKER}"))
    assert marker["metrics"]["step"] == 2 and marker["ranks"] == [0, 1]
    assert get(bucket, f"{run}checkpoint_000002/shared.txt") == "rank 0"  # the lowest rank's copy wins

    # the Result points into the bucket, and as_directory() downloads
    assert result.path == f"{bucket}/prefix/run"
    assert result.checkpoint.path == f"{bucket}/prefix/run/checkpoint_000003"
    assert isinstance(result.checkpoint.filesystem, s3fs.S3FileSystem)
    with result.checkpoint.as_directory() as d:
        assert Path(d, "rank_1.txt").read_text() == "step 3"
        assert Path(d, "sub", "deep_1.bin").read_bytes() == bytes([1, 3])
        downloaded = d
    assert not os.path.exists(downloaded)
    assert [m["step"] for _, m in result.best_checkpoints] == [0, 2, 3]
    assert list(result.metrics_dataframe["step"]) == [0, 1, 2, 3]

    # per-rank logs are uploaded at the end
    assert {run + "logs/rank_0.log", run + "logs/rank_1.log"} <= set(stored)
    assert "rank 1 says hello to the log" in get(bucket, run + "logs/rank_1.log")

    # Result.from_path rebuilds all of it from the bucket
    again = Result.from_path(f"s3://{bucket}/prefix/run")
    assert again.metrics == result.metrics and again.metrics["step"] == 3
    assert list(again.metrics_dataframe["score"]) == [5, 1, 3, 2]
    assert again.checkpoint.path == result.checkpoint.path
    assert [(c.path, m["score"]) for c, m in again.best_checkpoints] == [
        (c.path, m["score"]) for c, m in result.best_checkpoints
    ]


def test_second_fit_resumes_from_the_latest_checkpoint(bucket, moto_endpoint, monkeypatch):
    first = _trainer(bucket, scores=[1, 2]).fit()
    assert first.checkpoint.path.endswith("checkpoint_000001")

    # The same RunConfig(name, storage_path), this time with a ready filesystem that carries the
    # endpoint and the credentials itself (pickled to the workers): the environment no longer has them.
    fs = s3fs.S3FileSystem(endpoint_url=moto_endpoint, key="testing", secret="testing", skip_instance_cache=True)
    for var in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var)
    second = _trainer(bucket, scores=[3], storage_filesystem=fs).fit()

    assert second.metrics == {"step": 2, "score": 3, "resumed": True}  # get_checkpoint() gave step 1's
    assert list(second.metrics_dataframe["step"]) == [0, 1, 2]  # the history continues
    assert second.checkpoint.path == f"{bucket}/prefix/run/checkpoint_000002"
    with second.checkpoint.as_directory() as d:
        assert Path(d, "rank_0.txt").read_text() == "step 2"


def test_trainer_metadata_in_checkpoints_and_after_restore_on_s3(bucket):
    from test_local_e2e import check_trainer_metadata_through_restore

    check_trainer_metadata_through_restore(f"s3://{bucket}/prefix", f"s3://{bucket}/prefix/meta")
    stored = json.loads(get(bucket, "prefix/meta/checkpoint_000002/.metadata.json"))
    assert stored == {"owner": "trainer", "lr": 0.1, "step": 2}


def test_missing_bucket_is_reported_before_any_worker_starts(bucket):
    missing = f"{bucket}-missing"
    with pytest.raises(ValueError) as info:
        _trainer(bucket, scores=[1], storage_path=f"s3://{missing}/prefix").fit()
    msg = str(info.value)
    assert f"RunConfig.storage_path='s3://{missing}/prefix' cannot be written" in msg
    assert f"s3://{missing}/prefix/run" in msg and "the bucket must exist: create it first" in msg
    assert "was not removed" not in msg
    assert missing not in [b["Name"] for b in boto3.client("s3").list_buckets()["Buckets"]]  # not created


def test_storage_error_names_the_s3_url_when_the_endpoint_is_unreachable(bucket, monkeypatch, caplog):
    monkeypatch.setenv("TRAINFORGE_STORAGE_RETRIES", "3")
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    fs = s3fs.S3FileSystem(
        endpoint_url=f"http://127.0.0.1:{port}", config_kwargs={"retries": {"max_attempts": 1}}, skip_instance_cache=True
    )
    fs.retries = 1  # s3fs' own retry loop: keep the test fast
    storage = StorageContext(f"s3://{bucket}/prefix", "run", fs)
    with caplog.at_level(logging.WARNING, logger="trainforge"), pytest.raises(StorageError) as info:
        storage.write_text("run_state.json", "{}")
    msg = str(info.value)
    assert f"Storage operation 'write' on s3://{bucket}/prefix/run/run_state.json failed after 3 attempts" in msg
    assert "EndpointConnectionError" in msg and "AWS_ENDPOINT_URL" in msg
    warnings = [r.getMessage() for r in caplog.records if r.name == "trainforge"]
    assert len(warnings) == 2 and "attempt 2 of 3" in warnings[1]


def test_missing_s3fs_names_the_extra(monkeypatch):
    import sys

    registry = sys.modules["fsspec.registry"]  # (the attribute fsspec.registry is a mapping)
    monkeypatch.setitem(sys.modules, "s3fs", None)  # import s3fs -> ImportError
    monkeypatch.delitem(registry._registry, "s3", raising=False)
    with pytest.raises(ValueError) as info:
        resolve_filesystem("s3://bucket/prefix")
    msg = str(info.value)
    assert "'s3://bucket/prefix' cannot be opened" in msg and "pip install 'trainforge[s3]'" in msg


def test_driver_killed_mid_commit_on_s3(bucket, tmp_path):
    from test_storage_faults import check_after_kill, kill_driver_mid_commit

    storage = f"s3://{bucket}/prefix"
    kill_driver_mid_commit(storage, "killed", "s3", tmp_path)
    run = f"{bucket}/prefix/killed"

    def list_files(path: str) -> list[str]:
        prefix = path.split("/", 1)[1] + "/"
        return sorted({k[len(prefix):].split("/")[0] for k in keys(bucket, prefix)})

    def fresh_fit(loop, config):
        return DataParallelTrainer(
            loop,
            train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name="killed", storage_path=storage, verbose=0),
        )

    check_after_kill(f"s3://{run}", run, fresh_fit, list_files)
