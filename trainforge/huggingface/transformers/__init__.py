"""Hugging Face Transformers in a trainforge train loop (Ray Train's `huggingface.transformers` names).

Build the ``transformers.Trainer`` inside the train loop of a :class:`trainforge.torch.TorchTrainer`:
Accelerate adopts the process group trainforge set up (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ...).
Add :class:`RayTrainReportCallback` so the Trainer's logged and evaluation metrics are reported and
its checkpoints become the run's, and pass the Trainer through :func:`prepare_trainer`.

Example::

    from trainforge.huggingface.transformers import RayTrainReportCallback, prepare_trainer

    def train_loop(config):
        args = transformers.TrainingArguments(output_dir="out", eval_strategy="steps", eval_steps=50,
                                              save_steps=100, max_steps=300, report_to="none")
        trainer = transformers.Trainer(model=build_model(), args=args, train_dataset=train_ds,
                                       eval_dataset=eval_ds, callbacks=[RayTrainReportCallback()])
        trainer = prepare_trainer(trainer)
        checkpoint = trainforge.get_checkpoint()
        if checkpoint:
            with checkpoint.as_directory() as d:
                trainer.train(resume_from_checkpoint=os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME))
        else:
            trainer.train()

    TorchTrainer(train_loop, scaling_config=ScalingConfig(num_workers=2)).fit()

``import trainforge.huggingface.transformers`` does not import transformers: the first use of either
name does, and raises ``ImportError`` naming the extra to install when it is missing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainforge.huggingface.transformers._callback import RayTrainReportCallback

__all__ = ["RayTrainReportCallback", "prepare_trainer"]


def prepare_trainer(trainer: Any) -> Any:
    """Check ``trainer`` (a ``transformers.Trainer``) joined this run's process group and let it read
    trainforge datasets; return it.

    Raises ``RuntimeError`` when the Trainer sees a different world size than the run (its
    ``TrainingArguments`` were built outside the train loop, before the process group existed).
    A ``train_dataset`` / ``eval_dataset`` that is a shard from ``trainforge.get_dataset_shard(name)``
    is read with ``iter_torch_batches`` at ``per_device_{train,eval}_batch_size`` (it is already this
    worker's part: the Trainer does not split it again; ranks read the same number of rows, so up to
    ``num_workers - 1`` rows of a split dataset are left out); a one-shot iterator of batches (a
    generator) is read as is, as Ray does (set ``max_steps``). Other datasets are left to the Trainer.
    See ``trainforge.huggingface.transformers._trainer``.
    """
    from trainforge.huggingface.transformers import _trainer

    return _trainer.prepare_trainer(trainer)


def __getattr__(name: str) -> Any:
    if name == "RayTrainReportCallback":
        from trainforge.huggingface.transformers import _callback

        return _callback.RayTrainReportCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
