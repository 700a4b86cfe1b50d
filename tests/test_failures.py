"""Fault injection with real processes: workers that raise, exit, get killed, segfault, ignore
SIGTERM; drivers that get SIGTERM, Ctrl-C or SIGKILL. No process may be left behind. Tests taking
``executor`` run on local processes and on Ray actors (conftest.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import trainforge as train
from trainforge import DataParallelTrainer, RunConfig, ScalingConfig, TrainingFailedError
from trainforge._internal.failure_reason import exception_reason, failure_reason
from trainforge._testing.procs import pid_alive, wait_until_gone

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")


def _fit(loop, tmp_path, n=2, executor="local", **kwargs):
    return DataParallelTrainer(
        loop,
        scaling_config=ScalingConfig(num_workers=n, executor=executor),
        run_config=RunConfig(storage_path=str(tmp_path), name="f", verbose=0, **kwargs),
    ).fit()


def _wait_forever():
    while True:
        time.sleep(0.1)


def test_exception_in_one_rank_names_rank_type_message_traceback(tmp_path, executor):
    def loop():
        if train.get_context().get_world_rank() == 1:
            def inner_helper():
                raise ValueError("bad batch 17")

            inner_helper()
        _wait_forever()

    with pytest.raises(TrainingFailedError) as info:
        _fit(loop, tmp_path, executor=executor)
    msg = str(info.value)
    assert "rank 1 (pid " in msg
    assert "ValueError: bad batch 17" in msg
    assert "inner_helper" in msg and "Traceback" in msg
    assert "rank 0" not in msg  # rank 0 was stopped, it did not fail
    [attempt] = info.value.failures
    assert [(f.rank, f.kind, f.exc_type) for f in attempt] == [(1, "exception", "ValueError")]


def test_a_failed_fits_traceback_names_the_users_file_and_its_reason_is_one_line(tmp_path, executor):
    # A function defined inside another travels to the workers by value (cloudpickle): its frames
    # must still name this file, not "<dynamic-code>", in the error and in the one-line reason.
    def loop():
        def check_lr(lr):
            raise ValueError(f"bad lr {lr}")

        check_lr(-1)

    raise_line = loop.__code__.co_firstlineno + 2
    with pytest.raises(TrainingFailedError) as info:
        _fit(loop, tmp_path, n=1, executor=executor)
    msg = str(info.value)
    assert "<dynamic-code>" not in msg
    assert f'File "{__file__}", line {raise_line}, in check_lr' in msg
    assert exception_reason(info.value) == f"ValueError: bad lr -1 (test_failures.py:{raise_line}, in check_lr)"
    [[failure]] = info.value.failures
    assert failure_reason(failure) == exception_reason(info.value)


def test_identical_errors_from_ranks_are_grouped(tmp_path, executor):
    def loop():
        raise RuntimeError("same everywhere")

    with pytest.raises(TrainingFailedError) as info:
        _fit(loop, tmp_path, n=3, executor=executor)
    msg = str(info.value)
    assert msg.count("traceback of rank") == 1  # one group, one traceback
    assert "ranks 0, 1, 2 (pids " in msg and "): RuntimeError: same everywhere" in msg


@pytest.mark.parametrize(
    "how, expected",
    [
        ("exit", "exit code 3"),
        ("sigkill", "killed by SIGKILL (exit code -9)"),
        ("segfault", "killed by SIGSEGV"),
    ],
)
def test_dead_worker_is_reported_with_pid_and_exit(tmp_path, how, expected, executor):
    def loop():
        if train.get_context().get_world_rank() == 1:
            print("about to die", flush=True)
            if how == "exit":
                os._exit(3)
            elif how == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            else:
                import ctypes

                ctypes.string_at(0)
        _wait_forever()

    with pytest.raises(TrainingFailedError) as info:
        _fit(loop, tmp_path, executor=executor)
    msg = str(info.value)
    [failure] = info.value.failures[0]
    assert failure.rank == 1 and failure.kind == "died"
    assert f"rank 1 (pid {failure.pid})" in msg
    if executor == "local":
        assert expected in msg
    else:  # no exit status from Ray: its reason and the node instead
        assert "the Ray actor died on node 127.0.0.1" in msg and "worker process has died" in msg
    if how != "segfault":
        assert "about to die" in msg  # the last output of the dead rank is shown
    else:
        assert "Fatal Python error" in msg  # faulthandler's stack of the crash


@pytest.mark.slow
def test_peer_blocked_in_collective_is_stopped_when_a_rank_dies(tmp_path, executor):
    """Rank 0 waits in an allreduce that rank 1 never joins: the run must end promptly, not after the
    30-minute collective timeout."""
    from trainforge.torch import TorchTrainer

    def loop():
        import torch
        import torch.distributed as dist

        if dist.get_rank() == 1:
            os._exit(5)
        dist.all_reduce(torch.ones(1))
        _wait_forever()

    start = time.monotonic()
    died = "exit code 5" if executor == "local" else "worker process has died"
    with pytest.raises(TrainingFailedError, match=died):
        TorchTrainer(
            loop,
            scaling_config=ScalingConfig(num_workers=2, executor=executor),
            run_config=RunConfig(storage_path=str(tmp_path), verbose=0),
        ).fit()
    # Liveness, not performance: ending at all proves nobody waited on the collective timeout.
    assert time.monotonic() - start < 120


def test_worker_ignoring_sigterm_and_its_children_are_killed(tmp_path, executor):
    pid_file = tmp_path / "pids.txt"

    def loop():
        rank = train.get_context().get_world_rank()
        if rank == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            with open(pid_file, "w") as f:
                f.write(f"{os.getpid()} {child.pid}")
            _wait_forever()
        while not os.path.exists(pid_file):
            time.sleep(0.05)
        raise KeyError("trigger")

    with pytest.raises(TrainingFailedError, match="KeyError"):
        _fit(loop, tmp_path, executor=executor)
    pids = [int(p) for p in pid_file.read_text().split()]
    assert wait_until_gone(pids, timeout=5) == []


def test_worker_whose_loop_failed_is_killed_at_once_and_a_running_peer_gets_sigterm(tmp_path):
    """Rank 0's loop fails; rank 1 is still training. Stopping the group, rank 1 gets SIGTERM first
    (it may have cleanup to do), rank 0 (nothing left to do) is SIGKILLed without that grace. Each
    records the SIGTERM it gets; neither process survives."""
    marks = tmp_path / "marks"
    marks.mkdir()

    def loop():
        rank = train.get_context().get_world_rank()

        def on_sigterm(*_):
            (marks / f"sigterm_{rank}").write_text("")
            os._exit(143)

        signal.signal(signal.SIGTERM, on_sigterm)
        (marks / f"pid_{rank}").write_text(str(os.getpid()))
        if rank == 1:
            _wait_forever()
        while not (marks / "pid_1").exists():  # rank 1's handler is installed
            time.sleep(0.02)
        raise ValueError("rank 0 fails")

    with pytest.raises(TrainingFailedError, match="rank 0 fails"):
        _fit(loop, tmp_path)
    assert (marks / "sigterm_1").exists()
    assert not (marks / "sigterm_0").exists()
    pids = [int((marks / f"pid_{rank}").read_text()) for rank in (0, 1)]
    assert wait_until_gone(pids, timeout=5) == []


def test_stopped_group_is_reaped_meanwhile_and_the_pool_waits_for_it(tmp_path):
    """With the run's pool, shutdown() returns once every worker is killed; the pool's reaper waits
    for them and closes their files (the next group starts meanwhile), and closing the pool waits
    for the reaper."""
    from fakes import specs

    from trainforge._internal.worker_group.local import LocalWorkerGroup
    from trainforge._internal.worker_group.local_pool import LocalProcessPool

    pool = LocalProcessPool(stack_dir=str(tmp_path))
    group = LocalWorkerGroup(log_dir=str(tmp_path), log_to_driver=False, pool=pool)
    try:
        group.start(specs(2))
        workers = list(group._workers)
        group.shutdown(graceful=False)
    finally:
        pool.close()
    assert all(w.proc.returncode is not None for w in workers)  # reaped, not left as zombies
    assert all(w.log_file.closed for w in workers)


def test_successful_run_leaves_no_process(tmp_path, executor):
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()

    def loop():
        (pid_dir / str(os.getpid())).write_text("")
        train.report({"ok": 1})

    _fit(loop, tmp_path, n=2, executor=executor)
    pids = [int(p) for p in os.listdir(pid_dir)]
    assert len(pids) == 2
    assert [p for p in pids if pid_alive(p)] == []


def _start_hold_driver(tmp_path, n=2, executor="local"):
    """A driver process (its workers hold forever). For "ray" it joins this session's Ray instance
    through $RAY_ADDRESS (executor "auto")."""
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    if executor == "ray":
        import ray

        env["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    proc = subprocess.Popen(
        [sys.executable, os.path.join(SCRIPTS, "driver_hold.py"), str(tmp_path / "res"), str(pid_dir), str(n)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 60
    while len([f for f in os.listdir(pid_dir) if f.endswith(".pid")]) < n:
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, "workers did not start"
        time.sleep(0.05)
    pids = []
    for f in os.listdir(pid_dir):
        if f.endswith(".pid"):
            pids += [int(p) for p in (pid_dir / f).read_text().split()]
    assert all(pid_alive(p) for p in pids)
    return proc, pids


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_driver_stops_all_workers(tmp_path, sig, executor):
    proc, pids = _start_hold_driver(tmp_path, executor=executor)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
    assert "driver cleanup done" in out
    assert proc.returncode != 0
    assert wait_until_gone(pids, timeout=5) == []


def test_ctrl_c_prints_one_line_and_a_short_traceback(tmp_path, executor):
    proc, pids = _start_hold_driver(tmp_path, executor=executor)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert wait_until_gone(pids, timeout=5) == []  # no worker, nor a worker's child, left
    run_dir = str(tmp_path / "res" / "hold")
    [line] = [ln for ln in out.splitlines() if "interrupted" in ln and not ln.startswith("KeyboardInterrupt")]
    assert line == (
        "trainforge: interrupted: stopped 2 worker(s) of run 'hold' (attempt 0, 0 report(s), no checkpoint); "
        f"run directory: {run_dir} (resume with DataParallelTrainer.restore({run_dir!r}))"
    ), out
    # The exception still reaches the caller, from fit(): not through the controller or selectors.
    tb = out[out.index("Traceback (most recent call last):"):]
    assert "selectors.py" not in tb and "controller.py" not in tb and "trainer.py" in tb, tb
    assert tb.rstrip().endswith(f"KeyboardInterrupt: fit() was interrupted; run directory: {run_dir} "
                                f"(resume with DataParallelTrainer.restore({run_dir!r}))"), tb
    assert json.loads(open(os.path.join(run_dir, "run_state.json")).read())["status"] == "interrupted"


def test_killed_driver_leaves_no_worker(tmp_path, executor):
    proc, pids = _start_hold_driver(tmp_path, executor=executor)
    proc.kill()
    proc.wait(timeout=30)
    # Workers notice the driver's socket closing (and PDEATHSIG; Ray kills the actors of a dead
    # driver too); their children die with them.
    worker_pids = pids[0::2]
    assert wait_until_gone(worker_pids, timeout=10) == []
    # A worker's own children are not ours to reap once the worker is gone: kill them explicitly.
    for child in pids[1::2]:
        if pid_alive(child):
            os.kill(child, signal.SIGKILL)


# -- invalid configuration fails before any worker starts -----------------------------------------
def _no_workers_started():
    import psutil

    return psutil.Process().children(recursive=True) == []


def test_two_required_args_rejected():
    def loop(a, b):
        pass

    with pytest.raises(TypeError, match=r"2 required arguments \(a, b\)"):
        DataParallelTrainer(loop)
    assert _no_workers_started()


def test_invalid_scaling_rejected():
    with pytest.raises(ValueError, match=r"num_workers=0.*>= 1"):
        ScalingConfig(num_workers=0)
    with pytest.raises(ValueError, match="GPU"):
        ScalingConfig(num_workers=1, use_gpu=True, resources_per_worker={"GPU": 0})


def test_gpu_request_without_gpus_rejected(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ValueError, match=r"2 GPU\(s\) in all.*0 visible GPU"):
        DataParallelTrainer(lambda: None, scaling_config=ScalingConfig(num_workers=2, use_gpu=True))


def test_unknown_dataset_type_rejected():
    with pytest.raises(TypeError, match="'train'"):
        DataParallelTrainer(lambda: None, datasets={"train": object()})
    assert _no_workers_started()


def test_unwritable_storage_rejected_before_workers_start(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    trainer = DataParallelTrainer(lambda: None, run_config=RunConfig(storage_path=str(blocker / "sub")))
    with pytest.raises(ValueError, match="cannot be written"):
        trainer.fit()
    assert _no_workers_started()
