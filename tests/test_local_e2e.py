"""Real multi-process runs: the core API end to end. Tests taking ``executor`` run twice, on local
worker processes and on Ray actors (the shared behaviour suite, see conftest.py)."""

from __future__ import annotations

import asyncio
import os
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import trainforge as train
from trainforge import (
    Checkpoint,
    CheckpointConfig,
    DataParallelTrainer,
    Result,
    RunConfig,
    ScalingConfig,
)
from trainforge.backend import Backend, BackendConfig


def _run(loop, n=2, tmp_path=None, executor="local", **kwargs) -> Result:
    rc = kwargs.pop("run_config", None) or RunConfig(storage_path=str(tmp_path), name="run", verbose=0)
    scaling = ScalingConfig(num_workers=n, executor=executor)
    return DataParallelTrainer(loop, scaling_config=scaling, run_config=rc, **kwargs).fit()


def test_context_and_metrics(tmp_path, executor):
    def loop(config):
        ctx = train.get_context()
        for i in range(config["steps"]):
            train.report(
                {
                    "step": i,
                    "rank": ctx.get_world_rank(),
                    "world": ctx.get_world_size(),
                    "local_rank": ctx.get_local_rank(),
                    "local_world": ctx.get_local_world_size(),
                    "node_rank": ctx.get_node_rank(),
                    "name": ctx.get_experiment_name(),
                    "meta": ctx.get_metadata()["owner"],
                    "env_rank": int(os.environ["RANK"]),
                }
            )

    result = _run(
        loop, n=3, tmp_path=tmp_path, train_loop_config={"steps": 4}, metadata={"owner": "me"}, executor=executor
    )
    assert result.error is None
    assert result.metrics["step"] == 3 and result.metrics["rank"] == 0
    assert result.metrics["world"] == 3 and result.metrics["local_world"] == 3
    assert result.metrics["node_rank"] == 0 and result.metrics["name"] == "run"
    assert result.metrics["meta"] == "me" and result.metrics["env_rank"] == 0
    df = result.metrics_dataframe
    assert list(df["step"]) == [0, 1, 2, 3]
    assert set(df["rank"]) == {0}
    assert result.path == str(tmp_path / "run")


def test_fit_iter_yields_every_rank(tmp_path, executor):
    def loop():
        ctx = train.get_context()
        for i in range(3):
            train.report({"i": i, "rank": ctx.get_world_rank()})

    trainer = DataParallelTrainer(
        loop, scaling_config=ScalingConfig(num_workers=2, executor=executor),
        run_config=RunConfig(storage_path=str(tmp_path), verbose=0),
    )
    run = trainer.fit_iter()
    reports = list(run)
    assert [r.index for r in reports] == [0, 1, 2]
    assert [[m["rank"] for m in r.all_metrics] for r in reports] == [[0, 1]] * 3
    assert [r.metrics["i"] for r in reports] == [0, 1, 2]
    assert run.result is not None and run.result.metrics == {"i": 2, "rank": 0}


def test_loop_kinds_lambda_closure_async_zero_args(tmp_path, executor):
    captured = {"value": 7}
    results = []
    results.append(_run(lambda: train.report({"v": 1}), n=1, tmp_path=tmp_path / "a", executor=executor))
    results.append(_run(lambda: train.report({"v": captured["value"]}), n=1, tmp_path=tmp_path / "b", executor=executor))

    async def aloop(config):
        await asyncio.sleep(0)
        train.report({"v": config["x"]})

    results.append(_run(aloop, n=2, tmp_path=tmp_path / "c", train_loop_config={"x": 3}, executor=executor))

    class Callable:
        def __call__(self, config):
            train.report({"v": len(config)})

    results.append(_run(Callable(), n=1, tmp_path=tmp_path / "d", executor=executor))
    assert [r.metrics["v"] for r in results] == [1, 7, 3, 0]


def test_checkpoints_merge_ranks_and_keep_top_k(tmp_path, executor):
    def loop():
        import tempfile

        ctx = train.get_context()
        scores = [0.5, 0.9, 0.1, 0.7]
        for i, score in enumerate(scores):
            with tempfile.TemporaryDirectory() as d:
                with open(os.path.join(d, f"rank{ctx.get_world_rank()}.txt"), "w") as f:
                    f.write(str(i))
                with open(os.path.join(d, "shared.txt"), "w") as f:
                    f.write(f"rank {ctx.get_world_rank()}")
                train.report({"score": score, "i": i}, checkpoint=Checkpoint.from_directory(d))
        assert train.get_checkpoint() is None

    rc = RunConfig(
        storage_path=str(tmp_path),
        name="ck",
        verbose=0,
        checkpoint_config=CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="score"),
    )
    result = _run(loop, n=2, run_config=rc, executor=executor)
    # Top 2 by score (0.9 at i=1, 0.7 at i=3); i=3 is also the latest.
    assert [m["i"] for _, m in result.best_checkpoints] == [1, 3]
    assert result.checkpoint.path.endswith("checkpoint_000003")
    with result.checkpoint.as_directory() as d:
        files = sorted(f for f in os.listdir(d) if not f.startswith("."))
        assert files == ["rank0.txt", "rank1.txt", "shared.txt"]
        assert open(os.path.join(d, "shared.txt")).read() == "rank 0"  # lowest rank wins
    on_disk = sorted(p for p in os.listdir(tmp_path / "ck") if p.startswith("checkpoint_"))
    assert on_disk == ["checkpoint_000001", "checkpoint_000003"]
    assert not os.path.exists(tmp_path / "ck" / ".staging")  # removed once empty

    rebuilt = Result.from_path(result.path)
    assert rebuilt.metrics == result.metrics
    assert rebuilt.checkpoint == result.checkpoint
    assert [m["i"] for _, m in rebuilt.best_checkpoints] == [1, 3]
    assert list(rebuilt.metrics_dataframe["i"]) == [0, 1, 2, 3]


def test_checkpoint_from_rank0_only_and_metadata(tmp_path, executor):
    def loop():
        import tempfile

        rank = train.get_context().get_world_rank()
        with tempfile.TemporaryDirectory() as d:
            ckpt = None
            if rank == 0:
                open(os.path.join(d, "model.bin"), "w").write("weights")
                ckpt = Checkpoint.from_directory(d)
                ckpt.set_metadata({"epoch": 1})
            train.report({"loss": 0.5}, checkpoint=ckpt)

    result = _run(loop, n=2, tmp_path=tmp_path, executor=executor)
    assert result.checkpoint is not None
    assert result.checkpoint.get_metadata() == {"epoch": 1}
    target = result.checkpoint.to_directory(str(tmp_path / "copy"))
    assert open(os.path.join(target, "model.bin")).read() == "weights"


def metadata_loop(config):
    """Both ranks save a file each step; rank 0 also sets the checkpoint's "step" (and at step 1 an
    "owner" of its own, which must win over the trainer's). Resumes after the checkpoint's step."""
    import tempfile

    ctx = train.get_context()
    rank = ctx.get_world_rank()
    resumed = train.get_checkpoint()
    start = resumed.get_metadata()["step"] + 1 if resumed is not None else 0
    for step in range(start, config["steps"]):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, f"rank{rank}.txt"), "w") as f:
                f.write(str(step))
            ckpt = Checkpoint.from_directory(d)
            if rank == 0:
                ckpt.set_metadata({"step": step, **({"owner": "worker"} if step == 1 else {})})
            meta = ctx.get_metadata()
            train.report({"step": step, "start": start, "owner": meta["owner"]}, checkpoint=ckpt)


def check_trainer_metadata_through_restore(storage_path: str, restore_path: str, **run_kwargs) -> None:
    """A run with ``metadata=`` (2 steps), then ``restore()`` and 2 more steps: every committed
    checkpoint has the trainer's keys under the worker's own."""
    trainer = DataParallelTrainer(
        metadata_loop,
        train_loop_config={"steps": 2},
        metadata={"owner": "trainer", "lr": 0.1},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=storage_path, name="meta", verbose=0, **run_kwargs),
    )
    first = trainer.fit()
    assert first.metrics == {"step": 1, "start": 0, "owner": "trainer"}  # get_context().get_metadata()
    assert [c.get_metadata() for c, _ in first.best_checkpoints] == [
        {"owner": "trainer", "lr": 0.1, "step": 0},
        {"owner": "worker", "lr": 0.1, "step": 1},  # the worker's key wins
    ]

    second = DataParallelTrainer.restore(restore_path, train_loop_config={"steps": 4}).fit()
    assert list(second.metrics_dataframe["start"]) == [0, 0, 2, 2]  # resumed after checkpoint 1
    assert second.checkpoint.path.endswith("checkpoint_000003")
    assert [c.get_metadata() for c, _ in second.best_checkpoints] == [
        {"owner": "trainer", "lr": 0.1, "step": 0},
        {"owner": "worker", "lr": 0.1, "step": 1},
        {"owner": "trainer", "lr": 0.1, "step": 2},
        {"owner": "trainer", "lr": 0.1, "step": 3},
    ]
    assert Result.from_path(restore_path).checkpoint.get_metadata() == {"owner": "trainer", "lr": 0.1, "step": 3}


def test_trainer_metadata_in_checkpoints_and_after_restore(tmp_path):
    check_trainer_metadata_through_restore(str(tmp_path), str(tmp_path / "meta"))


@pytest.fixture
def umask():
    """``umask(mask)`` sets this process's umask (its workers inherit it) until the test ends."""
    before = os.umask(0o022)
    os.umask(before)
    yield os.umask
    os.umask(before)


def _modes(root: Path) -> dict[str, int]:
    """Every file and directory under ``root`` (itself included), relative: its mode."""
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in [root, *root.rglob("*")]}


def test_run_directory_is_tidy_after_a_run_with_a_restart(tmp_path, umask):
    """Checkpoints written in 0o700 temporary directories, a restart (so standby workers were
    started), under umask 022: afterwards no .staging/, no stack files (none was dumped), and the
    whole run directory (checkpoints, metrics, state, logs) is the owner's alone: files 0600,
    directories 0700 (``$TRAINFORGE_FILE_MODE`` unset)."""
    umask(0o022)

    def loop():
        import tempfile

        rank = train.get_context().get_world_rank()
        resumed = train.get_checkpoint()
        with tempfile.TemporaryDirectory() as d:
            os.mkdir(os.path.join(d, "sub"), mode=0o755)
            with open(os.path.join(d, "sub", f"rank{rank}.txt"), "w") as f:
                f.write("x")
            os.chmod(os.path.join(d, "sub", f"rank{rank}.txt"), 0o644)
            train.report({"resumed": resumed is not None}, checkpoint=Checkpoint.from_directory(d))
        if resumed is None and rank == 1:
            raise RuntimeError("fail once")

    rc = RunConfig(storage_path=str(tmp_path / "results"), name="tidy", verbose=0,
                   failure_config=train.FailureConfig(max_failures=1))  # fmt: skip
    result = _run(loop, n=2, run_config=rc)
    assert result.metrics == {"resumed": True}
    run = tmp_path / "results" / "tidy"
    assert not (run / ".staging").exists()
    assert sorted(os.listdir(run / "logs")) == ["rank_0.log", "rank_1.log"]
    modes = _modes(tmp_path / "results")  # the storage path it created, too
    wrong = {p: oct(m) for p, m in modes.items() if m != (0o700 if (tmp_path / "results" / p).is_dir() else 0o600)}
    assert wrong == {}, wrong
    checkpoints = [p for p in modes if p.startswith("tidy/checkpoint_")]
    assert len(checkpoints) == 2 * 5  # two checkpoints: the directory, sub/, two rank files and the marker
    assert {"tidy/metrics.jsonl", "tidy/run_state.json", "tidy/logs/rank_0.log"} <= set(modes)


def test_run_directory_follows_the_umask_when_configured(tmp_path, umask, monkeypatch):
    """``$TRAINFORGE_FILE_MODE=umask``: as Ray and MLflow write (group-readable under umask 027);
    any other value is refused before anything runs, naming the variable."""
    umask(0o027)
    monkeypatch.setenv("TRAINFORGE_FILE_MODE", "umask")

    def loop():
        import tempfile

        with tempfile.TemporaryDirectory() as d:  # 0700, its file 0600: the run directory's modes win
            os.mkdir(os.path.join(d, "sub"))
            with open(os.path.join(d, "sub", "w.txt"), "w") as f:
                f.write("x")
            os.chmod(os.path.join(d, "sub", "w.txt"), 0o600)
            train.report({"loss": 1.0}, checkpoint=Checkpoint.from_directory(d))

    result = _run(loop, n=1, run_config=RunConfig(storage_path=str(tmp_path / "shared"), name="group", verbose=0))
    modes = _modes(tmp_path / "shared")
    wrong = {p: oct(m) for p, m in modes.items() if m != (0o750 if (tmp_path / "shared" / p).is_dir() else 0o640)}
    assert wrong == {}, wrong
    assert os.path.relpath(result.checkpoint.path, tmp_path / "shared") + "/sub/w.txt" in modes
    monkeypatch.setenv("TRAINFORGE_FILE_MODE", "group-ish")
    with pytest.raises(ValueError, match=r"\$TRAINFORGE_FILE_MODE='group-ish': choose 'private'"):
        _run(loop, n=1, run_config=RunConfig(storage_path=str(tmp_path / "bad"), name="bad", verbose=0))


def test_stack_file_is_named_by_rank_and_removed_when_empty(tmp_path):
    from trainforge._internal.worker_group.local_pool import WorkerProcess

    earlier = tmp_path / "rank_1.stack"
    earlier.write_text("attempt 0 stacks\n")  # a dump by the previous attempt's rank 1
    startup = tmp_path / ".worker_7.stack"
    with open(startup, "a") as held_by_worker:  # as worker_main opens it, before it has a rank
        w = WorkerProcess(None, str(startup), (), "key")  # type: ignore[arg-type]
        w.name_stack_file(1)
        assert w.stack_file == str(earlier) and not startup.exists()
        held_by_worker.write("attempt 1 stacks\n")  # the worker's dumps follow the rename
    assert earlier.read_text() == "attempt 0 stacks\nattempt 1 stacks\n"
    w.remove_stack_file_if_empty()
    assert earlier.exists()  # a dump is kept

    old, new = (WorkerProcess(None, str(tmp_path / f".worker_{i}.stack"), (), "k") for i in (8, 9))  # type: ignore[arg-type]
    for worker in (old, new):
        Path(worker.stack_file).touch()
        worker.name_stack_file(0)
    old.remove_stack_file_if_empty()  # rank_0.stack is the newer worker's now: left alone
    assert (tmp_path / "rank_0.stack").exists()
    new.remove_stack_file_if_empty()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank_1.stack"]


def test_metadata_must_be_json_serializable(tmp_path):
    with pytest.raises(ValueError) as info:
        DataParallelTrainer(lambda: None, metadata={"when": object()})
    msg = str(info.value)
    assert "metadata={'when': <object object" in msg and "JSON-serializable" in msg


def test_unequal_report_counts_warn_and_do_not_hang(tmp_path, capfd, executor):
    def loop():
        import tempfile

        rank = train.get_context().get_world_rank()
        for i in range(3 if rank == 0 else 2):
            with tempfile.TemporaryDirectory() as d:
                open(os.path.join(d, "f"), "w").write(str(i))
                train.report({"i": i}, checkpoint=Checkpoint.from_directory(d))

    rc = RunConfig(storage_path=str(tmp_path), name="run", verbose=1)
    result = _run(loop, n=2, tmp_path=tmp_path, executor=executor, run_config=rc)
    _, err = capfd.readouterr()
    # One console line, in trainforge's style (no bare logging line, no Python warning).
    [line] = [ln for ln in err.splitlines() if "a different number of times" in ln]
    assert line.startswith("trainforge: Ranks called report()") and "rank 0: 3" in line and "rank 1: 2" in line
    assert result.metrics == {"i": 2}  # rank 0's last report is still in the metrics
    assert result.checkpoint.path.endswith("checkpoint_000001")  # report 2 was not committed
    assert not os.path.exists(os.path.join(result.path, ".staging"))  # report 2's files were discarded


def test_datasets_split_and_whole(tmp_path, executor):
    def loop():
        shard = train.get_dataset_shard("train")
        items = [int(x) for b in shard.iter_batches(batch_size=2) for x in b["item"]]
        val = train.get_dataset_shard("val")
        n_val = sum(len(b) for b in val.iter_batches(batch_size=4, batch_format="pandas"))
        train.report({"items": items, "n_val": n_val})

    datasets = {"train": list(range(10)), "val": pd.DataFrame({"x": range(5)})}
    trainer = DataParallelTrainer(
        loop,
        datasets=datasets,
        scaling_config=ScalingConfig(num_workers=3, executor=executor),
        run_config=RunConfig(storage_path=str(tmp_path), verbose=0),
    )
    reports = list(trainer.fit_iter())
    per_rank = [m["items"] for m in reports[0].all_metrics]
    assert sorted(x for items in per_rank for x in items) == list(range(10))
    assert sorted(len(items) for items in per_rank) == [3, 3, 4]
    assert [m["n_val"] for m in reports[0].all_metrics] == [5, 5, 5]


@pytest.mark.parametrize(
    "make",
    [
        lambda: [{"a": i, "b": 2 * i} for i in range(7)],
        lambda: {"a": np.arange(7), "b": np.arange(7) * 2},
        lambda: pd.DataFrame({"a": range(7), "b": [2 * i for i in range(7)]}),
        lambda: pa.table({"a": list(range(7)), "b": [2 * i for i in range(7)]}),
    ],
    ids=["list_of_dicts", "dict_of_arrays", "dataframe", "arrow"],
)
def test_dataset_types_through_workers(tmp_path, make, executor):
    def loop():
        shard = train.get_dataset_shard("train")
        rows = [(int(a), int(b)) for batch in shard.iter_batches(batch_size=3) for a, b in zip(batch["a"], batch["b"], strict=True)]
        torch_rows = sum(len(b["a"]) for b in shard.iter_torch_batches(batch_size=2))
        train.report({"rows": rows, "torch_rows": torch_rows})

    trainer = DataParallelTrainer(
        loop,
        datasets={"train": make()},
        scaling_config=ScalingConfig(num_workers=2, executor=executor),
        run_config=RunConfig(storage_path=str(tmp_path), verbose=0),
    )
    reports = list(trainer.fit_iter())
    rows = sorted(r for m in reports[0].all_metrics for r in m["rows"])
    assert rows == [(i, 2 * i) for i in range(7)]
    assert sum(m["torch_rows"] for m in reports[0].all_metrics) == 7


def test_torch_map_style_dataset(tmp_path, executor):
    import torch
    from torch.utils.data import TensorDataset

    ds = TensorDataset(torch.arange(6).float().unsqueeze(1), torch.arange(6))

    def loop():
        shard = train.get_dataset_shard("train")
        labels = [int(v) for b in shard.iter_torch_batches(batch_size=4) for v in b["1"]]
        train.report({"labels": labels})

    trainer = DataParallelTrainer(
        loop, datasets={"train": ds}, scaling_config=ScalingConfig(num_workers=2, executor=executor),
        run_config=RunConfig(storage_path=str(tmp_path), verbose=0),
    )
    reports = list(trainer.fit_iter())
    assert sorted(x for m in reports[0].all_metrics for x in m["labels"]) == list(range(6))


class _EnvBackend(Backend):
    def on_start(self, worker_group, backend_config):
        def set_env_var(value):
            import os

            os.environ["MY_ENV_VAR"] = value

        worker_group.execute(set_env_var, backend_config.env_var)


@dataclass
class _EnvBackendConfig(BackendConfig):
    env_var: str = "default_value"

    @property
    def backend_cls(self):
        return _EnvBackend


@dataclass
class _EnvBackendConfigMethod(BackendConfig):
    env_var: str = "default_value"

    def backend_cls(self):  # Ray Train examples also write it as a plain method
        return _EnvBackend


@pytest.mark.parametrize("config_cls", [_EnvBackendConfig, _EnvBackendConfigMethod])
def test_custom_backend_sets_env_on_every_worker(tmp_path, config_cls, executor):
    def loop():
        train.report({"env": os.environ["MY_ENV_VAR"]})

    trainer = DataParallelTrainer(
        loop,
        backend_config=config_cls(env_var="banana"),
        scaling_config=ScalingConfig(num_workers=2, executor=executor),
        run_config=RunConfig(storage_path=str(tmp_path), verbose=0),
    )
    reports = list(trainer.fit_iter())
    assert [m["env"] for m in reports[0].all_metrics] == ["banana", "banana"]


def test_worker_init_fn_runs_before_loop(tmp_path, executor):
    def init():
        import random

        os.environ["SEEDED"] = "yes"
        random.seed(1234)

    def loop():
        import random

        train.report({"seeded": os.environ.get("SEEDED"), "r": random.random()})

    trainer = DataParallelTrainer(
        loop, worker_init_fn=init, scaling_config=ScalingConfig(num_workers=2, executor=executor),
        run_config=RunConfig(storage_path=str(tmp_path), verbose=0),
    )
    reports = list(trainer.fit_iter())
    import random

    random.seed(1234)
    expected = random.random()
    assert [m["seeded"] for m in reports[0].all_metrics] == ["yes", "yes"]
    assert [m["r"] for m in reports[0].all_metrics] == [expected, expected]


def test_output_streams_with_rank_prefix_and_log_files(tmp_path, capfd, executor):
    def loop():
        import sys

        rank = train.get_context().get_world_rank()
        print(f"stdout line from {rank}")
        print(f"stderr line from {rank}", file=sys.stderr)

    result = _run(loop, n=2, tmp_path=tmp_path, executor=executor)
    out, err = capfd.readouterr()
    for rank in (0, 1):
        assert f"(rank={rank} pid=" in out and f") stdout line from {rank}" in out
        assert f") stderr line from {rank}" in err
        log = open(os.path.join(result.path, "logs", f"rank_{rank}.log")).read()
        assert f"stdout line from {rank}" in log and f"stderr line from {rank}" in log


def test_default_name_is_generated_and_printed(tmp_path, capfd, monkeypatch):
    monkeypatch.setenv("TRAINFORGE_STORAGE_PATH", str(tmp_path))
    result = DataParallelTrainer(lambda: train.report({"x": 1})).fit()
    name = os.path.basename(result.path)
    assert name.startswith("DataParallelTrainer_")
    assert os.path.dirname(result.path) == str(tmp_path)
    _, err = capfd.readouterr()
    assert name in err and result.path in err


def test_resume_from_checkpoint(tmp_path, executor):
    ckpt_dir = tmp_path / "given"
    ckpt_dir.mkdir()
    (ckpt_dir / "state.txt").write_text("41")

    def loop():
        ckpt = train.get_checkpoint()
        with ckpt.as_directory() as d:
            value = int(open(os.path.join(d, "state.txt")).read())
        train.report({"value": value + 1})

    result = _run(
        loop, n=2, tmp_path=tmp_path, resume_from_checkpoint=Checkpoint.from_directory(ckpt_dir), executor=executor
    )
    assert result.metrics == {"value": 42}


def test_report_outside_worker_raises():
    with pytest.raises(RuntimeError, match="inside a train loop"):
        train.report({"x": 1})


def test_unpicklable_metrics_raise_in_worker(tmp_path, executor):
    def loop():
        train.report({"f": lambda: 1})

    with pytest.raises(train.TrainingFailedError, match="must be picklable"):
        _run(loop, n=1, tmp_path=tmp_path, executor=executor)


def test_sys_path_of_driver_is_used_by_workers(tmp_path, executor):
    mod = tmp_path / "mods"
    mod.mkdir()
    (mod / "my_helper_mod.py").write_text("VALUE = 99\n")
    sys.path.insert(0, str(mod))
    try:
        import my_helper_mod  # noqa: F401

        def loop():

            train.report({"v": my_helper_mod.VALUE})

        assert _run(loop, n=1, tmp_path=tmp_path, executor=executor).metrics == {"v": 99}
    finally:
        sys.path.remove(str(mod))
        sys.modules.pop("my_helper_mod", None)


def test_fit_iter_stop_from_another_thread_ends_the_run_as_it_stands(tmp_path, executor):
    """TrainingIterator.stop() (what a tuner's scheduler uses): the workers go, the iteration ends,
    the result keeps the reports so far, and the run directory says it was stopped."""
    import json
    import threading

    def loop():
        i = 0
        while True:  # never ends by itself
            train.report({"i": i})
            i += 1
            time.sleep(0.05)

    trainer = DataParallelTrainer(
        loop, scaling_config=ScalingConfig(num_workers=2, executor=executor),
        run_config=RunConfig(name="stopped", storage_path=str(tmp_path), verbose=0),
    )  # fmt: skip
    run = trainer.fit_iter()
    seen = []
    for report in run:
        seen.append(report.index)
        if report.index == 2:
            threading.Thread(target=run.stop).start()
    assert seen[:3] == [0, 1, 2]
    assert run.result is not None and run.result.error is None and run.result.metrics["i"] == seen[-1]
    with open(tmp_path / "stopped" / "run_state.json") as f:
        assert json.load(f)["status"] == "stopped"


def test_fit_iter_stop_ends_each_train_loop_at_its_next_report(tmp_path, executor):
    """stop(): the workers' loops end cleanly at their next report() (SystemExit(0) from report, so
    `finally` runs and `except Exception` does not swallow it); a loop that never reports again is
    ended by the signal after the grace period. Either way no worker process is left (the autouse
    leftover-process check)."""
    import threading

    marks = tmp_path / "marks"
    marks.mkdir()

    def loop(config):
        rank = train.get_context().get_world_rank()
        i = 0
        try:
            while True:
                try:
                    train.report({"i": i})
                except Exception:  # noqa: BLE001 - a user's broad except must not swallow the stop
                    (marks / f"swallowed_{rank}").write_text("")
                i += 1
                if config["hang"] and i == 3 and rank == 1:
                    threading.Event().wait()  # never reports again
                time.sleep(0.02)
        except SystemExit as exc:
            (marks / f"rank_{rank}").write_text(f"{type(exc).__name__} {exc.code} {i}")
            raise

    for hang in (False, True):
        for f in marks.iterdir():
            f.unlink()
        trainer = DataParallelTrainer(
            loop, train_loop_config={"hang": hang}, scaling_config=ScalingConfig(num_workers=2, executor=executor),
            run_config=RunConfig(name=f"stop-{hang}", storage_path=str(tmp_path), verbose=0),
        )  # fmt: skip
        run = trainer.fit_iter()
        for report in run:
            if report.index == 2:
                threading.Thread(target=run.stop, kwargs={"grace_s": 0.5}).start()
        assert run.result is not None and run.result.error is None
        texts = {f.name: f.read_text() for f in marks.iterdir()}
        assert not any(name.startswith("swallowed") for name in texts), texts
        assert texts["rank_0"].startswith("StopTraining 0"), texts
        if hang:
            # Ended after the grace period: SIGTERM for a local worker, ray.kill for an actor.
            assert texts.get("rank_1", "SystemExit 143").startswith("SystemExit 143"), texts
        else:
            assert texts["rank_1"].startswith("StopTraining 0"), texts
