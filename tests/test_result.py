"""``Result`` (in memory and rebuilt from a run directory) and ``Checkpoint``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from trainforge import Checkpoint, CheckpointConfig, Result, TrainingFailedError
from trainforge._internal.checkpoint import METADATA_FILE
from trainforge._internal.checkpoint_manager import CheckpointManager
from trainforge._internal.metrics_log import MetricsLog
from trainforge._internal.storage import RUN_STATE_FILE, StorageContext, dumps

# -- Result -------------------------------------------------------------------------------------------


def test_metrics_dataframe_columns_and_rows(tmp_path):
    history = [{"epoch": 0, "loss": 1.0}, {"epoch": 1, "loss": 0.5, "acc": 0.9}]
    result = Result(
        metrics=history[-1], checkpoint=None, error=None, path=str(tmp_path), metrics_history=history
    )
    df = result.metrics_dataframe
    assert list(df.columns) == ["epoch", "loss", "acc"]
    assert len(df) == 2
    assert df["epoch"].tolist() == [0, 1]
    assert df["loss"].tolist() == [1.0, 0.5]
    assert df["acc"].isna().tolist() == [True, False]


def test_metrics_dataframe_empty(tmp_path):
    df = Result(metrics=None, checkpoint=None, error=None, path=str(tmp_path)).metrics_dataframe
    assert len(df) == 0


def write_run_state(storage: StorageContext, checkpoint_config: dict, error: str | None = None) -> None:
    """What ``DataParallelTrainer._save_state`` writes."""
    state = {
        "trainer": "DataParallelTrainer",
        "status": "errored" if error else "finished",
        "num_workers": 2,
        "checkpoint_config": checkpoint_config,
        "error": error,
        "time": 0.0,
    }
    storage.write_text(RUN_STATE_FILE, dumps(state))


def make_run(
    tmp_path: Path, accs: list[float], num_to_keep: int | None, error: str | None = None
) -> StorageContext:
    """A run directory as a run leaves it: metrics, checkpoints pruned by its manager, run state."""
    storage = StorageContext(str(tmp_path / "results"), "my_run")
    storage.prepare()
    config = CheckpointConfig(num_to_keep=num_to_keep, checkpoint_score_attribute="acc")
    manager = CheckpointManager(config, storage.delete_checkpoint)
    log = MetricsLog(storage)
    for i, acc in enumerate(accs):
        metrics = {"epoch": i, "acc": acc}
        log.append(metrics)
        src = tmp_path / f"src{i}"
        src.mkdir()
        (src / "model.txt").write_text(f"epoch {i}")
        storage.stage_checkpoint(str(src), 0, i, 0)
        manager.register(storage.commit_checkpoint(0, i, [0], i, metrics), metrics, i)
    log.flush()
    write_run_state(
        storage,
        {"num_to_keep": num_to_keep, "checkpoint_score_attribute": "acc", "checkpoint_score_order": "max"},
        error,
    )
    return storage


def test_from_path_rebuilds_metrics_and_checkpoints(tmp_path):
    storage = make_run(tmp_path, [0.1, 0.9, 0.8, 0.2], num_to_keep=None)
    result = Result.from_path(storage.run_path)
    assert result.path == storage.run_path
    assert result.error is None
    assert result.metrics == {"epoch": 3, "acc": 0.2}
    assert result.metrics_dataframe["acc"].tolist() == [0.1, 0.9, 0.8, 0.2]
    assert result.checkpoint == Checkpoint(storage.path("checkpoint_000003"))
    with result.checkpoint.as_directory() as d:
        assert Path(d, "model.txt").read_text() == "epoch 3"
    assert [c.path for c, _ in result.best_checkpoints] == [
        storage.path(f"checkpoint_{i:06d}") for i in range(4)
    ]
    assert [m["acc"] for _, m in result.best_checkpoints] == [0.1, 0.9, 0.8, 0.2]


def test_from_path_after_pruning(tmp_path):
    storage = make_run(tmp_path, [0.1, 0.9, 0.8, 0.2, 0.3], num_to_keep=2)
    result = Result.from_path(storage.run_path)
    # best two by acc (epochs 1, 2) plus the latest (epoch 4), in report order
    assert [m["epoch"] for _, m in result.best_checkpoints] == [1, 2, 4]
    assert result.checkpoint.path == storage.path("checkpoint_000004")
    assert len(result.metrics_dataframe) == 5  # the history keeps every report
    assert not Path(storage.path("checkpoint_000000")).exists()


def test_from_path_with_trailing_slash_and_pathlike(tmp_path):
    storage = make_run(tmp_path, [0.5], num_to_keep=None)
    assert Result.from_path(storage.run_path + "/").checkpoint.path == storage.path("checkpoint_000000")
    assert Result.from_path(Path(storage.run_path)).metrics == {"epoch": 0, "acc": 0.5}


def test_from_path_only_lists_committed_checkpoints(tmp_path):
    storage = make_run(tmp_path, [0.3, 0.4], num_to_keep=None)
    Path(storage.path("checkpoint_000002")).mkdir()  # an interrupted commit: no marker
    result = Result.from_path(storage.run_path)
    assert result.checkpoint.path == storage.path("checkpoint_000001")
    assert len(result.best_checkpoints) == 2


def test_from_path_of_errored_run(tmp_path):
    storage = make_run(tmp_path, [0.3], num_to_keep=None, error="Training failed: rank 1 (pid 9): boom")
    result = Result.from_path(storage.run_path)
    assert isinstance(result.error, TrainingFailedError)
    assert "rank 1 (pid 9): boom" in str(result.error)


def test_from_path_of_a_non_run_directory(tmp_path):
    (tmp_path / "somewhere").mkdir()
    with pytest.raises(ValueError) as info:
        Result.from_path(str(tmp_path / "somewhere"))
    msg = str(info.value)
    assert str(tmp_path / "somewhere") in msg and RUN_STATE_FILE in msg


def test_from_path_of_a_missing_directory(tmp_path):
    with pytest.raises(ValueError, match=RUN_STATE_FILE):
        Result.from_path(str(tmp_path / "nope"))


# -- get_best_checkpoint --------------------------------------------------------------------------------


def _result_with(metrics: list[dict]) -> Result:
    pairs = [(Checkpoint(f"/ck/{i}"), m) for i, m in enumerate(metrics)]
    return Result(metrics=metrics[-1] if metrics else None, checkpoint=pairs[-1][0] if pairs else None,
                  error=None, path="/run", best_checkpoints=pairs)  # fmt: skip


def test_get_best_checkpoint_max_and_min():
    result = _result_with([{"acc": 0.5, "loss": 3.0}, {"acc": 0.9, "loss": 1.0}, {"acc": 0.7, "loss": 0.5}])
    assert result.get_best_checkpoint(metric="acc", mode="max") == Checkpoint("/ck/1")
    assert result.get_best_checkpoint(metric="acc", mode="min") == Checkpoint("/ck/0")
    assert result.get_best_checkpoint("loss", "min") == Checkpoint("/ck/2")


def test_get_best_checkpoint_skips_checkpoints_without_the_metric_and_ties_go_to_the_first():
    result = _result_with([{"acc": 0.9}, {"loss": 0.1}, {"acc": None}, {"acc": 0.9}, {"acc": 0.2}])
    assert result.get_best_checkpoint("acc", "max") == Checkpoint("/ck/0")
    assert result.get_best_checkpoint("acc", "min") == Checkpoint("/ck/4")
    assert result.get_best_checkpoint("loss", "max") == Checkpoint("/ck/1")


def test_get_best_checkpoint_nested_metric():
    result = _result_with([{"val": {"acc": 0.4}}, {"val": {"acc": 0.8}}, {"val/acc": 0.6}])
    assert result.get_best_checkpoint("val/acc", "max") == Checkpoint("/ck/1")
    assert result.get_best_checkpoint("val/acc", "min") == Checkpoint("/ck/0")


def test_get_best_checkpoint_rejects_a_bad_mode():
    with pytest.raises(ValueError) as info:
        _result_with([{"acc": 1.0}]).get_best_checkpoint("acc", "maximum")
    msg = str(info.value)
    assert "mode='maximum'" in msg and "'max' or 'min'" in msg


def test_get_best_checkpoint_of_an_unknown_metric_lists_the_metrics():
    result = _result_with([{"epoch": 0, "loss": 1.0}, {"epoch": 1, "val": {"acc": 0.5}}])
    with pytest.raises(ValueError) as info:
        result.get_best_checkpoint("accuracy", "max")
    msg = str(info.value)
    assert "metric='accuracy'" in msg
    assert "['epoch', 'loss', 'val', 'val/acc']" in msg


def test_get_best_checkpoint_without_checkpoints_is_none():
    assert _result_with([]).get_best_checkpoint("acc", "max") is None


def test_get_best_checkpoint_of_a_result_from_path(tmp_path):
    storage = make_run(tmp_path, [0.1, 0.9, 0.8, 0.2, 0.3], num_to_keep=3)
    result = Result.from_path(storage.run_path)
    assert [m["epoch"] for _, m in result.best_checkpoints] == [1, 2, 4]  # kept: top 3 by acc
    assert result.get_best_checkpoint("acc", "max").path == storage.path("checkpoint_000001")
    assert result.get_best_checkpoint("acc", "min").path == storage.path("checkpoint_000004")
    assert result.get_best_checkpoint("epoch", "max").path == storage.path("checkpoint_000004")


# -- Checkpoint ---------------------------------------------------------------------------------------


def test_from_directory_of_missing_dir(tmp_path):
    missing = tmp_path / "missing"
    with pytest.raises(ValueError) as info:
        Checkpoint.from_directory(missing)
    assert repr(str(missing)) in str(info.value)


def test_from_directory_of_a_file(tmp_path):
    f = tmp_path / "file.pt"
    f.write_text("x")
    with pytest.raises(ValueError):
        Checkpoint.from_directory(f)


def test_from_directory_is_absolute(tmp_path, monkeypatch):
    (tmp_path / "ck").mkdir()
    monkeypatch.chdir(tmp_path)
    ckpt = Checkpoint.from_directory("ck")
    assert ckpt.path == str(tmp_path / "ck")
    assert os.fspath(ckpt) == ckpt.path
    assert ckpt.is_local


def test_to_directory_copies(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("A")
    (src / "sub" / "b.txt").write_text("B")
    ckpt = Checkpoint.from_directory(src)
    dest = tmp_path / "dest"
    out = ckpt.to_directory(dest)
    assert out == str(dest)
    assert (dest / "a.txt").read_text() == "A" and (dest / "sub" / "b.txt").read_text() == "B"
    (dest / "a.txt").write_text("changed")
    assert (src / "a.txt").read_text() == "A"  # a copy, not the original


def test_to_directory_default_is_a_new_temp_dir(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "w.bin").write_text("w")
    out = Checkpoint.from_directory(src).to_directory()
    try:
        assert out != str(src)
        assert Path(out, "w.bin").read_text() == "w"
    finally:
        import shutil

        shutil.rmtree(out)


def test_as_directory_yields_the_local_path(tmp_path):
    ckpt = Checkpoint.from_directory(tmp_path)
    with ckpt.as_directory() as d:
        assert d == str(tmp_path)
    assert tmp_path.is_dir()  # not removed afterwards


def test_metadata_round_trip(tmp_path):
    ckpt = Checkpoint.from_directory(tmp_path)
    assert ckpt.get_metadata() == {}
    ckpt.set_metadata({"epoch": 3, "tags": ["a"]})
    assert ckpt.get_metadata() == {"epoch": 3, "tags": ["a"]}
    ckpt.update_metadata({"epoch": 4, "lr": 0.1})
    assert ckpt.get_metadata() == {"epoch": 4, "tags": ["a"], "lr": 0.1}
    assert json.loads((tmp_path / METADATA_FILE).read_text()) == {"epoch": 4, "tags": ["a"], "lr": 0.1}
    # a fresh handle on the same directory sees it, and set replaces rather than merges
    again = Checkpoint.from_directory(tmp_path)
    again.set_metadata({"only": True})
    assert ckpt.get_metadata() == {"only": True}


def test_metadata_must_be_a_dict(tmp_path):
    with pytest.raises(TypeError, match="dict"):
        Checkpoint.from_directory(tmp_path).set_metadata([1, 2])


def test_equality_and_hash(tmp_path):
    a = Checkpoint.from_directory(tmp_path)
    b = Checkpoint(str(tmp_path))
    assert a == b and hash(a) == hash(b)
    assert a != Checkpoint(str(tmp_path / "other"))
    assert str(tmp_path) in repr(a)
