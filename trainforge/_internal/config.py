"""User-facing configuration dataclasses, validated on construction.

A bad value raises ``ValueError`` (or ``TypeError`` for a wrong type) naming the field, the value and
what is allowed, before any worker process is started.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
EXECUTORS = ("auto", "local", "ray")


class CheckpointUploadMode(enum.Enum):
    """How ``report(..., checkpoint=...)`` persists: SYNC returns once the files are in storage;
    ASYNC returns once they are copied to a local staging directory and uploads in the background
    (order, retention and the final Result stay correct; the run waits for pending uploads)."""

    SYNC = "SYNC"
    ASYNC = "ASYNC"

    @classmethod
    def parse(cls, value: Any, field_name: str) -> CheckpointUploadMode:
        if isinstance(value, cls):
            return value
        if isinstance(value, str) and value.upper() in cls.__members__:
            return cls[value.upper()]
        raise ValueError(f"{field_name}={value!r} is not valid: use CheckpointUploadMode.SYNC or .ASYNC.")


def _bad(cls: str, name: str, value: Any, allowed: str) -> ValueError:
    return ValueError(f"{cls}.{name}={value!r} is not valid: {allowed}.")


@dataclass
class ScalingConfig:
    """How many workers to run and what each one gets.

    Example::

        ScalingConfig(num_workers=4, use_gpu=True)
        ScalingConfig(num_workers=2, resources_per_worker={"CPU": 2, "GPU": 0.5})

    ``use_gpu=True`` gives each worker one GPU unless ``resources_per_worker["GPU"]`` says otherwise
    (fractions share a GPU between workers). Each worker gets its own ``CUDA_VISIBLE_DEVICES`` (on
    Ray: the GPUs Ray assigned to it); a worker without a GPU share gets an empty one and sees no GPU,
    as on Ray, so ``use_gpu=False`` trains on the CPU on a GPU machine too.

    ``executor`` (trainforge extension) says where the workers run:

    - ``"auto"`` (default): Ray actors when this process is connected to a Ray cluster already
      (``ray.init(...)`` was called) or ``$RAY_ADDRESS`` is set; local processes otherwise.
    - ``"local"``: processes on this machine, started by trainforge.
    - ``"ray"``: Ray actors (``pip install 'trainforge[ray]'``); without a connection, ``fit()`` calls
      ``ray.init()``, which joins ``$RAY_ADDRESS`` or starts a local Ray instance.

    On Ray the workers are placed in one placement group, one bundle per worker of
    ``resources_per_worker`` (1 CPU by default, plus GPUs and custom resources), with
    ``placement_strategy`` ``"PACK"``, ``"SPREAD"``, ``"STRICT_PACK"`` or ``"STRICT_SPREAD"``.
    Local workers all run on this machine and ignore it.
    """

    num_workers: int | tuple[int, int] = 1
    use_gpu: bool = False
    resources_per_worker: dict[str, float] | None = None
    placement_strategy: str = "PACK"
    executor: str = "auto"

    def __post_init__(self) -> None:
        n = self.num_workers
        if isinstance(n, list):
            n = self.num_workers = tuple(n)
        if isinstance(n, tuple):
            if (
                len(n) != 2
                or any(isinstance(v, bool) or not isinstance(v, int) for v in n)
                or n[0] < 1
                or n[1] < n[0]
            ):
                raise _bad(
                    "ScalingConfig", "num_workers", n, "an elastic range is a tuple (min, max) of ints with 1 <= min <= max"
                )
        elif isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(
                f"ScalingConfig.num_workers={n!r} must be an int (the number of workers) or a (min, max) tuple, "
                f"got {type(n).__name__}."
            )
        elif n < 1:
            raise _bad("ScalingConfig", "num_workers", n, "it must be an integer >= 1")
        if not isinstance(self.use_gpu, bool):
            raise TypeError(f"ScalingConfig.use_gpu={self.use_gpu!r} must be True or False.")
        if self.placement_strategy not in PLACEMENT_STRATEGIES:
            raise _bad(
                "ScalingConfig", "placement_strategy", self.placement_strategy, f"choose one of {PLACEMENT_STRATEGIES}"
            )
        if self.executor not in EXECUTORS:
            raise _bad("ScalingConfig", "executor", self.executor, f"choose one of {EXECUTORS}")
        res = self.resources_per_worker
        if res is not None:
            if not isinstance(res, dict):
                raise TypeError(
                    f"ScalingConfig.resources_per_worker={res!r} must be a dict like {{'CPU': 1, 'GPU': 1}}."
                )
            for key, amount in res.items():
                if not isinstance(key, str):
                    raise _bad("ScalingConfig", "resources_per_worker", res, "resource names must be strings")
                if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not math.isfinite(amount) or amount < 0:
                    raise _bad(
                        "ScalingConfig",
                        f"resources_per_worker[{key!r}]",
                        amount,
                        "amounts must be finite numbers >= 0",
                    )
            gpu = res.get("GPU")
            if self.use_gpu and gpu is not None and gpu == 0:
                raise _bad(
                    "ScalingConfig",
                    "resources_per_worker['GPU']",
                    gpu,
                    "use_gpu=True needs a GPU amount > 0 per worker; drop the 'GPU' key or set use_gpu=False",
                )
            if gpu and gpu > 1 and gpu != int(gpu):
                raise _bad(
                    "ScalingConfig",
                    "resources_per_worker['GPU']",
                    gpu,
                    "use a fraction <= 1 to share a GPU or a whole number for several GPUs",
                )

    @property
    def min_workers(self) -> int:
        return self.num_workers[0] if isinstance(self.num_workers, tuple) else self.num_workers

    @property
    def max_workers(self) -> int:
        return self.num_workers[1] if isinstance(self.num_workers, tuple) else self.num_workers

    @property
    def elastic(self) -> bool:
        return isinstance(self.num_workers, tuple) and self.num_workers[0] != self.num_workers[1]

    @property
    def gpus_per_worker(self) -> float:
        """GPUs each worker gets (0 when the run is CPU-only)."""
        res = self.resources_per_worker or {}
        if "GPU" in res:
            return float(res["GPU"])
        return 1.0 if self.use_gpu else 0.0

    @property
    def cpus_per_worker(self) -> float:
        return float((self.resources_per_worker or {}).get("CPU", 1))


@dataclass
class CheckpointConfig:
    """Which checkpoints to keep.

    By default every committed checkpoint is kept. With ``num_to_keep=k`` at most k are kept: the
    lowest scoring ones by ``checkpoint_score_attribute`` (a numeric key of the metrics reported with
    the checkpoint) are deleted, or the oldest when no attribute is given. The most recent checkpoint is
    always kept in addition, so a run can always resume from where it stopped (as in Ray Train).
    ``checkpoint_upload_mode`` is the run's default for ``report(checkpoint_upload_mode=...)``
    (trainforge extension; SYNC by default).

    ``checkpoint_frequency`` and ``checkpoint_at_end`` (Ray Train's fields) apply where trainforge's
    own loop decides when to checkpoint: the ``params=`` form of ``XGBoostTrainer`` and
    ``LightGBMTrainer`` saves the model every ``checkpoint_frequency`` boosting rounds (0: never
    during training) and at the end unless ``checkpoint_at_end=False``. A train loop of your own
    checkpoints whenever it passes ``report(checkpoint=...)``.
    """

    num_to_keep: int | None = None
    checkpoint_score_attribute: str | None = None
    checkpoint_score_order: str = "max"
    checkpoint_upload_mode: CheckpointUploadMode | str = CheckpointUploadMode.SYNC
    checkpoint_frequency: int = 0
    checkpoint_at_end: bool | None = None

    def __post_init__(self) -> None:
        self.checkpoint_upload_mode = CheckpointUploadMode.parse(
            self.checkpoint_upload_mode, "CheckpointConfig.checkpoint_upload_mode"
        )
        k = self.num_to_keep
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise _bad("CheckpointConfig", "num_to_keep", k, "use None (keep all) or an integer >= 1")
        if self.checkpoint_score_order not in ("max", "min"):
            raise _bad("CheckpointConfig", "checkpoint_score_order", self.checkpoint_score_order, "use 'max' or 'min'")
        attr = self.checkpoint_score_attribute
        if attr is not None and not isinstance(attr, str):
            raise _bad("CheckpointConfig", "checkpoint_score_attribute", attr, "use a metric name (str) or None")
        f = self.checkpoint_frequency
        if isinstance(f, bool) or not isinstance(f, int) or f < 0:
            raise _bad("CheckpointConfig", "checkpoint_frequency", f, "use an integer >= 0 (0: no periodic checkpoint)")
        if self.checkpoint_at_end not in (None, True, False):
            raise _bad("CheckpointConfig", "checkpoint_at_end", self.checkpoint_at_end, "use True, False or None")


@dataclass
class FailureConfig:
    """How often to restart the worker group after a failure. ``-1`` means without limit.

    ``hang_timeout_s`` (trainforge extension): a worker that is alive but has made no progress (no
    report, and no output line) for this long is declared hung: its Python stack (all threads) is
    captured, and it is handled as a failure. None (the default) turns hang detection off.
    """

    max_failures: int = 0
    hang_timeout_s: float | None = None

    def __post_init__(self) -> None:
        m = self.max_failures
        if isinstance(m, bool) or not isinstance(m, int) or m < -1:
            raise _bad("FailureConfig", "max_failures", m, "use an integer >= 0, or -1 for unlimited restarts")
        h = self.hang_timeout_s
        if h is not None and (isinstance(h, bool) or not isinstance(h, (int, float)) or not math.isfinite(h) or h <= 0):
            raise _bad("FailureConfig", "hang_timeout_s", h, "use None (no hang detection) or a number of seconds > 0")


@dataclass
class RunConfig:
    """Where results go and how the run behaves.

    ``storage_path`` defaults to ``~/trainforge_results`` (or ``$TRAINFORGE_STORAGE_PATH``); the run's
    directory is ``{storage_path}/{name}``; ``name`` defaults to ``{TrainerClass}_{timestamp}`` and is
    printed at start. ``storage_path`` may be any fsspec URL (``s3://bucket/prefix``, ``gs://...``,
    ``memory://...``); ``storage_filesystem`` takes a ready fsspec filesystem instead (then
    ``storage_path`` is a path inside it). ``verbose``: 0 prints nothing, 1 prints the run directory, worker start-up and
    rank-0 metrics at most once a second, 2 prints every report.

    ``stop`` (as Ray 2.x's ``RunConfig.stop``): ``{metric: value}`` (stop at the first result with
    ``result[metric] >= value``; ``"a/b"`` reads a nested metric), a function
    ``(trial_id, result) -> bool``, or a ``tune.Stopper`` (``from trainforge import tune``). In a Tuner it applies to
    every trial. In a trainer's ``fit()`` it applies too, as in Ray Train 2.x, where ``fit()`` runs as
    one Tune trial: each result is rank 0's report plus ``training_iteration`` (1, 2, ...) and
    ``trial_id`` (the run's name); the run ends at the first result the stopper accepts, that result
    being the last (its metrics are ``Result.metrics``, later reports are dropped), and ``fit()``
    returns normally. A stopper's ``stop_all()`` also ends the run.
    """

    name: str | None = None
    storage_path: str | None = None
    storage_filesystem: Any = None
    checkpoint_config: CheckpointConfig | None = None
    failure_config: FailureConfig | None = None
    callbacks: list[Any] | None = None
    verbose: int = 1
    log_to_driver: bool = True
    stop: Any = None

    def __post_init__(self) -> None:
        from trainforge._internal.stop_criteria import make_stopper

        make_stopper(self.stop)  # raises ValueError naming a bad value now, not at the first result
        if self.name is not None:
            if not isinstance(self.name, str) or not self.name or "/" in self.name or self.name in (".", ".."):
                raise _bad("RunConfig", "name", self.name, "use a non-empty string without '/'")
        if self.storage_path is not None and not isinstance(self.storage_path, str):
            try:
                import os

                self.storage_path = os.fspath(self.storage_path)
            except TypeError:
                raise _bad("RunConfig", "storage_path", self.storage_path, "use a path or an fsspec URL string") from None
        if self.checkpoint_config is None:
            self.checkpoint_config = CheckpointConfig()
        elif not isinstance(self.checkpoint_config, CheckpointConfig):
            raise TypeError(f"RunConfig.checkpoint_config={self.checkpoint_config!r} must be a CheckpointConfig.")
        if self.failure_config is None:
            self.failure_config = FailureConfig()
        elif not isinstance(self.failure_config, FailureConfig):
            raise TypeError(f"RunConfig.failure_config={self.failure_config!r} must be a FailureConfig.")
        if self.callbacks is not None and not isinstance(self.callbacks, (list, tuple)):
            raise TypeError(f"RunConfig.callbacks={self.callbacks!r} must be a list of trainforge.Callback.")
        if isinstance(self.verbose, bool) or self.verbose not in (0, 1, 2):
            raise _bad("RunConfig", "verbose", self.verbose, "use 0, 1 or 2")
