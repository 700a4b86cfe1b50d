"""XGBoost and LightGBM on trainforge workers (``trainforge.xgboost``, ``trainforge.lightgbm``): both
trainer forms with 2 workers on scikit-learn's breast cancer data, the reported metrics against the
checkpointed model, XGBoost's collective ranks and its per-attempt tracker, LightGBM's per-attempt
ports, a SIGKILLed worker resuming from the last checkpoint, restore, tuning the params= form, the
examples, and the errors a user can cause."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import trainforge as train
from trainforge import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig

pytest.importorskip("sklearn")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FRAMEWORKS = [
    pytest.param(name, marks=pytest.mark.skipif(__import__("importlib").util.find_spec(name) is None, reason=f"{name} not installed"))
    for name in ("xgboost", "lightgbm")
]  # fmt: skip
pytestmark = pytest.mark.slow


def _frames():
    from sklearn.datasets import load_breast_cancer

    x, y = load_breast_cancer(return_X_y=True, as_frame=True)
    frame = x.assign(target=y)
    return frame.iloc[:450].reset_index(drop=True), frame.iloc[450:].reset_index(drop=True)


def _framework(name):
    """(trainer class, callback class, params of a small binary model, the logloss key, rounds of a booster)."""
    if name == "xgboost":
        from trainforge.xgboost import RayTrainReportCallback, XGBoostTrainer

        params = {"objective": "binary:logistic", "eval_metric": ["logloss", "error"], "tree_method": "hist",
                  "max_depth": 3, "nthread": 1}  # fmt: skip
        return XGBoostTrainer, RayTrainReportCallback, params, "logloss", lambda b: b.num_boosted_rounds()
    from trainforge.lightgbm import LightGBMTrainer, RayTrainReportCallback

    params = {"objective": "binary", "metric": ["binary_logloss", "binary_error"], "num_leaves": 8,
              "verbose": -1, "num_threads": 1}  # fmt: skip
    return LightGBMTrainer, RayTrainReportCallback, params, "binary_logloss", lambda b: b.current_iteration()


def _predict(name, booster, frame):
    features = frame.drop(columns=["target"])
    if name == "xgboost":
        import xgboost

        return booster.predict(xgboost.DMatrix(features))
    return booster.predict(features)


def _logloss(p, y):
    p = np.clip(p, 1e-15, 1 - 1e-15)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def _rc(tmp_path, name, **kw):
    return RunConfig(storage_path=str(tmp_path / "runs"), name=name, verbose=0, **kw)


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_params_form_reports_the_checkpointed_models_metrics(tmp_path, name):
    trainer_cls, _, params, logloss, rounds_of = _framework(name)
    train_df, valid_df = _frames()
    result = trainer_cls(
        params=params, label_column="target", num_boost_round=12,
        datasets={"train": train_df, "valid": valid_df}, scaling_config=ScalingConfig(num_workers=2),
        run_config=_rc(tmp_path, "form", checkpoint_config=CheckpointConfig(checkpoint_frequency=5)),
    ).fit()  # fmt: skip
    # A report per round, every dataset an evaluation set named by its key.
    assert len(result.metrics_history) == 12
    assert set(result.metrics) == {f"{d}-{m}" for d in ("train", "valid") for m in params.get("eval_metric", params.get("metric"))}
    # Checkpoints every 5 rounds and at the end, each the booster alone, written once.
    checkpoints = [c for c, _ in result.best_checkpoints]
    assert len(checkpoints) == 3 and checkpoints[-1].path == result.checkpoint.path
    models = [trainer_cls.get_model(c) for c in checkpoints]
    assert [rounds_of(m) for m in models] == [5, 10, 12]
    for c in checkpoints:
        assert [f for f in os.listdir(c.path) if not f.startswith(".")] == [_framework(name)[1].CHECKPOINT_NAME]
    # The metrics reported are the final model's on the whole validation set: XGBoost sums over the
    # workers' shards, LightGBM's workers each evaluate the whole of it (only "train" is split).
    model = models[-1]
    expected = _logloss(_predict(name, model, valid_df), valid_df["target"].to_numpy())
    assert result.metrics[f"valid-{logloss}"] == pytest.approx(expected, rel=1e-5)
    if name == "xgboost":  # the train metric covers both workers' halves of the training set
        expected = _logloss(_predict(name, model, train_df), train_df["target"].to_numpy())
        assert result.metrics[f"train-{logloss}"] == pytest.approx(expected, rel=1e-5)


def _xgb_loop(config):
    """Train-loop form: record XGBoost's view of the collective and the tracker this attempt used."""
    import xgboost

    from trainforge.xgboost import RayTrainReportCallback
    from trainforge.xgboost import _config as backend

    frame = train.get_dataset_shard("train").iter_batches(batch_size=None, batch_format="pandas").__next__()
    ctx = train.get_context()
    with open(os.path.join(config["dir"], f"rank{ctx.get_world_rank()}-attempt{ctx.get_attempt()}.json"), "w") as f:
        json.dump({"rank": xgboost.collective.get_rank(), "world": xgboost.collective.get_world_size(),
                   "port": backend._worker_args["dmlc_tracker_port"], "rows": len(frame),
                   "start": (RayTrainReportCallback.get_model(train.get_checkpoint()).num_boosted_rounds()
                             if train.get_checkpoint() else 0)}, f)  # fmt: skip
    dtrain = xgboost.DMatrix(frame.drop(columns=["target"]), label=frame["target"])
    start, rounds = None, config["rounds"]
    if train.get_checkpoint():
        start = RayTrainReportCallback.get_model(train.get_checkpoint())
        rounds -= start.num_boosted_rounds()
    xgboost.train(
        config["params"], dtrain, num_boost_round=rounds, evals=[(dtrain, "train")], xgb_model=start,
        verbose_eval=False, callbacks=[*config.get("callbacks", []),
                                       RayTrainReportCallback(metrics={"loss": "train-logloss"}, frequency=5)],
    )  # fmt: skip


def _lgb_loop(config):
    """Train-loop form: record this worker's network parameters in this attempt."""
    import lightgbm

    from trainforge.lightgbm import RayTrainReportCallback, get_network_params

    frame = train.get_dataset_shard("train").iter_batches(batch_size=None, batch_format="pandas").__next__()
    ctx = train.get_context()
    start, rounds = None, config["rounds"]
    if train.get_checkpoint():
        start = RayTrainReportCallback.get_model(train.get_checkpoint())
        rounds -= start.current_iteration()
    network = get_network_params()
    with open(os.path.join(config["dir"], f"rank{ctx.get_world_rank()}-attempt{ctx.get_attempt()}.json"), "w") as f:
        json.dump({**network, "rows": len(frame), "start": start.current_iteration() if start else 0}, f)
    params = {**config["params"], **network, "tree_learner": "data_parallel", "pre_partition": True}
    dtrain = lightgbm.Dataset(frame.drop(columns=["target"]), label=frame["target"])
    lightgbm.train(
        params, dtrain, num_boost_round=rounds, valid_sets=[dtrain], valid_names=["train"], init_model=start,
        callbacks=[*config.get("callbacks", []),
                   RayTrainReportCallback(metrics={"loss": "train-binary_logloss"}, frequency=5)],
    )  # fmt: skip


def _records(directory):
    return {f[:-5]: json.load(open(os.path.join(directory, f))) for f in os.listdir(directory) if f.endswith(".json")}


def test_xgboost_train_loop_ranks_are_trainforges(tmp_path):
    pytest.importorskip("xgboost")
    from trainforge.xgboost import XGBoostTrainer

    _, _, params, _, _ = _framework("xgboost")
    train_df, _ = _frames()
    (tmp_path / "rec").mkdir()
    trainer = XGBoostTrainer(
        _xgb_loop, train_loop_config={"params": params, "rounds": 6, "dir": str(tmp_path / "rec")},
        datasets={"train": train_df}, scaling_config=ScalingConfig(num_workers=2), run_config=_rc(tmp_path, "loop"),
    )  # fmt: skip
    result = trainer.fit()
    records = _records(tmp_path / "rec")
    assert {k: (v["rank"], v["world"], v["rows"]) for k, v in records.items()} == {
        "rank0-attempt0": (0, 2, 225), "rank1-attempt0": (1, 2, 225)}  # fmt: skip
    assert list(result.metrics) == ["loss"]  # renamed by metrics={...}
    # A report per round, and one with the end's checkpoint (XGBoost does not say which round is last).
    assert len(result.metrics_history) == 6 + 1 and result.metrics_history[-1] == result.metrics_history[-2]
    assert trainer._backend._tracker is None  # freed when the attempt ended


def test_lightgbm_network_params_fresh_per_run(tmp_path):
    pytest.importorskip("lightgbm")
    from trainforge.lightgbm import LightGBMConfig, LightGBMTrainer, get_network_params

    assert get_network_params() == {}  # outside a LightGBMTrainer's worker
    _, _, params, _, _ = _framework("lightgbm")
    train_df, _ = _frames()
    ports = []
    for run in range(2):
        rec = tmp_path / f"rec{run}"
        rec.mkdir()
        LightGBMTrainer(
            _lgb_loop, train_loop_config={"params": params, "rounds": 3, "dir": str(rec)},
            lightgbm_config=LightGBMConfig(timeout_s=61), datasets={"train": train_df},
            scaling_config=ScalingConfig(num_workers=2), run_config=_rc(tmp_path, f"net{run}"),
        ).fit()  # fmt: skip
        r0, r1 = (_records(rec)[f"rank{r}-attempt0"] for r in (0, 1))
        machines = r0["machines"].split(",")
        assert r0["machines"] == r1["machines"] and r0["num_machines"] == 2 and len(machines) == 2
        assert machines == [f"127.0.0.1:{r0['local_listen_port']}", f"127.0.0.1:{r1['local_listen_port']}"]
        assert r0["time_out"] == 2  # minutes, rounded up from 61 s (LightGBM's default: 120 minutes)
        ports.append({r0["local_listen_port"], r1["local_listen_port"]})
    assert not ports[0] & ports[1]


class _KillRank1:
    """A callback run before the report callback: SIGKILLs rank 1 of attempt 0 once round 8 (index
    7) was evaluated; the checkpoint of round 5 is committed by then (both ranks reported it)."""

    order = 5  # LightGBM: before RayTrainReportCallback (20)
    before_iteration = False

    def _maybe_kill(self, iteration):
        ctx = train.get_context()
        if ctx.get_attempt() == 0 and ctx.get_world_rank() == 1 and iteration == 7:
            os.kill(os.getpid(), signal.SIGKILL)

    def __call__(self, env):  # LightGBM
        self._maybe_kill(env.iteration)


def _xgb_kill_callback():
    import xgboost

    class KillRank1(xgboost.callback.TrainingCallback, _KillRank1):
        def after_iteration(self, model, epoch, evals_log):
            self._maybe_kill(epoch)
            return False

    return KillRank1()


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_sigkilled_worker_resumes_from_last_checkpoint(tmp_path, name):
    trainer_cls, _, params, _, rounds_of = _framework(name)
    train_df, valid_df = _frames()
    (tmp_path / "rec").mkdir()
    killer = _xgb_kill_callback() if name == "xgboost" else _KillRank1()
    result = trainer_cls(
        _xgb_loop if name == "xgboost" else _lgb_loop,
        train_loop_config={"params": params, "rounds": 12, "dir": str(tmp_path / "rec"), "callbacks": [killer]},
        datasets={"train": train_df}, scaling_config=ScalingConfig(num_workers=2),
        run_config=_rc(tmp_path, "kill", failure_config=FailureConfig(max_failures=1)),
    ).fit()  # fmt: skip
    (killed,) = [f for f in result.failures if f.kind == "died"]  # rank 0's collective may fail too
    assert (killed.attempt, killed.rank) == (0, 1) and "SIGKILL" in killed.exit_description()
    assert {f.attempt for f in result.failures} == {0}
    records = _records(tmp_path / "rec")
    # Attempt 1 continued boosting from the round-5 checkpoint, through a new tracker / new ports.
    assert records["rank0-attempt1"]["start"] == records["rank1-attempt1"]["start"] == 5
    key = "port" if name == "xgboost" else "local_listen_port"
    assert records["rank0-attempt0"][key] != records["rank0-attempt1"][key]
    assert rounds_of(trainer_cls.get_model(result.checkpoint)) == 12
    # The history is cut back to the checkpoint the restart resumed from: rounds 1-5 of attempt 0,
    # 6-12 of attempt 1 (XGBoost: and the end's checkpoint report), each round once.
    assert len(result.metrics_history) == 5 + 7 + (name == "xgboost")


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_resume_from_checkpoint_continues_boosting(tmp_path, name):
    trainer_cls, _, params, _, rounds_of = _framework(name)
    train_df, valid_df = _frames()

    def fit(rounds, resume=None, run="a"):
        return trainer_cls(
            params=params, label_column="target", num_boost_round=rounds, datasets={"train": train_df},
            scaling_config=ScalingConfig(num_workers=2), run_config=_rc(tmp_path, run), resume_from_checkpoint=resume,
        ).fit()  # fmt: skip

    first = fit(4)
    second = fit(7, resume=first.checkpoint, run="b")
    assert len(second.metrics_history) == 3  # rounds 5-7 only
    assert rounds_of(trainer_cls.get_model(second.checkpoint)) == 7
    restored = trainer_cls.restore(str(tmp_path / "runs" / "b"))
    assert type(restored) is trainer_cls and restored.train_loop_config["num_boost_round"] == 7


def test_tuning_the_params_form(tmp_path):
    pytest.importorskip("xgboost")
    from trainforge import tune
    from trainforge.tune import TuneConfig, Tuner
    from trainforge.xgboost import XGBoostTrainer

    _, _, params, _, _ = _framework("xgboost")
    train_df, valid_df = _frames()
    trainer = XGBoostTrainer(
        params=params, label_column="target", num_boost_round=3, datasets={"train": train_df, "valid": valid_df},
        scaling_config=ScalingConfig(num_workers=2),
    )  # fmt: skip
    grid = Tuner(
        trainer, param_space={"params": {"max_depth": tune.grid_search([1, 4])}, "num_boost_round": 5},
        tune_config=TuneConfig(metric="valid-logloss", mode="min", server=False), run_config=_rc(tmp_path, "tune"),
    ).fit()  # fmt: skip
    assert grid.num_errors == 0 and len(grid) == 2
    for r, depth in zip(grid, (1, 4), strict=True):
        assert r.config["params"] == {"max_depth": depth} and len(r.metrics_history) == 5
        nodes = [len(tree.strip().splitlines()) for tree in XGBoostTrainer.get_model(r.checkpoint).get_dump()]
        assert (max(nodes) == 3) == (depth == 1)  # stumps: a split and two leaves; depth 4 grows more


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_example(tmp_path, name):
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "examples", f"{name}_breast_cancer.py"), "--num-boost-round", "6",
         "--storage-path", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=240,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "valid accuracy: " in proc.stdout and "boosting rounds: 6" in proc.stdout, proc.stdout


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_errors_a_user_can_cause(tmp_path, name):
    trainer_cls, callback_cls, params, _, _ = _framework(name)
    train_df, _ = _frames()
    ok = {"params": params, "label_column": "target", "datasets": {"train": train_df}}
    with pytest.raises(ValueError, match="pass either train_loop_per_worker or label_column=, params="):
        trainer_cls(lambda: None, **ok)
    with pytest.raises(ValueError, match="label_column= .* is required"):
        trainer_cls(params=params, datasets={"train": train_df})
    with pytest.raises(ValueError, match=r"num_boost_round=0 is not valid"):
        trainer_cls(**ok, num_boost_round=0)
    with pytest.raises(ValueError, match="datasets must hold a 'train' dataset"):
        trainer_cls(params=params, label_column="target", datasets={"valid": train_df})
    with pytest.raises(ValueError, match="train_loop_config=.* needs a train_loop_per_worker"):
        trainer_cls(**ok, train_loop_config={"a": 1})
    with pytest.raises(ValueError, match=r"frequency=-1\) is not valid"):
        callback_cls(frequency=-1)
    with pytest.raises(ValueError, match=r"metrics=3\) is not valid"):
        callback_cls(metrics=3)
    with pytest.raises(ValueError, match="checkpoint_frequency=-2 is not valid"):
        CheckpointConfig(checkpoint_frequency=-2)
    # A label that is not a column: the worker's error says which columns there are.
    result = trainer_cls(
        params=params, label_column="label", datasets={"train": train_df}, run_config=_rc(tmp_path, "badlabel"),
    ).fit_iter()  # fmt: skip
    list(result)
    assert "label_column='label' is not a column of datasets['train']" in str(result.result.error)
    with pytest.raises(FileNotFoundError, match="has no file 'model"):
        callback_cls.get_model(train.Checkpoint.from_directory(str(tmp_path)))


def test_config_validation():
    from trainforge.lightgbm import LightGBMConfig
    from trainforge.xgboost import XGBoostConfig

    with pytest.raises(ValueError, match="XGBoostConfig.xgboost_communicator='nccl' is not valid"):
        XGBoostConfig(xgboost_communicator="nccl")
    with pytest.raises(ValueError, match="XGBoostConfig.timeout_s=0 is not valid"):
        XGBoostConfig(timeout_s=0)
    with pytest.raises(ValueError, match="LightGBMConfig.timeout_s=1.5 is not valid"):
        LightGBMConfig(timeout_s=1.5)
    assert XGBoostConfig().framework == "xgboost" and LightGBMConfig().to_dict() == {"timeout_s": 120}


_IMPORT_CHECK = """
import sys
sys.modules["xgboost"] = sys.modules["lightgbm"] = None  # as if not installed
import trainforge.xgboost, trainforge.lightgbm
for make in (lambda: trainforge.xgboost.XGBoostTrainer(lambda: None),
             lambda: trainforge.lightgbm.LightGBMTrainer(lambda: None),
             lambda: trainforge.xgboost.RayTrainReportCallback,
             lambda: trainforge.lightgbm.RayTrainReportCallback()):
    try:
        make()
    except ImportError as exc:
        print("ERROR=" + str(exc))
"""


def test_missing_framework_names_the_extra_and_the_import_is_light():
    proc = subprocess.run([sys.executable, "-c", _IMPORT_CHECK], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    errors = [line for line in proc.stdout.splitlines() if line.startswith("ERROR=")]
    assert len(errors) == 4, proc.stdout
    assert sum("pip install 'trainforge[xgboost]'" in e for e in errors) == 2
    assert sum("pip install 'trainforge[lightgbm]'" in e for e in errors) == 2


def test_public_names_are_pinned():
    import trainforge.lightgbm as tl
    import trainforge.xgboost as tx

    assert tx.__all__ == ["XGBoostTrainer", "XGBoostConfig", "RayTrainReportCallback"]
    assert tl.__all__ == ["LightGBMTrainer", "LightGBMConfig", "RayTrainReportCallback", "get_network_params"]
    assert (tx.RayTrainReportCallback.CHECKPOINT_NAME, tl.RayTrainReportCallback.CHECKPOINT_NAME) == (
        "model.ubj", "model.txt")  # Ray's file names  # fmt: skip


# -- RunConfig(verbose=...): the frameworks' own logs -------------------------------------------------
_QUIET_RUN = """
import sys
import numpy as np, pandas as pd
from trainforge import RunConfig, ScalingConfig
from trainforge.model import Data, LightGBMModel, ModelTrainer, XGBoostModel

class ChurnData(Data):  # docs/model-lifecycle.md's model, as a new user runs it
    label_column = "churned"

    def setup(self, config):
        rng = np.random.default_rng(0)
        x = rng.standard_normal((2000, 4))
        frame = pd.DataFrame(x, columns=["tenure", "calls", "spend", "age"])
        frame["churned"] = (x[:, 0] - x[:, 1] + 0.3 * rng.standard_normal(2000) < 0).astype(int)
        return {"train": frame.iloc[:1600], "valid": frame.iloc[1600:]}

class XGBChurn(XGBoostModel):
    def setup(self, config):
        self.register(params={"objective": "binary:logistic", "eval_metric": "error", "max_depth": 3}, num_boost_round=20)

class LGBChurn(LightGBMModel):
    def setup(self, config):
        self.register(params={"objective": "binary", "metric": "binary_error", "num_leaves": 8}, num_boost_round=20)

model, verbose, storage = {"xgboost": XGBChurn, "lightgbm": LGBChurn}[sys.argv[1]], int(sys.argv[2]), sys.argv[3]
trainer = ModelTrainer(model, data=ChurnData, scaling_config=ScalingConfig(num_workers=2),
                       run_config=RunConfig(verbose=verbose, storage_path=storage, name="run"))
print("ERROR", trainer.fit().metrics["valid-" + ("error" if sys.argv[1] == "xgboost" else "binary_error")])
"""


def _quiet_run(tmp_path, name, verbose):
    """The run's output lines (stdout and stderr, C++ and forwarded worker output included)."""
    proc = subprocess.run(
        [sys.executable, "-c", _QUIET_RUN, name, str(verbose), str(tmp_path / f"v{verbose}")],
        cwd=tmp_path, capture_output=True, text=True, timeout=240,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = (proc.stdout + proc.stderr).splitlines()
    assert sum(line.startswith("ERROR ") for line in lines) == 1
    return lines


@pytest.mark.skipif(__import__("importlib").util.find_spec("xgboost") is None, reason="xgboost not installed")
def test_xgboost_verbose_0_silences_the_per_round_log_and_verbose_1_prints_it_once(tmp_path):
    import re

    rounds = re.compile(r"\[(\d+)\]\ttrain-error:[\d.]+\tvalid-error:[\d.]+$")
    quiet = _quiet_run(tmp_path, "xgboost", 0)
    assert [line for line in quiet if rounds.search(line)] == []
    # what is left: the result, and XGBoost's collective saying each worker's rank (its C++ console)
    assert [line for line in quiet if not line.startswith("ERROR ") and "got rank" not in line] == []
    loud = [int(m.group(1)) for m in map(rounds.search, _quiet_run(tmp_path, "xgboost", 1)) if m]
    assert loud == list(range(20))  # every round once: rank 0's log, as in Ray


@pytest.mark.skipif(__import__("importlib").util.find_spec("lightgbm") is None, reason="lightgbm not installed")
def test_lightgbm_verbose_0_silences_its_log_on_every_worker(tmp_path):
    quiet = _quiet_run(tmp_path, "lightgbm", 0)
    # LightGBM's network listener thread logs with its own (thread-local) level: "Listening..." per worker
    assert [line for line in quiet if "[LightGBM]" in line and "Listening..." not in line] == []
    assert sum("Listening..." in line for line in quiet) <= 2
    loud = _quiet_run(tmp_path, "lightgbm", 1)
    assert sum("[LightGBM] [Info]" in line for line in loud) > 10  # verbose >= 1: LightGBM's log as it is
