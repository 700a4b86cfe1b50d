"""The managed loop (``trainforge.model``): ``Model`` hooks and inference, ``LoopConfig`` checks, the
command channel, and real runs on 2 (or 1) CPU workers: sample-weighted metrics equal to a single-
process reference, the global batch split, a SIGKILLed worker resuming at the right epoch and batch
with the epoch's metrics unchanged, driven train()/validate() on workers that stay up (and survive a
kill), bf16 on the CPU, schedulers, gradient accumulation and clipping, early stopping, an async
step, Tuner(MyModel), and restore()."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader, Subset, TensorDataset  # noqa: E402

import trainforge  # noqa: E402
from trainforge import FailureConfig, RunConfig, ScalingConfig  # noqa: E402
from trainforge._testing.procs import pid_alive  # noqa: E402
from trainforge.model import BATCH_SIZE, EarlyStopping, LoopConfig, Model, ModelTrainer  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- the models the runs train --------------------------------------------------------------------
def _data(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g)


def _initial_net() -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 3)


class Tiny(Model):
    """A linear 3-class classifier on 4 random features. Config: lr, BATCH_SIZE (global), n (samples),
    val_batch, scheduler (StepLR gamma 0.5 each step), uneven (each rank its own unequal part, no
    DistributedSampler), kill ({"epoch", "batch", "rank"}: SIGKILL there in attempt 0)."""

    def setup(self, config):
        net = _initial_net()
        opt = torch.optim.SGD(net.parameters(), lr=config.get("lr", 0.1))
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5) if config.get("scheduler") else None
        self.register(models=net, optimizers=opt, criterion=torch.nn.CrossEntropyLoss(), schedulers=sched)
        self.steps, self.max_grad_norm, self.starts, self.pid_seen = 0, 0.0, [], os.getpid()

    def setup_data(self, config):
        x, y = _data(config.get("n", 50))
        data = TensorDataset(x, y)
        if config.get("uneven"):  # rank 0: samples 0-29, rank 1: 30-42 (no sampler: the parts are the shards)
            part = range(0, 30) if self.world_rank == 0 else range(30, 43)
            loader = DataLoader(Subset(data, list(part)), batch_size=7)
            self.register_data(train_loader=loader, validation_loader=loader, add_dist_sampler=False)
            return
        self.register_data(
            train_loader=DataLoader(data, batch_size=config.get(BATCH_SIZE, 8), shuffle=True),
            validation_loader=DataLoader(data, batch_size=config.get("val_batch", 7)),
        )

    def train_step(self, batch, batch_idx):
        ctx = trainforge.get_context()
        if not self.starts or self.starts[-1][0] != ctx.get_attempt():
            self.starts.append([ctx.get_attempt(), self.epoch, batch_idx])  # where each attempt began
        kill = self.config.get("kill")
        if kill and ctx.get_attempt() == 0 and ctx.get_world_rank() == kill["rank"] and (
            self.epoch, batch_idx) == (kill["epoch"], kill["batch"]):  # fmt: skip
            os.kill(os.getpid(), signal.SIGKILL)
        loss = super().train_step(batch, batch_idx)
        return {"loss": loss, "worker_batch_size": float(self.config.get(BATCH_SIZE, 0))}

    def on_before_optimizer_step(self, optimizer):
        self.steps += 1
        norm = torch.norm(torch.stack([p.grad.norm() for g in optimizer.param_groups for p in g["params"]]))
        self.max_grad_norm = max(self.max_grad_norm, float(norm))

    def state_dict(self):
        return {"steps": self.steps, "max_grad_norm": self.max_grad_norm, "starts": self.starts,
                "lr": self.optimizer.param_groups[0]["lr"]}  # fmt: skip

    def load_state_dict(self, state):
        if state:
            self.steps, self.max_grad_norm, self.starts = state["steps"], state["max_grad_norm"], state["starts"]
            self.saved_lr = state["lr"]


class BF16Tiny(Tiny):
    def train_step(self, batch, batch_idx):
        x, y = batch
        out = self.forward(x)
        return {"loss": self._loss(out, y), "bf16": float(out.dtype == torch.bfloat16)}


class HalfTiny(Tiny):
    def train_step(self, batch, batch_idx):
        x, y = batch
        out = self.forward(x)
        return {"loss": self._loss(out, y), "half": float(out.dtype == torch.float16)}


class AsyncTiny(Tiny):
    loops: set[int] = set()

    async def train_step(self, batch, batch_idx):
        await asyncio.sleep(0)
        AsyncTiny.loops.add(id(asyncio.get_running_loop()))
        return Model.train_step(self, batch, batch_idx)

    def state_dict(self):
        return {**super().state_dict(), "loops": len(AsyncTiny.loops)}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.loops_seen = state["loops"] if state else None


class TunedTiny(Tiny):
    @classmethod
    def hyperparameter_space(cls):
        from trainforge import tune

        return {"lr": tune.uniform(0.01, 0.1)}


def _reference(n: int, indices=None) -> dict[str, float]:
    """What one process computes over the same samples with the initial weights: mean loss, accuracy."""
    x, y = _data(n)
    if indices is not None:
        x, y = x[indices], y[indices]
    with torch.no_grad():
        out = _initial_net()(x)
        losses = torch.nn.functional.cross_entropy(out, y, reduction="none").double()
    return {"loss": float(losses.mean()), "accuracy": float((out.argmax(-1) == y).double().mean())}


def _rc(tmp_path, name, failures=0):
    return RunConfig(storage_path=str(tmp_path), name=name, verbose=0,
                     failure_config=FailureConfig(max_failures=failures))  # fmt: skip


# -- units: config, tracker, metrics, channel, inference ------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_epochs": 0}, "LoopConfig.num_epochs=0 is not valid: use an integer >= 1"),
        ({"use_fp16": "fp8"}, "LoopConfig.use_fp16='fp8' is not valid: use False, True, 'bf16' or 'fp16'"),
        ({"scheduler_step_freq": "step"}, "LoopConfig.scheduler_step_freq='step' is not valid: choose one of ('batch', 'epoch', 'manual')"),
        ({"gradient_accumulation_steps": 0}, "LoopConfig.gradient_accumulation_steps=0 is not valid"),
        ({"grad_clip_norm": -1.0}, "LoopConfig.grad_clip_norm=-1.0 is not valid: use None (no clipping) or a number > 0"),
        ({"checkpoint_every_n_epochs": -1}, "LoopConfig.checkpoint_every_n_epochs=-1 is not valid"),
        ({"checkpoint_every_n_batches": 3, "gradient_accumulation_steps": 2},
         "LoopConfig.checkpoint_every_n_batches=3 is not valid: use a multiple of gradient_accumulation_steps=2"),
        ({"early_stopping": "val_loss"}, "LoopConfig.early_stopping='val_loss' is not valid"),
        ({"validate_every_n_epochs": 1.5}, "LoopConfig.validate_every_n_epochs=1.5 is not valid"),
    ],
)
def test_loop_config_errors_name_field_value_and_what_is_allowed(kwargs, message):
    with pytest.raises(ValueError) as info:
        LoopConfig(**kwargs)
    assert message in str(info.value)


def test_early_stopping_config_and_tracker():
    from trainforge.model._early_stopping import EarlyStoppingTracker

    with pytest.raises(ValueError, match=r"EarlyStopping.mode='down' is not valid: use 'min' or 'max'"):
        EarlyStopping("val_loss", mode="down")
    with pytest.raises(ValueError, match=r"EarlyStopping.patience=-1 is not valid"):
        EarlyStopping("val_loss", patience=-1)
    tracker = EarlyStoppingTracker(EarlyStopping("acc", mode="max", patience=2, min_delta=0.01))
    assert [tracker.update({"acc": a}) for a in (0.5, 0.6, 0.605, 0.6)] == [False, False, False, True]
    resumed = EarlyStoppingTracker(tracker.config, tracker.state())
    assert (resumed.best, resumed.wait) == (0.6, 2)
    with pytest.raises(ValueError, match=r"EarlyStopping\(metric='acc'\): no such metric this epoch; the epoch reported \['loss'\]"):
        tracker.update({"loss": 1.0})


def test_epoch_metrics_are_sample_weighted_and_survive_a_checkpoint():
    from trainforge.model._metrics import EpochMetrics

    m = EpochMetrics()
    m.add({"loss": torch.tensor(1.0)}, 8)
    m.add({"loss": 4.0}, 2)
    resumed = EpochMetrics.from_state(m.state())  # what a mid-epoch checkpoint keeps
    resumed.add({"loss": torch.tensor(2.0)}, 10)
    out = resumed.reduce()
    assert out == {"batch_count": 3, "num_samples": 20, "loss": pytest.approx((8 + 8 + 20) / 20), "last_loss": 2.0}
    assert out["loss"] != pytest.approx((1 + 4 + 2) / 3)  # not the unweighted mean of batch means


def test_command_channel_resends_the_pending_command_to_a_newer_attempt():
    from trainforge.model._commands import Command, CommandClient, CommandServer

    server = CommandServer()
    try:
        info = server.worker_info()
        old = CommandClient.connect(info, attempt=0, rank=0)
        server.send(Command("train", 1))
        assert old.recv().seq == 1
        server.done(1)
        server.send(Command("train", 2))
        assert old.recv().seq == 2
        new = CommandClient.connect(info, attempt=1, rank=0)  # a restarted worker: gets the pending one
        got = new.recv()
        assert (got.kind, got.seq) == ("train", 2)
        assert old.recv() is None  # the older attempt's connection was dropped
        stale = CommandClient.connect(info, attempt=0, rank=1)
        assert stale.recv() is None
        server.done(2)
        server.send(Command("stop", 3))
        assert new.recv().kind == "stop"
        for c in (old, new, stale):
            c.close()
    finally:
        server.close()


class Scaled(Model):
    def setup(self, config):
        net = _initial_net()
        self.register(models=net, optimizers=torch.optim.SGD(net.parameters(), lr=0.1))
        self.calls = []

    def preprocess(self, data):
        return torch.as_tensor(data, dtype=torch.float32) * self.config["scale"]

    def forward(self, x):
        self.calls.append((torch.is_grad_enabled(), self.model.training))
        return self.model(x)

    def postprocess(self, output):
        return output.argmax(-1).tolist()

    def state_dict(self):
        return {"note": "kept"}

    def load_state_dict(self, state):
        self.note = state["note"]


def test_inference_runs_preprocess_forward_postprocess_without_grad_in_eval_mode(tmp_path):
    model = Scaled({"scale": 2.0})
    rows = [[0.1, 0.2, 0.3, 0.4], [-1.0, 0.5, 2.0, 0.0]]
    out = model(rows)
    expected = _initial_net()(torch.tensor(rows) * 2.0).argmax(-1).tolist()
    assert out == expected
    assert model.calls == [(False, False)] and model.model.training  # the mode is restored afterwards
    assert repr(model) == "Scaled(config={'scale': 2.0}, models=[Linear])"

    with torch.no_grad():
        model.model.weight.add_(1.0)  # "trained": differs from a fresh Scaled
    model.save(str(tmp_path / "m"))
    loaded = Model.load(str(tmp_path / "m"))
    assert type(loaded) is Scaled and loaded.config == {"scale": 2.0} and loaded.note == "kept"
    assert torch.equal(loaded.model.weight, model.model.weight) and not loaded.model.training
    assert loaded(rows) == model(rows)
    assert Scaled.from_checkpoint(trainforge.Checkpoint.from_directory(str(tmp_path / "m")))(rows) == model(rows)


def test_a_class_without_import_path_is_pickled_with_the_model(tmp_path):
    class Local(Model):  # defined in a function: no import path
        def setup(self, config):
            self.register(models=torch.nn.Linear(2, 1), criterion=torch.nn.MSELoss())

    Local({"a": object.__name__}).save(str(tmp_path / "m"))
    import json

    manifest = json.loads((tmp_path / "m" / "model.json").read_text())
    assert manifest["class"] is None and manifest["class_name"].endswith("Local")
    assert (tmp_path / "m" / "model_class.pkl").exists()
    assert Model.load(str(tmp_path / "m")).config == {"a": "object"}
    with pytest.raises(TypeError, match="not a Scaled"):
        Scaled.load(str(tmp_path / "m"))
    with pytest.raises(FileNotFoundError, match="not a trainforge model directory"):
        Model.load(str(tmp_path))


def test_model_trainer_checks_its_arguments():
    with pytest.raises(TypeError, match="is not a trainforge.model.Model subclass"):
        ModelTrainer(torch.nn.Linear)

    class NoSetup(Model):
        pass

    with pytest.raises(TypeError, match="does not implement setup"):
        ModelTrainer(NoSetup)
    with pytest.raises(TypeError, match="must be a trainforge.model.LoopConfig"):
        ModelTrainer(Tiny, loop_config={"num_epochs": 2})
    with pytest.raises(RuntimeError, match="no trained model yet"):
        ModelTrainer(Tiny).get_model()


_IMPORT_CHECK = """
import sys
import trainforge.model, trainforge.sgd, trainforge.sgd.torch, trainforge.sgd.utils
print("TORCH=" + str("torch" in sys.modules))
sys.modules["torch"] = None  # as if not installed
from trainforge.model import Model, ModelTrainer

class M(Model):
    def setup(self, config):
        self.register(models=None)

for make in (lambda: ModelTrainer(M), lambda: M()):
    try:
        make()
    except ImportError as exc:
        print("ERROR=" + str(exc))
"""


def test_import_is_light_and_a_missing_torch_names_the_extra():
    proc = subprocess.run([sys.executable, "-c", _IMPORT_CHECK], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert "TORCH=False" in proc.stdout, proc.stdout
    errors = [line for line in proc.stdout.splitlines() if line.startswith("ERROR=")]
    assert len(errors) == 2 and all("pip install 'trainforge[torch]'" in e for e in errors), proc.stdout


def test_the_managed_loop_never_names_tune_or_rays_packages():
    """Train code never imports tune (not even by name in a docstring); RaySGD is named in prose."""
    offenders = []
    for sub in ("model", "sgd"):
        for root, _, files in os.walk(os.path.join(REPO, "trainforge", sub)):
            for name in (n for n in files if n.endswith(".py")):
                with open(os.path.join(root, name)) as f:
                    text = f.read()
                offenders += [(name, s) for s in ("trainforge.tune", "ray.util.sgd", "ray.train", "ray.tune", "ray.air")
                              if s in text]  # fmt: skip
    assert offenders == []


# -- real runs ------------------------------------------------------------------------------------
@pytest.mark.slow
def test_driven_train_validate_on_workers_that_stay_up_with_exact_weighted_metrics(tmp_path):
    """lr=0: the weights stay the initial ones, so every epoch's train_loss and the validation's
    metrics equal a single-process computation over the same 50 samples. Each worker's 25 samples come
    in batches of 8, 8, 8, 1 (train) and 7, 7, 7, 4 (validation): an unweighted mean would differ."""
    ref = _reference(50)
    trainer = ModelTrainer(Tiny, config={"lr": 0.0, BATCH_SIZE: 16, "n": 50},
                           scaling_config=ScalingConfig(num_workers=2), run_config=_rc(tmp_path, "driven"))  # fmt: skip
    with trainer:
        pids = trainer.apply_workers(os.getpid)
        results = [trainer.train() for _ in range(3)]
        val = trainer.validate()
        per_worker = trainer.train(reduce_results=False)
        assert trainer.apply_workers(os.getpid) == pids  # the same processes all along
        assert trainer.apply(lambda m: m.pid_seen) == pids
    assert [r["epoch"] for r in results] == [1, 2, 3]
    for r in results:
        assert set(r) == {"epoch", "batch_count", "num_samples", "train_loss", "last_train_loss",
                          "train_worker_batch_size", "last_train_worker_batch_size"}  # fmt: skip
        assert r["num_samples"] == 50 and r["batch_count"] == 4
        assert r["train_loss"] == pytest.approx(ref["loss"], abs=1e-6)
        assert r["train_worker_batch_size"] == 8.0  # config[BATCH_SIZE] 16 split over 2 workers
    assert set(val) == {"batch_count", "num_samples", "val_loss", "val_accuracy", "last_val_loss", "last_val_accuracy"}
    assert val["val_loss"] == pytest.approx(ref["loss"], abs=1e-6)
    assert val["val_accuracy"] == pytest.approx(ref["accuracy"], abs=1e-6)
    assert val["num_samples"] == 50
    assert [w["num_samples"] for w in per_worker] == [25, 25] and all(w["epoch"] == 4 for w in per_worker)
    assert not any(pid_alive(pid) for pid in pids)
    result = trainer.shutdown()  # idempotent: the Result of the run
    assert result is not None and result.error is None and result.checkpoint is not None
    assert trainer.get_model().model.weight.tolist() == _initial_net().weight.tolist()
    assert trainer.train_loop_config == {"lr": 0.0, BATCH_SIZE: 16, "n": 50}


@pytest.mark.slow
def test_validation_is_weighted_across_workers_with_unequal_parts(tmp_path):
    """Rank 0 validates 30 samples, rank 1 13: the mean over the workers is weighted by samples."""
    ref = _reference(50, list(range(43)))
    with ModelTrainer(Tiny, config={"uneven": True, "n": 50}, scaling_config=ScalingConfig(num_workers=2),
                      run_config=_rc(tmp_path, "uneven")) as trainer:  # fmt: skip
        val = trainer.validate()
        per_worker = trainer.validate(reduce_results=False)
    assert val["num_samples"] == 43
    assert val["val_loss"] == pytest.approx(ref["loss"], abs=1e-6)
    assert val["val_accuracy"] == pytest.approx(ref["accuracy"], abs=1e-6)
    unweighted = (per_worker[0]["val_loss"] + per_worker[1]["val_loss"]) / 2
    assert abs(unweighted - ref["loss"]) > 1e-3  # the test would catch an unweighted mean


def _kill_run(tmp_path, name, kill):
    config = {"lr": 0.1, BATCH_SIZE: 8, "n": 64, **({"kill": kill} if kill else {})}
    return ModelTrainer(
        Tiny, config=config, loop_config=LoopConfig(num_epochs=2, checkpoint_every_n_batches=2),
        scaling_config=ScalingConfig(num_workers=2), run_config=_rc(tmp_path, name, failures=1),
    ).fit()  # fmt: skip


@pytest.mark.slow
def test_sigkilled_worker_resumes_at_the_epoch_and_batch_with_the_same_metrics(tmp_path):
    """8 batches per worker per epoch, a checkpoint every 2: rank 1 dies starting batch 5 of epoch 1
    (0-based); the last checkpoint was after batch 3, so attempt 1 starts at epoch 1, batch 4, in the
    same data order and with the epoch's sums so far: every epoch's metrics equal an uninterrupted run's."""
    killed = _kill_run(tmp_path, "killed", {"epoch": 1, "batch": 5, "rank": 1})
    clean = _kill_run(tmp_path, "clean", None)
    assert {f.attempt for f in killed.failures} == {0} and not clean.failures  # one failed attempt
    assert any(f.rank == 1 and f.exit_code == -signal.SIGKILL for f in killed.failures)
    model = Tiny.from_checkpoint(killed.checkpoint)
    assert model.starts == [[0, 0, 0], [1, 1, 4]]  # (attempt, epoch, batch) where each attempt began
    assert model.steps == 16  # 8 optimizer steps per epoch, counted across the restart (state_dict hooks)
    epochs = lambda r: [row for row in r.metrics_history if "train_loss" in row]  # noqa: E731
    assert [row["epoch"] for row in epochs(killed)] == [1, 2]
    for a, b in zip(epochs(killed), epochs(clean), strict=True):
        for key in ("train_loss", "last_train_loss", "val_loss", "val_accuracy", "num_samples"):
            assert a[key] == pytest.approx(b[key], abs=1e-6), key
    clean_model = Tiny.from_checkpoint(clean.checkpoint)
    assert torch.allclose(model.model.weight, clean_model.model.weight, atol=1e-6)
    assert not torch.equal(model.model.weight, _initial_net().weight)  # get_model() has trained weights


@pytest.mark.slow
def test_driven_train_survives_a_worker_killed_mid_epoch(tmp_path):
    ref = _reference(50)
    config = {"lr": 0.0, BATCH_SIZE: 16, "n": 50, "kill": {"epoch": 1, "batch": 2, "rank": 1}}
    with ModelTrainer(Tiny, config=config, scaling_config=ScalingConfig(num_workers=2),
                      run_config=_rc(tmp_path, "driven-kill", failures=1)) as trainer:  # fmt: skip
        first = trainer.train()
        second = trainer.train()  # rank 1 dies in it; the restarted group answers it
        third = trainer.train()
    result = trainer.shutdown()
    assert [m["epoch"] for m in (first, second, third)] == [1, 2, 3]
    assert second["train_loss"] == pytest.approx(ref["loss"], abs=1e-6) and second["num_samples"] == 50
    assert {f.attempt for f in result.failures} == {0}
    assert any(f.rank == 1 and f.exit_code == -signal.SIGKILL for f in result.failures)


@pytest.mark.slow
def test_use_fp16_on_the_cpu_runs_the_forward_in_bfloat16(tmp_path):
    result = ModelTrainer(BF16Tiny, config={BATCH_SIZE: 10}, loop_config=LoopConfig(num_epochs=2, use_fp16=True),
                          run_config=_rc(tmp_path, "bf16")).fit()  # fmt: skip
    assert result.metrics["train_bf16"] == 1.0
    assert result.metrics["train_loss"] < result.metrics_history[0]["train_loss"] + 0.5  # it trains, finitely
    assert BF16Tiny.from_checkpoint(result.checkpoint).model.weight.dtype == torch.float32


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="float16 with a gradient scaler needs a GPU")
def test_use_fp16_on_a_gpu_runs_the_forward_in_float16_with_a_scaler(tmp_path):
    result = ModelTrainer(HalfTiny, config={BATCH_SIZE: 10}, loop_config=LoopConfig(num_epochs=2, use_fp16=True),
                          scaling_config=ScalingConfig(num_workers=1, use_gpu=True),
                          run_config=_rc(tmp_path, "fp16")).fit()  # fmt: skip
    assert result.metrics["train_half"] == 1.0
    with result.checkpoint.as_directory() as d:
        state = torch.load(os.path.join(d, "training_state.pt"), weights_only=False)
    assert state["scaler"] is not None


@pytest.mark.slow
@pytest.mark.parametrize(("freq", "lr"), [("batch", 0.1 * 0.5**8), ("epoch", 0.1 * 0.5**2)])
def test_scheduler_steps_per_batch_or_per_epoch(tmp_path, freq, lr):
    """2 epochs of 4 batches; StepLR halves the learning rate at each scheduler step."""
    result = ModelTrainer(Tiny, config={BATCH_SIZE: 8, "n": 32, "scheduler": True},
                          loop_config=LoopConfig(num_epochs=2, scheduler_step_freq=freq),
                          run_config=_rc(tmp_path, freq)).fit()  # fmt: skip
    assert Tiny.from_checkpoint(result.checkpoint).saved_lr == pytest.approx(lr)


@pytest.mark.slow
def test_gradient_accumulation_and_clipping(tmp_path):
    """2 workers, 8 batches each per epoch, 3 batches per optimizer step: steps after batches 3, 6 and
    8 of each epoch; every gradient clipped to norm 0.05."""
    result = ModelTrainer(Tiny, config={"lr": 0.5, BATCH_SIZE: 8, "n": 64},
                          loop_config=LoopConfig(num_epochs=2, gradient_accumulation_steps=3, grad_clip_norm=0.05),
                          scaling_config=ScalingConfig(num_workers=2), run_config=_rc(tmp_path, "accum")).fit()  # fmt: skip
    model = Tiny.from_checkpoint(result.checkpoint)
    assert model.steps == 6
    assert 0.04 < model.max_grad_norm <= 0.05 + 1e-6


@pytest.mark.slow
def test_early_stopping_stops_at_the_right_epoch_and_says_so(tmp_path):
    """lr=0: val_loss never improves after epoch 1; patience 2 stops after epoch 3 of 10."""
    result = ModelTrainer(Tiny, config={"lr": 0.0, BATCH_SIZE: 25},
                          loop_config=LoopConfig(num_epochs=10, early_stopping=EarlyStopping("val_loss", patience=2)),
                          run_config=_rc(tmp_path, "early")).fit()  # fmt: skip
    assert [row["epoch"] for row in result.metrics_history] == [1, 2, 3]
    assert [row["early_stopped"] for row in result.metrics_history] == [False, False, True]
    assert result.checkpoint is not None


@pytest.mark.slow
def test_async_train_step_runs_on_one_event_loop_per_worker(tmp_path):
    result = ModelTrainer(AsyncTiny, config={BATCH_SIZE: 10}, loop_config=LoopConfig(num_epochs=2),
                          run_config=_rc(tmp_path, "async")).fit()  # fmt: skip
    assert result.metrics["batch_count"] == 5
    assert AsyncTiny.from_checkpoint(result.checkpoint).loops_seen == 1


@pytest.mark.slow
@pytest.mark.parametrize("form", ["class", "trainer"])
def test_tuner_of_a_model_searches_its_hyperparameter_space(tmp_path, form):
    """Tuner(MyModel) and Tuner(ModelTrainer(MyModel, ...)): hyperparameter_space() is the default
    param_space (the model's config)."""
    from trainforge.tune import TuneConfig, Tuner

    trainable = TunedTiny if form == "class" else ModelTrainer(
        TunedTiny, config={BATCH_SIZE: 10}, loop_config=LoopConfig(num_epochs=2))  # fmt: skip
    grid = Tuner(trainable, tune_config=TuneConfig(num_samples=2, server=False, metric="train_loss", mode="min"),
                 run_config=RunConfig(storage_path=str(tmp_path), name="tuned", verbose=0)).fit()  # fmt: skip
    assert len(grid) == 2 and grid.num_errors == 0
    assert all(r.metrics["epoch"] == (1 if form == "class" else 2) for r in grid)
    lrs = [r.config["train_loop_config"]["lr"] for r in grid]
    assert all(0.01 <= lr <= 0.1 for lr in lrs) and lrs[0] != lrs[1]
    best = grid.get_best_result()
    assert TunedTiny.from_checkpoint(best.checkpoint).config["lr"] in lrs


@pytest.mark.slow
def test_restore_continues_a_run_from_its_latest_epoch(tmp_path):
    first = ModelTrainer(Tiny, config={BATCH_SIZE: 10}, run_config=_rc(tmp_path, "restored")).fit()
    assert ModelTrainer.can_restore(first.path)
    trainer = ModelTrainer.restore(first.path, loop_config=LoopConfig(num_epochs=2))
    assert isinstance(trainer, ModelTrainer) and trainer.config == {BATCH_SIZE: 10}
    result = trainer.fit()
    assert [row["epoch"] for row in result.metrics_history] == [1, 2]
    assert trainer.get_model().model.weight.tolist() != Tiny.from_checkpoint(first.checkpoint).model.weight.tolist()


@pytest.mark.slow
def test_the_digits_example_trains_predicts_saves_and_loads(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "examples", "model_digits.py"), "--epochs", "3", "--fp16",
         "--storage-path", str(tmp_path)],
        capture_output=True, text=True, timeout=240, cwd=REPO, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    accuracy = float(proc.stdout.split("inference accuracy:")[1].split()[0])
    assert accuracy > 0.85, proc.stdout
    assert "same predictions: True" in proc.stdout


@pytest.mark.slow
def test_a_driven_run_works_on_either_executor(tmp_path, executor):
    """On Ray the workers connect back to the driver's Ray node IP for their commands."""
    with ModelTrainer(Tiny, config={"lr": 0.0, BATCH_SIZE: 16}, run_config=_rc(tmp_path, f"either-{executor}"),
                      scaling_config=ScalingConfig(num_workers=2, executor=executor)) as trainer:  # fmt: skip
        pids = trainer.apply_workers(os.getpid)
        assert trainer.train()["train_loss"] == pytest.approx(_reference(50)["loss"], abs=1e-6)
        assert trainer.validate()["num_samples"] == 50
        assert trainer.apply_workers(os.getpid) == pids
