"""PyTorch Lightning in a trainforge run: a Lightning ``Trainer`` with trainforge's strategy, cluster
environment and report callback in the train loop of a 2-worker ``TorchTrainer``, under both the
``lightning.pytorch`` and the standalone ``pytorch_lightning`` namespaces; its metrics and checkpoints
in the ``Result``; a SIGKILLed worker and the restart from the last checkpoint; the example; and the
errors a user can cause."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import pytest

import trainforge as train
from trainforge import FailureConfig, RunConfig, ScalingConfig
from trainforge.torch import TorchTrainer

pytest.importorskip("sklearn")
NAMESPACES = [
    pytest.param(ns, marks=pytest.mark.skipif(importlib.util.find_spec(ns.split(".")[0]) is None, reason=f"{ns} not installed"))
    for ns in ("lightning.pytorch", "pytorch_lightning")
]  # fmt: skip
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.slow


def _fit(config: dict, callbacks: list) -> None:
    """Fit an MLP on the digits with a Lightning Trainer of namespace ``config["ns"]``; write what
    rank 0's Trainer ended with to ``config["out"]``."""
    import torch
    from sklearn.datasets import load_digits
    from torch.utils.data import DataLoader, TensorDataset

    from trainforge.lightning import (
        RayDDPStrategy,
        RayLightningEnvironment,
        RayTrainReportCallback,
        prepare_trainer,
    )

    pl = importlib.import_module(config["ns"])  # the strategy & co. below are built from this namespace

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))

        def training_step(self, batch, batch_idx):
            loss = torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1])
            self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
            return loss

        def validation_step(self, batch, batch_idx):
            logits = self.net(batch[0])
            self.log("val_loss", torch.nn.functional.cross_entropy(logits, batch[1]), sync_dist=True)
            self.log("val_accuracy", (logits.argmax(-1) == batch[1]).float().mean(), sync_dist=True)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-2)

    x, y = load_digits(return_X_y=True)
    data = TensorDataset(torch.tensor(x[:640] / 16, dtype=torch.float32), torch.tensor(y[:640]))
    val = TensorDataset(torch.tensor(x[1500:] / 16, dtype=torch.float32), torch.tensor(y[1500:]))
    pl.seed_everything(0)
    trainer = pl.Trainer(
        max_epochs=config["epochs"], devices="auto", accelerator="cpu", strategy=RayDDPStrategy(),
        plugins=[RayLightningEnvironment()], callbacks=[RayTrainReportCallback(), *callbacks],
        enable_checkpointing=False, logger=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=config["root"],
    )  # fmt: skip
    trainer = prepare_trainer(trainer)
    loaders = DataLoader(data, batch_size=32, shuffle=True), DataLoader(val, batch_size=100)
    checkpoint = train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            trainer.fit(Net(), *loaders, ckpt_path=os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME))
    else:
        trainer.fit(Net(), *loaders)
    if train.get_context().get_world_rank() == 0:
        with open(config["out"], "w") as f:
            json.dump(
                {
                    "metrics": {k: v.item() for k, v in trainer.callback_metrics.items()},
                    "epoch": trainer.current_epoch,
                    "step": trainer.global_step,
                    "classes": [
                        type(trainer.strategy).__module__,
                        type(trainer.strategy).__mro__[1].__module__,
                    ],
                },
                f,
            )


def _config(tmp_path, ns: str, epochs: int) -> dict:
    return {"ns": ns, "epochs": epochs, "root": str(tmp_path / "pl"), "out": str(tmp_path / "out.json")}


@pytest.mark.parametrize("ns", NAMESPACES)
def test_ddp_metrics_and_one_checkpoint_per_epoch(tmp_path, ns):
    config = _config(tmp_path, ns, epochs=3)
    result = TorchTrainer(
        lambda: _fit(config, []),
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(tmp_path / "runs"), name="pl", verbose=0),
    ).fit()
    out = json.load(open(config["out"]))
    # The strategy is built on the namespace the loop used (ray#47089: never the other one).
    module = "_lightning_pytorch" if ns == "lightning.pytorch" else "_pytorch_lightning"
    assert out["classes"][0] == f"trainforge.lightning.{module}" and out["classes"][1].startswith(ns)
    # Result.metrics: what the Trainer ended with, validation included.
    assert result.metrics == {**out["metrics"], "epoch": 2, "step": out["step"]}
    assert {"train_loss", "val_loss", "val_accuracy"} <= set(result.metrics)
    assert out["step"] == 3 * 10  # 640 rows: 320 per worker (the run's ranks shard the data), batches of 32
    # One run checkpoint per epoch, holding Lightning's checkpoint once.
    assert [m["epoch"] for _, m in result.best_checkpoints] == [0, 1, 2]
    for ckpt, metrics in result.best_checkpoints:
        assert sorted(f for f in os.listdir(ckpt.path) if not f.startswith(".")) == ["checkpoint.ckpt"]
        import torch

        state = torch.load(os.path.join(ckpt.path, "checkpoint.ckpt"), weights_only=False)
        assert (state["epoch"], state["global_step"]) == (metrics["epoch"], metrics["step"])


def test_sigkilled_worker_resumes_from_last_checkpoint(tmp_path):
    ns = "lightning.pytorch" if importlib.util.find_spec("lightning") else "pytorch_lightning"
    pl = pytest.importorskip(ns)
    config = {**_config(tmp_path, ns, epochs=4), "starts": str(tmp_path / "starts.txt")}

    class Probe(pl.Callback):
        """Records the epoch each attempt starts at; SIGKILLs rank 1 after the first step of epoch 2
        of attempt 0 (that step's gradient all-reduce waits for rank 0, so rank 0 has finished
        reporting epoch 1's checkpoint)."""

        def on_train_epoch_start(self, trainer, pl_module):
            ctx = train.get_context()
            with open(config["starts"], "a") as f:
                f.write(f"{ctx.get_attempt()} {ctx.get_world_rank()} {trainer.current_epoch}\n")

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            ctx = train.get_context()
            if ctx.get_attempt() == 0 and ctx.get_world_rank() == 1 and trainer.current_epoch == 2:
                import signal

                os.kill(os.getpid(), signal.SIGKILL)

    result = TorchTrainer(
        lambda: _fit(config, [Probe()]),
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            storage_path=str(tmp_path / "runs"),
            name="plkill",
            verbose=0,
            failure_config=FailureConfig(max_failures=1),
        ),
    ).fit()
    # rank 1's death (rank 0's collective may fail too, even noticed first)
    (killed,) = [f for f in result.failures if f.kind == "died"]
    assert (killed.attempt, killed.rank) == (0, 1) and "SIGKILL" in killed.exit_description()
    assert {f.attempt for f in result.failures} == {0}
    starts = open(config["starts"]).read().split("\n")[:-1]
    assert sorted(line for line in starts if line.startswith("1 ")) == ["1 0 2", "1 0 3", "1 1 2", "1 1 3"]
    assert result.metrics["epoch"] == 3 and "val_loss" in result.metrics
    assert list(result.metrics_dataframe["epoch"]) == [0, 1, 2, 3]  # epoch 2 of attempt 0 never finished


@pytest.mark.parametrize("ns", NAMESPACES)
def test_example(tmp_path, ns):
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "examples", "lightning_digits.py"), "--epochs", "2", "--namespace", ns,
         "--storage-path", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=240,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"namespace: {ns}" in proc.stdout and "val_accuracy: " in proc.stdout
    checkpoint = proc.stdout.split("checkpoint: ")[-1].strip()
    assert os.path.isfile(os.path.join(checkpoint, "checkpoint.ckpt")), proc.stdout


@pytest.mark.parametrize("ns", NAMESPACES)
def test_classes_follow_the_callers_namespace(ns):
    import trainforge.lightning as tl

    pl = importlib.import_module(ns)  # the only Lightning this function refers to
    for name in ("RayDDPStrategy", "RayLightningEnvironment", "RayTrainReportCallback"):
        obj = getattr(tl, name)()
        assert isinstance(obj, getattr(tl, name)) and type(obj).__name__ == name
        assert type(obj).__module__ == {"lightning.pytorch": "trainforge.lightning._lightning_pytorch",
                                        "pytorch_lightning": "trainforge.lightning._pytorch_lightning"}[ns]  # fmt: skip
        roots = ("lightning.",) if ns == "lightning.pytorch" else ("pytorch_lightning.", "lightning_fabric.")
        assert any(base.__module__.startswith(roots) for base in type(obj).__mro__[1:])
    assert isinstance(tl.RayDDPStrategy(), pl.strategies.DDPStrategy)
    assert not isinstance(tl.RayDDPStrategy(), tl.RayFSDPStrategy)
    import pickle

    env = pickle.loads(pickle.dumps(tl.RayLightningEnvironment()))
    assert isinstance(env, tl.RayLightningEnvironment)


def test_prepare_trainer_and_callback_errors():
    ns = "lightning.pytorch" if importlib.util.find_spec("lightning") else "pytorch_lightning"
    pl = pytest.importorskip(ns)
    from trainforge.lightning import (
        RayDDPStrategy,
        RayDeepSpeedStrategy,
        RayLightningEnvironment,
        RayTrainReportCallback,
        prepare_trainer,
    )

    quiet = {
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "enable_checkpointing": False,
    }
    with pytest.raises(TypeError, match="takes a Lightning Trainer"):
        prepare_trainer(object())
    with pytest.raises(RuntimeError, match="strategy is SingleDeviceStrategy.*use one of RayDDPStrategy"):
        prepare_trainer(pl.Trainer(accelerator="cpu", **quiet))
    with pytest.raises(
        RuntimeError,
        match=r"cluster environment is LightningEnvironment: pass plugins=\[RayLightningEnvironment\(\)\]",
    ):
        prepare_trainer(pl.Trainer(accelerator="cpu", strategy=RayDDPStrategy(), **quiet))
    trainer = pl.Trainer(
        accelerator="cpu", strategy=RayDDPStrategy(), plugins=[RayLightningEnvironment()], **quiet
    )
    assert prepare_trainer(trainer) is trainer
    with pytest.raises(ValueError, match=r"checkpoint_every_n_epochs=-1\) is not valid"):
        RayTrainReportCallback(checkpoint_every_n_epochs=-1)
    if importlib.util.find_spec("deepspeed") is None:
        with pytest.raises(Exception, match="deepspeed"):
            RayDeepSpeedStrategy()


_IMPORT_CHECK = """
import sys
sys.modules["lightning"] = sys.modules["pytorch_lightning"] = None  # as if not installed
import trainforge.lightning as tl
assert "torch" not in sys.modules  # importing the subpackage imports no framework
try:
    tl.RayDDPStrategy()
except ImportError as exc:
    print("ERROR=" + str(exc))
"""


def test_missing_lightning_names_the_extra_and_the_import_is_light():
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORT_CHECK], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr
    assert "ERROR=" in proc.stdout and "pip install 'trainforge[lightning]'" in proc.stdout, proc.stdout


def test_public_names_are_pinned():
    import trainforge.lightning as tl

    assert tl.__all__ == [
        "RayDDPStrategy", "RayFSDPStrategy", "RayDeepSpeedStrategy", "RayLightningEnvironment",
        "RayTrainReportCallback", "prepare_trainer",
    ]  # fmt: skip
    assert tl.RayTrainReportCallback.CHECKPOINT_NAME == "checkpoint.ckpt"  # Ray's file name
