"""Recovery with real processes: restarts from the latest checkpoint, the kill-after-report race,
hang detection, restore after the driver is SIGKILLed, elastic resizing. Tests taking ``executor`` run
on local processes and on Ray actors (conftest.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

import trainforge as train
from trainforge import (
    Checkpoint,
    DataParallelTrainer,
    FailureConfig,
    Result,
    RunConfig,
    ScalingConfig,
    TrainingFailedError,
)
from trainforge._testing.procs import wait_until_gone

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")
sys.path.insert(0, SCRIPTS)

from restore_loop import loop as restore_loop  # noqa: E402


def _rc(tmp_path, name="rec", **failure):
    return RunConfig(storage_path=str(tmp_path), name=name, verbose=0, failure_config=FailureConfig(**failure))


def _save(value) -> Checkpoint:
    d = tempfile.mkdtemp()
    with open(os.path.join(d, "value"), "w") as f:
        f.write(str(value))
    return Checkpoint.from_directory(d)


def _load(ckpt) -> int:
    with ckpt.as_directory() as d:
        return int(open(os.path.join(d, "value")).read())


def test_restart_resumes_from_latest_checkpoint_and_continues_history(tmp_path, caplog, executor):
    def loop():
        ctx = train.get_context()
        ckpt = train.get_checkpoint()
        start = _load(ckpt) + 1 if ckpt else 0
        for step in range(start, 5):
            train.report({"step": step, "attempt": ctx.get_attempt()}, checkpoint=_save(step))
            if step == 2 and ctx.get_attempt() == 0 and ctx.get_world_rank() == 1:
                raise RuntimeError("injected failure at step 2")

    with caplog.at_level("WARNING", logger="trainforge"):
        result = DataParallelTrainer(
            loop, scaling_config=ScalingConfig(num_workers=2, executor=executor), run_config=_rc(tmp_path, max_failures=1)
        ).fit()
    df = result.metrics_dataframe
    assert list(df["step"]) == [0, 1, 2, 3, 4]  # no step repeated: history continues at the checkpoint
    assert list(df["attempt"]) == [0, 0, 0, 1, 1]
    assert _load(result.checkpoint) == 4
    restarts = [r.getMessage() for r in caplog.records if "restarting as attempt" in r.getMessage()]
    assert len(restarts) == 1 and restarts[0].startswith("attempt 0 failed: rank 1 (pid ")
    assert "injected failure at step 2; restarting as attempt 1 from checkpoint_000002" in restarts[0]


@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_restart_after_worker_death(tmp_path, how, executor):
    def loop():
        ctx = train.get_context()
        if ctx.get_attempt() == 0 and ctx.get_world_rank() == 0:
            train.report({"a": 0}, checkpoint=_save(7))
            if how == "exit":
                os._exit(9)
            os.kill(os.getpid(), signal.SIGKILL)
        if ctx.get_attempt() == 0:
            train.report({"a": 0})
            while True:
                time.sleep(0.1)
        train.report({"resumed": _load(train.get_checkpoint()), "attempt": ctx.get_attempt()})

    result = DataParallelTrainer(
        loop, scaling_config=ScalingConfig(num_workers=2, executor=executor), run_config=_rc(tmp_path, max_failures=1)
    ).fit()
    assert result.metrics == {"resumed": 7, "attempt": 1}


@pytest.mark.parametrize("round_", range(3))
def test_checkpoint_reported_by_every_rank_survives_immediate_death(tmp_path, round_, executor):
    """Every rank reports checkpoint 0; rank 1 dies the instant its report() returns. The restarted
    group must resume from that checkpoint (Ray Train 2.60 can restart from an older one here)."""

    def loop():
        ctx = train.get_context()
        if ctx.get_attempt() == 1:
            ckpt = train.get_checkpoint()
            train.report({"resumed_from": _load(ckpt) if ckpt else None})
            return
        train.report({"step": 0}, checkpoint=_save(100 + ctx.get_world_rank()))
        if ctx.get_world_rank() == 1:
            os._exit(1)
        while True:
            time.sleep(0.05)

    result = DataParallelTrainer(
        loop, scaling_config=ScalingConfig(num_workers=2, executor=executor), run_config=_rc(tmp_path, max_failures=1)
    ).fit()
    assert result.metrics == {"resumed_from": 100}  # rank 0's file wins the merge of "value"


def test_unlimited_restarts(tmp_path, executor):
    def loop():
        attempt = train.get_context().get_attempt()
        if attempt < 3:
            raise ValueError(f"flaky {attempt}")
        train.report({"attempt": attempt})

    result = DataParallelTrainer(
        loop, scaling_config=ScalingConfig(num_workers=1, executor=executor), run_config=_rc(tmp_path, max_failures=-1)
    ).fit()
    assert result.metrics == {"attempt": 3}


def test_gives_up_after_max_failures_listing_every_attempt(tmp_path, executor):
    def loop():
        raise ValueError(f"boom in attempt {train.get_context().get_attempt()}")

    with pytest.raises(TrainingFailedError) as info:
        DataParallelTrainer(
            loop, scaling_config=ScalingConfig(num_workers=2, executor=executor), run_config=_rc(tmp_path, max_failures=2)
        ).fit()
    msg = str(info.value)
    assert "failed 3 times" in msg
    for attempt in range(3):
        assert f"[attempt {attempt}] ranks 0, 1" in msg and f"boom in attempt {attempt}" in msg
    assert len(info.value.failures) == 3


def test_silent_worker_is_declared_hung_with_its_stack(tmp_path, executor):
    def loop():
        if train.get_context().get_world_rank() == 1:
            def stuck_waiting_for_nothing():
                while True:
                    time.sleep(0.05)

            stuck_waiting_for_nothing()
        train.report({"ok": 1})

    with pytest.raises(TrainingFailedError) as info:
        DataParallelTrainer(
            loop, scaling_config=ScalingConfig(num_workers=2, executor=executor), run_config=_rc(tmp_path, hang_timeout_s=2)
        ).fit()
    msg = str(info.value)
    assert "rank 1 (pid" in msg and "worker hung: no report and no output for more than 2s" in msg
    assert "stacks (all threads) of hung rank 1" in msg
    assert "stuck_waiting_for_nothing" in msg
    [failure] = info.value.failures[0]
    assert failure.kind == "hung" and failure.rank == 1
    # a local worker's stacks stay in logs/rank_1.stack (named by rank); the empty ones are removed
    stacks = sorted(f for f in os.listdir(tmp_path / "rec" / "logs") if f.endswith(".stack"))
    assert stacks == (["rank_1.stack"] if executor == "local" else [])
    if executor == "local":
        assert "stuck_waiting_for_nothing" in (tmp_path / "rec" / "logs" / "rank_1.stack").read_text()


@pytest.mark.slow
def test_hang_inside_a_collective_shows_the_blocked_frame(tmp_path, executor):
    """Rank 0 deadlocks on a lock; rank 1 waits in all_reduce (blocked in C++): both are hung, and
    the stacks show where, although neither thread runs Python code."""
    from trainforge.torch import TorchTrainer

    def loop():
        import threading

        import torch
        import torch.distributed as dist

        if dist.get_rank() == 0:
            lock = threading.Lock()
            lock.acquire()

            def deadlocked_on_my_own_lock():
                lock.acquire()

            deadlocked_on_my_own_lock()
        def waiting_in_all_reduce():
            dist.all_reduce(torch.ones(1))

        waiting_in_all_reduce()

    with pytest.raises(TrainingFailedError) as info:
        TorchTrainer(
            loop, scaling_config=ScalingConfig(num_workers=2, executor=executor), run_config=_rc(tmp_path, hang_timeout_s=3)
        ).fit()
    msg = str(info.value)
    assert "deadlocked_on_my_own_lock" in msg and "waiting_in_all_reduce" in msg
    assert sorted(f.rank for f in info.value.failures[0]) == [0, 1]


def _run_driver_until_blocked(tmp_path, name, block_at):
    gate = tmp_path / "gate"
    gate.mkdir()
    proc = subprocess.Popen(
        [sys.executable, os.path.join(SCRIPTS, "driver_restore.py"), str(tmp_path / "res"), name, str(gate),
         str(block_at)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    marker = tmp_path / "res" / name / f"checkpoint_{block_at - 1:06d}" / ".trainforge_checkpoint.json"
    deadline = time.monotonic() + 90
    while not (marker.exists() and len(os.listdir(gate)) == 2):
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, "driver did not reach the blocking epoch"
        time.sleep(0.05)
    return proc


def test_restore_after_driver_sigkill_continues_history(tmp_path):
    import psutil

    proc = _run_driver_until_blocked(tmp_path, "killed", block_at=3)
    workers = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    assert len(workers) == 2
    proc.kill()
    proc.wait(timeout=30)
    run_dir = tmp_path / "res" / "killed"
    assert wait_until_gone(workers, timeout=10) == []
    assert DataParallelTrainer.can_restore(str(run_dir))
    assert not DataParallelTrainer.can_restore(str(tmp_path))

    trainer = DataParallelTrainer.restore(
        str(run_dir), train_loop_config={"epochs": 6, "block_at": None, "gate_dir": str(tmp_path)}
    )
    result = trainer.fit()
    df = result.metrics_dataframe
    assert list(df["epoch"]) == [0, 1, 2, 3, 4, 5]
    assert list(df["start"]) == [0, 0, 0, 3, 3, 3]  # resumed after checkpoint of epoch 2
    assert Result.from_path(str(run_dir)).metrics == {"epoch": 5, "start": 3}


def test_fit_again_with_same_name_resumes(tmp_path):
    proc = _run_driver_until_blocked(tmp_path, "again", block_at=2)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    result = DataParallelTrainer(
        restore_loop,
        train_loop_config={"epochs": 4, "block_at": None, "gate_dir": str(tmp_path)},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(tmp_path / "res"), name="again", verbose=0),
    ).fit()
    assert list(result.metrics_dataframe["epoch"]) == [0, 1, 2, 3]
    assert list(result.metrics_dataframe["start"]) == [0, 0, 2, 2]


def test_elastic_shrinks_after_failure_and_grows_back(tmp_path, monkeypatch):
    resources = tmp_path / "resources.json"
    resources.write_text(json.dumps({"CPU": 3}))
    monkeypatch.setenv("TRAINFORGE_LOCAL_RESOURCES", f"@{resources}")

    def loop():
        ctx = train.get_context()
        rows = sum(len(b["item"]) for b in train.get_dataset_shard("train").iter_batches(batch_size=5))
        attempt, rank = ctx.get_attempt(), ctx.get_world_rank()
        metrics = {"attempt": attempt, "world": ctx.get_world_size(), "rows": rows}
        if attempt == 0:
            train.report(metrics, checkpoint=_save(0))
            if rank == 2:
                while json.loads(resources.read_text())["CPU"] != 2:
                    time.sleep(0.02)
                os._exit(3)  # ... and a worker is lost
            while True:
                time.sleep(0.05)
        if attempt == 1:
            if rank == 0:
                resources.write_text(json.dumps({"CPU": 3}))  # resources come back
            train.report(metrics, checkpoint=_save(1))  # the group grows at this checkpoint
            while True:
                time.sleep(0.05)
        train.report(metrics)

    class ShrinkAfterTheFirstCheckpoint(train.Callback):
        """Resources shrink once attempt 0's checkpoint is committed (the driver has made that
        checkpoint's sizing decision by then), so it is the failure, not a resize, that shrinks the
        group; a worker shrinking them itself would race the commit."""

        def on_report(self, report):
            if report.attempt == 0:
                resources.write_text(json.dumps({"CPU": 2}))

    run_config = _rc(tmp_path, max_failures=1)
    run_config.callbacks = [ShrinkAfterTheFirstCheckpoint()]
    trainer = DataParallelTrainer(
        loop,
        datasets={"train": list(range(12))},
        scaling_config=ScalingConfig(num_workers=(1, 3)),
        run_config=run_config,
    )
    reports = list(run := trainer.fit_iter())
    assert run.result.error is None
    assert [(r.attempt, len(r.all_metrics)) for r in reports] == [(0, 3), (1, 2), (2, 3)]
    for r in reports:
        assert {m["world"] for m in r.all_metrics} == {len(r.all_metrics)}
        assert sum(m["rows"] for m in r.all_metrics) == 12  # re-sharded for every size


def test_elastic_gives_up_when_minimum_never_fits(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFORGE_LOCAL_RESOURCES", json.dumps({"CPU": 1}))
    monkeypatch.setenv("TRAINFORGE_RESOURCE_WAIT_S", "1")
    with pytest.raises(TrainingFailedError, match=r"need at least 2 worker\(s\).*offers \{'CPU': 1.0\}"):
        DataParallelTrainer(
            lambda: None, scaling_config=ScalingConfig(num_workers=(2, 4)), run_config=_rc(tmp_path)
        ).fit()


def _two_spawned_workers(pool):
    """Two workers acquired from ``pool`` with no zygote to fork them: spawned processes, connected, then discarded."""
    workers = pool.acquire(2, ())
    assert all(isinstance(w.proc, subprocess.Popen) for w in workers)
    pool.wait_connected(workers)
    for w in workers:
        pool._discard(w)
    return workers


@pytest.mark.slow
def test_restart_uses_prestarted_standby_workers(tmp_path):
    """A run that may restart keeps standby workers with torch and torch._dynamo already imported,
    forked by one zygote of the pool's own (it imported them once for both); the restarted group is
    made of them (and none outlives the run: the autouse leak check)."""
    from trainforge.torch import TorchTrainer

    def loop():
        import sys

        ctx = train.get_context()
        if ctx.get_attempt() == 0:
            if ctx.get_world_rank() == 1:
                raise RuntimeError("fail once")
            while True:
                time.sleep(0.05)
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            parent = f.read().replace(b"\0", b" ").decode()
        train.report({"dynamo_preloaded": "torch._dynamo" in sys.modules, "parent": os.getppid(),
                      "parent_cmdline": parent})  # fmt: skip

    trainer = TorchTrainer(loop, scaling_config=ScalingConfig(num_workers=2), run_config=_rc(tmp_path, max_failures=1))
    [report] = list(trainer.fit_iter())
    assert [m["dynamo_preloaded"] for m in report.all_metrics] == [True, True]
    [parent] = {m["parent"] for m in report.all_metrics}
    assert parent != os.getpid()
    assert "trainforge._internal.zygote" in report.all_metrics[0]["parent_cmdline"]


def test_standby_workers_are_fresh_processes_when_no_zygote_starts(tmp_path, monkeypatch):
    from trainforge._internal.worker_group import local_pool

    def no_zygote(*args, **kwargs):
        raise OSError("no zygote here")

    monkeypatch.setattr(local_pool, "StandbyZygote", no_zygote)
    pool = local_pool.LocalProcessPool(stack_dir=str(tmp_path))
    try:
        pool.prewarm(2, ())
        assert pool.standby_count == 2
        workers = _two_spawned_workers(pool)
    finally:
        pool.close()
    assert all(w.proc.returncode is not None for w in workers)


def test_first_group_of_a_run_that_may_restart_is_forked_by_the_pools_zygote(tmp_path):
    """The zygote starts with the run and forks the first group's workers too, so it serves standby
    workers from the first step on; the run's own zygote, not the driver, is their parent."""

    def loop():
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            parent = f.read().replace(b"\0", b" ").decode()
        train.report({"parent": os.getppid(), "parent_cmdline": parent})

    result = DataParallelTrainer(loop, scaling_config=ScalingConfig(num_workers=2),
                                 run_config=_rc(tmp_path, max_failures=1)).fit()  # fmt: skip
    assert result.error is None
    assert result.metrics["parent"] != os.getpid()
    assert "trainforge._internal.zygote" in result.metrics["parent_cmdline"]


def test_zygote_of_a_run_that_fails_to_start_is_killed(tmp_path):
    """The zygote starts with the executor; a run that fails before its controller runs (here a
    callback's on_run_start) still ends it (the autouse check fails a test that leaves it behind)."""

    class Broken(train.Callback):
        def on_run_start(self, run_path, num_workers):
            raise RuntimeError("broken callback")

    rc = RunConfig(storage_path=str(tmp_path), name="rec", verbose=0, callbacks=[Broken()],
                   failure_config=FailureConfig(max_failures=1))  # fmt: skip
    with pytest.raises(RuntimeError, match="broken callback"):
        DataParallelTrainer(lambda: None, scaling_config=ScalingConfig(num_workers=2), run_config=rc).fit()


def test_workers_are_fresh_processes_when_the_pools_zygote_does_not_serve(tmp_path, monkeypatch):
    from trainforge._internal.worker_group import local_pool

    monkeypatch.setattr(local_pool.StandbyZygote, "wait_ready", lambda self, timeout: False)
    pool = local_pool.LocalProcessPool(stack_dir=str(tmp_path))
    try:
        pool.start_zygote(())
        zygote = pool._zygote
        assert zygote is not None
        _two_spawned_workers(pool)
    finally:
        pool.close()
    assert zygote.proc.returncode is not None  # killed and reaped with the pool


def test_no_standby_workers_without_restarts(tmp_path):
    def loop():
        import psutil

        siblings = psutil.Process(os.getppid()).children()
        train.report({"processes": len(siblings), "parent": os.getppid()})

    result = DataParallelTrainer(loop, scaling_config=ScalingConfig(num_workers=2), run_config=_rc(tmp_path)).fit()
    # Just the two workers, children of the driver: max_failures=0 keeps no spares (and no zygote).
    assert result.metrics == {"processes": 2, "parent": os.getpid()}


def _report_resume_point_or_checkpoint() -> int | None:
    """In a restarted attempt: report the step the checkpoint holds and return None. Else: one report
    on every rank, with checkpoint 5 from rank 0 only, and return the rank."""
    ctx = train.get_context()
    if ctx.get_attempt() == 1:
        ckpt = train.get_checkpoint()
        train.report({"resumed_from": _load(ckpt) if ckpt else None})
        return None
    rank = ctx.get_world_rank()
    train.report({"step": 0}, checkpoint=_save(5) if rank == 0 else None)
    return rank


@pytest.mark.parametrize("round_", range(3))
def test_metrics_only_report_of_a_dying_rank_still_commits_the_checkpoint(tmp_path, round_):
    """Rank 0 reports a checkpoint, rank 1 the same report without one, and dies the instant its
    report() returns: that report counts, so the checkpoint is committed and resumed from."""

    def loop():
        rank = _report_resume_point_or_checkpoint()
        if rank is None:
            return
        if rank == 1:
            os._exit(1)
        while True:
            time.sleep(0.05)

    result = DataParallelTrainer(
        loop, scaling_config=ScalingConfig(num_workers=2), run_config=_rc(tmp_path, max_failures=1)
    ).fit()
    assert result.metrics == {"resumed_from": 5}


@pytest.mark.parametrize("round_", range(2))
def test_dying_ranks_last_report_commits_although_every_rank_failed_at_once(tmp_path, round_, executor):
    """As above, but rank 0 fails the moment rank 1 is gone (as a peer in a collective does): every
    rank has then failed, so the driver stops listening early, yet not before rank 1's last report,
    which it reads before recording the death."""
    gone = tmp_path / "rank1_gone"

    def loop():
        rank = _report_resume_point_or_checkpoint()
        if rank is None:
            return
        if rank == 1:
            gone.write_text("")
            os._exit(1)
        while not gone.exists():
            time.sleep(0.01)
        raise RuntimeError("lost rank 1")

    result = DataParallelTrainer(
        loop, scaling_config=ScalingConfig(num_workers=2, executor=executor), run_config=_rc(tmp_path, max_failures=1)
    ).fit()
    assert result.metrics == {"resumed_from": 5}
