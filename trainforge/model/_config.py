"""``LoopConfig`` and ``EarlyStopping``: what the managed loop does, validated on construction.

A bad value raises ``ValueError`` naming the field, the value and what is allowed, on the driver,
before any worker starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# RaySGD's names (its ``utils`` module): a config key and two metric keys.
BATCH_SIZE = "batch_size"  # config[BATCH_SIZE] is the global batch size, divided among the workers
NUM_SAMPLES = "num_samples"
BATCH_COUNT = "batch_count"

SCHEDULER_STEP_FREQS = ("batch", "epoch", "manual")
FP16_VALUES = (False, True, "bf16", "fp16")
MODES = ("min", "max")


def _bad(cls: str, name: str, value: Any, allowed: str) -> ValueError:
    return ValueError(f"{cls}.{name}={value!r} is not valid: {allowed}.")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class EarlyStopping:
    """Stop ``fit()`` once ``metric`` (a key of the epoch's metrics, e.g. ``"val_loss"``) has not
    improved by more than ``min_delta`` for ``patience`` evaluations in a row (``mode``: ``"min"`` or
    ``"max"``). The last report then has ``early_stopped: True`` and the run ends with a checkpoint.

    Example::

        LoopConfig(num_epochs=50, early_stopping=EarlyStopping("val_loss", mode="min", patience=3))
    """

    metric: str
    mode: str = "min"
    patience: int = 3
    min_delta: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.metric, str) or not self.metric:
            raise _bad("EarlyStopping", "metric", self.metric, "use the name of a reported metric, e.g. 'val_loss'")
        if self.mode not in MODES:
            raise _bad("EarlyStopping", "mode", self.mode, "use 'min' or 'max'")
        if not _is_int(self.patience) or self.patience < 0:
            raise _bad("EarlyStopping", "patience", self.patience, "use an integer >= 0")
        d = self.min_delta
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not math.isfinite(d) or d < 0:
            raise _bad("EarlyStopping", "min_delta", d, "use a number >= 0")


@dataclass
class LoopConfig:
    """What the managed loop does around the model's hooks.

    Example::

        LoopConfig(num_epochs=10, use_fp16=True, scheduler_step_freq="batch", grad_clip_norm=1.0,
                   checkpoint_every_n_epochs=1, checkpoint_every_n_batches=100,
                   early_stopping=EarlyStopping("val_loss", patience=3))

    - ``num_epochs``: epochs ``fit()`` runs (a driven run's ``train()`` runs one per call).
    - ``use_fp16``: mixed precision. ``True``: float16 with a gradient scaler on a GPU, bfloat16 on the
      CPU; ``"bf16"`` or ``"fp16"`` choose the dtype (``"fp16"`` always uses the scaler).
    - ``scheduler_step_freq`` (RaySGD's names): ``"batch"`` steps the registered schedulers after every
      optimizer step, ``"epoch"`` after every training epoch, ``"manual"`` never (step them yourself).
    - ``gradient_accumulation_steps``: batches whose gradients are summed before one optimizer step
      (the loss is divided by it; DDP all-reduces only on the step's last batch).
    - ``grad_clip_norm``: clip the gradients' total norm to this before each optimizer step.
    - ``checkpoint_every_n_epochs``: a checkpoint after every n-th epoch (0: only after the last);
      ``checkpoint_every_n_batches``: also one every n batches within an epoch (a multiple of
      ``gradient_accumulation_steps``), from which a restart resumes at that batch.
    - ``early_stopping``: an :class:`EarlyStopping`, or None.
    - ``validate_every_n_epochs``: ``fit()`` validates after every n-th epoch and after the last (0: never).
    """

    num_epochs: int = 1
    use_fp16: bool | str = False
    scheduler_step_freq: str = "epoch"
    gradient_accumulation_steps: int = 1
    grad_clip_norm: float | None = None
    checkpoint_every_n_epochs: int = 1
    checkpoint_every_n_batches: int | None = None
    early_stopping: EarlyStopping | None = None
    validate_every_n_epochs: int = 1

    def __post_init__(self) -> None:
        c = "LoopConfig"
        if not _is_int(self.num_epochs) or self.num_epochs < 1:
            raise _bad(c, "num_epochs", self.num_epochs, "use an integer >= 1")
        if not any(self.use_fp16 is v or (isinstance(v, str) and self.use_fp16 == v) for v in FP16_VALUES):
            raise _bad(c, "use_fp16", self.use_fp16, "use False, True, 'bf16' or 'fp16'")
        if self.scheduler_step_freq not in SCHEDULER_STEP_FREQS:
            raise _bad(c, "scheduler_step_freq", self.scheduler_step_freq, f"choose one of {SCHEDULER_STEP_FREQS}")
        g = self.gradient_accumulation_steps
        if not _is_int(g) or g < 1:
            raise _bad(c, "gradient_accumulation_steps", g, "use an integer >= 1")
        n = self.grad_clip_norm
        if n is not None and (isinstance(n, bool) or not isinstance(n, (int, float)) or not math.isfinite(n) or n <= 0):
            raise _bad(c, "grad_clip_norm", n, "use None (no clipping) or a number > 0")
        e = self.checkpoint_every_n_epochs
        if not _is_int(e) or e < 0:
            raise _bad(c, "checkpoint_every_n_epochs", e, "use an integer >= 0 (0: only after the last epoch)")
        b = self.checkpoint_every_n_batches
        if b is not None and (not _is_int(b) or b < 1):
            raise _bad(c, "checkpoint_every_n_batches", b, "use None or an integer >= 1")
        if b is not None and b % g:
            raise _bad(
                c, "checkpoint_every_n_batches", b,
                f"use a multiple of gradient_accumulation_steps={g} (a checkpoint is taken after an optimizer step)",
            )  # fmt: skip
        if self.early_stopping is not None and not isinstance(self.early_stopping, EarlyStopping):
            raise _bad(c, "early_stopping", self.early_stopping, "use None or a trainforge.model.EarlyStopping")
        v = self.validate_every_n_epochs
        if not _is_int(v) or v < 0:
            raise _bad(c, "validate_every_n_epochs", v, "use an integer >= 0 (0: fit() never validates)")

    @property
    def amp_dtype(self) -> str | None:
        """The ``amp_dtype`` for ``trainforge.torch.accelerate`` (None: the device's default)."""
        return {"bf16": "bfloat16", "fp16": "float16"}.get(self.use_fp16) if isinstance(self.use_fp16, str) else None


def split_batch_size(config: dict[str, Any], world_size: int) -> dict[str, Any]:
    """A worker's copy of ``config`` with ``config[BATCH_SIZE]`` (the global batch) divided among
    ``world_size`` workers, as RaySGD did. Without the key, ``config`` is returned as it is."""
    if BATCH_SIZE not in config:
        return config
    global_batch = config[BATCH_SIZE]
    if not _is_int(global_batch) or global_batch < world_size:
        raise ValueError(
            f"config[{BATCH_SIZE!r}]={global_batch!r} is not valid: it is the global batch size, split among "
            f"{world_size} worker(s); use an integer >= {world_size}."
        )
    return {**config, BATCH_SIZE: global_batch // world_size}
