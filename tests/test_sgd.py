"""RaySGD v1 programs on ``trainforge.sgd`` with only their imports changed: RaySGD's documented
linear-regression example (``TrainingOperator.from_creators``), a RaySGD-style digits classifier
(``setup`` with ``register``/``register_data``, ``BATCH_SIZE``) on 2 workers with ``save``/``load``, a
``train_epoch`` override with ``AverageMeterCollection``, ``update_scheduler`` and
``apply_all_operators``; RaySGD's constructor errors; the example script end to end."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import trainforge.sgd  # noqa: E402
import trainforge.sgd.torch  # noqa: E402
import trainforge.sgd.utils  # noqa: E402
from trainforge import TrainingFailedError  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# -- RaySGD's example (python/ray/util/sgd/torch/examples/train_example.py) with only its imports ----
# -- changed: examples/raysgd_linear.py, loaded here from its file (its functions pickled by value) -
import importlib.util  # noqa: E402

import cloudpickle  # noqa: E402
import torch.nn as nn  # noqa: E402

from trainforge.sgd import TorchTrainer  # noqa: E402
from trainforge.sgd.torch import TrainingOperator  # noqa: E402


def _load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"_example_{name}", os.path.join(REPO, "examples", f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)  # the workers cannot import it by name
    return module


raysgd_linear = _load_example("raysgd_linear")
model_creator = raysgd_linear.model_creator


@pytest.mark.slow
def test_raysgd_linear_regression_example(capsys):
    raysgd_linear.train_example(num_workers=1)
    out = capsys.readouterr().out
    stats = [eval(line) for line in out.splitlines() if line.startswith("{'epoch'")]  # noqa: S307 - our own output
    assert [s["epoch"] for s in stats] == [1, 2, 3, 4, 5]
    for s in stats:
        assert set(s) == {"num_samples", "epoch", "batch_count", "train_loss", "last_train_loss"}
        assert (s["num_samples"], s["batch_count"]) == (1000, 250)
    assert stats[-1]["train_loss"] < stats[0]["train_loss"] / 10
    weight, bias = (float(v) for v in out.split("trained weight:")[1].split("success!")[0].replace("bias:", "").split(","))
    assert abs(weight - 2) < 0.2 and abs(bias - 5) < 0.5
    assert "success!" in out


# -- a digits classifier written against RaySGD's documented API -------------------------------------
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from trainforge.sgd.utils import BATCH_SIZE, AverageMeterCollection  # noqa: E402  (was: ray.util.sgd.utils)


def digits_data():
    x, y = load_digits(return_X_y=True)
    x_train, x_val, y_train, y_val = train_test_split(x / 16.0, y, test_size=0.2, random_state=0, stratify=y)
    to_set = lambda x, y: TensorDataset(torch.tensor(x, dtype=torch.float32), torch.tensor(y))  # noqa: E731
    return to_set(x_train, y_train), to_set(x_val, y_val)


class DigitsOperator(TrainingOperator):
    def setup(self, config):
        train_dataset, val_dataset = digits_data()
        train_loader = DataLoader(train_dataset, batch_size=config[BATCH_SIZE], shuffle=True)
        val_loader = DataLoader(val_dataset, batch_size=config[BATCH_SIZE])
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
        optimizer = torch.optim.Adam(model.parameters(), lr=config.get("lr", 1e-2))
        criterion = nn.CrossEntropyLoss()
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.9)
        self.model, self.optimizer, self.criterion, self.scheduler = self.register(
            models=model, optimizers=optimizer, criterion=criterion, schedulers=scheduler)
        self.register_data(train_loader=train_loader, validation_loader=val_loader)


def _digits_trainer(tmp_path, name):
    from trainforge import RunConfig

    return TorchTrainer(training_operator_cls=DigitsOperator, num_workers=2, use_gpu=False,
                        config={"lr": 1e-2, BATCH_SIZE: 64}, scheduler_step_freq="epoch",
                        run_config=RunConfig(storage_path=str(tmp_path), name=name, verbose=0))  # fmt: skip


@pytest.mark.slow
def test_raysgd_digits_classifier_train_validate_get_model_save_load(tmp_path):
    trainer = _digits_trainer(tmp_path, "digits")
    for _ in range(4):
        stats = trainer.train()
    assert stats["epoch"] == 4 and stats["num_samples"] == 1437 + 1  # DistributedSampler pads 1437 to 2 x 719
    assert trainer.model_trainer.train_loop_config[BATCH_SIZE] == 64  # each worker's config had 32
    val = trainer.validate()
    assert set(val) == {"batch_count", "num_samples", "val_loss", "val_accuracy", "last_val_loss", "last_val_accuracy"}
    assert val["num_samples"] == 360 and val["val_accuracy"] > 0.9
    model = trainer.get_model()
    assert isinstance(model, nn.Sequential)
    _, val_set = digits_data()
    x, y = val_set.tensors
    with torch.no_grad():
        accuracy = float((model(x).argmax(-1) == y).float().mean())
    assert accuracy == pytest.approx(val["val_accuracy"], abs=1e-6)
    path = trainer.save(str(tmp_path / "checkpoint"))
    trainer.shutdown()

    trainer2 = _digits_trainer(tmp_path, "digits2")
    trainer2.load(path)
    val2 = trainer2.validate()
    assert val2["val_loss"] == pytest.approx(val["val_loss"], abs=1e-6)
    assert trainer2.train()["epoch"] == 5  # the epoch count came with the state
    trainer2.shutdown()


class MeterOperator(DigitsOperator):
    """A train_epoch of its own (RaySGD's documented AverageMeterCollection pattern) and a scheduler
    stepped by hand."""

    def setup(self, config):
        super().setup(config)
        self.scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(self.optimizer, factor=0.5, patience=0)
        self.schedulers = [self.scheduler]

    def train_epoch(self, iterator, info):
        meter_collection = AverageMeterCollection()
        self.model.train()
        for batch in iterator:
            metrics = self.train_batch(batch, {})
            meter_collection.update({"train_loss": metrics["train_loss"]}, n=metrics["num_samples"])
        return meter_collection.summary()


@pytest.mark.slow
def test_train_epoch_override_update_scheduler_and_apply(tmp_path):
    from trainforge import RunConfig

    trainer = TorchTrainer(training_operator_cls=MeterOperator, num_workers=2, config={"lr": 1e-2, BATCH_SIZE: 64},
                           scheduler_step_freq="manual", run_config=RunConfig(storage_path=str(tmp_path), verbose=0))  # fmt: skip
    with trainer:
        stats = trainer.train(num_steps=3)
        assert stats["batch_count"] == 3 and stats["num_samples"] == 3 * 64
        per_worker = trainer.train(num_steps=2, reduce_results=False)
        assert [w["batch_count"] for w in per_worker] == [2, 2]
        for _ in range(2):
            trainer.update_scheduler(1.0)  # no improvement after the first: the lr halves
        assert trainer.apply_all_operators(lambda op: op.optimizer.param_groups[0]["lr"]) == [5e-3, 5e-3]
        assert len(set(trainer.apply_all_workers(os.getpid))) == 2


class NoFreqOperator(DigitsOperator):
    pass


def test_raysgd_constructor_errors():
    with pytest.raises(ValueError, match="creator functions are deprecated"):
        TorchTrainer(training_operator_cls=DigitsOperator, model_creator=model_creator)
    with pytest.raises(ValueError, match="Scheduler step freq must be in"):
        TorchTrainer(training_operator_cls=DigitsOperator, scheduler_step_freq="step")
    with pytest.raises(ValueError, match="The number of workers must be greater than 0"):
        TorchTrainer(training_operator_cls=DigitsOperator, num_workers=0)
    with pytest.raises(ValueError, match="subclass of trainforge.sgd.torch.TrainingOperator"):
        TorchTrainer(training_operator_cls=nn.Linear)
    with pytest.raises(ValueError, match="apex"):
        TorchTrainer(training_operator_cls=DigitsOperator, use_fp16="apex")
    with pytest.raises(NotImplementedError, match="Tuner"):
        TorchTrainer.as_trainable(training_operator_cls=DigitsOperator)
    summary = AverageMeterCollection()
    summary.update({"loss": 0.5, "acc": 0.5}, n=32)
    summary.update({"loss": 0.1, "acc": 0.9}, n=32)
    assert summary.summary() == pytest.approx(
        {"batch_count": 2, "num_samples": 64, "loss": 0.3, "last_loss": 0.1, "acc": 0.7, "last_acc": 0.9}
    )


@pytest.mark.slow
def test_schedulers_without_a_step_freq_fail_as_in_raysgd(tmp_path):
    from trainforge import FailureConfig, RunConfig

    trainer = TorchTrainer(training_operator_cls=NoFreqOperator, config={BATCH_SIZE: 64},
                           run_config=RunConfig(storage_path=str(tmp_path), verbose=0,
                                                failure_config=FailureConfig(max_failures=0)))  # fmt: skip
    with pytest.raises(TrainingFailedError, match="scheduler_step_freq passed into TorchTrainer cannot be None"):
        trainer.train()
    trainer.shutdown()


def test_public_names_and_a_light_import():
    assert trainforge.sgd.__all__ == ["TorchTrainer", "TrainingOperator"]
    assert trainforge.sgd.torch.__all__ == ["TorchTrainer", "TrainingOperator"]
    assert trainforge.sgd.TorchTrainer is trainforge.sgd.torch.TorchTrainer
    assert sorted(trainforge.sgd.utils.__all__) == [
        "AverageMeter", "AverageMeterCollection", "BATCH_COUNT", "BATCH_SIZE", "NUM_SAMPLES"]  # fmt: skip
    assert trainforge.sgd.utils.BATCH_SIZE == "batch_size"  # RaySGD's key
    code = "import sys, trainforge.sgd.torch, trainforge.sgd.utils; print('TORCH=' + str('torch' in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert "TORCH=False" in proc.stdout, proc.stderr


@pytest.mark.slow
def test_the_linear_example_script_runs(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, os.path.join(REPO, "examples", "raysgd_linear.py"), "--num-workers", "2"],
                          capture_output=True, text=True, timeout=240, cwd=str(tmp_path), env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "trained weight:" in proc.stdout and "success!" in proc.stdout
