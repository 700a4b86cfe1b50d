"""TensorFlow in a trainforge run: a 2-worker ``TensorflowTrainer`` whose Keras ``fit()`` under
``MultiWorkerMirroredStrategy`` reports its logs and a checkpoint that loads back; each worker's
``TF_CONFIG`` (fresh ports on a restart) and thread settings; a SIGKILLed worker and the restart from
the last checkpoint at the next epoch; the example; and the errors a user can cause.

Tests that need TensorFlow are skipped without it (``tensorflow`` or ``tf_keras`` not installed);
the others check what happens then. Collecting this file imports no TensorFlow (5 s); two tests
import ``tf_keras`` (and so TensorFlow) in the pytest process, as a driver loading a checkpoint does.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

import trainforge as train
from trainforge import DataParallelTrainer, FailureConfig, RunConfig, ScalingConfig
from trainforge.tensorflow import TensorflowCheckpoint, TensorflowConfig, TensorflowTrainer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAVE_TF = importlib.util.find_spec("tensorflow") is not None and importlib.util.find_spec("tf_keras") is not None
needs_tf = pytest.mark.skipif(not HAVE_TF, reason="tensorflow and tf-keras not installed")
pytestmark = pytest.mark.slow
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "2"}  # the workers' TensorFlow C++ info lines


def _fit(config: dict) -> None:
    """Fit an MLP on 640 digits (2 workers: 10 steps of 32 rows each per epoch) under
    MultiWorkerMirroredStrategy, resuming from the run's checkpoint if there is one. Rank 0 writes
    Keras's history and its model's predictions on 16 rows to ``config["out"]``; with
    ``config["starts"]`` every rank appends "attempt rank epoch optimizer-steps" at each epoch's start;
    with ``config["kill"]`` rank 1 of attempt 0 SIGKILLs itself after the first step of epoch 2."""
    import numpy as np
    import tensorflow as tf
    from sklearn.datasets import load_digits

    from trainforge.tensorflow.keras import ReportCheckpointCallback

    assert tf.keras.callbacks.Callback.__module__.startswith("tf_keras"), tf.keras.callbacks.Callback
    ctx = train.get_context()

    class Probe(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch
            if config.get("starts"):
                with open(config["starts"], "a") as f:
                    steps = int(self.model.optimizer.iterations.numpy())
                    f.write(f"{ctx.get_attempt()} {ctx.get_world_rank()} {epoch} {steps}\n")

        def on_train_batch_end(self, batch, logs=None):
            # The first step's all-reduce needs rank 0 in epoch 2 too, so both ranks reported epoch 1.
            if config.get("kill") and (ctx.get_attempt(), ctx.get_world_rank(), self.epoch, batch) == (0, 1, 2, 0):
                os.kill(os.getpid(), signal.SIGKILL)

    x, y = load_digits(return_X_y=True)
    x, y = (x[:640] / 16).astype(np.float32), y[:640]
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    checkpoint = train.get_checkpoint()
    initial_epoch = 0
    with strategy.scope():
        if checkpoint:
            model = TensorflowCheckpoint(checkpoint.path, checkpoint.filesystem).get_model()
            initial_epoch = checkpoint.get_metadata()["epoch"] + 1
        else:
            tf.keras.utils.set_random_seed(0)
            model = tf.keras.Sequential(
                [tf.keras.layers.Dense(32, activation="relu", input_shape=(64,)), tf.keras.layers.Dense(10)]
            )
            model.compile(
                optimizer=tf.keras.optimizers.Adam(1e-2),
                loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"],
            )
    history = model.fit(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(64),
        epochs=config["epochs"],
        initial_epoch=initial_epoch,
        verbose=0,
        callbacks=[ReportCheckpointCallback(), Probe()],
    )
    predictions = model.predict(x[:16], verbose=0)  # on every rank: a distributed model's predict is a collective
    if ctx.get_world_rank() == 0:
        with open(config["out"], "w") as f:
            json.dump({"history": history.history, "predictions": predictions.tolist()}, f)


def _run_config(tmp_path, name: str, max_failures: int = 0) -> RunConfig:
    return RunConfig(
        storage_path=str(tmp_path / "runs"), name=name, verbose=0, failure_config=FailureConfig(max_failures)
    )


@needs_tf
def test_fit_reports_keras_logs_and_a_checkpoint_that_loads_back(tmp_path, monkeypatch):
    for key, value in QUIET.items():
        monkeypatch.setenv(key, value)
    config = {"epochs": 3, "out": str(tmp_path / "out.json")}
    result = TensorflowTrainer(
        _fit, train_loop_config=config, scaling_config=ScalingConfig(num_workers=2),
        run_config=_run_config(tmp_path, "tf"),
    ).fit()  # fmt: skip
    out = json.load(open(config["out"]))
    history = out["history"]
    # Every epoch's report is exactly what Keras logged (rank 0's logs: all ranks log the same).
    assert set(history) == {"loss", "accuracy"} and len(history["loss"]) == 3
    assert result.metrics == {key: values[-1] for key, values in history.items()}
    df = result.metrics_dataframe
    for key, values in history.items():
        assert list(df[key]) == values
    # One checkpoint per epoch, holding the model once (rank 0's), its epoch in the metadata.
    assert [c.get_metadata()["epoch"] for c, _ in result.best_checkpoints] == [0, 1, 2]
    for ckpt, _ in result.best_checkpoints:
        assert sorted(f for f in os.listdir(ckpt.path) if not f.startswith(".")) == ["model.keras"]
    # The last checkpoint loads (here, in the driver: tf_keras, no TF_USE_LEGACY_KERAS) to the model
    # rank 0 ended with.
    import numpy as np
    from sklearn.datasets import load_digits

    model = TensorflowCheckpoint(result.checkpoint.path).get_model()
    x = (load_digits(return_X_y=True)[0][:16] / 16).astype(np.float32)
    np.testing.assert_allclose(model.predict(x, verbose=0), np.array(out["predictions"]), rtol=1e-5, atol=1e-6)
    assert int(model.optimizer.iterations.numpy()) == 30  # the optimizer's state came along


@needs_tf
def test_sigkilled_worker_resumes_from_last_checkpoint_at_the_next_epoch(tmp_path, monkeypatch):
    for key, value in QUIET.items():
        monkeypatch.setenv(key, value)
    config = {"epochs": 4, "out": str(tmp_path / "out.json"), "starts": str(tmp_path / "starts.txt"), "kill": True}
    result = TensorflowTrainer(
        _fit, train_loop_config=config, scaling_config=ScalingConfig(num_workers=2),
        run_config=_run_config(tmp_path, "tfkill", max_failures=1),
    ).fit()  # fmt: skip
    # rank 1's death (rank 0's collective may fail too, even be noticed first)
    (killed,) = [f for f in result.failures if f.kind == "died"]
    assert (killed.attempt, killed.rank) == (0, 1) and "SIGKILL" in killed.exit_description()
    assert {f.attempt for f in result.failures} == {0}
    starts = open(config["starts"]).read().split("\n")[:-1]
    assert sorted(line for line in starts if line.startswith("0 ")) == [
        "0 0 0 0", "0 0 1 10", "0 0 2 20", "0 1 0 0", "0 1 1 10", "0 1 2 20",
    ]  # fmt: skip
    # Attempt 1: epoch 1's checkpoint (model and optimizer state, 20 steps), from epoch 2 on.
    assert sorted(line for line in starts if line.startswith("1 ")) == ["1 0 2 20", "1 0 3 30", "1 1 2 20", "1 1 3 30"]
    history = json.load(open(config["out"]))["history"]
    assert len(history["loss"]) == 2 and result.metrics["loss"] == history["loss"][-1]
    assert len(result.metrics_dataframe) == 4  # epoch 2 of attempt 0 never finished
    assert result.checkpoint.get_metadata()["epoch"] == 3


def _write_env(config: dict) -> None:
    """Write this worker's TensorFlow environment to ``<dir>/<attempt>_<rank>.json``; with
    ``config["fail_first"]``, fail attempt 0 after its report."""
    keys = ("TF_CONFIG", "TF_USE_LEGACY_KERAS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")
    ctx = train.get_context()
    env = {key: os.environ.get(key) for key in keys}
    with open(os.path.join(config["dir"], f"{ctx.get_attempt()}_{ctx.get_world_rank()}.json"), "w") as f:
        json.dump({**env, "tf_imported": "tensorflow" in sys.modules}, f)
    train.report({"attempt": ctx.get_attempt()})
    if config.get("fail_first") and ctx.get_attempt() == 0:
        raise RuntimeError("attempt 0 fails, to see the next attempt's ports")


@needs_tf
def test_tf_config_per_rank_and_fresh_ports_on_every_attempt(tmp_path, monkeypatch, executor):
    """Through a DataParallelTrainer given a TensorflowConfig (the backend does it all, and no worker
    imports TensorFlow, so this is cheap): each rank's TF_CONFIG, new ports at the restart, Keras 2
    routing, and the thread pools (explicit, the user's environment variable, else per reserved CPU)."""
    monkeypatch.setenv("TF_NUM_INTEROP_THREADS", "2")  # the user's choice wins over the default
    result = DataParallelTrainer(
        _write_env,
        train_loop_config={"dir": str(tmp_path), "fail_first": True},
        backend_config=TensorflowConfig(intra_op_threads=3),
        scaling_config=ScalingConfig(num_workers=2, executor=executor),
        run_config=_run_config(tmp_path, "tfconfig", max_failures=1),
    ).fit()
    assert result.metrics == {"attempt": 1} and [f.attempt for f in result.failures] == [0, 0]
    ports = []
    for attempt in (0, 1):
        envs = [json.load(open(tmp_path / f"{attempt}_{rank}.json")) for rank in (0, 1)]
        configs = [json.loads(env["TF_CONFIG"]) for env in envs]
        workers = configs[0]["cluster"]["worker"]
        assert [c["task"] for c in configs] == [{"type": "worker", "index": 0}, {"type": "worker", "index": 1}]
        assert configs[1]["cluster"] == {"worker": workers}
        assert len(workers) == 2 and all(w.startswith("127.0.0.1:") for w in workers)
        ports.append({int(w.rsplit(":", 1)[1]) for w in workers})
        assert len(ports[-1]) == 2
        for env in envs:
            assert env["TF_USE_LEGACY_KERAS"] == "1" and env["TF_NUM_INTRAOP_THREADS"] == "3"
            # A Ray actor has its node's environment, not the driver's: there, the CPUs per worker.
            assert env["TF_NUM_INTEROP_THREADS"] == ("2" if executor == "local" else "1")
            assert env["tf_imported"] is False
    assert ports[0] != ports[1]  # fresh ports for the restart


def test_cluster_addresses_on_one_host_and_across_hosts():
    from types import SimpleNamespace

    from trainforge.tensorflow._config import cluster_addresses

    one_host = [("h", "10.0.0.1", 1001), ("h", "10.0.0.1", 1002)]
    assert cluster_addresses(None, one_host) == ["127.0.0.1:1001", "127.0.0.1:1002"]
    group = SimpleNamespace(worker_metadata=[SimpleNamespace(node_ip="192.168.0.1"), SimpleNamespace(node_ip="127.0.0.1")])
    found = [("a", "10.0.0.1", 1001), ("b", "fe80::2", 1002)]
    # The cluster's own idea of a node's address first; a worker's own finding when that is loopback.
    assert cluster_addresses(group, found) == ["192.168.0.1:1001", "[fe80::2]:1002"]
    assert cluster_addresses(SimpleNamespace(), found) == ["10.0.0.1:1001", "[fe80::2]:1002"]


@needs_tf
def test_thread_pools_follow_the_cpus_reserved_per_worker(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    for key in ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"):
        monkeypatch.delenv(key, raising=False)
    DataParallelTrainer(
        _write_env,
        train_loop_config={"dir": str(tmp_path)},
        backend_config=TensorflowConfig(),
        scaling_config=ScalingConfig(num_workers=1, resources_per_worker={"CPU": 2}),
        run_config=_run_config(tmp_path, "tfthreads"),
    ).fit()
    env = json.load(open(tmp_path / "0_0.json"))
    assert (env["TF_NUM_INTRAOP_THREADS"], env["TF_NUM_INTEROP_THREADS"]) == ("2", "2")
    assert json.loads(env["TF_CONFIG"])["cluster"]["worker"][0].startswith("127.0.0.1:")


@needs_tf
def test_example(tmp_path):
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "examples", "tensorflow_digits.py"), "--epochs", "2",
         "--storage-path", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=240,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    reported = float(proc.stdout.split("\nval_accuracy: ")[1].split()[0])
    loaded = float(proc.stdout.split("checkpoint model val_accuracy: ")[1].split()[0])
    assert reported > 0.8 and abs(reported - loaded) < 1e-3, proc.stdout  # the checkpoint is the last model
    checkpoint = proc.stdout.split("checkpoint: ")[-1].strip()
    assert os.path.isfile(os.path.join(checkpoint, "model.keras")), proc.stdout


def test_config_errors():
    for name in ("intra_op_threads", "inter_op_threads"):
        for bad in (-1, 1.5, "2", True):
            with pytest.raises(ValueError, match=rf"TensorflowConfig\.{name}={bad!r} is not valid: use a number"):
                TensorflowConfig(**{name: bad})
    assert TensorflowConfig(intra_op_threads=0, inter_op_threads=4).to_dict() == {
        "intra_op_threads": 0, "inter_op_threads": 4,
    }  # fmt: skip
    from trainforge.torch import TorchConfig

    with pytest.raises(TypeError, match="must be a trainforge.tensorflow.TensorflowConfig, got TorchConfig"):
        TensorflowTrainer(lambda: None, tensorflow_config=TorchConfig())
    with pytest.raises(TypeError, match="worker_init_fn=1 must be a function"):
        TensorflowTrainer(lambda: None, worker_init_fn=1)  # type: ignore[arg-type]


@needs_tf
def test_callback_and_checkpoint_errors(tmp_path):
    from trainforge.tensorflow.keras import ReportCheckpointCallback

    with pytest.raises(ValueError, match=r"checkpoint_on='epoch_begin'\) is not valid: use one of"):
        ReportCheckpointCallback(checkpoint_on="epoch_begin")
    with pytest.raises(ValueError, match=r"report_metrics_on=\[\]\) is not valid"):
        ReportCheckpointCallback(report_metrics_on=[])
    with pytest.raises(ValueError, match=r"metrics=\{'a': 1\}\) is not valid"):
        ReportCheckpointCallback(metrics={"a": 1})  # type: ignore[dict-item]
    callback = ReportCheckpointCallback(metrics={"acc": "accuracy"})
    assert callback._reported_metrics("epoch_end", {"accuracy": 0.5, "loss": 1.0}) == {"acc": 0.5}
    with pytest.raises(KeyError, match=r"Keras logged no \['accuracy'\] at epoch_end \(it logged \['loss'\]\)"):
        callback._reported_metrics("epoch_end", {"loss": 1.0})
    assert not callback._implements_train_batch_hooks()
    assert ReportCheckpointCallback(report_metrics_on=["epoch_end", "train_batch_end"])._implements_train_batch_hooks()
    with pytest.raises(ValueError, match="holds no Keras model"):
        TensorflowCheckpoint.from_directory(str(tmp_path)).get_model()
    with pytest.raises(ValueError, match="not an existing .h5 file"):
        TensorflowCheckpoint.from_h5(tmp_path / "missing.h5")


@needs_tf
@pytest.mark.filterwarnings("ignore:You are saving your model as an HDF5 file")
def test_prepare_dataset_shard_and_checkpoint_formats(tmp_path):
    import numpy as np
    import tensorflow as tf
    import tf_keras

    from trainforge.tensorflow import prepare_dataset_shard

    ds = prepare_dataset_shard(tf.data.Dataset.range(4))
    assert ds.options().experimental_distribute.auto_shard_policy == tf.data.experimental.AutoShardPolicy.OFF
    assert list(ds.as_numpy_iterator()) == [0, 1, 2, 3]

    model = tf_keras.Sequential([tf_keras.layers.Dense(2, input_shape=(3,))])
    x = np.ones((1, 3), np.float32)
    model.save(tmp_path / "m.h5")
    model.save(tmp_path / "saved", save_format="tf")
    for checkpoint in (
        TensorflowCheckpoint.from_model(model),
        TensorflowCheckpoint.from_h5(tmp_path / "m.h5"),
        TensorflowCheckpoint.from_saved_model(tmp_path / "saved"),
    ):
        try:
            np.testing.assert_allclose(checkpoint.get_model().predict(x, verbose=0), model.predict(x, verbose=0))
        finally:
            shutil.rmtree(checkpoint.path)
    with pytest.raises(ValueError, match="no saved_model.pb"):
        TensorflowCheckpoint.from_saved_model(tmp_path)


_IMPORT_CHECK = """
import sys
if sys.argv[1] == "missing":
    sys.modules["tensorflow"] = sys.modules["tf_keras"] = None  # as if not installed
import trainforge.tensorflow as ttf
import trainforge.tensorflow.keras
assert not {"tensorflow", "tf_keras", "keras", "torch"} & {m for m in sys.modules if sys.modules[m] is not None}
try:
    ttf.TensorflowTrainer(lambda: None)
    print("BUILT")
except ImportError as exc:
    print("ERROR=" + str(exc))
"""


@pytest.mark.parametrize("case", ["installed", "missing"])
def test_missing_tensorflow_names_the_extra_and_the_import_is_light(case):
    if case == "installed" and not HAVE_TF:
        pytest.skip("tensorflow and tf-keras not installed")
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORT_CHECK, case], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr
    if case == "installed":
        assert "BUILT" in proc.stdout, proc.stdout  # constructing the trainer does not import TensorFlow either
    else:
        assert "ERROR=TensorflowTrainer needs TensorFlow" in proc.stdout, proc.stdout
        assert "pip install 'trainforge[tensorflow]'" in proc.stdout, proc.stdout


_NO_TF_KERAS = """
import importlib.util, sys
find_spec = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a: None if name == "tf_keras" else find_spec(name, *a)
import trainforge.tensorflow as ttf
try:
    ttf.TensorflowTrainer(lambda: None)
except ImportError as exc:
    print("ERROR=" + str(exc))
"""


@needs_tf
def test_missing_tf_keras_says_which_version_to_install():
    proc = subprocess.run(
        [sys.executable, "-c", _NO_TF_KERAS], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr
    from trainforge.tensorflow.env import tensorflow_version

    major, minor = (tensorflow_version() or "").split(".")[:2]
    assert f"pip install 'tf-keras~={major}.{minor}.0' --no-deps" in proc.stdout, proc.stdout
    assert "Keras 3" in proc.stdout and "MultiWorkerMirroredStrategy" in proc.stdout, proc.stdout


@needs_tf
def test_restore_keeps_the_config_and_the_users_worker_init_fn(tmp_path):
    def init() -> None:
        os.environ["MY_INIT"] = "1"

    trainer = TensorflowTrainer(
        lambda: None, tensorflow_config=TensorflowConfig(inter_op_threads=2), worker_init_fn=init,
        run_config=_run_config(tmp_path, "tfrestore"),
    )  # fmt: skip
    state = trainer._constructor_state()
    assert state["tensorflow_config"] == TensorflowConfig(inter_op_threads=2) and state["worker_init_fn"] is init
    assert "backend_config" not in state
    rebuilt = TensorflowTrainer(**{k: v for k, v in state.items() if k != "trainer_cls"})
    assert rebuilt._user_worker_init_fn is init


def test_public_names_are_pinned():
    import trainforge.tensorflow as ttf
    import trainforge.tensorflow.keras as tk

    assert ttf.__all__ == ["TensorflowTrainer", "TensorflowConfig", "TensorflowCheckpoint", "prepare_dataset_shard"]
    assert tk.__all__ == ["ReportCheckpointCallback"]
    assert issubclass(ttf.TensorflowTrainer, train.DataParallelTrainer)
    assert issubclass(ttf.TensorflowCheckpoint, train.Checkpoint)
    assert TensorflowCheckpoint.MODEL_FILENAME_KEY == "_model_filename"  # Ray's metadata key
