"""Tracker sinks (trainforge.tune.logger, trainforge.air.integrations.mlflow/.wandb): real 2-worker
fits and a small Tuner, with what each sink wrote read back by its own reader (TensorBoard's
EventAccumulator and tensorboardX's record format, MlflowClient on a file store, W&B's offline run
file); sinks that raise or crawl change nothing in the run; the queue's rules driven step by step."""

from __future__ import annotations

import csv
import glob
import importlib.util
import json
import logging
import os
import pickle
import struct
import subprocess
import sys
import threading
import time

import pytest

import trainforge as train
from trainforge import (
    Callback,
    Checkpoint,
    DataParallelTrainer,
    FailureConfig,
    Result,
    RunConfig,
    ScalingConfig,
    TrainingReport,
)
from trainforge.tune.logger import CSVLoggerCallback, JsonLoggerCallback, LoggerCallback, TBXLoggerCallback

pytest.importorskip("tensorboardX")
mlflow = pytest.importorskip("mlflow")
wandb = pytest.importorskip("wandb")

from trainforge.air.integrations.mlflow import MLflowLoggerCallback, setup_mlflow  # noqa: E402
from trainforge.air.integrations.wandb import WandbLoggerCallback, setup_wandb  # noqa: E402

REPORTS = 4


@pytest.fixture
def wandb_offline(monkeypatch):
    """W&B without network or login; its service process (wandb-core) is stopped after the test."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    yield
    wandb.teardown()


@pytest.fixture
def mlflow_store(tmp_path, monkeypatch):
    """A file store URI; MLflow's own default (``sqlite:///mlflow.db`` in the cwd) is never used."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    return f"file://{tmp_path / 'mlruns'}"


def _client(uri):
    from mlflow.tracking import MlflowClient

    from trainforge._internal.sinks.mlflow import file_store_allowed

    with file_store_allowed(uri):
        return MlflowClient(tracking_uri=uri)


def _rc(tmp_path, callbacks, name="run", **kw):
    return RunConfig(name=name, storage_path=str(tmp_path / "results"), verbose=0, callbacks=callbacks, **kw)


def _metrics(i, lr=0.1):
    return {"loss": 1.0 / (i + 1), "nested": {"acc": 0.1 * i}, "lr": lr, "tag": f"step{i}"}


def _loop(config):
    for i in range(REPORTS):
        checkpoint = None
        if config.get("checkpoint_dir") and i == REPORTS - 1 and train.get_context().get_world_rank() == 0:
            os.makedirs(config["checkpoint_dir"], exist_ok=True)
            with open(os.path.join(config["checkpoint_dir"], "model.txt"), "w") as f:
                f.write("weights")
            checkpoint = Checkpoint.from_directory(config["checkpoint_dir"])
        train.report(_metrics(i, config["lr"]), checkpoint=checkpoint)


# -- readers ----------------------------------------------------------------------------------------
def _tb_scalars(logdir):
    """{tag: [(step, value)]} as TensorBoard's EventAccumulator reads the directory (tensorboardX's
    own record format, parsed here, when tensorboard is not installed)."""
    if importlib.util.find_spec("tensorboard") is None:
        return _tb_records(logdir)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(logdir)
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _tb_records(logdir):
    """{tag: [(step, value)]} parsed from the event files with tensorboardX's protos (TFRecord: u64
    length, u32 crc, payload, u32 crc), files in name order; a SessionLog START at step s drops the
    earlier points at steps >= s, as TensorBoard does (``purge_step``)."""
    from tensorboardX.proto import event_pb2

    out: dict[str, list] = {}
    for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
        data = open(path, "rb").read()
        pos = 0
        while pos + 12 <= len(data):
            (length,) = struct.unpack("<Q", data[pos : pos + 8])
            event = event_pb2.Event()
            event.ParseFromString(data[pos + 12 : pos + 12 + length])
            pos += 12 + length + 4
            if event.HasField("session_log") and event.session_log.status == event_pb2.SessionLog.START:
                out = {tag: [(s, v) for s, v in points if s < event.step] for tag, points in out.items()}
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    out.setdefault(value.tag, []).append((event.step, value.simple_value))
    return out


def _wandb_records(path, pb):
    """The records of a W&B ``.wandb`` file: LevelDB log blocks of 32 KiB, each record's parts with a
    header of crc (u32), length (u16), type (u8: 1 full, 2 first, 3 middle, 4 last)."""
    data = open(path, "rb").read()
    assert data[:4] == b":W&B", path
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def _wandb_runs(run_dir):
    """Each offline run under ``run_dir/wandb``: its run record and its history rows."""
    from wandb.proto import wandb_internal_pb2 as pb

    runs = []
    for path in sorted(glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", "run-*.wandb"))):
        run, history = None, []
        for record in _wandb_records(path, pb):
            which = record.WhichOneof("record_type")
            if which == "run":
                run = record.run
            elif which == "history":
                row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                history.append({k: v for k, v in row.items() if not k.startswith("_") or k == "_step"})
        runs.append((run, history))
    return runs


def _wandb_artifacts(run_dir):
    """(name, type) of every artifact the offline runs under ``run_dir`` logged."""
    from wandb.proto import wandb_internal_pb2 as pb

    out = []
    for path in sorted(glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", "run-*.wandb"))):
        for record in _wandb_records(path, pb):
            if record.WhichOneof("record_type") == "artifact":
                out.append((record.artifact.name, record.artifact.type))
    return out


def _expected_rows(history):
    return [{**row, "training_iteration": i + 1} for i, row in enumerate(history)]


def _check_files(run_dir, history, config):
    """result.json, params.json and progress.csv hold exactly the run's history (and config)."""
    with open(os.path.join(run_dir, "result.json")) as f:
        assert [json.loads(line) for line in f] == _expected_rows(history)
    with open(os.path.join(run_dir, "params.json")) as f:
        assert json.load(f) == config
    with open(os.path.join(run_dir, "progress.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(history)
    for row, reported in zip(rows, _expected_rows(history), strict=True):
        assert float(row["loss"]) == reported["loss"]
        assert float(row["nested/acc"]) == reported["nested"]["acc"]
        assert (
            row["tag"] == reported["tag"] and int(row["training_iteration"]) == reported["training_iteration"]
        )


def _check_tensorboard(run_dir, history):
    scalars = _tb_scalars(run_dir)
    assert sorted(scalars) == ["loss", "lr", "nested/acc"]  # numbers only: "tag" is a string
    for tag, pick in (("loss", lambda m: m["loss"]), ("nested/acc", lambda m: m["nested"]["acc"])):
        assert [s for s, _ in scalars[tag]] == list(range(1, len(history) + 1))
        assert [v for _, v in scalars[tag]] == pytest.approx([pick(m) for m in history], rel=1e-6)


def _check_wandb(run_dir, history, config, name, group=""):
    [(run, rows)] = _wandb_runs(run_dir)
    assert run.display_name == name and run.run_group == group
    assert {u.key: json.loads(u.value_json) for u in run.config.update if u.key != "_wandb"} == config
    assert [r["_step"] for r in rows] == list(range(1, len(history) + 1))
    for row, reported in zip(rows, history, strict=True):
        assert row["loss"] == pytest.approx(reported["loss"]) and row["nested/acc"] == pytest.approx(
            reported["nested"]["acc"]
        )
        assert row["tag"] == reported["tag"]


def _check_mlflow_run(client, run, history, params):
    assert run.info.status == "FINISHED"
    assert run.data.params == params
    for key, pick in (("loss", lambda m: m["loss"]), ("nested/acc", lambda m: m["nested"]["acc"])):
        points = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        assert points == [(i + 1, pick(m)) for i, m in enumerate(history)]
    assert "tag" not in run.data.metrics


# -- end to end -------------------------------------------------------------------------------------
def test_import_trainforge_imports_no_tracker_library():
    code = (
        "import sys, trainforge, trainforge.tune, trainforge.tune.logger\n"
        "import trainforge.air.integrations.mlflow as m, trainforge.air.integrations.wandb as w\n"
        "from trainforge.tune.logger import CSVLoggerCallback, JsonLoggerCallback, TBXLoggerCallback\n"
        "sinks = [CSVLoggerCallback(), JsonLoggerCallback(), TBXLoggerCallback(), m.MLflowLoggerCallback(),\n"
        "         w.WandbLoggerCallback(project='p')]  # constructing one imports nothing either\n"
        "print('HEAVY=' + ','.join(x for x in ('tensorboardX', 'tensorboard', 'mlflow', 'wandb') if x in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY=\n" in proc.stdout, proc.stdout


def test_two_worker_fit_every_sink_logs_what_was_reported(tmp_path, wandb_offline, mlflow_store):
    config = {"lr": 0.1, "opt": {"momentum": 0.9}, "checkpoint_dir": str(tmp_path / "ckpt")}
    sinks = [
        CSVLoggerCallback(), JsonLoggerCallback(), TBXLoggerCallback(),
        MLflowLoggerCallback(tracking_uri=mlflow_store, experiment_name="sinks", tags={"team": "a"}, save_artifact=True),
        WandbLoggerCallback(project="sinks", upload_checkpoints=True),
    ]  # fmt: skip
    result = DataParallelTrainer(
        _loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=_rc(tmp_path, sinks),
    ).fit()
    history = result.metrics_history
    assert history == [_metrics(i) for i in range(REPORTS)]
    for sink in sinks:
        stats = sink.stats()
        assert (stats.logged, stats.dropped, stats.queued, stats.errors) == (REPORTS, 0, 0, 0), (sink, stats)
    _check_files(result.path, history, config)
    _check_tensorboard(result.path, history)
    assert _tb_records(result.path)["loss"] == _tb_scalars(result.path)["loss"]  # tensorboardX's own format
    _check_wandb(result.path, history, config, name="run")
    assert _wandb_artifacts(result.path) == [("checkpoint_run", "model")]  # upload_checkpoints

    client = _client(mlflow_store)
    experiment = client.get_experiment_by_name("sinks")
    [run] = client.search_runs([experiment.experiment_id])
    assert (
        run.info.run_name == "run"
        and run.data.tags["team"] == "a"
        and "mlflow.parentRunId" not in run.data.tags
    )
    _check_mlflow_run(
        client, run, history, {"lr": "0.1", "opt/momentum": "0.9", "checkpoint_dir": config["checkpoint_dir"]}
    )
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}  # save_artifact: the run directory
    assert {"metrics.jsonl", "result.json", result.checkpoint.path.rsplit("/", 1)[-1]} <= artifacts, artifacts
    assert DataParallelTrainer.can_restore(result.path)  # the trainer, sinks included, still pickles


def test_tuner_one_tracker_run_per_trial_nested_under_the_experiment(tmp_path, wandb_offline, mlflow_store):
    from trainforge import tune

    def trial(config):
        for i in range(REPORTS):
            tune.report(_metrics(i, config["lr"]))

    lrs = [0.1, 0.2, 0.3]
    sinks = [CSVLoggerCallback(), JsonLoggerCallback(), TBXLoggerCallback(),
             MLflowLoggerCallback(tracking_uri=mlflow_store), WandbLoggerCallback(project="sinks")]  # fmt: skip
    grid = tune.Tuner(
        trial,
        param_space={"lr": tune.grid_search(lrs), "model": {"width": 8}},
        tune_config=tune.TuneConfig(metric="loss", mode="min", server=False),
        run_config=tune.RunConfig(
            name="exp", storage_path=str(tmp_path / "results"), callbacks=sinks, verbose=0
        ),
    ).fit()
    assert grid.num_errors == 0 and len(grid) == 3
    for sink in sinks:
        assert (sink.stats().logged, sink.stats().dropped) == (3 * REPORTS, 0), sink

    client = _client(mlflow_store)
    experiment = client.get_experiment_by_name("exp")  # the tuner's experiment name
    runs = client.search_runs([experiment.experiment_id])
    [parent] = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = {r.data.tags["trial_id"]: r for r in runs if r is not parent}
    assert parent.info.run_name == "exp" and parent.info.status == "FINISHED" and len(children) == 3

    for result in grid:
        trial_dir = result.path
        trial_id = result.metrics["trial_id"]
        trial_config = {"lr": result.config["lr"], "model": {"width": 8}}
        history = [_metrics(i, trial_config["lr"]) for i in range(REPORTS)]
        name = os.path.basename(trial_dir)
        _check_files(trial_dir, history, trial_config)
        _check_tensorboard(trial_dir, history)
        _check_wandb(trial_dir, history, trial_config, name=name, group="exp")
        child = children[trial_id]
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id and child.info.run_name == name
        _check_mlflow_run(client, child, history, {"lr": str(trial_config["lr"]), "model/width": "8"})


def test_a_failing_sink_changes_nothing_in_the_result(tmp_path, caplog):
    class Broken(LoggerCallback):
        def log_trial_start(self, trial):
            raise RuntimeError("tracker down")

    class BrokenResults(LoggerCallback):
        def log_trial_result(self, iteration, trial, result):
            result["loss"] = -1.0  # a sink's copy: the run's history must not change
            raise ConnectionError("timeout")

        def log_trial_end(self, trial, failed=False):
            raise OSError("cannot close")

    sinks = [Broken(), BrokenResults(), JsonLoggerCallback()]
    with caplog.at_level(logging.WARNING, logger="trainforge.sinks"):
        result = DataParallelTrainer(
            _loop, train_loop_config={"lr": 0.1}, scaling_config=ScalingConfig(num_workers=2),
            run_config=_rc(tmp_path, sinks),
        ).fit()  # fmt: skip
    assert result.error is None
    assert result.metrics_history == [_metrics(i) for i in range(REPORTS)] and result.metrics == _metrics(
        REPORTS - 1
    )
    broken, results, good = (s.stats() for s in sinks)
    assert (broken.logged, broken.dropped, broken.errors) == (0, REPORTS, 1)
    assert (results.logged, results.dropped) == (0, REPORTS)
    assert results.errors >= 2  # a failing call per batch of queued results, and log_trial_end
    assert isinstance(results.last_error, OSError)
    assert (good.logged, good.dropped) == (REPORTS, 0)
    failures = [r.getMessage() for r in caplog.records if "failed for run" in r.getMessage()]
    assert len(failures) == 2  # once per sink, not once per failure
    assert "Broken: log_trial_start failed for run run: RuntimeError: tracker down" in failures[0]


def test_a_sink_sleeping_200ms_per_call_never_holds_up_reports(tmp_path):
    """Every report reaches the driver's callbacks while the slow sink has written none of them
    (its first call waits until the last report has passed); it writes them all before fit()
    returns."""
    passed = threading.Event()

    class Slow(LoggerCallback):
        calls = 0

        def log_trial_result(self, iteration, trial, result):
            assert passed.wait(60)
            time.sleep(0.2)  # the slow tracker being simulated, not a wait for an event
            Slow.calls += 1

    class Witness(Callback):
        seen: list[int] = []

        def on_report(self, report):
            Witness.seen.append(slow.stats().logged)
            if report.index == REPORTS - 1:
                passed.set()

    slow = Slow()
    result = DataParallelTrainer(
        _loop, train_loop_config={"lr": 0.1}, scaling_config=ScalingConfig(num_workers=2),
        run_config=_rc(tmp_path, [slow, Witness()]),
    ).fit()  # fmt: skip
    assert Witness.seen == [0] * REPORTS  # every report went by while the sink had logged none
    assert Slow.calls == REPORTS and slow.stats().logged == REPORTS and slow.stats().dropped == 0
    assert result.metrics_history == [_metrics(i) for i in range(REPORTS)]


def test_files_follow_the_history_across_a_restart(tmp_path):
    """Reports redone after a restart from a checkpoint replace the rows after it (CSV/JSON) and
    TensorBoard drops the superseded steps (purge_step)."""

    def loop():
        ctx = train.get_context()
        start = 2 if train.get_checkpoint() else 0
        for step in range(start, 5):
            checkpoint = None
            if step == 1 and ctx.get_world_rank() == 0:
                os.makedirs(d := os.path.join(str(tmp_path), f"ck{ctx.get_attempt()}"), exist_ok=True)
                checkpoint = Checkpoint.from_directory(d)
            train.report({"step": step, "attempt": ctx.get_attempt()}, checkpoint=checkpoint)
            if step == 3 and ctx.get_attempt() == 0 and ctx.get_world_rank() == 1:
                raise RuntimeError("injected failure after step 3")

    sinks = [CSVLoggerCallback(), JsonLoggerCallback(), TBXLoggerCallback()]
    result = DataParallelTrainer(
        loop, scaling_config=ScalingConfig(num_workers=2), run_config=_rc(tmp_path, sinks, failure_config=FailureConfig(max_failures=1))
    ).fit()  # fmt: skip
    history = result.metrics_history
    assert [r["step"] for r in history] == [0, 1, 2, 3, 4] and [r["attempt"] for r in history] == [
        0,
        0,
        1,
        1,
        1,
    ]
    assert sinks[0].stats().logged >= 6  # some reports were logged twice: before and after the restart
    with open(os.path.join(result.path, "result.json")) as f:
        assert [json.loads(line) for line in f] == _expected_rows(history)
    with open(os.path.join(result.path, "progress.csv"), newline="") as f:
        assert [(int(r["step"]), int(r["attempt"])) for r in csv.DictReader(f)] == [
            (r["step"], r["attempt"]) for r in history
        ]
    assert _tb_scalars(result.path)["attempt"] == [
        (i + 1, float(r["attempt"])) for i, r in enumerate(history)
    ]


def test_setup_mlflow_and_setup_wandb_log_from_rank_zero_only(tmp_path, wandb_offline, mlflow_store):
    wandb_dir = str(tmp_path / "wb")

    def loop(config):
        mlf = setup_mlflow(
            config, tracking_uri=mlflow_store, experiment_name="inloop", create_experiment_if_not_exists=True
        )
        run = setup_wandb(config, project="inloop", dir=wandb_dir)
        rank = train.get_context().get_world_rank()
        for i in range(3):
            mlf.log_metric("loss", 1.0 / (i + 1), step=i)
            run.log({"loss": 1.0 / (i + 1), "rank": rank})
            train.report({"i": i})
        mlf.end_run()
        run.finish()

    DataParallelTrainer(
        loop, train_loop_config={"lr": 0.5, "mlflow": {"tracking_uri": "ignored: the argument wins"}},
        scaling_config=ScalingConfig(num_workers=2), run_config=_rc(tmp_path, []),
    ).fit()  # fmt: skip
    client = _client(mlflow_store)
    [run] = client.search_runs([client.get_experiment_by_name("inloop").experiment_id])
    assert run.info.run_name == "run" and run.data.params == {"lr": "0.5"} and run.info.status == "FINISHED"
    assert [m.value for m in client.get_metric_history(run.info.run_id, "loss")] == [1.0, 0.5, 1.0 / 3]
    [(wb_run, rows)] = _wandb_runs(wandb_dir)
    assert wb_run.display_name == "run" and [r["rank"] for r in rows] == [0, 0, 0]


def test_setup_mlflow_refuses_a_named_experiment_that_does_not_exist(tmp_path, mlflow_store):
    with pytest.raises(ValueError, match="'nope' does not exist .* create_experiment_if_not_exists=True"):
        setup_mlflow({}, tracking_uri=mlflow_store, experiment_name="nope")


# -- the queue, step by step ------------------------------------------------------------------------
def _report(i, metrics=None):
    metrics = metrics if metrics is not None else {"loss": float(i)}
    return TrainingReport(index=i, metrics=metrics, all_metrics=[metrics], checkpoint=None)


def _end(sink, tmp_path, error=None):
    sink.on_run_end(Result(metrics=None, checkpoint=None, error=error, path=str(tmp_path)))


class _Gated(LoggerCallback):
    """Logs into ``self.logged``; its first hook waits for ``self.gate``."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.logged: list[tuple[int, dict]] = []
        self.ended: list[bool] = []

    def log_trial_start(self, trial):
        self.entered.set()
        assert self.gate.wait(60)

    def log_trial_result(self, iteration, trial, result):
        self.logged.append((iteration, result))

    def log_trial_end(self, trial, failed=False):
        self.ended.append(failed)


def test_a_full_queue_drops_new_results_and_counts_them(tmp_path, caplog):
    sink = _Gated(queue_size=2)
    sink.on_run_start(str(tmp_path / "r"), 1)
    assert sink.entered.wait(30)  # the thread holds the start; what comes next waits in the queue
    with caplog.at_level(logging.WARNING, logger="trainforge.sinks"):
        for i in range(5):
            sink.on_report(_report(i))  # the sink is stuck in log_trial_start: 2 wait, 3 are dropped
    assert (sink.stats().queued, sink.stats().dropped) == (2, 3)
    assert sum("further results are dropped" in r.getMessage() for r in caplog.records) == 1
    sink.gate.set()
    _end(sink, tmp_path)
    assert sink.logged == [(1, {"loss": 0.0}), (2, {"loss": 1.0})] and sink.ended == [False]
    assert (sink.stats().logged, sink.stats().dropped) == (2, 3)


def test_the_end_of_a_run_waits_at_most_flush_timeout(tmp_path, caplog):
    sink = _Gated(flush_timeout_s=0.2)
    sink.on_run_start(str(tmp_path / "r"), 1)
    for i in range(3):
        sink.on_report(_report(i))
    with caplog.at_level(logging.WARNING, logger="trainforge.sinks"):
        _end(sink, tmp_path, error=RuntimeError("x"))  # returns though the sink is still stuck
    assert "still had 3 results to write after 0.2s" in caplog.text
    sink.gate.set()  # the call in progress returns: the queued results are dropped, the run closed
    thread = sink._sink_drain()._thread
    if thread is not None:
        thread.join(30)
    assert sink.logged == [] and sink.ended == [True] and sink.stats().dropped == 3


def test_nan_and_inf_are_not_sent_to_mlflow_and_params_are_truncated(tmp_path, mlflow_store):
    sink = MLflowLoggerCallback(tracking_uri=mlflow_store, experiment_name="limits")
    sink.on_run_start(str(tmp_path / "limits_run"), 1)  # no trainer on the stack: a run named by its path
    sink.on_report(
        _report(0, {"loss": float("nan"), "acc": 0.5, "inf": float("inf"), "bad key!": 1.0, "flag": True})
    )
    sink.on_report(_report(1, {"loss": 0.25, "acc": 0.75, "inf": 1.0, "bad key!": 2.0, "flag": False}))
    _end(sink, tmp_path)
    client = _client(mlflow_store)
    [run] = client.search_runs([client.get_experiment_by_name("limits").experiment_id])
    history = {
        k: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, k)]
        for k in ("loss", "acc", "inf")
    }
    assert history == {"loss": [(2, 0.25)], "acc": [(1, 0.5), (2, 0.75)], "inf": [(2, 1.0)]}
    assert "bad key_" in run.data.metrics and "flag" not in run.data.metrics

    from trainforge._internal.sinks.mlflow import param_items

    params = dict(param_items({"k" * 300: "v" * 600, "a": {"b": [1, 2]}, "odd key?": 1}))
    assert params == {"k" * 250: "v" * 500, "a/b": "[1, 2]", "odd key_": "1"}


def test_sinks_pickle_without_their_live_state(tmp_path):
    sink = JsonLoggerCallback(flush_timeout_s=5)
    sink.on_run_start(str(tmp_path / "p"), 1)
    sink.on_report(_report(0))
    copy = pickle.loads(pickle.dumps(sink))
    _end(sink, tmp_path)
    assert copy.flush_timeout_s == 5 and "_drain" not in copy.__dict__ and "_files" not in copy.__dict__
    assert copy.stats().logged == 0 and sink.stats().logged == 1


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda: JsonLoggerCallback(queue_size=0),
            r"JsonLoggerCallback\(queue_size=0\) is not valid: use an integer >= 1",
        ),
        (
            lambda: CSVLoggerCallback(flush_timeout_s=-1),
            r"flush_timeout_s=-1\) is not valid: use a number of seconds >= 0",
        ),
        (
            lambda: MLflowLoggerCallback(tags=["a"]),
            r"MLflowLoggerCallback\(tags=\['a'\]\) is not valid: use a dict",
        ),
        (
            lambda: WandbLoggerCallback(excludes="loss"),
            r"excludes='loss'\) is not valid: use a list of metric names",
        ),
        (
            lambda: WandbLoggerCallback(api_key_file="/nonexistent/key"),
            r"api_key_file='/nonexistent/key'\): cannot read it",
        ),
    ],
)
def test_bad_arguments_say_what_to_pass(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize(
    "module, make, extra",
    [
        ("tensorboardX", lambda: TBXLoggerCallback(), "tensorboard"),
        ("mlflow", lambda: MLflowLoggerCallback(), "mlflow"),
        ("wandb", lambda: WandbLoggerCallback(), "wandb"),
    ],
)
def test_a_missing_library_names_the_extra(monkeypatch, module, make, extra):
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed
    with pytest.raises(ImportError, match=rf"needs {module}: pip install 'trainforge\[{extra}\]'"):
        make()


def test_only_the_settings_of_a_config_are_logged():
    import numpy as np

    from trainforge._internal.sinks.values import loggable_config

    config = {"lr": np.float32(0.5), "epochs": np.int64(3), "name": "a", "flag": True, "none": None,
              "layers": [64, 32], "x_train": np.zeros((100, 8)), "rows": list(range(100)), "opt": {"m": 0.9, "obj": object()}}  # fmt: skip
    assert loggable_config(config) == {"lr": 0.5, "epochs": 3, "name": "a", "flag": True, "none": None,
                                       "layers": [64, 32], "opt": {"m": 0.9}}  # fmt: skip


@pytest.mark.slow
def test_the_tracking_example_runs(tmp_path, monkeypatch):
    """examples/tracking.py as a user runs it: a 2-worker fit and a 2-trial Tuner with every sink."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")])),
           "WANDB_SILENT": "true", "MLFLOW_TRACKING_URI": "", "MLFLOW_EXPERIMENT_NAME": ""}  # fmt: skip
    proc = subprocess.run(
        [sys.executable, os.path.join(repo, "examples", "tracking.py"), "--storage-path", str(tmp_path), "--epochs", "3"],
        cwd=repo, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (
        "sinks: CSVLoggerCallback, JsonLoggerCallback, TBXLoggerCallback, MLflowLoggerCallback, WandbLoggerCallback"
        in proc.stdout
    )
    assert proc.stdout.count("logged 3, dropped 0") == 5, proc.stdout
    assert "tune: best lr" in proc.stdout
    with open(tmp_path / "tracking-fit" / "result.json") as f:
        assert [json.loads(line)["epoch"] for line in f] == [0, 1, 2]
    assert len(glob.glob(str(tmp_path / "tracking-tune" / "*" / "wandb" / "offline-run-*"))) == 2


def test_the_same_file_sink_twice_on_a_run_writes_each_row_once(tmp_path):
    """A Tuner over a trainer gives each trial the trainer's callbacks and tune's: the same kind of
    file sink in both would write every row twice; the second is refused (logged, counted)."""
    first, second = JsonLoggerCallback(), JsonLoggerCallback()
    run = str(tmp_path / "twice")
    for sink in (first, second):
        sink.on_run_start(run, 1)
    for i in range(3):
        for sink in (first, second):
            sink.on_report(_report(i))
    for sink in (first, second):
        _end(sink, tmp_path)
    # The first to start the run wins, however the sinks' threads are scheduled (claimed in on_run_start).
    assert (first.stats().logged, second.stats().logged, second.stats().dropped) == (3, 0, 3)
    assert "another JsonLoggerCallback is writing" in str(second.stats().last_error)
    with open(os.path.join(run, "result.json")) as f:
        assert [json.loads(line)["loss"] for line in f] == [0.0, 1.0, 2.0]


def test_public_names_are_pinned():
    import trainforge.air.integrations.mlflow as mlflow_integration
    import trainforge.air.integrations.wandb as wandb_integration
    import trainforge.tune.logger as logger_module

    assert logger_module.__all__ == [
        "CSVLoggerCallback", "JsonLoggerCallback", "LoggerCallback", "ResultRecord", "SinkStats",
        "TBXLoggerCallback", "TrialInfo",
    ]  # fmt: skip
    assert mlflow_integration.__all__ == ["MLflowLoggerCallback", "setup_mlflow"]
    assert wandb_integration.__all__ == ["WandbLoggerCallback", "setup_wandb"]
    for module in (logger_module, mlflow_integration, wandb_integration):
        assert all(getattr(module, name, None) is not None for name in module.__all__)
    assert issubclass(MLflowLoggerCallback, LoggerCallback) and issubclass(LoggerCallback, Callback)


def test_files_of_a_run_on_remote_storage_are_copied_into_its_directory(tmp_path):
    """On remote storage a sink writes into a local directory, copied into the run directory (through
    the storage's filesystem) once the run has ended, then removed."""
    import fsspec

    from trainforge._internal.sinks.run_info import _uploader

    class Storage:  # what the uploader uses of a StorageContext on remote storage
        fs = fsspec.filesystem("memory")
        run_path = "/bucket/exp/run"

    local = tmp_path / "local"
    local.mkdir()
    (local / "result.json").write_text('{"loss": 1}\n')
    _uploader(Storage())(str(local))
    assert Storage.fs.cat_file("/bucket/exp/run/result.json") == b'{"loss": 1}\n'
    assert not local.exists()
