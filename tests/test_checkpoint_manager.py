"""Which checkpoints the manager keeps, and which it deletes."""

from __future__ import annotations

import logging

import pytest

from trainforge._internal.checkpoint import Checkpoint
from trainforge._internal.checkpoint_manager import CheckpointManager
from trainforge._internal.config import CheckpointConfig


class Deleted(list):
    def __call__(self, checkpoint: Checkpoint) -> None:
        self.append(checkpoint.path)


def feed(manager: CheckpointManager, metrics_list: list[dict]) -> list[list[str]]:
    """Register one checkpoint per metrics dict (named c0, c1, ...); return what each call dropped."""
    dropped = []
    for m in metrics_list:
        i = manager.next_index
        out = manager.register(Checkpoint(f"/ckpt/c{i}"), m, i)
        dropped.append([c.path for c in out])
    return dropped


def kept(manager: CheckpointManager) -> list[str]:
    return [c.path.rsplit("/", 1)[-1] for c, _ in manager.best_checkpoints]


def test_keeps_everything_by_default():
    deleted = Deleted()
    m = CheckpointManager(CheckpointConfig(), deleted)
    feed(m, [{"i": i} for i in range(5)])
    assert kept(m) == ["c0", "c1", "c2", "c3", "c4"]
    assert deleted == []
    assert m.latest.path == "/ckpt/c4"


def test_without_attribute_keeps_newest_k():
    deleted = Deleted()
    m = CheckpointManager(CheckpointConfig(num_to_keep=2), deleted)
    dropped = feed(m, [{"i": i} for i in range(5)])
    assert kept(m) == ["c3", "c4"]
    assert dropped == [[], [], ["/ckpt/c0"], ["/ckpt/c1"], ["/ckpt/c2"]]
    assert deleted == ["/ckpt/c0", "/ckpt/c1", "/ckpt/c2"]


def test_max_keeps_best_k_plus_latest():
    deleted = Deleted()
    m = CheckpointManager(CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="acc"), deleted)
    feed(m, [{"acc": a} for a in (0.5, 0.9, 0.7, 0.8, 0.1)])
    # best two: c1 (0.9), c3 (0.8); c4 is the latest and is kept as well
    assert kept(m) == ["c1", "c3", "c4"]
    assert sorted(deleted) == ["/ckpt/c0", "/ckpt/c2"]
    assert m.latest.path == "/ckpt/c4"


def test_min_keeps_lowest_scores():
    deleted = Deleted()
    m = CheckpointManager(
        CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="loss", checkpoint_score_order="min"),
        deleted,
    )
    feed(m, [{"loss": v} for v in (3.0, 1.0, 2.0, 0.5, 4.0)])
    assert kept(m) == ["c1", "c3", "c4"]
    assert sorted(deleted) == ["/ckpt/c0", "/ckpt/c2"]


def test_latest_that_is_also_best_is_not_counted_twice():
    m = CheckpointManager(CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="acc"), Deleted())
    feed(m, [{"acc": a} for a in (0.1, 0.2, 0.3, 0.4)])
    assert kept(m) == ["c2", "c3"]


def test_ties_prefer_the_newer_checkpoint():
    m = CheckpointManager(CheckpointConfig(num_to_keep=1, checkpoint_score_attribute="acc"), Deleted())
    feed(m, [{"acc": 1}, {"acc": 1}, {"acc": 0}])
    assert kept(m) == ["c1", "c2"]


@pytest.mark.parametrize("bad", [None, "high", float("nan"), True])
def test_missing_or_non_numeric_score_is_worst_and_warns(caplog, bad):
    deleted = Deleted()
    m = CheckpointManager(CheckpointConfig(num_to_keep=1, checkpoint_score_attribute="acc"), deleted)
    metrics = [{"acc": 0.2}, {"other": 1} if bad is None else {"acc": bad}, {"acc": 0.1}, {"acc": 0.05}]
    with caplog.at_level(logging.WARNING, logger="trainforge"):
        feed(m, metrics)
    # c1 (no usable score) goes first even though c2 and c3 score lower
    assert "/ckpt/c1" in deleted
    assert kept(m) == ["c0", "c3"]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "acc" in warnings[0].getMessage() and "/ckpt/c1" in warnings[0].getMessage()


def test_no_warning_when_scores_present(caplog):
    m = CheckpointManager(CheckpointConfig(num_to_keep=1, checkpoint_score_attribute="acc"), Deleted())
    with caplog.at_level(logging.WARNING, logger="trainforge"):
        feed(m, [{"acc": 1}, {"acc": 2}, {"acc": 3}])
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_best_checkpoints_in_report_order_with_metrics_copies():
    m = CheckpointManager(CheckpointConfig(num_to_keep=3, checkpoint_score_attribute="acc"), Deleted())
    metrics = [{"acc": a} for a in (0.9, 0.1, 0.8, 0.7, 0.2)]
    feed(m, metrics)
    best = m.best_checkpoints
    assert [c.path for c, _ in best] == ["/ckpt/c0", "/ckpt/c2", "/ckpt/c3", "/ckpt/c4"]
    assert [mm["acc"] for _, mm in best] == [0.9, 0.8, 0.7, 0.2]
    best[0][1]["acc"] = -1
    assert m.best_checkpoints[0][1]["acc"] == 0.9
    metrics[0]["acc"] = -5  # the caller's dict is not aliased either
    assert m.best_checkpoints[0][1]["acc"] == 0.9


def test_works_without_delete_callback():
    m = CheckpointManager(CheckpointConfig(num_to_keep=1))
    dropped = feed(m, [{}, {}, {}])
    assert dropped[-1] == ["/ckpt/c1"]
    assert kept(m) == ["c2"]


def test_load_adopts_existing_and_continues_numbering():
    m = CheckpointManager(CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="acc"), Deleted())
    assert m.latest is None and m.next_index == 0
    m.load(
        [
            (Checkpoint("/ckpt/c3"), {"index": 3, "metrics": {"acc": 0.5}}),
            (Checkpoint("/ckpt/c1"), {"index": 1, "metrics": {"acc": 0.9}}),
        ]
    )
    assert kept(m) == ["c1", "c3"]
    assert m.latest.path == "/ckpt/c3"
    assert m.next_index == 4
    feed(m, [{"acc": 0.1}])
    assert kept(m) == ["c1", "c3", "c4"]
    feed(m, [{"acc": 0.95}])
    assert kept(m) == ["c1", "c5"]
