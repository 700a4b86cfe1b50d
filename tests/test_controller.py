"""The controller state machine, stepped one iteration at a time against a fake worker group."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeWorkerGroup, RecordingBackend, RecordingCallback, done, failure, report, specs

from trainforge._internal import controller as controller_mod
from trainforge._internal.backend import BackendConfig
from trainforge._internal.checkpoint import Checkpoint
from trainforge._internal.checkpoint_manager import CheckpointManager
from trainforge._internal.config import CheckpointConfig, FailureConfig
from trainforge._internal.controller import Controller, RunState
from trainforge._internal.controller_hooks import ControllerHooks
from trainforge._internal.exceptions import (
    TrainingFailedError,
    WorkerFailure,
    WorkerGroupError,
    WorkerStartError,
)
from trainforge._internal.failure_policy import FailurePolicy
from trainforge._internal.metrics_log import MetricsLog
from trainforge._internal.storage import COMMIT_MARKER, METRICS_FILE, StorageContext


@pytest.fixture(autouse=True)
def _short_settle(monkeypatch):
    # After a failure the controller listens this long for the other ranks; keep the tests fast.
    monkeypatch.setattr(controller_mod, "FAILURE_SETTLE_S", 0.02)


class Harness:
    """A controller wired to fakes; ``groups`` are handed out one per attempt."""

    def __init__(
        self,
        tmp_path: Path,
        groups: list[FakeWorkerGroup],
        *,
        n: int = 2,
        max_failures: int = 0,
        checkpoint_config: CheckpointConfig | None = None,
        initial_checkpoint: Checkpoint | None = None,
        worker_init_fn: Any = None,
    ):
        self.storage = StorageContext(str(tmp_path), "run")
        self.storage.prepare()
        self.groups = list(groups)
        self.made: list[FakeWorkerGroup] = []
        self.spec_attempts: list[int] = []
        self.payload_calls: list[tuple[int, Checkpoint | None, int]] = []
        self.backend = RecordingBackend()
        self.callback = RecordingCallback()
        self.manager = CheckpointManager(
            checkpoint_config or CheckpointConfig(), self.storage.delete_checkpoint
        )
        self.n = n
        hooks = ControllerHooks(
            make_worker_group=self._make_group,
            make_specs=self._make_specs,
            make_payloads=self._make_payloads,
            worker_init_fn=worker_init_fn,
            callbacks=[self.callback],
        )
        self.controller = Controller(
            hooks,
            self.backend,
            BackendConfig(),
            self.storage,
            self.manager,
            FailurePolicy(FailureConfig(max_failures)),
            MetricsLog(self.storage),
            initial_checkpoint=initial_checkpoint,
        )

    def _make_group(self) -> FakeWorkerGroup:
        group = self.groups.pop(0)
        self.made.append(group)
        return group

    def _make_specs(self, attempt: int, n: int = 0):
        self.spec_attempts.append(attempt)
        return specs(n or self.n)

    def _make_payloads(self, attempt, checkpoint, worker_specs):
        self.payload_calls.append((attempt, checkpoint, len(worker_specs)))
        return [f"payload-{attempt}-{s.rank}".encode() for s in worker_specs]

    def step(self, times: int = 1) -> RunState:
        for _ in range(times):
            self.controller.step()
        return self.controller.state

    def run(self) -> list[Any]:
        return list(self.controller.run_iter())

    # files a worker's report() would have staged
    def stage(self, attempt: int, index: int, rank: int, files: dict[str, str]) -> None:
        root = Path(self.storage.staging_path(attempt, index, rank))
        for rel, text in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)

    def staged_report(self, attempt: int, index: int, rank: int, files: dict[str, str], metrics=None):
        """A poll batch that stages the files first, then emits the checkpoint report."""

        def batch():
            self.stage(attempt, index, rank, files)
            return [report(rank, index, metrics, ckpt=True)]

        return batch

    def ckpt_dir(self, seq: int) -> Path:
        return Path(self.storage.path(f"checkpoint_{seq:06d}"))


def read_tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


# -- the happy path -----------------------------------------------------------------------------------


def test_state_transitions_and_backend_order(tmp_path):
    group = FakeWorkerGroup([[report(0, 0), report(1, 0)], [done(0, 1)], [done(1, 1)]])
    h = Harness(tmp_path, [group])
    c = h.controller
    assert c.state is RunState.INITIALIZING
    assert h.step() is RunState.SCHEDULING
    assert group.calls == []  # nothing started yet
    assert h.step() is RunState.RUNNING
    assert [name for name, *_ in group.calls] == ["start", "on_start", "on_training_start", "start_training"]
    assert group.calls[0] == ("start", 2)
    assert [g for _, g in h.backend.log] == [group, group]
    assert h.payload_calls == [(0, None, 2)]
    assert group.payloads == [b"payload-0-0", b"payload-0-1"]
    assert h.step() is RunState.RUNNING  # the reports
    assert h.step() is RunState.RUNNING  # only rank 0 is done
    assert group.shutdowns == []
    assert h.step() is RunState.FINISHED
    assert h.backend.hooks == ["on_start", "on_training_start", "on_shutdown"]
    assert group.calls[-2:] == [("on_shutdown",), ("shutdown", True)]
    assert group.shutdowns == [True]
    assert c.error is None


def test_worker_init_fn_runs_before_backend(tmp_path):
    def init() -> str:
        return "ok"

    group = FakeWorkerGroup([[done(0, 0), done(1, 0)]])
    h = Harness(tmp_path, [group], worker_init_fn=init)
    h.step(2)
    names = [call[0] for call in group.calls]
    assert names == ["start", "execute", "on_start", "on_training_start", "start_training"]
    assert group.calls[1][1] is init


def test_step_in_terminal_state_starts_nothing(tmp_path):
    h = Harness(tmp_path, [FakeWorkerGroup([[done(0, 0), done(1, 0)]])])
    assert h.step(3) is RunState.FINISHED
    try:
        h.controller.step()
    except Exception:
        pass  # refusing is fine; starting a new group is not
    assert h.controller.state is RunState.FINISHED
    assert len(h.made) == 1 and h.spec_attempts == [0]


def test_report_completes_only_when_every_rank_made_it(tmp_path):
    group = FakeWorkerGroup(
        [
            [report(0, 0, {"loss": 1.0})],
            [report(1, 0, {"loss": 1.5}), report(0, 1, {"loss": 0.5})],
            [report(1, 1, {"loss": 0.7})],
            [done(0, 2), done(1, 2)],
        ]
    )
    h = Harness(tmp_path, [group])
    h.step(2)
    h.step()
    # rank 0's metrics are in the history at once, but the report is not complete
    assert h.controller.metrics.rows == [{"loss": 1.0}]
    assert h.callback.reports == []
    h.step()
    assert [r.index for r in h.callback.reports] == [0]
    assert h.controller.metrics.rows == [{"loss": 1.0}, {"loss": 0.5}]
    first = h.callback.reports[0]
    assert first.metrics == {"loss": 1.0}
    assert first.all_metrics == [{"loss": 1.0}, {"loss": 1.5}]
    assert first.checkpoint is None and first.attempt == 0
    h.step()
    assert [r.index for r in h.callback.reports] == [0, 1]
    assert h.step() is RunState.FINISHED


def test_rank_nonzero_metrics_not_in_history(tmp_path):
    group = FakeWorkerGroup([[report(1, 0, {"who": 1})]])
    h = Harness(tmp_path, [group])
    h.step(3)
    assert h.controller.metrics.rows == []


def test_run_iter_yields_each_complete_report_once_and_flushes_metrics(tmp_path):
    group = FakeWorkerGroup(
        [
            [report(0, 0, {"x": 0})],
            [report(1, 0, {"x": 10}), report(0, 1, {"x": 1})],
            [report(1, 1, {"x": 11}), done(0, 2), done(1, 2)],
        ]
    )
    h = Harness(tmp_path, [group])
    out = h.run()
    assert [(r.index, r.metrics) for r in out] == [(0, {"x": 0}), (1, {"x": 1})]
    assert h.controller.state is RunState.FINISHED
    assert group.shutdowns[0] is True
    lines = Path(h.storage.path(METRICS_FILE)).read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{"x": 0}, {"x": 1}]
    result = h.controller.result()
    assert result.metrics == {"x": 1} and result.error is None
    assert result.path == h.storage.run_path


# -- checkpoints --------------------------------------------------------------------------------------


def test_checkpoint_commits_when_all_ranks_reported_and_merges_lowest_rank_wins(tmp_path):
    h = Harness(tmp_path, [])
    group = FakeWorkerGroup(
        [
            # rank 1 reports first: the merge order must still be by rank, not by arrival
            h.staged_report(
                0, 0, 1, {"shared.txt": "from rank 1", "opt_1.pt": "r1", "sub/deep.txt": "d1"}, {"loss": 9}
            ),
            h.staged_report(0, 0, 0, {"shared.txt": "from rank 0", "model.pt": "r0"}, {"loss": 3}),
            [done(0, 1), done(1, 1)],
        ]
    )
    h.groups.append(group)
    h.step(2)
    h.step()
    assert not h.ckpt_dir(0).exists()
    assert h.manager.latest is None
    assert Path(h.storage.staging_path(0, 0, 1)).is_dir()
    h.step()
    final = h.ckpt_dir(0)
    tree = read_tree(final)
    marker = json.loads(tree.pop(COMMIT_MARKER))
    assert tree == {"model.pt": "r0", "opt_1.pt": "r1", "shared.txt": "from rank 0", "sub/deep.txt": "d1"}
    assert marker["ranks"] == [0, 1] and marker["metrics"] == {"loss": 3} and marker["index"] == 0
    h.step()  # the committed report's staging directory goes at the next step (after run_iter yielded it)
    assert not Path(h.storage.staging_path(0, 0)).exists()
    assert h.manager.latest == Checkpoint(str(final))
    assert h.callback.reports[0].checkpoint == Checkpoint(str(final))
    assert [c.path for c, _ in h.storage.list_checkpoints()] == [str(final)]
    assert h.step() is RunState.FINISHED


def test_checkpoint_of_some_ranks_only(tmp_path):
    h = Harness(tmp_path, [])
    h.groups.append(
        FakeWorkerGroup(
            [[report(0, 0, {"a": 1})], h.staged_report(0, 0, 1, {"only1.txt": "1"}), [done(0, 1), done(1, 1)]]
        )
    )
    h.run()
    assert read_tree(h.ckpt_dir(0)).keys() == {"only1.txt", COMMIT_MARKER}
    marker = json.loads((h.ckpt_dir(0) / COMMIT_MARKER).read_text())
    assert marker["ranks"] == [1]
    assert marker["metrics"] == {"a": 1}  # rank 0's metrics go with the checkpoint


def test_successive_checkpoints_get_increasing_numbers(tmp_path):
    h = Harness(tmp_path, [], n=1)
    h.groups.append(
        FakeWorkerGroup(
            [h.staged_report(0, i, 0, {"step": str(i)}, {"i": i}) for i in range(3)] + [[done(0, 3)]]
        )
    )
    out = h.run()
    assert [r.checkpoint.path for r in out] == [str(h.ckpt_dir(i)) for i in range(3)]
    assert [(h.ckpt_dir(i) / "step").read_text() for i in range(3)] == ["0", "1", "2"]
    assert [m for _, m in h.manager.best_checkpoints] == [{"i": 0}, {"i": 1}, {"i": 2}]


def test_unequal_report_counts_warn_and_skip_incomplete_checkpoint(tmp_path, caplog):
    h = Harness(tmp_path, [])
    h.groups.append(
        FakeWorkerGroup(
            [
                [report(0, 0, {"i": 0}), report(1, 0, {"i": 0})],
                h.staged_report(0, 1, 0, {"model.pt": "only rank 0"}, {"i": 1}),
                [done(0, 2), done(1, 1)],
            ]
        )
    )
    h.step(4)
    assert Path(h.storage.staging_path(0, 1, 0)).is_dir()
    with caplog.at_level("WARNING", logger="trainforge"):
        assert h.step() is RunState.FINISHED
    [msg] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]  # one warning, logged once
    assert "a different number of times" in msg and "rank 0: 2" in msg and "rank 1: 1" in msg
    assert not Path(h.storage.staging_path(0, 1)).exists()
    assert not h.ckpt_dir(0).exists()
    assert h.manager.latest is None
    assert h.controller.metrics.rows == [{"i": 0}, {"i": 1}]
    assert [r.index for r in h.callback.reports] == [0]


def test_equal_report_counts_do_not_warn(tmp_path, caplog):
    h = Harness(tmp_path, [FakeWorkerGroup([[report(0, 0), report(1, 0)], [done(0, 1), done(1, 1)]])])
    with warnings.catch_warnings(), caplog.at_level("WARNING", logger="trainforge"):
        warnings.simplefilter("error")
        h.run()
    assert h.controller.state is RunState.FINISHED
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


# -- failures -----------------------------------------------------------------------------------------


def test_failure_without_retries_errors_naming_the_rank(tmp_path):
    h = Harness(tmp_path, [])
    group = FakeWorkerGroup(
        [
            h.staged_report(0, 0, 0, {"model.pt": "x"}),
            [failure(1, "CUDA error: out of memory", pid=4242)],
        ]
    )
    h.groups.append(group)
    h.step(3)
    assert h.step() is RunState.ERRORED
    err = h.controller.error
    assert isinstance(err, TrainingFailedError)
    assert "rank 1 (pid 4242)" in str(err)
    assert "RuntimeError: CUDA error: out of memory" in str(err)
    assert len(err.failures) == 1 and err.failures[0][0].rank == 1
    assert group.shutdowns == [False]
    assert "on_shutdown" not in h.backend.hooks
    # the incomplete checkpoint report was discarded
    assert not Path(h.storage.staging_path(0, 0)).exists()
    assert not h.ckpt_dir(0).exists()
    result = h.controller.result()
    assert result.error is err and result.checkpoint is None


def test_simultaneous_failures_are_grouped_into_one_attempt(tmp_path):
    group = FakeWorkerGroup([[failure(0, "same", t=200.0)], [failure(1, "same", t=100.0)]])
    h = Harness(tmp_path, [group])
    h.run()
    err = h.controller.error
    assert isinstance(err, TrainingFailedError)
    assert len(err.failures) == 1 and {f.rank for f in err.failures[0]} == {0, 1}
    assert str(err).count("RuntimeError: same") == 1
    assert "ranks 0, 1 (pids 1000, 1001): RuntimeError: same" in str(err)


def _not_polled_again():
    raise AssertionError("polled after every rank had failed or finished")


@pytest.mark.parametrize(
    ("script", "failed"),
    [
        ([[failure(0)], [failure(1)], _not_polled_again], [0, 1]),  # both failed
        ([[done(1, 0)], [failure(0)], _not_polled_again], [0]),  # one finished, the other failed
    ],
    ids=["all-failed", "finished-and-failed"],
)
def test_settle_window_ends_once_every_rank_failed_or_finished(tmp_path, monkeypatch, script, failed):
    monkeypatch.setattr(controller_mod, "FAILURE_SETTLE_S", 3600.0)  # only ending early ends it
    h = Harness(tmp_path, [FakeWorkerGroup(list(script))])
    h.run()
    err = h.controller.error
    assert isinstance(err, TrainingFailedError)
    assert len(err.failures) == 1 and sorted(f.rank for f in err.failures[0]) == failed


def test_report_on_the_wire_at_failure_is_still_committed(tmp_path):
    h = Harness(tmp_path, [])
    h.groups.append(
        FakeWorkerGroup(
            [
                h.staged_report(0, 0, 0, {"a": "0"}),
                [failure(0, "after report")],
                h.staged_report(0, 0, 1, {"b": "1"}),
            ]
        )
    )
    h.step(2)
    h.step()
    assert h.step() is RunState.ERRORED
    assert read_tree(h.ckpt_dir(0)).keys() == {"a", "b", COMMIT_MARKER}


def test_restart_after_failure_resumes_from_latest_checkpoint(tmp_path):
    h = Harness(tmp_path, [], max_failures=1)
    first = FakeWorkerGroup(
        [
            h.staged_report(0, 0, 0, {"model.pt": "e0"}, {"epoch": 0}),
            h.staged_report(0, 0, 1, {"opt.pt": "e0"}, {"epoch": 0}),
            [failure(0, "preempted")],
        ]
    )
    second = FakeWorkerGroup(
        [[report(0, 0, {"epoch": 1}), report(1, 0, {"epoch": 1})], [done(0, 1), done(1, 1)]]
    )
    h.groups += [first, second]
    h.step(4)
    assert h.step() is RunState.RESTARTING
    assert first.shutdowns == [False]
    assert h.controller.attempt == 0
    assert h.step() is RunState.SCHEDULING
    assert h.controller.attempt == 1
    assert h.callback.restarts == [(1, "rank 0 (pid 1000): RuntimeError: preempted")]
    assert h.step() is RunState.RUNNING
    assert h.made == [first, second]
    assert h.spec_attempts == [0, 1]
    latest = h.manager.latest
    assert latest is not None and latest.path == str(h.ckpt_dir(0))
    assert h.payload_calls == [(0, None, 2), (1, latest, 2)]
    assert second.payloads == [b"payload-1-0", b"payload-1-1"]
    assert [(name, g) for name, g in h.backend.log] == [
        ("on_start", first),
        ("on_training_start", first),
        ("on_start", second),
        ("on_training_start", second),
    ]
    assert h.step(2) is RunState.FINISHED
    assert second.shutdowns == [True]
    assert h.controller.error is None
    assert [r.attempt for r in h.callback.reports] == [0, 1]
    assert h.controller.metrics.rows == [{"epoch": 0}, {"epoch": 1}]


def test_one_numbering_of_reports_and_attempts_across_restarts(tmp_path, caplog):
    """Reports are numbered by their row in the history (which continues from the checkpoint), failures
    and the restart line by attempt as get_attempt() numbers them; each failure reaches on_failure."""
    h = Harness(tmp_path, [], max_failures=1)
    recorded: list[list[WorkerFailure]] = []
    h.controller.hooks.on_failure = recorded.append
    h.groups += [
        FakeWorkerGroup(
            [
                [report(0, 0, {"s": 0}), report(1, 0, {"s": 0})],
                h.staged_report(0, 1, 0, {"m": "1"}, {"s": 1}),
                h.staged_report(0, 1, 1, {"m": "1"}, {"s": 1}),
                [report(0, 2, {"s": 2}), report(1, 2, {"s": 2})],  # after the checkpoint: redone
                [failure(1, "first")],
            ]
        ),
        FakeWorkerGroup([[report(0, 0, {"s": 2}), report(1, 0, {"s": 2})], [failure(0, "second")]]),
    ]
    with caplog.at_level("WARNING", logger="trainforge"):
        reports = h.run()
    assert [(r.index, r.attempt, r.metrics["s"]) for r in reports] == [(0, 0, 0), (1, 0, 1), (2, 0, 2), (2, 1, 2)]
    assert h.controller.metrics.rows == [{"s": 0}, {"s": 1}, {"s": 2}]  # report 2 is the redone one
    assert [[(f.attempt, f.message) for f in a] for a in recorded] == [[(0, "first")], [(1, "second")]]
    assert [(f.attempt, f.rank) for f in h.controller.result().failures] == [(0, 1), (1, 0)]
    assert h.callback.restarts == [(1, "rank 1 (pid 1001): RuntimeError: first")]
    [line] = [r.getMessage() for r in caplog.records if "restarting" in r.getMessage()]
    assert line == (
        "attempt 0 failed: rank 1 (pid 1001): RuntimeError: first; restarting as attempt 1 from "
        "checkpoint_000000 (failure 1 of 1 allowed)"
    )
    text = str(h.controller.error)
    assert "[attempt 0] rank 1 (pid 1001): RuntimeError: first" in text
    assert "[attempt 1] rank 0 (pid 1000): RuntimeError: second" in text


def test_restart_without_checkpoint_uses_initial_checkpoint(tmp_path):
    resume = tmp_path / "resume"
    resume.mkdir()
    initial = Checkpoint.from_directory(resume)
    groups = [FakeWorkerGroup([[failure(1)]]), FakeWorkerGroup([[done(0, 0), done(1, 0)]])]
    h = Harness(tmp_path, groups, max_failures=1, initial_checkpoint=initial)
    h.run()
    assert h.controller.state is RunState.FINISHED
    assert [(a, c) for a, c, _ in h.payload_calls] == [(0, initial), (1, initial)]


def test_failed_attempt_staging_is_discarded_before_restart(tmp_path):
    h = Harness(tmp_path, [], max_failures=1)
    h.groups += [
        FakeWorkerGroup([h.staged_report(0, 0, 0, {"m": "x"}), [failure(1)]]),
        FakeWorkerGroup([[done(0, 0), done(1, 0)]]),
    ]
    h.run()
    assert not Path(h.storage.staging_path(0, 0)).exists()
    assert not h.ckpt_dir(0).exists()


def test_error_after_k_plus_one_failures_lists_every_attempt(tmp_path):
    groups = [FakeWorkerGroup([[failure(i % 2, f"failure number {i}")]]) for i in range(3)]
    h = Harness(tmp_path, groups, max_failures=2)
    h.run()
    assert h.controller.state is RunState.ERRORED
    err = h.controller.error
    assert isinstance(err, TrainingFailedError)
    text = str(err)
    assert "3 times" in text and "max_failures=2" in text
    positions = [text.index(f"[attempt {i}] rank {i % 2} ") for i in range(3)]  # numbered as get_attempt()
    assert positions == sorted(positions)
    for i in range(3):
        assert f"failure number {i}" in text
    assert [[f.message for f in attempt] for attempt in err.failures] == [
        [f"failure number {i}"] for i in range(3)
    ]
    assert [g.shutdowns[0] for g in groups] == [False, False, False]
    assert h.spec_attempts == [0, 1, 2]


def test_unlimited_failures(tmp_path):
    groups = [FakeWorkerGroup([[failure(0, f"f{i}")]]) for i in range(6)]
    groups.append(FakeWorkerGroup([[report(0, 0, {"ok": 1}), report(1, 0)], [done(0, 1), done(1, 1)]]))
    h = Harness(tmp_path, groups, max_failures=-1)
    h.run()
    assert h.controller.state is RunState.FINISHED
    assert h.controller.error is None
    assert h.controller.attempt == 6
    assert len(h.controller.failures) == 6
    assert [a for a, _ in h.callback.restarts] == [1, 2, 3, 4, 5, 6]


def test_failure_during_start_counts_as_a_failure(tmp_path):
    group = FakeWorkerGroup(start_error=WorkerStartError("worker 1 did not connect within 120s"))
    h = Harness(tmp_path, [group])
    h.step()
    assert h.step() is RunState.ERRORED
    err = h.controller.error
    assert isinstance(err, TrainingFailedError)
    assert "WorkerStartError: worker 1 did not connect within 120s" in str(err)
    assert h.backend.log == []
    assert [c[0] for c in group.calls] == ["start", "shutdown"]
    assert group.shutdowns == [False]
    assert h.payload_calls == []


def test_failure_during_start_is_retried(tmp_path):
    bad = WorkerGroupError("could not start")
    bad.failures = [WorkerFailure(rank=1, pid=77, kind="died", exit_code=-9, time=1.0)]
    groups = [FakeWorkerGroup(start_error=bad), FakeWorkerGroup([[done(0, 0), done(1, 0)]])]
    h = Harness(tmp_path, groups, max_failures=1)
    h.step()
    assert h.step() is RunState.RESTARTING
    assert h.controller.failures == [bad.failures]
    assert h.callback.restarts == []
    h.run()
    assert h.controller.state is RunState.FINISHED
    assert h.spec_attempts == [0, 1]
    ((attempt, reason),) = h.callback.restarts
    assert attempt == 1
    assert "rank 1 (pid 77)" in reason and "SIGKILL" in reason


def test_failure_in_backend_on_start_counts_as_a_failure(tmp_path):
    class FailingBackend(RecordingBackend):
        def on_start(self, worker_group, backend_config):
            raise WorkerGroupError("rank 0 could not join the process group")

    h = Harness(tmp_path, [FakeWorkerGroup()])
    h.controller.backend = FailingBackend()
    h.run()
    assert h.controller.state is RunState.ERRORED
    assert "could not join the process group" in str(h.controller.error)
    assert h.made[0].shutdowns[0] is False


def test_run_iter_closed_early_stops_the_group(tmp_path):
    group = FakeWorkerGroup([[report(0, 0), report(1, 0)], [report(0, 1), report(1, 1)]])
    h = Harness(tmp_path, [group])
    it = h.controller.run_iter()
    assert next(it).index == 0
    it.close()
    assert group.shutdowns == [False]
    assert os.path.isdir(h.storage.run_path)
