"""Hang detection, elastic sizing and history continuity, stepped against a fake worker group."""

from __future__ import annotations

import time

import pytest
from fakes import FakeWorkerGroup, done, failure, report
from test_controller import Harness

from trainforge._internal import controller as controller_mod
from trainforge._internal.config import ScalingConfig
from trainforge._internal.controller import RunState
from trainforge._internal.scaling_policy import ScalingDecision, ScalingPolicy


@pytest.fixture(autouse=True)
def _short_settle(monkeypatch):
    monkeypatch.setattr(controller_mod, "FAILURE_SETTLE_S", 0.02)


def test_silent_rank_is_hung_with_its_stack(tmp_path):
    group = FakeWorkerGroup()
    h = Harness(tmp_path, [group])
    h.controller.hang_timeout_s = 5.0
    h.step(2)
    group.progress = {0: time.monotonic(), 1: time.monotonic() - 60}
    assert h.step() is RunState.ERRORED
    assert ("dump_stacks", 1) in group.calls and ("dump_stacks", 0) not in group.calls
    msg = str(h.controller.error)
    assert "rank 1 (pid 1001): worker hung: no report and no output for more than 5s" in msg
    assert "stuck_rank_1" in msg
    assert group.shutdowns == [False]


def test_no_hang_check_without_timeout(tmp_path):
    group = FakeWorkerGroup([[], [done(0, 0), done(1, 0)]])
    h = Harness(tmp_path, [group])
    h.step(2)
    group.progress = {0: time.monotonic() - 1e6, 1: time.monotonic() - 1e6}
    h.step(3)
    assert h.controller.state is RunState.FINISHED


def test_scaling_policy_fixed_and_elastic():
    avail = {"CPU": 2.0}
    fixed = ScalingPolicy(ScalingConfig(num_workers=4), lambda: avail)
    assert fixed.size_now() == 4  # a fixed size ignores the resource view (oversubscription is allowed)
    elastic = ScalingPolicy(ScalingConfig(num_workers=(1, 4)), lambda: avail)
    assert elastic.size_now() == 2
    assert elastic.decide(2) is ScalingDecision.KEEP
    avail["CPU"] = 8
    assert elastic.size_now() == 4 and elastic.decide(2) is ScalingDecision.GROW
    assert elastic.decide(4) is ScalingDecision.KEEP
    avail["CPU"] = 3
    assert elastic.decide(4) is ScalingDecision.SHRINK and elastic.decide(3) is ScalingDecision.KEEP
    avail["CPU"] = 1
    assert elastic.decide(4) is ScalingDecision.SHRINK and elastic.size_now() == 1  # down to min, not below
    assert fixed.decide(4) is ScalingDecision.KEEP  # a fixed size never resizes
    avail["CPU"] = 0.5
    assert elastic.size_now() is None
    assert elastic.decide(2) is ScalingDecision.KEEP  # below min: the failure path handles lost resources
    two_cpu = ScalingPolicy(ScalingConfig(num_workers=(1, 4), resources_per_worker={"CPU": 2, "GPU": 1}),
                            lambda: {"CPU": 8, "GPU": 3})
    assert two_cpu.size_now() == 3  # GPUs bind first


def test_elastic_grows_at_a_checkpoint_and_continues_from_it(tmp_path):
    avail = {"CPU": 2.0}
    g1, g2 = FakeWorkerGroup(), FakeWorkerGroup([[done(r, 0) for r in range(3)]])
    h = Harness(tmp_path, [g1, g2])
    h.controller.scaling = ScalingPolicy(ScalingConfig(num_workers=(1, 3)), lambda: avail)
    h.step(2)
    assert g1.calls[0] == ("start", 2)
    avail["CPU"] = 3.0
    g1.script = [
        [report(0, 0, {"i": 0}), report(1, 0, {"i": 0})],
        h.staged_report(0, 1, 0, {"w": "x"}, {"i": 1}),
        [report(1, 1, {"i": 1}), report(0, 2, {"i": 2})],  # rank 0 is one report ahead
    ]
    h.step(3)
    assert h.controller.state is RunState.RESIZING
    h.step()  # RESIZING -> SCHEDULING
    assert g1.shutdowns == [False]
    assert [r["i"] for r in h.controller.metrics.rows] == [0, 1]  # report 2 is redone after the resize
    h.step()
    assert g2.calls[0] == ("start", 3)
    assert h.payload_calls[-1][0] == 1 and h.payload_calls[-1][1] is not None  # attempt 1, from the checkpoint
    h.step(2)
    assert h.controller.state is RunState.FINISHED and h.controller.sizes == [2, 3]


def test_elastic_shrinks_at_a_checkpoint_when_resources_are_reclaimed(tmp_path):
    avail = {"CPU": 3.0}
    g1, g2 = FakeWorkerGroup(), FakeWorkerGroup([[done(0, 0)]])
    h = Harness(tmp_path, [g1, g2])
    h.controller.scaling = ScalingPolicy(ScalingConfig(num_workers=(1, 3)), lambda: avail)
    h.step(2)
    assert g1.calls[0] == ("start", 3)
    g1.script = [[report(r, 0, {"i": 0}) for r in range(3)]]  # no checkpoint: no sizing decision
    h.step()
    avail["CPU"] = 1.0  # a scheduler takes two workers' resources back
    assert h.step() is RunState.RUNNING
    g1.script = [
        lambda: [*h.staged_report(0, 1, 0, {"w": "x"}, {"i": 1})(), report(1, 1, {"i": 1})],
        [report(2, 1, {"i": 1}), report(0, 2, {"i": 2})],  # rank 0 is one report ahead
    ]
    h.step(2)
    assert h.controller.state is RunState.RESIZING
    h.step()  # RESIZING -> SCHEDULING
    assert g1.shutdowns == [False]
    assert [r["i"] for r in h.controller.metrics.rows] == [0, 1]  # report 2 is redone after the resize
    assert h.callback.restarts == [(1, "resize to 1 workers")] and h.controller.failures == []
    assert controller_mod.parse_resize_reason(h.callback.restarts[0][1]) == 1
    h.step()
    assert g2.calls[0] == ("start", 1)
    assert h.payload_calls[-1][0] == 1 and h.payload_calls[-1][1] is not None  # attempt 1, from the checkpoint
    h.step(2)
    assert h.controller.state is RunState.FINISHED and h.controller.sizes == [3, 1]


def test_elastic_waits_for_minimum_then_starts(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFORGE_RESOURCE_WAIT_S", "30")
    monkeypatch.setattr(controller_mod.time, "sleep", lambda s: None)
    avail = {"CPU": 1.0}
    group = FakeWorkerGroup()
    h = Harness(tmp_path, [group])
    h.controller.scaling = ScalingPolicy(ScalingConfig(num_workers=(2, 2)), lambda: avail)
    # (2, 2) is not elastic: the size is fixed and never waits
    h.step(2)
    assert group.calls[0] == ("start", 2)

    g2 = FakeWorkerGroup()
    h2 = Harness(tmp_path / "b", [g2])
    h2.controller.scaling = ScalingPolicy(ScalingConfig(num_workers=(2, 3)), lambda: avail)
    h2.step(3)
    assert h2.controller.state is RunState.SCHEDULING and g2.calls == []
    avail["CPU"] = 2.0
    assert h2.step() is RunState.RUNNING and g2.calls[0] == ("start", 2)


def test_restart_truncates_history_to_latest_checkpoint(tmp_path):
    g1 = FakeWorkerGroup()
    g2 = FakeWorkerGroup([[done(0, 0), done(1, 0)]])
    h = Harness(tmp_path, [g1, g2], max_failures=1)
    h.step(2)
    g1.script = [
        [report(0, 0, {"i": 0}), report(1, 0, {"i": 0})],
        h.staged_report(0, 1, 0, {"f": "1"}, {"i": 1}),
        [report(1, 1, {"i": 1})],
        [report(0, 2, {"i": 2}), report(1, 2, {"i": 2})],
        [failure(1)],
    ]
    h.step(5)
    assert h.controller.state is RunState.RESTARTING
    h.step()
    assert [r["i"] for r in h.controller.metrics.rows] == [0, 1]
    # and on disk, so Result.from_path and restore agree
    from trainforge._internal.metrics_log import MetricsLog

    assert [r["i"] for r in MetricsLog(h.storage).rows] == [0, 1]
