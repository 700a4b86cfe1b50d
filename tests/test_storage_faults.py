"""Storage faults: transient errors are retried with backoff and logged, permanent ones raise a
StorageError naming the operation, the URL and the cause; storage errors end runs (driver side) or fail
the rank (worker side); a driver killed in the middle of a commit leaves nothing that is picked up."""

from __future__ import annotations

import collections
import errno
import json
import logging
import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from fsspec.implementations.local import LocalFileSystem

import trainforge as train
from trainforge import (
    CheckpointConfig,
    DataParallelTrainer,
    Result,
    RunConfig,
    ScalingConfig,
    TrainingFailedError,
)
from trainforge._internal import retry
from trainforge._internal.exceptions import StorageError, TrainforgeError
from trainforge._internal.retry import is_transient
from trainforge._internal.storage import COMMIT_MARKER, StorageContext
from trainforge._testing.procs import wait_until_gone
from trainforge._testing.wait import wait_until

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")


@pytest.fixture(autouse=True)
def _fast_retries(monkeypatch):
    monkeypatch.setenv("TRAINFORGE_STORAGE_RETRY_DELAY_S", "0.001")


ERRORS = {
    "conn": lambda: ConnectionResetError(errno.ECONNRESET, "connection reset by peer"),
    "timeout": lambda: TimeoutError("read timed out"),
    "perm": lambda: PermissionError(errno.EACCES, "Access Denied"),
}


class FaultyFS(LocalFileSystem):
    """The local disk through fsspec, where method ``m`` raises ``fail[m][i]`` (a key of ERRORS) on its
    i-th call (counting only calls whose paths contain ``match``). Picklable: workers get a fresh
    instance with the same plan and their own counts."""

    cachable = False

    def __init__(self, fail: dict[str, list[str]] | None = None, match: str = "", **kwargs):
        super().__init__(**kwargs)
        self.fail = dict(fail or {})
        self.match = match
        self.calls: collections.Counter = collections.Counter()

    def _maybe_fail(self, method: str, args: tuple) -> None:
        if self.match not in repr(args):
            return
        self.calls[method] += 1
        plan = self.fail.get(method, [])
        if self.calls[method] <= len(plan):
            raise ERRORS[plan[self.calls[method] - 1]]()

    def put(self, *args, **kwargs):
        self._maybe_fail("put", args)
        return super().put(*args, **kwargs)

    def copy(self, *args, **kwargs):
        self._maybe_fail("copy", args)
        return super().copy(*args, **kwargs)

    def pipe_file(self, *args, **kwargs):
        self._maybe_fail("pipe_file", args)
        return super().pipe_file(*args, **kwargs)

    def cat_file(self, *args, **kwargs):
        self._maybe_fail("cat_file", args)
        return super().cat_file(*args, **kwargs)


def faulty_storage(tmp_path: Path, **fail: list[str]) -> StorageContext:
    s = StorageContext(str(tmp_path / "res"), "run", FaultyFS())
    s.prepare()
    s.fs.fail = fail
    s.fs.calls.clear()
    return s


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


# -- what is transient --------------------------------------------------------------------------------


def _client_error(status: int, code: str) -> Exception:
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")


def _chained(outer: BaseException, cause: BaseException) -> BaseException:
    outer.__cause__ = cause
    return outer


def test_transient_classification():
    pytest.importorskip("botocore")
    from botocore.exceptions import ConnectTimeoutError, EndpointConnectionError, ReadTimeoutError

    transient = [
        ConnectionResetError(),
        ConnectionRefusedError(),
        TimeoutError(),
        EndpointConnectionError(endpoint_url="http://127.0.0.1:1"),
        ConnectTimeoutError(endpoint_url="http://127.0.0.1:1"),
        ReadTimeoutError(endpoint_url="http://127.0.0.1:1"),
        _client_error(503, "SlowDown"),
        _client_error(500, "InternalError"),
        _client_error(400, "RequestTimeout"),
        _client_error(429, "TooManyRequests"),
        # what s3fs raises: an OSError whose cause is the botocore error
        _chained(OSError(errno.EBUSY, "Please reduce your request rate."), _client_error(503, "SlowDown")),
        _chained(RuntimeError("wrapped"), ConnectionResetError()),
    ]
    permanent = [
        PermissionError(errno.EACCES, "denied"),
        _chained(PermissionError("Access Denied"), _client_error(403, "AccessDenied")),
        _chained(FileNotFoundError("The specified bucket does not exist"), _client_error(404, "NoSuchBucket")),
        NotADirectoryError(errno.ENOTDIR, "not a directory"),
        _client_error(400, "InvalidBucketName"),
        OSError(errno.EIO, "generic"),
        ValueError("bad path"),
        # a permanent outer error is not retried even when a transient one happened on the way
        _chained(PermissionError("denied"), ConnectionResetError()),
    ]
    assert [is_transient(e) for e in transient] == [True] * len(transient)
    assert [is_transient(e) for e in permanent] == [False] * len(permanent)


# -- retries on the driver side -----------------------------------------------------------------------


def test_transient_errors_are_retried_and_each_retry_is_logged(tmp_path, caplog):
    s = faulty_storage(tmp_path, pipe_file=["conn", "timeout"])
    with caplog.at_level(logging.WARNING, logger="trainforge"):
        s.write_text("run_state.json", '{"ok": 1}')
    assert s.fs.calls["pipe_file"] == 3
    assert s.read_text("run_state.json") == '{"ok": 1}'
    retries = [r.getMessage() for r in caplog.records if r.name == "trainforge"]
    url = f"file://{tmp_path}/res/run/run_state.json"
    assert len(retries) == 2
    assert "'write'" in retries[0] and url in retries[0] and "attempt 1 of 5" in retries[0]
    assert "ConnectionResetError" in retries[0]
    assert "attempt 2 of 5" in retries[1] and "TimeoutError: read timed out" in retries[1]


def test_permanent_error_is_not_retried_and_names_operation_url_cause_and_fix(tmp_path):
    s = faulty_storage(tmp_path, pipe_file=["perm", "perm"])
    with pytest.raises(StorageError) as info:
        s.write_text("run_state.json", "{}")
    assert s.fs.calls["pipe_file"] == 1
    err = info.value
    msg = str(err)
    url = f"file://{tmp_path}/res/run/run_state.json"
    assert f"Storage operation 'write' on {url} failed: PermissionError:" in msg
    assert "Access Denied" in msg and "To fix:" in msg and "credentials" in msg
    assert isinstance(err, TrainforgeError) and isinstance(err.__cause__, PermissionError)
    assert (err.operation, err.url, err.attempts) == ("write", url, 1)
    copy = pickle.loads(pickle.dumps(err))  # crosses process boundaries intact
    assert (str(copy), copy.operation, copy.url, copy.attempts) == (msg, "write", url, 1)


def test_transient_error_that_outlasts_its_retries(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFORGE_STORAGE_RETRIES", "3")
    s = faulty_storage(tmp_path, cat_file=["timeout"] * 3)
    with pytest.raises(StorageError) as info:
        s.read_text("metrics.jsonl")
    assert s.fs.calls["cat_file"] == 3
    msg = str(info.value)
    assert "'read'" in msg and "failed after 3 attempts: TimeoutError" in msg
    assert "TRAINFORGE_STORAGE_RETRIES" in msg


def test_backoff_doubles_up_to_the_cap(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFORGE_STORAGE_RETRIES", "6")
    monkeypatch.setenv("TRAINFORGE_STORAGE_RETRY_DELAY_S", "1.5")
    waits: list[float] = []
    monkeypatch.setattr(retry.time, "sleep", waits.append)
    s = faulty_storage(tmp_path, pipe_file=["conn"] * 6)
    with pytest.raises(StorageError):
        s.write_text("x", "y")
    assert waits == [1.5, 3.0, 5.0, 5.0, 5.0]


def test_commit_retries_each_step_and_stays_correct(tmp_path):
    s = faulty_storage(tmp_path)
    for rank in (0, 1):
        src = write_tree(tmp_path / f"src{rank}", {"shared.txt": f"rank{rank}", f"r{rank}/own.txt": str(rank)})
        s.stage_checkpoint(str(src), 0, 0, rank)
    s.fs.fail = {"copy": ["conn", "timeout"], "pipe_file": ["conn"]}
    ckpt = s.commit_checkpoint(0, 0, [0, 1], seq=0, metrics={"loss": 1.0})
    files = {str(p.relative_to(ckpt.path)): p.read_text() for p in Path(ckpt.path).rglob("*") if p.is_file()}
    assert json.loads(files.pop(COMMIT_MARKER))["metrics"] == {"loss": 1.0}
    assert files == {"shared.txt": "rank0", "r0/own.txt": "0", "r1/own.txt": "1"}
    assert s.fs.calls["copy"] == 3 and s.fs.calls["pipe_file"] == 2
    s.remove_committed_staging()
    assert not Path(s.staging_path(0, 0)).exists()


def test_failed_commit_leaves_no_checkpoint(tmp_path):
    s = faulty_storage(tmp_path)
    s.stage_checkpoint(str(write_tree(tmp_path / "src", {"model.pt": "w"})), 0, 0, 0)
    s.fs.fail = {"pipe_file": ["perm"]}  # the marker cannot be written
    with pytest.raises(StorageError) as info:
        s.commit_checkpoint(0, 0, [0], seq=0, metrics={})
    assert "'commit_checkpoint'" in str(info.value) and COMMIT_MARKER in str(info.value)
    assert Path(s.path("checkpoint_000000", "model.pt")).exists()  # copied, but not committed
    assert s.list_checkpoints() == []
    s.remove_uncommitted()
    assert not Path(s.path("checkpoint_000000")).exists()


def test_unwritable_storage_is_a_configuration_error_naming_the_url(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ValueError) as info:
        StorageContext(str(blocker / "res"), "run").prepare()
    msg = str(info.value)
    assert f"RunConfig.storage_path={str(blocker / 'res')!r} cannot be written" in msg
    assert f"could not create the run directory {blocker / 'res' / 'run'}: NotADirectoryError" in msg
    assert f"{str(blocker)!r} is a file, not a directory: move it away" in msg
    assert "was not removed" not in msg  # nothing was removed: the run has not started
    assert isinstance(info.value.__cause__, NotADirectoryError)


def test_storage_path_that_cannot_be_created_says_why_and_what_to_do():
    with pytest.raises(ValueError) as info:
        StorageContext("/proc/nope", "run").prepare()
    msg = str(info.value)
    assert msg.startswith("RunConfig.storage_path='/proc/nope' cannot be written: could not create the run "
                          "directory /proc/nope/run: FileNotFoundError")  # fmt: skip
    assert "directories cannot be created in '/proc': choose a location you can write to" in msg
    assert "exists and was not removed" not in msg and "s3://" not in msg and "credentials" not in msg
    assert isinstance(info.value.__cause__, FileNotFoundError)


def test_storage_path_without_permission_says_so(tmp_path, monkeypatch):
    def denied(path, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", path)

    monkeypatch.setattr(os, "mkdir", denied)  # (the tests may run as root, who may write anywhere)
    with pytest.raises(ValueError) as info:
        StorageContext(str(tmp_path / "new" / "res"), "run").prepare()
    msg = str(info.value)
    assert "could not create the run directory" in msg and "PermissionError" in msg
    assert f"you may not create files in {str(tmp_path)!r}: choose a location you can write to" in msg
    assert "credentials" not in msg


def test_storage_path_probe_write_failure_on_remote_storage(tmp_path):
    s = StorageContext(str(tmp_path / "res"), "run", FaultyFS(fail={"pipe_file": ["perm"]}))
    with pytest.raises(ValueError) as info:
        s.prepare()
    msg = str(info.value)
    assert f"could not write a file in the run directory file://{tmp_path}/res/run: PermissionError" in msg
    assert "check the credentials" in msg


def test_unreachable_storage_at_start_keeps_the_retry_advice(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFORGE_STORAGE_RETRIES", "2")
    s = StorageContext(str(tmp_path / "res"), "run", FaultyFS(fail={"pipe_file": ["conn", "conn"]}))
    with pytest.raises(ValueError) as info:
        s.prepare()
    msg = str(info.value)
    assert "failed after 2 attempts: ConnectionResetError" in msg and "TRAINFORGE_STORAGE_RETRIES" in msg
    assert isinstance(info.value.__cause__, ConnectionResetError)


# -- storage errors in real runs ----------------------------------------------------------------------


def _ckpt_loop(config):
    import tempfile

    rank = train.get_context().get_world_rank()
    with tempfile.TemporaryDirectory() as d:
        Path(d, f"rank_{rank}.txt").write_text("w")
        train.report({"step": 0}, checkpoint=train.Checkpoint.from_directory(d))


def _fit(tmp_path, fs, loop=_ckpt_loop, name="run"):
    return DataParallelTrainer(
        loop,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(tmp_path / "res"), name=name, storage_filesystem=fs, verbose=0),
    ).fit()


def test_driver_storage_error_ends_the_run(tmp_path):
    with pytest.raises(StorageError) as info:
        _fit(tmp_path, FaultyFS(fail={"copy": ["perm"]}))
    msg = str(info.value)
    assert "'commit_checkpoint'" in msg and f"file://{tmp_path}/res/run/checkpoint_000000" in msg
    assert "PermissionError" in msg
    assert StorageContext(str(tmp_path / "res"), "run").list_checkpoints() == []


def test_worker_storage_error_fails_the_rank_and_names_the_url(tmp_path):
    with pytest.raises(TrainingFailedError) as info:
        _fit(tmp_path, FaultyFS(fail={"put": ["perm"]}, match="/.staging/"))
    msg = str(info.value)
    failed = info.value.failures[0][0]
    assert f"rank {failed.rank} (pid {failed.pid}): StorageError: Storage operation 'stage_checkpoint' on" in msg
    assert f"file://{tmp_path}/res/run/.staging/a0_r0/rank_{failed.rank} failed: PermissionError" in msg


def test_worker_retries_transient_upload_errors(tmp_path):
    result = _fit(tmp_path, FaultyFS(fail={"put": ["conn", "timeout"]}, match="/.staging/"))
    assert sorted(os.listdir(result.checkpoint.path)) == [COMMIT_MARKER, "rank_0.txt", "rank_1.txt"]
    log = Path(tmp_path, "res", "run", "logs", "rank_1.log").read_text()
    assert "storage operation 'stage_checkpoint'" in log and "(attempt 1 of 5), retrying" in log
    assert "(attempt 2 of 5), retrying" in log and "ConnectionResetError" in log


# -- a driver killed in the middle of a commit --------------------------------------------------------


def kill_driver_mid_commit(storage_path: str, name: str, kind: str, tmp_path: Path) -> None:
    """Run tests/scripts/driver_commit_kill.py until it blocks before writing the marker of its second
    checkpoint, SIGKILL it, and wait until its workers are gone too."""
    ready = tmp_path / f"ready_{kind}"
    proc = subprocess.Popen(
        [sys.executable, os.path.join(SCRIPTS, "driver_commit_kill.py"), storage_path, name, str(ready), kind],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until(lambda: ready.exists() or proc.poll() is not None, 120, "the driver to reach the commit or exit")
        assert ready.exists(), f"the driver never reached the commit:\n{proc.communicate(timeout=30)[0].decode()}"
        workers = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert wait_until_gone(workers, timeout=15) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def _second_run_loop(config):
    """Checks, before anything is committed, what the new run sees; then commits one checkpoint."""
    import tempfile

    import fsspec

    rank = train.get_context().get_world_rank()
    fs, run = fsspec.core.url_to_fs(config["run_url"])
    half = f"{run}/checkpoint_000001"
    fs.invalidate_cache()
    ckpt = train.get_checkpoint()
    with ckpt.as_directory() as d:
        seen = Path(d, f"rank_{rank}.txt").read_text()
    with tempfile.TemporaryDirectory() as d:
        Path(d, f"rank_{rank}.txt").write_text("run2")
        staging = f"{run}/.staging"
        train.report(
            {
                "resumed_from": seen,
                "resumed_path": ckpt.path,
                "half_written_left": fs.exists(half),
                "staging_left": fs.ls(staging, detail=False) if fs.exists(staging) else [],
            },
            checkpoint=train.Checkpoint.from_directory(d),
        )


def check_after_kill(run_url: str, run_path: str, second_run, list_files) -> None:
    """Assertions shared by the local and the S3 variant. ``second_run(loop, config)`` returns the
    trainer of the next run on the directory; ``list_files(dir)`` lists a directory."""
    # The half-written checkpoint is there, complete but for its marker...
    half = f"{run_path}/checkpoint_000001"
    assert sorted(list_files(half)) == ["rank_0.txt", "rank_1.txt", "run1_only.txt"]
    assert "a0_r1" in list_files(f"{run_path}/.staging")  # its staged files too
    # ...and nothing picks it up.
    before = Result.from_path(run_url)
    assert before.checkpoint is not None and before.checkpoint.path.endswith("checkpoint_000000")
    assert [c.path.rsplit("/", 1)[-1] for c, _ in before.best_checkpoints] == ["checkpoint_000000"]

    result = second_run(_second_run_loop, {"run_url": run_url}).fit()
    rows = result.metrics_dataframe
    last = rows.iloc[-1]
    assert last["resumed_from"] == "run1-step0" and last["resumed_path"].endswith("checkpoint_000000")
    assert not last["half_written_left"]
    assert [p for p in last["staging_left"] if p.endswith("a0_r1")] == []  # the new run stages a0_r0 first
    # the new run committed its own checkpoint_000001: none of the killed run's files are in it
    assert result.checkpoint.path.endswith("checkpoint_000001")
    assert sorted(list_files(half)) == [COMMIT_MARKER, "rank_0.txt", "rank_1.txt"]
    with result.checkpoint.as_directory() as d:
        assert Path(d, "rank_0.txt").read_text() == "run2"


def test_driver_killed_mid_commit_leaves_nothing_that_is_picked_up(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(SCRIPTS)  # trainer.pkl refers to the script's loop and filesystem
    storage = str(tmp_path / "res")
    kill_driver_mid_commit(storage, "killed", "local", tmp_path)
    run = f"{storage}/killed"
    assert DataParallelTrainer.can_restore(run)

    def restore(loop, config):  # the killed run's own storage_filesystem would block again: replace it
        return DataParallelTrainer.restore(
            run,
            train_loop_per_worker=loop,
            train_loop_config=config,
            run_config=RunConfig(checkpoint_config=CheckpointConfig(), verbose=0),
        )

    check_after_kill(run, run, restore, os.listdir)
