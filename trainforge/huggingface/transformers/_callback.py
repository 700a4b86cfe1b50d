"""``RayTrainReportCallback``: a ``transformers.Trainer`` reports its metrics and checkpoints to trainforge.

What a rank reports, and when:

- every ``on_log`` (training logs, evaluation metrics, the final summary) updates one dict holding every
  key logged so far with its latest value, plus ``step`` (``state.global_step``); a resumed run starts
  from the checkpoint's ``log_history``. So a checkpoint's metrics are always the latest ones, whatever
  ``logging_steps`` / ``eval_steps`` / ``save_steps`` are (Ray's callback takes the last log entry, so
  it needs ``save_steps % eval_steps == 0``).
- ``on_save`` reports that dict with the checkpoint at once. The logs of a step without a save are
  reported together at the next step, epoch or the end of training: one report per step that logged.
  Every rank reports the same number of times, since the Trainer logs and saves on every rank.
- The checkpoint is the directory the Trainer just wrote (``checkpoint-<step>``, or
  ``tmp-checkpoint-<step>`` where transformers 4.37 stages it), under ``CHECKPOINT_NAME`` in the run's
  checkpoint. Rank 0 hands over its files except the other ranks' RNG states; every other rank hands
  over only its own ``rng_state_<rank>.pth``. So the files are persisted once, not once per rank, and
  each rank's RNG state comes from the rank that wrote it (also on hosts that share no file system).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from typing import Any

from trainforge import Checkpoint, report
from trainforge.huggingface.transformers._imports import import_transformers

_TrainerCallback: Any = import_transformers().TrainerCallback

_RANK_FILE = re.compile(r"rng_state_(\d+)\.pth$")


class RayTrainReportCallback(_TrainerCallback):  # type: ignore[misc]
    """Report the Trainer's logged and evaluation metrics and its checkpoints to trainforge.

    Example::

        trainer = transformers.Trainer(..., callbacks=[RayTrainReportCallback()])
        # or: trainer.add_callback(RayTrainReportCallback())

    A run's checkpoint holds the Trainer's checkpoint directory in ``CHECKPOINT_NAME``: resume with
    ``trainer.train(resume_from_checkpoint=os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME))``.
    See the module docstring for what is reported when.
    """

    CHECKPOINT_NAME = "checkpoint"

    def __init__(self) -> None:
        super().__init__()
        self._metrics: dict[str, Any] = {}
        self._pending = False
        self._training = False

    # -- events -------------------------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._training = True
        self._pending = False
        self._metrics = {}
        for entry in state.log_history:  # a run resumed from a checkpoint continues its history
            self._metrics.update(entry)

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        self._metrics.update(logs or {})
        self._metrics["step"] = state.global_step
        self._pending = True
        if not self._training:  # trainer.evaluate() outside train(): no later event to wait for
            self._flush()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._flush()

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._flush()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._flush()
        self._training = False

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        source = _saved_directory(args.output_dir, state.global_step, rank=args.process_index)
        # Staged beside the Trainer's files (same file system: hard links, no copy); the Trainer's
        # checkpoint rotation only looks at checkpoint-* directories.
        where = args.output_dir if os.path.isdir(args.output_dir) else None
        staging = tempfile.mkdtemp(prefix=".trainforge-", dir=where)
        try:
            target = os.path.join(staging, self.CHECKPOINT_NAME)
            linked = _link_own_files(source, target, args.process_index) if source else 0
            checkpoint = Checkpoint.from_directory(staging) if linked else None
            if args.process_index == 0 and checkpoint is None:
                raise RuntimeError(
                    f"RayTrainReportCallback: the Trainer saved at step {state.global_step} but no "
                    f"checkpoint-{state.global_step} directory with files is in output_dir="
                    f"{args.output_dir!r}. Keep the Trainer's default checkpoint layout (no custom "
                    "_save_checkpoint / output directory per trial)."
                )
            self._metrics["step"] = state.global_step
            if state.epoch is not None:
                self._metrics["epoch"] = state.epoch
            report(dict(self._metrics), checkpoint=checkpoint)
            self._pending = False
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _flush(self) -> None:
        if self._pending:
            self._pending = False
            report(dict(self._metrics))


def _saved_directory(output_dir: str, step: int, rank: int) -> str | None:
    """The directory the Trainer saved step ``step`` into: ``checkpoint-<step>``, else its staging
    name ``tmp-checkpoint-<step>`` (transformers 4.37, where only rank 0 renames it), else the
    newest ``checkpoint-*`` (rank 0 only: another rank may have nothing of its own to hand over)."""
    for name in (f"checkpoint-{step}", f"tmp-checkpoint-{step}"):
        path = os.path.join(output_dir, name)
        if os.path.isdir(path):
            return path
    if rank != 0:
        return None
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None


def _owned(relpath: str, rank: int) -> bool:
    """Whether ``rank`` hands over the file ``relpath``: its own RNG state; on rank 0, every file
    that is not another rank's RNG state."""
    match = _RANK_FILE.search(relpath)
    if match is not None:
        return int(match.group(1)) == rank
    return rank == 0


def _link_own_files(source: str, target: str, rank: int) -> int:
    """Hard-link (copy across file systems) the files of ``source`` this rank owns into ``target``;
    return how many."""
    count = 0
    for root, _dirs, files in os.walk(source):
        for name in files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, source)
            if not _owned(rel, rank):
                continue
            dest = os.path.join(target, rel)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            try:
                os.link(path, dest)
            except OSError:
                shutil.copy2(path, dest)
            count += 1
    return count
