"""Hugging Face Transformers in a trainforge run: a ``transformers.Trainer`` in the train loop of a
2-worker ``TorchTrainer`` (tiny BERT built from a config, token ids straight from scikit-learn's digits:
no tokenizer, nothing downloaded), its metrics and checkpoints in the ``Result``, a SIGKILLed worker and
the restart from the last checkpoint, the example, and the errors a user can cause."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import trainforge as train
from trainforge import FailureConfig, RunConfig, ScalingConfig
from trainforge.torch import TorchTrainer

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytest.importorskip("sklearn")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.slow


def _digits_tokens(rows: int | None = None):
    """Digits as token ids (pixel intensities 0..16) and labels."""
    import numpy as np
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x, y = x.astype(np.int64)[:rows], y.astype(np.int64)[:rows]
    return x, y


def _trainer(config: dict, train_dataset, eval_dataset, callbacks):
    os.environ["HF_HUB_OFFLINE"] = "1"
    import transformers

    from trainforge.huggingface.transformers import RayTrainReportCallback, prepare_trainer

    transformers.set_seed(0)
    model = transformers.BertForSequenceClassification(
        transformers.BertConfig(
            vocab_size=17, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
            max_position_embeddings=64, num_labels=10,
        )
    )  # fmt: skip
    args = transformers.TrainingArguments(
        output_dir=config["output_dir"],
        max_steps=12,
        per_device_train_batch_size=16,
        per_device_eval_batch_size=64,
        logging_steps=2,
        eval_strategy="steps",
        eval_steps=3,
        save_steps=4,  # not a multiple of eval_steps: the callback keeps the latest eval metrics itself
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        ddp_find_unused_parameters=False,
    )
    trainer = transformers.Trainer(
        model=model,
        args=args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        callbacks=[RayTrainReportCallback(), *callbacks],
    )
    return prepare_trainer(trainer)


def _merged(history: list[dict]) -> dict:
    merged: dict = {}
    for entry in history:
        merged.update(entry)
    return merged


def test_trainer_metrics_and_one_checkpoint_per_save(tmp_path):
    """Result.metrics is what the Trainer logged (train, eval, the summary and a later evaluate()),
    every save is one run checkpoint holding the model once and each rank's RNG state."""
    output_dir = str(tmp_path / "hf")

    def loop(config):
        import torch

        x, y = _digits_tokens()
        rows = [{"input_ids": torch.tensor(a), "labels": int(b)} for a, b in zip(x, y, strict=True)]
        trainer = _trainer(config, rows[:1200], rows[1200:1400], [])
        trainer.train()
        trainer.evaluate()  # outside train(): reported at once
        if train.get_context().get_world_rank() == 0:
            with open(config["history"], "w") as f:
                json.dump(trainer.state.log_history, f)

    history_path = str(tmp_path / "history.json")
    result = TorchTrainer(
        loop,
        train_loop_config={"output_dir": output_dir, "history": history_path},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(tmp_path / "runs"), name="hf", verbose=0),
    ).fit()
    history = json.load(open(history_path))
    assert result.metrics == _merged(history)
    assert {"loss", "eval_loss", "train_loss", "learning_rate"} <= set(result.metrics)
    assert result.metrics["step"] == 12

    # One run checkpoint per save (steps 4, 8, 12), each with the latest eval metrics at that step.
    saved = [(ckpt, metrics) for ckpt, metrics in result.best_checkpoints]
    assert [m["step"] for _, m in saved] == [4, 8, 12]
    logged_evals = {e["step"]: e["eval_loss"] for e in history if "eval_loss" in e}
    assert [m["eval_loss"] for _, m in saved] == [logged_evals[3], logged_evals[6], logged_evals[12]]
    run_dir = result.path
    assert sorted(d for d in os.listdir(run_dir) if d.startswith("checkpoint_")) == [
        "checkpoint_000000", "checkpoint_000001", "checkpoint_000002"
    ]  # fmt: skip
    for ckpt, metrics in saved:
        files = set(os.listdir(os.path.join(ckpt.path, "checkpoint")))
        assert {
            "model.safetensors",
            "optimizer.pt",
            "trainer_state.json",
            "rng_state_0.pth",
            "rng_state_1.pth",
        } <= files
        state = json.load(open(os.path.join(ckpt.path, "checkpoint", "trainer_state.json")))
        assert state["global_step"] == metrics["step"]
    last = os.path.join(saved[-1][0].path, "checkpoint", "rng_state_1.pth")
    assert (
        open(last, "rb").read()
        == open(os.path.join(output_dir, "checkpoint-12", "rng_state_1.pth"), "rb").read()
    )
    assert not [d for d in os.listdir(output_dir) if d.startswith(".trainforge-")]  # staging removed


def test_sigkilled_worker_resumes_from_last_checkpoint_on_shards(tmp_path):
    """Shards of ``datasets=`` through prepare_trainer (201 rows: the ranks' shards differ by one row
    and read the same number); rank 1 is SIGKILLed at step 6 of attempt 0; attempt 1 resumes the
    Trainer from the step-4 checkpoint and finishes."""
    x, y = _digits_tokens(201)
    starts = tmp_path / "starts.txt"

    def loop(config):
        import signal

        import transformers

        from trainforge.huggingface.transformers import RayTrainReportCallback

        ctx = train.get_context()

        class Probe(transformers.TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                with open(config["starts"], "a") as f:
                    f.write(f"{ctx.get_attempt()} {ctx.get_world_rank()} {state.global_step}\n")

            def on_step_end(self, args, state, control, **kwargs):
                if ctx.get_attempt() == 0 and ctx.get_world_rank() == 1 and state.global_step == 6:
                    os.kill(os.getpid(), signal.SIGKILL)

        shard = train.get_dataset_shard("train")
        trainer = _trainer(config, shard, train.get_dataset_shard("eval"), [Probe()])
        assert len(trainer.get_train_dataloader()) == 7  # 100 rows on each rank, batches of 16
        checkpoint = train.get_checkpoint()
        if checkpoint:
            with checkpoint.as_directory() as d:
                trainer.train(resume_from_checkpoint=os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME))
        else:
            trainer.train()

    result = TorchTrainer(
        loop,
        train_loop_config={"output_dir": str(tmp_path / "hf"), "starts": str(starts)},
        datasets={"train": {"input_ids": x, "labels": y}, "eval": {"input_ids": x[:64], "labels": y[:64]}},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            storage_path=str(tmp_path / "runs"),
            name="hfkill",
            verbose=0,
            failure_config=FailureConfig(max_failures=1),
        ),
    ).fit()
    assert result.error is None
    # rank 1's death (rank 0's collective may fail too, even noticed first)
    (killed,) = [f for f in result.failures if f.kind == "died"]
    assert (killed.attempt, killed.rank) == (0, 1) and "SIGKILL" in killed.exit_description()
    assert {f.attempt for f in result.failures} == {0}
    assert sorted(starts.read_text().split("\n")[:-1]) == ["0 0 0", "0 1 0", "1 0 4", "1 1 4"]
    assert result.metrics["step"] == 12 and "eval_loss" in result.metrics
    with result.checkpoint.as_directory() as d:
        state = json.load(open(os.path.join(d, "checkpoint", "trainer_state.json")))
    assert state["global_step"] == 12
    steps = list(result.metrics_dataframe["step"])
    assert steps[-1] == 12 and 4 in steps


def test_example_trains_and_checkpoints(tmp_path):
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "examples", "huggingface_transformers.py"), "--epochs", "2",
         "--storage-path", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=240,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "eval_accuracy: " in proc.stdout
    checkpoint = proc.stdout.split("checkpoint: ")[-1].strip()
    assert os.path.isfile(os.path.join(checkpoint, "checkpoint", "model.safetensors")), proc.stdout


_IMPORT_CHECK = """
import sys
sys.modules["transformers"] = None  # as if not installed
import trainforge.huggingface.transformers as hf
assert "torch" not in sys.modules  # importing the subpackage imports no framework
try:
    hf.RayTrainReportCallback
except ImportError as exc:
    print("ERROR=" + str(exc))
"""


def test_missing_transformers_names_the_extra_and_the_import_is_light():
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORT_CHECK], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr
    assert "ERROR=" in proc.stdout and "pip install 'trainforge[transformers]'" in proc.stdout, proc.stdout


def test_prepare_trainer_errors(monkeypatch):
    from trainforge.huggingface.transformers import _trainer, prepare_trainer

    with pytest.raises(TypeError, match="takes a transformers.Trainer, got dict"):
        prepare_trainer({})

    class Args:
        world_size = 1

    class FakeTrainer(_trainer.import_transformers().Trainer):
        def __init__(self):
            self.args = Args()

    class Context:
        def get_world_size(self):
            return 2

    monkeypatch.setattr(_trainer, "in_session", lambda: True)
    monkeypatch.setattr(_trainer, "get_context", lambda: Context())
    with pytest.raises(
        RuntimeError, match="sees world_size=1, but this run has 2 workers.*inside the train loop"
    ):
        prepare_trainer(FakeTrainer())


def test_rank_file_ownership():
    from trainforge.huggingface.transformers._callback import _owned

    assert _owned("model.safetensors", 0) and not _owned("model.safetensors", 1)
    assert _owned("rng_state_0.pth", 0) and not _owned("rng_state_1.pth", 0)
    assert _owned("rng_state_1.pth", 1) and not _owned("rng_state_0.pth", 1)
    assert _owned("rng_state.pth", 0)  # one process: no rank in the name


def test_public_names_are_pinned():
    import trainforge.huggingface
    import trainforge.huggingface.transformers as hf

    assert trainforge.huggingface.__all__ == []
    assert hf.__all__ == ["RayTrainReportCallback", "prepare_trainer"]
    assert hf.RayTrainReportCallback.CHECKPOINT_NAME == "checkpoint"  # Ray's layout: <checkpoint>/checkpoint/
