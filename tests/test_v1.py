"""Ray Train 1.x programs on ``trainforge.v1`` with only their imports changed.

Units (no processes): the pinned public names and a light import; config validation; the 1.x
functions outside a run; the checkpoint bookkeeping of ``CheckpointStrategy``; the JSON and
TensorBoard callbacks read back; how a tuner trial pairs checkpoints with results; how the driver
reads the workers' answers (a fake core run).

Real runs: one started 2-worker ``Trainer`` shared by several tests (its workers stay up between
runs: same pids), results and checkpoints in 1.x's layout, callbacks, datasets, the train
function's errors, the line between the 1.x and 2.x APIs; a kill -9 of a worker restarting from the
latest checkpoint (``max_retries``); Ray's examples (examples/v1_*.py), each run and checked.
"""

from __future__ import annotations

import ast
import glob
import importlib.util
import json
import os
import signal
import struct
import subprocess
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")

import cloudpickle  # noqa: E402
import numpy as np  # noqa: E402

import trainforge  # noqa: E402
import trainforge.v1 as train  # noqa: E402
import trainforge.v1.callbacks  # noqa: E402
import trainforge.v1.tensorflow  # noqa: E402
import trainforge.v1.torch  # noqa: E402
from trainforge import (  # noqa: E402
    DataParallelTrainer,
    FailureConfig,
    RunConfig,
    ScalingConfig,
    TrainingFailedError,
    TrainingReport,
)
from trainforge.v1 import CheckpointStrategy, Trainer, TrainingCallback  # noqa: E402
from trainforge.v1._checkpoint import CheckpointManager  # noqa: E402
from trainforge.v1._constants import MESSAGE_KEY  # noqa: E402
from trainforge.v1._group import MISMATCH, WorkerGroup  # noqa: E402
from trainforge.v1._protocol import (  # noqa: E402
    DONE,
    ERROR,
    RESULT,
    RemoteError,
    RemoteTraceback,
    message,
    read_checkpoint,
)
from trainforge.v1._worker import PairingSink  # noqa: E402
from trainforge.v1.callbacks import JsonLoggerCallback, TBXLoggerCallback  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers need not import this file


def _load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"_example_{name}", os.path.join(REPO, "examples", f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)  # the workers cannot import it by name
    return module


def _tb_scalars(logdir) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value)]} of the TensorBoard event files in ``logdir`` (TFRecord: u64 length,
    u32 crc, payload, u32 crc), read with tensorboardX's protos."""
    from tensorboardX.proto import event_pb2

    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(glob.glob(os.path.join(str(logdir), "events.out.tfevents.*"))):
        data = open(path, "rb").read()
        pos = 0
        while pos + 12 <= len(data):
            (length,) = struct.unpack("<Q", data[pos : pos + 8])
            event = event_pb2.Event()
            event.ParseFromString(data[pos + 12 : pos + 12 + length])
            pos += 12 + length + 4
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    out.setdefault(value.tag, []).append((event.step, value.simple_value))
    return out


# -- units ------------------------------------------------------------------------------------------
def test_public_names_are_pinned_and_the_import_is_light():
    assert train.__all__ == [
        "BackendConfig", "CheckpointStrategy", "TensorflowConfig", "TorchConfig", "Trainer", "TrainingCallback",
        "TrainingIterator", "get_dataset_shard", "load_checkpoint", "local_rank", "report", "save_checkpoint",
        "world_rank", "world_size",
    ]  # fmt: skip
    assert train.callbacks.__all__ == [
        "JsonLoggerCallback", "MLflowLoggerCallback", "PrintCallback", "TBXLoggerCallback", "TrainingCallback"]
    assert train.torch.__all__ == [
        "TorchConfig", "accelerate", "backward", "enable_reproducibility", "get_device", "prepare_data_loader",
        "prepare_model", "prepare_optimizer",
    ]  # fmt: skip
    assert train.tensorflow.__all__ == ["TensorflowConfig", "prepare_dataset_shard"]
    # 1.x programs write train.torch.prepare_model(...) after `import ray.train as train`
    assert train.torch.TorchConfig is trainforge.torch.TorchConfig and train.TrainingCallback is train.callbacks.TrainingCallback
    code = ("import sys, trainforge.v1, trainforge.v1.torch, trainforge.v1.callbacks, trainforge.v1.tensorflow; "
            "print('HEAVY=' + str([m for m in ('torch', 'tensorflow', 'tensorboardX', 'mlflow') if m in sys.modules]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert "HEAVY=[]" in proc.stdout, proc.stdout + proc.stderr


def test_configs_are_validated_on_construction(tmp_path):
    with pytest.raises(ValueError, match="num_to_keep=-1"):
        CheckpointStrategy(num_to_keep=-1)
    with pytest.raises(ValueError, match="checkpoint_score_order='lowest'.*'max' or 'min'"):
        CheckpointStrategy(checkpoint_score_order="lowest")
    with pytest.raises(ValueError, match="num_workers=0"):
        Trainer("torch", num_workers=0, logdir=str(tmp_path))
    with pytest.raises(ValueError, match="horovod.*not supported.*backend='torch'"):
        Trainer("horovod", num_workers=1, logdir=str(tmp_path))
    with pytest.raises(ValueError, match=r"Invalid backend: 'jax'.*\['tensorflow', 'torch'\]"):
        Trainer("jax", num_workers=1, logdir=str(tmp_path))
    with pytest.raises(ValueError, match="`use_gpu` is False but `GPU` was found"):
        Trainer("torch", num_workers=1, resources_per_worker={"GPU": 1}, logdir=str(tmp_path))
    with pytest.raises(ValueError, match="max_retries=-2"):
        Trainer("torch", num_workers=1, max_retries=-2, logdir=str(tmp_path))
    with pytest.raises(ValueError, match="single worker"):
        TBXLoggerCallback(worker_to_log=[0, 1])
    with pytest.raises(TypeError, match="workers_to_log='all'"):
        JsonLoggerCallback(workers_to_log="all")
    trainer = Trainer("torch", num_workers=1, logdir=str(tmp_path / "logs"))
    assert trainer.logdir == tmp_path / "logs" and trainer.logdir.is_dir() and trainer.latest_run_dir is None
    with pytest.raises(RuntimeError, match="not active.*start this one"):  # 1.x's message
        trainer.run(lambda: 1)
    with pytest.raises(NotImplementedError, match="Ray actor handles"):
        trainer.to_worker_group(object)
    relative = Trainer("torch", num_workers=1, logdir="mine")  # under the storage path, as 1.x under ~/ray_results
    assert relative.logdir == tmp_path / "results" / "mine"
    assert Trainer("tensorflow", num_workers=1).logdir.name.startswith("train_")


def test_the_1x_functions_outside_a_run_warn_and_return_defaults():
    with pytest.warns(UserWarning, match="only be called inside a training function"):
        assert train.world_rank() == 0
    with pytest.warns(UserWarning):
        assert train.world_size() == 1 and train.local_rank() == 0
    with pytest.warns(UserWarning, match=r"trainforge.v1.report\(\)"):
        train.report(loss=1.0)
    with pytest.warns(UserWarning):
        assert train.load_checkpoint() is None


def test_checkpoint_strategy_keeps_the_best_files_in_the_1x_layout(tmp_path):
    manager = CheckpointManager()
    manager.start_run(tmp_path / "run_001", CheckpointStrategy(num_to_keep=2, checkpoint_score_attribute="loss",
                                                               checkpoint_score_order="min"))  # fmt: skip
    for loss in (5, 2, 4, 1, 3):
        manager.process({"loss": loss, "_timestamp": 0})
    files = sorted(p.name for p in (tmp_path / "run_001" / "checkpoints").iterdir())
    assert files == ["checkpoint_000002", "checkpoint_000004"]  # losses 2 and 1: the best two
    assert manager.best_checkpoint_path == tmp_path / "run_001" / "checkpoints" / "checkpoint_000004"
    assert Trainer.load_checkpoint(manager.best_checkpoint_path) == {"loss": 1, "_timestamp": 0}
    assert manager.latest_checkpoint == {"loss": 3, "_timestamp": 0} and manager.latest_checkpoint_id == 5

    manager.start_run(tmp_path / "run_002", CheckpointStrategy(num_to_keep=0))
    manager.process({"epoch": 0})  # no score attribute needed: nothing is written
    assert manager.latest_checkpoint == {"epoch": 0} and not (tmp_path / "run_002").exists()
    manager.start_run(tmp_path / "run_003", None)  # default: keep all, the newest is the best
    with pytest.raises(ValueError, match="checkpoint_score_attribute: _timestamp. Include this attribute"):
        manager.process({"epoch": 0})
    for i in range(3):
        manager.process({"epoch": i, "_timestamp": 7})  # a tie: the newer one wins
    assert len(list((tmp_path / "run_003" / "checkpoints").iterdir())) == 3
    assert manager.best_checkpoint_path.name == "checkpoint_000003"


def test_print_callback_prints_a_json_list_of_the_workers_results_as_1x(capsys):
    results = [{"loss": 2.290156, "n": np.int64(3)}, {"loss": 2.275099, "n": np.int64(4)}]
    trainforge.v1.callbacks.PrintCallback().handle_result(results)
    out = capsys.readouterr().out
    assert json.loads(out) == [{"loss": 2.290156, "n": 3}, {"loss": 2.275099, "n": 4}]
    assert out == '[\n    {\n        "loss": 2.290156,\n        "n": 3\n    },\n    {\n        "loss": 2.275099,\n' \
                  '        "n": 4\n    }\n]\n'  # json.dumps(results, indent=4), as 1.x printed it


def test_json_and_tensorboard_callbacks_write_files_that_read_back(tmp_path):
    results = [[{"loss": 1.0 / i, "acc": {"top1": 0.1 * i}, "hist": [1, 2, 3], "_training_iteration": i,
                 "_timestamp": 5, "rank": r} for r in range(2)] for i in (1, 2, 3)]  # fmt: skip
    json_all, json_0, tbx = JsonLoggerCallback(workers_to_log=None), JsonLoggerCallback(filename="r0.json"), TBXLoggerCallback()
    for cb in (json_all, json_0, tbx):
        cb.start_training(logdir=str(tmp_path), config={"lr": 0.1})
        for step in results:
            cb.handle_result(step)
        cb.finish_training(error=False)
    assert json.loads((tmp_path / "results.json").read_text()) == results
    assert json.loads((tmp_path / "r0.json").read_text()) == [[step[0]] for step in results]
    scalars = _tb_scalars(tmp_path)
    assert [s for s, _ in scalars["ray/train/loss"]] == [1, 2, 3]
    assert [round(v, 4) for _, v in scalars["ray/train/acc/top1"]] == [0.1, 0.2, 0.3]
    assert "ray/train/_timestamp" not in scalars and "ray/train/_training_iteration" not in scalars
    with pytest.raises(ValueError, match="must be a directory"):
        JsonLoggerCallback(logdir=str(tmp_path / "missing")).start_training(logdir=str(tmp_path), config={})


def test_the_mlflow_callback_logs_params_and_one_workers_metrics(tmp_path):
    pytest.importorskip("mlflow")
    from trainforge.v1.callbacks import MLflowLoggerCallback

    with pytest.raises(ValueError, match="experiment_id= .*or experiment_name="):
        MLflowLoggerCallback()
    cb = MLflowLoggerCallback(experiment_name="v1", tags={"team": "a"}, worker_to_log=1)
    cb.start_training(logdir=str(tmp_path), config={"lr": 0.1})
    for i in (1, 2):
        cb.handle_result([{"loss": 9.0, "_training_iteration": i}, {"loss": 1.0 / i, "note": "x", "_training_iteration": i}])
    cb.finish_training(error=False)
    client = cb._client  # the store it opened ({run_dir}/mlruns, MLflow's file store, by default)
    assert (tmp_path / "mlruns").is_dir()
    run = client.get_run(cb.run_id)
    assert run.data.params == {"lr": "0.1"} and run.data.tags["team"] == "a" and run.info.status == "FINISHED"
    assert [(m.step, m.value) for m in client.get_metric_history(cb.run_id, "loss")] == [(1, 1.0), (2, 0.5)]
    assert "note" not in run.data.metrics


class _FakeCore:
    """A core session that records reports (and reads a checkpoint's dict back)."""

    def __init__(self):
        self.reports = []

    def report(self, metrics, checkpoint=None):
        self.reports.append((metrics.get("i"), read_checkpoint(checkpoint)[1]["c"] if checkpoint else None))


def test_a_tuner_trial_pairs_each_checkpoint_with_one_result():
    def play(calls):
        core = _FakeCore()
        sink = PairingSink(core, rank=0)
        for kind, i in calls:
            sink.result({"i": i}) if kind == "r" else sink.checkpoint({"c": i})
        sink.flush()
        return core.reports

    # report then save_checkpoint every epoch: each checkpoint rides with its epoch's result
    assert play([("r", 1), ("c", 1), ("r", 2), ("c", 2)]) == [(1, 1), (2, 2)]
    assert play([("r", 1), ("r", 2), ("c", 2), ("r", 3)]) == [(1, None), (2, 2), (3, None)]
    assert play([("c", 0), ("r", 1), ("r", 2)]) == [(1, 0), (2, None)]  # a checkpoint first: with the next result
    assert play([("r", 1), ("c", 1), ("c", 2)]) == [(1, 1), (1, 2)]  # no result left: the last one's again


class _FakeRun:
    def __init__(self, reports):
        self._reports = iter(reports)
        self.result = None
        self.closed = False

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._reports)

    def close(self):
        self.closed = True


class _FakeServer:
    def __init__(self):
        self.sent, self.done_seqs, self.closed = [], [], False

    def send(self, command):
        self.sent.append(command)

    def done(self, seq):
        self.done_seqs.append(seq)

    def close(self):
        self.closed = True


def _report(*messages):
    return TrainingReport(index=0, metrics={MESSAGE_KEY: messages[0]}, all_metrics=[{MESSAGE_KEY: m} for m in messages],
                          checkpoint=None)  # fmt: skip


def test_the_driver_reads_each_report_of_every_rank_and_stops_an_inconsistent_group():
    boom = RemoteError.capture(KeyError("boom"), rank=0)
    run, server = _FakeRun([_report(message(RESULT, 1, {"a": 0}), message(RESULT, 1, {"a": 1})),
                            _report(message(ERROR, 1, boom), message(ERROR, 1, boom))]), _FakeServer()  # fmt: skip
    group = WorkerGroup(run, server)
    group.begin("run", b"payload")
    assert server.sent[0].kind == "run" and server.sent[0].payload == b"payload"
    answer = group.next_answer()
    assert (answer.kind, answer.values, group.busy) == (RESULT, [{"a": 0}, {"a": 1}], 1)
    answer = group.next_answer()  # every rank raised: answered, the workers are idle, the group stays
    assert answer.kind == ERROR and group.busy is None and not group.closed and server.done_seqs == [1]
    error = answer.error()
    assert isinstance(error, KeyError) and isinstance(error.__cause__, RemoteTraceback)
    assert "also raised on rank(s) [0]" in str(error.__cause__) and "KeyError: 'boom'" in str(error.__cause__)

    run = _FakeRun([_report(message(RESULT, 1, {}), message(DONE, 1, 7))])
    group = WorkerGroup(run, _FakeServer())
    group.begin("run")
    with pytest.raises(RuntimeError, match="called the same number of times"):
        group.next_answer()
    assert group.closed and run.closed and MISMATCH.startswith("Some workers returned results with different types")
    run = _FakeRun([_report(message(ERROR, 1, boom), message(RESULT, 1, {}))])
    group = WorkerGroup(run, _FakeServer())
    group.begin("run")
    assert group.next_answer().kind == ERROR and group.closed and run.closed  # rank 1 is still running: stopped
    run = _FakeRun([_report(message(DONE, 1, 3), message(ERROR, 1, boom))])
    group = WorkerGroup(run, _FakeServer())
    group.begin("run")
    assert group.next_answer().kind == ERROR and not group.closed and group.busy is None  # both left the function


# -- real runs: one started Trainer, its workers up across tests ---------------------------------------
@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    from trainforge._testing.procs import wait_settled

    t = Trainer("torch", num_workers=2, logdir=str(tmp_path_factory.mktemp("v1") / "logs"))
    t.start()
    # Its standby workers start in the background: all of them before the first test's snapshot of
    # this process's children, which would otherwise count a late one as that test's leftover.
    wait_settled()
    yield t
    t.shutdown()


def _whoami(config=None):
    return os.getpid(), train.world_rank(), train.local_rank(), train.world_size(), config


def _epochs(config):
    checkpoint = train.load_checkpoint()
    start = checkpoint["epoch"] + 1 if checkpoint else 0
    for epoch in range(start, start + config["epochs"]):
        loss = config["losses"][epoch % len(config["losses"])]
        train.report(epoch=epoch, loss=loss)
        train.save_checkpoint(epoch=epoch, loss=loss, rank=train.world_rank())
    return start


@pytest.mark.slow
def test_workers_stay_up_between_runs_and_run_returns_each_workers_value(trainer):
    first = trainer.run(_whoami, config={"x": 1})
    second = trainer.run(_whoami)  # a function taking no config works too
    assert [r[1:] for r in first] == [(0, 0, 2, {"x": 1}), (1, 1, 2, {"x": 1})]
    assert [r[0] for r in second] == [r[0] for r in first]  # the same processes
    assert len({r[0] for r in first}) == 2 and os.getpid() not in {r[0] for r in first}
    assert trainer.latest_run_dir == trainer.logdir / "run_002" and trainer.latest_run_dir.is_dir()


@pytest.mark.slow
def test_results_and_checkpoints_come_back_in_the_1x_layout(trainer):
    strategy = CheckpointStrategy(num_to_keep=2, checkpoint_score_attribute="loss", checkpoint_score_order="min")
    iterator = trainer.run_iterator(_epochs, config={"epochs": 4, "losses": [4.0, 1.0, 3.0, 2.0]},
                                    checkpoint_strategy=strategy)  # fmt: skip
    assert iterator.get_final_results() is None  # not finished: 1.x's answer
    with pytest.raises(RuntimeError, match="previous run_iterator.*not finished"):
        trainer.run(_whoami)
    steps = list(iterator)
    assert iterator.is_finished() and iterator.get_final_results() == [0, 0]
    assert [[r["epoch"] for r in step] for step in steps] == [[0, 0], [1, 1], [2, 2], [3, 3]]
    assert [step[0]["_training_iteration"] for step in steps] == [1, 2, 3, 4]
    assert all({"_timestamp", "_time_this_iter_s"} <= set(r) for step in steps for r in step)
    run_dir = trainer.latest_run_dir
    files = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert files == ["checkpoint_000002", "checkpoint_000004"]  # losses 1.0 and 2.0
    assert trainer.latest_checkpoint_dir == run_dir / "checkpoints"
    assert trainer.best_checkpoint_path == run_dir / "checkpoints" / "checkpoint_000002"
    assert trainer.best_checkpoint["epoch"] == 1 and trainer.best_checkpoint["rank"] == 0  # rank 0's is kept
    assert {k: trainer.latest_checkpoint[k] for k in ("epoch", "loss")} == {"epoch": 3, "loss": 2.0}
    # a checkpoint file reaches every worker's load_checkpoint(); run() returns each one's value
    assert trainer.run(_epochs, config={"epochs": 1, "losses": [0.5]}, checkpoint=trainer.best_checkpoint_path) == [2, 2]
    forced = trainer.run_iterator(_epochs, config={"epochs": 3, "losses": [1.0]})
    assert forced.get_final_results(force=True) == [0, 0] and forced.is_finished()  # results dropped, checkpoints kept
    assert trainer.latest_checkpoint["epoch"] == 2 and len(list(trainer.latest_checkpoint_dir.iterdir())) == 3
    with pytest.raises(TypeError, match="checkpoint_strategy='min'"):
        trainer.run(_epochs, checkpoint_strategy="min")


class _Recorder(TrainingCallback):
    def __init__(self):
        self.calls = []

    def start_training(self, logdir, config, **info):
        self.calls.append(("start", logdir, config))

    def handle_result(self, results, **info):
        self.calls.append(("result", [(r["epoch"], r["loss"]) for r in results]))

    def finish_training(self, error=False, **info):
        self.calls.append(("finish", error))


def _report_per_rank(config):
    for epoch in range(3):
        train.report(epoch=epoch, loss=float(10 * train.world_rank() + epoch))
    if config.get("fail"):
        raise ValueError("bad data")


@pytest.mark.slow
def test_callbacks_get_one_dict_per_worker_per_report_and_their_files_read_back(trainer):
    recorder, json_cb, tbx = _Recorder(), JsonLoggerCallback(workers_to_log=[1]), TBXLoggerCallback(worker_to_log=1)
    trainer.run(_report_per_rank, config={}, callbacks=[recorder, json_cb, tbx])
    run_dir = trainer.latest_run_dir
    assert recorder.calls == [("start", str(run_dir), {}), ("result", [(0, 0.0), (0, 10.0)]),
                              ("result", [(1, 1.0), (1, 11.0)]), ("result", [(2, 2.0), (2, 12.0)]), ("finish", False)]  # fmt: skip
    logged = json.loads((run_dir / "results.json").read_text())
    assert [[r["loss"] for r in step] for step in logged] == [[10.0], [11.0], [12.0]]
    assert _tb_scalars(run_dir)["ray/train/loss"] == [(1, 10.0), (2, 11.0), (3, 12.0)]
    recorder = _Recorder()
    with pytest.raises(ValueError, match="bad data"):
        trainer.run(_report_per_rank, config={"fail": True}, callbacks=[recorder])
    assert recorder.calls[-1] == ("finish", True) and len(recorder.calls) == 5


def _report_rank():
    train.report(rank=train.world_rank())


@pytest.mark.slow
def test_print(trainer, capsys):
    # Ray 1.x's test_print: one report per worker, the output parsed as a JSON list, one dict per worker
    trainer.run(_report_rank, callbacks=[trainforge.v1.callbacks.PrintCallback()])
    results = json.loads(capsys.readouterr().out)
    assert len(results) == 2
    for i, result in enumerate(results):
        assert result["rank"] == i


def _shards():
    whole = train.get_dataset_shard()
    return whole if whole is None or isinstance(whole, dict) else [row["item"] for row in whole.iter_rows()]


def _named_shards():
    return {name: train.get_dataset_shard(name).count() for name in ("train", "val")}


@pytest.mark.slow
def test_a_dataset_is_split_among_the_workers(trainer):
    assert trainer.run(_shards, dataset=list(range(10))) == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    import numpy as np

    named = {"train": list(range(10)), "val": {"x": np.arange(6.0)}}
    assert trainer.run(_named_shards, dataset=named) == [{"train": 5, "val": 3}] * 2  # as 1.x, every one is split
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert trainer.run(_shards) == [None, None]
    with pytest.raises(TypeError, match="unsupported type"):
        trainer.run(_shards, dataset={"train": "not data"})


def _raises_on_every_rank():
    raise KeyError(f"missing on rank {train.world_rank()}")


def _calls_2x_report():
    trainforge.report({"loss": 1.0})


def _calls_2x_get_checkpoint():
    return trainforge.get_checkpoint()


@pytest.mark.slow
def test_errors_of_the_train_function_and_of_the_other_api_are_raised_and_the_workers_stay(trainer):
    pids = [r[0] for r in trainer.run(_whoami)]
    with pytest.raises(KeyError, match="missing on rank 0") as info:  # the original exception, as 1.x re-raised it
        trainer.run(_raises_on_every_rank)
    assert isinstance(info.value.__cause__, RemoteTraceback) and "_raises_on_every_rank" in str(info.value.__cause__)
    with pytest.raises(RuntimeError, match=r"Ray Train 2.x's API.*trainforge.v1.report\(\*\*metrics\)"):
        trainer.run(_calls_2x_report)
    with pytest.raises(RuntimeError, match=r"trainforge.v1.load_checkpoint\(\)"):
        trainer.run(_calls_2x_get_checkpoint)
    assert [r[0] for r in trainer.run(_whoami)] == pids  # every rank answered: the same workers go on
    with pytest.raises(ValueError, match="0 or 1 arguments"):
        trainer.run(lambda a, b: None)


def _2x_loop_calling_1x():
    trainforge.v1.report(loss=1.0)


@pytest.mark.slow
def test_a_1x_call_inside_a_2x_run_names_the_2x_function(tmp_path):
    trainer = DataParallelTrainer(_2x_loop_calling_1x, scaling_config=ScalingConfig(num_workers=1),
                                  run_config=RunConfig(storage_path=str(tmp_path), verbose=0,
                                                       failure_config=FailureConfig(max_failures=0)))  # fmt: skip
    with pytest.raises(TrainingFailedError, match=r"Ray Train 1.x's API.*call trainforge.report\(\{...\}\) instead"):
        trainer.fit()


def _killed_once(config):
    import torch.distributed as dist

    checkpoint = train.load_checkpoint()
    start = checkpoint["epoch"] + 1 if checkpoint else 0
    for epoch in range(start, 4):
        train.report(epoch=epoch, pid=os.getpid())
        train.save_checkpoint(epoch=epoch)
        dist.barrier()  # both ranks' checkpoint reports are sent: the checkpoint commits
        if epoch == config["kill_at"] and train.world_rank() == 1 and not os.path.exists(config["marker"]):
            open(config["marker"], "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
    return start


def _rank1_raises():
    if train.world_rank() == 1:
        raise OSError("disk full on rank 1")
    return "rank 0 went on"


@pytest.mark.slow
def test_a_killed_worker_restarts_from_the_latest_checkpoint_within_max_retries(tmp_path):
    trainer = Trainer("torch", num_workers=2, logdir=str(tmp_path / "logs"), max_retries=1)
    trainer.start()
    try:
        iterator = trainer.run_iterator(_killed_once, config={"kill_at": 1, "marker": str(tmp_path / "killed")})
        steps = [[(r["epoch"], r["pid"]) for r in step] for step in iterator]
        assert [[e for e, _ in step] for step in steps] == [[0, 0], [1, 1], [2, 2], [3, 3]]
        before, after = {p for step in steps[:2] for _, p in step}, {p for step in steps[2:] for _, p in step}
        assert len(before) == 2 and len(after) == 2 and not before & after  # new workers after the kill
        assert iterator.get_final_results() == [2, 2]  # they continued from epoch 1's checkpoint
        assert sorted(p.name for p in (trainer.latest_run_dir / "checkpoints").iterdir()) == [
            f"checkpoint_{i:06d}" for i in range(1, 5)]  # fmt: skip
        # a second kill is one failure more than max_retries=1 allows
        with pytest.raises(TrainingFailedError, match="SIGKILL"):
            trainer.run(_killed_once, config={"kill_at": 2, "marker": str(tmp_path / "killed-again")})
        # the group is gone: the next run starts another; there only rank 1 raises: raised, and as rank 0
        # returned, both are idle and stay up
        pids = [r[0] for r in trainer.run(_whoami)]
        with pytest.raises(OSError, match="disk full on rank 1"):
            trainer.run(_rank1_raises)
        assert [r[0] for r in trainer.run(_whoami)] == pids
    finally:
        trainer.shutdown()


# -- Ray's examples ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_linear_regression_example(tmp_path):
    example = _load_example("v1_linear_regression")
    results = example.train_linear(num_workers=2, epochs=3)
    assert len(results) == 2 and all(len(worker) == 3 for worker in results)
    losses = [r["loss"] for r in results[0]]
    assert losses[-1] < losses[0], losses
    weights = [worker[-1]["model"]["module.weight"].item() for worker in results]  # DDP's state dicts, as reported
    assert weights[0] == pytest.approx(weights[1]) and 1.5 < weights[0] < 2.5  # in sync, near y = 2x + 5's 2
    (run_dir,) = glob.glob(str(tmp_path / "results" / "train_*" / "run_001"))
    logged = json.loads(open(os.path.join(run_dir, "results.json")).read())
    assert [step[0]["loss"] for step in logged] == pytest.approx(losses)
    assert [s for s, _ in _tb_scalars(run_dir)["ray/train/loss"]] == [1, 2, 3]


@pytest.mark.slow
def test_the_fashion_mnist_example():
    example = _load_example("v1_fashion_mnist")
    losses = example.train_fashion_mnist(num_workers=2)
    assert len(losses) == 2 and all(len(worker) == 4 for worker in losses)
    assert all(worker[-1] < worker[0] for worker in losses), losses


@pytest.mark.slow
def test_the_callbacks_and_checkpoints_example(capsys):
    example = _load_example("v1_callbacks")
    out = example.train_with_callbacks(num_workers=2)
    assert out["history"] == [[5, 5], [4, 4], [2, 2]]
    assert out["first_run_dir"] == str(out["logdir"] / "run_001")
    checkpoints = out["logdir"] / "run_002" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["checkpoint_000003", "checkpoint_000004"]  # losses 2, 1
    assert {k: out["best"][k] for k in ("epoch", "model", "loss")} == {"epoch": 3, "model": 6, "loss": 1}
    assert out["resumed"] == [10, 10] and out["latest"]["model"] == 10  # resumed from the best: 6 + epoch 4
    assert str(checkpoints / "checkpoint_000004") in capsys.readouterr().out
    assert _tb_scalars(out["logdir"] / "run_001")["ray/train/loss"] == [(1, 5.0), (2, 4.0), (3, 2.0)]


@pytest.mark.slow
def test_the_tune_example():
    example = _load_example("v1_tune_linear")
    best = example.tune_linear(num_workers=1, num_samples=2, use_gpu=False)
    assert 1e-4 <= best["lr"] <= 1e-1 and best["batch_size"] in (4, 16, 32) and best["epochs"] == 3


@pytest.mark.slow
def test_the_tensorflow_example_script(tmp_path):
    pytest.importorskip("tensorflow")
    pytest.importorskip("tf_keras")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, os.path.join(REPO, "examples", "v1_tensorflow_mnist.py"), "--smoke-test"],
                          capture_output=True, text=True, timeout=240, cwd=str(tmp_path), env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("Results: "))
    history = ast.literal_eval(line[len("Results: "):])  # rank 0's history.history
    assert set(history) == {"loss", "accuracy"} and len(history["loss"]) == 1
