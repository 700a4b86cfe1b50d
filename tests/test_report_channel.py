"""How reports travel from a worker to the driver: local workers write them into a shared-memory
ring, everything else (and a report too big for the ring) goes over the socket. Whatever the path,
the driver sees each rank's messages in the order they were sent."""

from __future__ import annotations

import pytest

import trainforge as train
from trainforge import Checkpoint, DataParallelTrainer, RunConfig, ScalingConfig
from trainforge._internal.worker_group import report_ring

BIG = report_ring.DEFAULT_BYTES  # a metrics payload bigger than the whole ring


def _fit(loop, tmp_path, executor: str = "local", n: int = 2):
    return DataParallelTrainer(
        loop,
        scaling_config=ScalingConfig(num_workers=n, executor=executor),
        run_config=RunConfig(storage_path=str(tmp_path), name="run", verbose=0),
    ).fit()


def test_a_report_too_big_for_the_ring_keeps_its_place_among_the_others(tmp_path, executor):
    def loop():
        import tempfile

        for i in range(30):
            metrics = {"i": i}
            if i in (7, 20):
                metrics["blob"] = "x" * BIG  # goes over the socket, between ring records
            checkpoint = None
            if i == 21:
                d = tempfile.mkdtemp()
                with open(f"{d}/state.txt", "w") as f:
                    f.write(str(i))
                checkpoint = Checkpoint.from_directory(d)
            train.report(metrics, checkpoint=checkpoint)

    result = _fit(loop, tmp_path, executor)
    assert result.error is None
    assert list(result.metrics_dataframe["i"]) == list(range(30))
    assert result.metrics["i"] == 29
    assert result.checkpoint is not None
    with result.checkpoint.as_directory() as d, open(f"{d}/state.txt") as f:
        assert f.read() == "21"


@pytest.mark.skipif(not report_ring.available(), reason="needs os.memfd_create (Linux)")
def test_local_workers_report_metrics_through_the_ring_and_checkpoints_over_the_socket(tmp_path, monkeypatch):
    # Count what reaches the driver by which path: with a ring, only the reports that carry a
    # checkpoint come over the socket (to wake the driver, which commits it at once).
    from trainforge._internal.worker_group import socket_group

    seen: list[tuple[str, str]] = []
    original_dispatch = socket_group.SocketWorkerGroup._dispatch
    original_drain = socket_group.SocketWorkerGroup._drain_ring
    in_drain = [False]

    def dispatch(self, w, msg):
        seen.append(("ring" if in_drain[0] else "socket", msg[0]))
        return original_dispatch(self, w, msg)

    def drain(self, w, upto=None):
        in_drain[0] = True
        try:
            return original_drain(self, w, upto)
        finally:
            in_drain[0] = False

    monkeypatch.setattr(socket_group.SocketWorkerGroup, "_dispatch", dispatch)
    monkeypatch.setattr(socket_group.SocketWorkerGroup, "_drain_ring", drain)

    def loop():
        import tempfile

        for i in range(200):
            checkpoint = None
            if i == 100:
                checkpoint = Checkpoint.from_directory(tempfile.mkdtemp())
            train.report({"i": i}, checkpoint=checkpoint)

    result = _fit(loop, tmp_path)
    assert result.error is None
    assert len(result.metrics_dataframe) == 200
    assert result.checkpoint is not None
    reports = [path for path, kind in seen if kind == "report"]
    assert reports.count("ring") == 398 and reports.count("socket") == 2
    # "done" follows ring records, so it comes wrapped with the ring position it must wait for.
    assert ("socket", "after") in seen
