"""Asynchronous checkpoint persisting (``CheckpointUploadMode.ASYNC``): ``report()`` returns before the
upload, the rank's messages stay in report order, the run waits for pending uploads, a failed upload
fails the worker, and SYNC stays the default."""

from __future__ import annotations

import os
import re
import tempfile
import threading
import time
from pathlib import Path

import pytest
from fsspec.implementations.local import LocalFileSystem

import trainforge as train
from trainforge import (
    CheckpointConfig,
    CheckpointUploadMode,
    DataParallelTrainer,
    Result,
    RunConfig,
    ScalingConfig,
    TrainingFailedError,
)
from trainforge._internal.checkpoint import Checkpoint
from trainforge._internal.exceptions import StorageError
from trainforge._internal.session import Session, TrainContext
from trainforge._internal.storage import COMMIT_MARKER, StorageContext
from trainforge._testing.wait import wait_until

STAGED = re.compile(r"/\.staging/a\d+_r(\d+)/rank_(\d+)/?$")


# -- the session and its uploader, with a fake storage ------------------------------------------------


class FakeStorage:
    """``stage_checkpoint`` waits for ``release`` (when given), then records the files it was given."""

    def __init__(self, release: threading.Event | None = None, error: BaseException | None = None):
        self.release = release
        self.error = error
        self.staged: dict[int, dict[str, str]] = {}

    def stage_checkpoint(self, local_dir: str, attempt: int, report_index: int, rank: int) -> None:
        if self.release is not None:
            assert self.release.wait(30), "never released"
        if self.error is not None:
            raise self.error
        self.staged[report_index] = {p.name: p.read_text() for p in Path(local_dir).iterdir()}


def make_session(storage, mode="SYNC"):
    sent: list[tuple[tuple, bool]] = []
    ctx = TrainContext(world_size=1, world_rank=0, local_rank=0, local_world_size=1, node_rank=0, experiment_name="x")
    session = Session(ctx, lambda msg, wait=False: sent.append((msg, wait)), storage, None, {}, upload_mode=mode)
    return session, sent


def user_checkpoint(tmp_path: Path, name: str, text: str) -> Checkpoint:
    d = tmp_path / name
    d.mkdir()
    (d / "model.txt").write_text(text)
    return Checkpoint.from_directory(d)


def test_async_report_returns_at_once_and_later_reports_queue_behind_it(tmp_path, monkeypatch):
    local_tmp = tmp_path / "tmp"
    local_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(local_tmp))  # where the local copies go
    release = threading.Event()
    storage = FakeStorage(release)
    session, sent = make_session(storage)
    ckpt = user_checkpoint(tmp_path, "c0", "weights 0")
    session.report({"i": 0}, checkpoint=ckpt, checkpoint_upload_mode="async")
    assert len(list(local_tmp.iterdir())) == 1
    os.remove(os.path.join(ckpt.path, "model.txt"))  # the user may delete it as soon as report returns
    session.report({"i": 1})
    session.report({"i": 2})
    assert sent == []  # nothing may overtake the pending upload
    release.set()
    session.close(wait=True)
    assert [(m[1], m[3], wait) for m, wait in sent] == [(0, True, True), (1, False, False), (2, False, False)]
    assert storage.staged == {0: {"model.txt": "weights 0"}}
    assert list(local_tmp.iterdir()) == []  # the local copy is removed once uploaded


def test_sync_report_waits_for_pending_async_uploads(tmp_path):
    release = threading.Event()
    session, sent = make_session(FakeStorage(release), mode=CheckpointUploadMode.ASYNC)  # the run default
    session.report({"i": 0}, checkpoint=user_checkpoint(tmp_path, "c0", "0"))
    done = threading.Event()

    def sync_report():
        session.report({"i": 1}, checkpoint=user_checkpoint(tmp_path, "c1", "1"), checkpoint_upload_mode="SYNC")
        done.set()

    t = threading.Thread(target=sync_report)
    t.start()
    assert not done.wait(0.2)  # blocked behind the asynchronous upload
    release.set()
    t.join(30)
    assert done.is_set()
    session.close(wait=True)
    assert [(m[1], wait) for m, wait in sent] == [(0, True), (1, True)]


def test_failed_upload_raises_at_the_next_report_and_at_the_end(tmp_path):
    err = StorageError("Storage operation 'stage_checkpoint' on s3://b/run/.staging failed: boom")
    session, sent = make_session(FakeStorage(error=err))
    session.report({"i": 0}, checkpoint=user_checkpoint(tmp_path, "c0", "0"), checkpoint_upload_mode="async")
    wait_until(lambda: session._uploader.error is not None, 30, "the uploader's error", interval=0.005)
    with pytest.raises(StorageError, match="s3://b/run/.staging"):
        session.report({"i": 1})
    with pytest.raises(StorageError):
        session.close(wait=True)
    assert sent == []


def test_close_without_waiting_drops_queued_uploads(tmp_path):
    release = threading.Event()
    storage = FakeStorage(release)
    session, sent = make_session(storage)
    for i in range(3):
        session.report({"i": i}, checkpoint=user_checkpoint(tmp_path, f"c{i}", str(i)), checkpoint_upload_mode="async")
    session.close(wait=False)  # the loop failed
    release.set()
    wait_until(lambda: not session._uploader.busy, 30, "the uploader to be idle", interval=0.005)
    assert [m[1] for m, _ in sent] in ([], [0])  # at most the upload already running completes
    assert set(storage.staged) <= {0}


def test_invalid_upload_mode_is_rejected(tmp_path):
    session, _ = make_session(FakeStorage())
    with pytest.raises(ValueError, match=r"report\(checkpoint_upload_mode=\.\.\.\)='later' is not valid"):
        session.report({"i": 0}, checkpoint=user_checkpoint(tmp_path, "c0", "0"), checkpoint_upload_mode="later")


# -- real runs: a filesystem whose uploads wait for a gate file ----------------------------------------


class GateFS(LocalFileSystem):
    """The local disk through fsspec. Uploading report i of rank r (a ``put`` into the staging area)
    waits until ``{gate_dir}/open_r{i}_rank{r}`` exists (unless ``gated`` is False), takes ``slow_s``
    more for report ``slow_index``, or fails with ``fail``; when done it creates
    ``{gate_dir}/uploaded_r{i}_rank{r}``."""

    cachable = False

    def __init__(self, gate_dir: str, gated: bool = True, slow_index: int = -1, slow_s: float = 0.0,
                 fail: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.gate_dir, self.gated, self.fail = gate_dir, gated, fail
        self.slow_index, self.slow_s = slow_index, slow_s

    def put(self, lpath, rpath, *args, **kwargs):
        m = STAGED.search(str(rpath))
        if m is None:  # e.g. the logs at the end
            return super().put(lpath, rpath, *args, **kwargs)
        key = f"r{m.group(1)}_rank{m.group(2)}"
        if self.fail:
            raise PermissionError(13, "Access Denied")
        if self.gated:
            try:
                wait_until(lambda: os.path.exists(os.path.join(self.gate_dir, f"open_{key}")), 20, f"gate {key}",
                           interval=0.005)  # fmt: skip
            except TimeoutError:
                raise RuntimeError(f"gate {key} never opened: report() waited for its own upload") from None
        if int(m.group(1)) == self.slow_index:
            time.sleep(self.slow_s)  # a slow upload, still running when the loop returns
        out = super().put(lpath, rpath, *args, **kwargs)
        Path(self.gate_dir, f"uploaded_{key}").touch()
        return out


def _mixed_loop(config):
    gate = Path(config["gate_dir"])
    rank = train.get_context().get_world_rank()

    def ckpt(i, score, mode=None):
        with tempfile.TemporaryDirectory() as d:
            Path(d, f"rank_{rank}.txt").write_text(f"report {i}")
            train.report({"i": i, "score": score}, train.Checkpoint.from_directory(d), checkpoint_upload_mode=mode)

    def open_gate(i):
        (gate / f"open_r{i}_rank{rank}").touch()

    def uploaded(i):
        return (gate / f"uploaded_r{i}_rank{rank}").exists()

    ckpt(0, 5)  # the run default: ASYNC; returns while its upload waits for the gate
    pending = not uploaded(0)
    train.report({"i": 1, "pending_at_return": pending})  # made while upload 0 is pending
    train.report({"i": 2})
    open_gate(0)
    ckpt(3, 1, CheckpointUploadMode.ASYNC)
    open_gate(3)
    open_gate(4)
    ckpt(4, 3, "sync")  # waits for upload 3, then uploads itself
    train.report({"i": 5, "sync_uploaded": uploaded(4)})
    open_gate(6)
    ckpt(6, 2)  # a slow upload: the run must wait for it


def test_async_checkpoints_keep_order_retention_and_the_final_result(tmp_path):
    gate_dir = tmp_path / "gates"
    gate_dir.mkdir()
    storage = str(tmp_path / "res")
    result = DataParallelTrainer(
        _mixed_loop,
        train_loop_config={"gate_dir": str(gate_dir)},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name="run",
            storage_path=storage,
            storage_filesystem=GateFS(str(gate_dir), slow_index=6, slow_s=1.0),
            checkpoint_config=CheckpointConfig(
                num_to_keep=2, checkpoint_score_attribute="score", checkpoint_upload_mode="async"
            ),
            verbose=0,
        ),
    ).fit()
    rows = result.metrics_dataframe
    assert list(rows["i"]) == [0, 1, 2, 3, 4, 5, 6]  # rank 0's reports arrived in order
    assert rows.loc[1, "pending_at_return"] and rows.loc[5, "sync_uploaded"]
    # commits in report order: seq 0 = report 0 (score 5), 1 = report 3 (score 1, dropped), 2 = report 4
    # (score 3), 3 = report 6 (score 2, the latest: the run waited for its slow upload)
    kept = [(c.path.rsplit("/", 1)[-1], m["i"]) for c, m in result.best_checkpoints]
    assert kept == [("checkpoint_000000", 0), ("checkpoint_000002", 4), ("checkpoint_000003", 6)]
    run = Path(storage, "run")
    assert sorted(p.name for p in run.glob("checkpoint_*")) == [name for name, _ in kept]
    for name, i in kept:
        files = {p.name: p.read_text() for p in (run / name).iterdir()}
        assert files.pop(COMMIT_MARKER) and files == {"rank_0.txt": f"report {i}", "rank_1.txt": f"report {i}"}
    assert result.checkpoint.path.endswith("checkpoint_000003")
    assert not (run / ".staging").exists()  # removed once empty
    again = Result.from_path(str(run))
    assert [(c.path, m["i"]) for c, m in again.best_checkpoints] == [(c.path, m["i"]) for c, m in result.best_checkpoints]
    assert list(again.metrics_dataframe["i"]) == list(range(7))


def _one_checkpoint_loop(config):
    gate = Path(config["gate_dir"])
    rank = train.get_context().get_world_rank()
    with tempfile.TemporaryDirectory() as d:
        Path(d, "w.txt").write_text("w")
        train.report({"i": 0}, checkpoint=train.Checkpoint.from_directory(d))
    (gate / f"returned_rank{rank}").touch()
    train.report({"i": 1, "uploaded_at_return": (gate / f"uploaded_r0_rank{rank}").exists()})


def test_sync_is_the_default(tmp_path):
    assert CheckpointConfig().checkpoint_upload_mode is CheckpointUploadMode.SYNC
    result = DataParallelTrainer(
        _one_checkpoint_loop,
        train_loop_config={"gate_dir": str(tmp_path)},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name="run", storage_path=str(tmp_path / "res"), storage_filesystem=GateFS(str(tmp_path), gated=False),
            verbose=0,
        ),
    ).fit()
    assert result.metrics == {"i": 1, "uploaded_at_return": True}


def test_failed_async_upload_fails_the_worker_with_the_url(tmp_path):
    with pytest.raises(TrainingFailedError) as info:
        DataParallelTrainer(
            _one_checkpoint_loop,
            train_loop_config={"gate_dir": str(tmp_path)},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(
                name="run",
                storage_path=str(tmp_path / "res"),
                storage_filesystem=GateFS(str(tmp_path), fail=True),
                checkpoint_config=CheckpointConfig(checkpoint_upload_mode="async"),
                verbose=0,
            ),
        ).fit()
    msg = str(info.value)
    assert "StorageError: Storage operation 'stage_checkpoint' on file://" in msg
    assert "/res/run/.staging/a0_r0/rank_" in msg and "PermissionError" in msg
    assert any(tmp_path.glob("returned_rank*"))  # report() had returned before the upload failed
    assert StorageContext(str(tmp_path / "res"), "run").list_checkpoints() == []
