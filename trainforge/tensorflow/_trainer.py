"""``TensorflowTrainer``: a ``DataParallelTrainer`` whose workers form one TensorFlow cluster."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from trainforge._internal.framework_trainer import FrameworkTrainer
from trainforge.tensorflow._config import TensorflowConfig
from trainforge.tensorflow.env import check_installed, prepare_worker


class TensorflowTrainer(FrameworkTrainer):
    """Run ``train_loop_per_worker`` on N workers that ``tf.distribute.MultiWorkerMirroredStrategy``
    joins into one cluster (each worker's ``TF_CONFIG`` is set before the loop starts).

    Example::

        def train_loop(config):
            import tensorflow as tf
            from trainforge.tensorflow.keras import ReportCheckpointCallback

            strategy = tf.distribute.MultiWorkerMirroredStrategy()
            with strategy.scope():
                model = build_and_compile_model()
            model.fit(dataset, epochs=config["epochs"], callbacks=[ReportCheckpointCallback()])

        result = TensorflowTrainer(
            train_loop, train_loop_config={"epochs": 5}, scaling_config=ScalingConfig(num_workers=2)
        ).fit()

    Takes the arguments of :class:`trainforge.DataParallelTrainer`, plus ``tensorflow_config`` (a
    :class:`TensorflowConfig`; default ``TensorflowConfig()``).

    Each worker imports TensorFlow as it starts, with ``TF_USE_LEGACY_KERAS=1``, so ``tf.keras`` is
    tf-keras (Keras 2). Variables TensorFlow reads at import (``TF_CPP_MIN_LOG_LEVEL``,
    ``TF_ENABLE_ONEDNN_OPTS``) therefore belong in the driver's environment, which local workers
    inherit, not in ``worker_init_fn``. Under ``MultiWorkerMirroredStrategy``, ``fit``, ``evaluate``,
    ``predict`` and ``save`` are collectives: call them on every worker (one that skips a call leaves
    the others waiting for it).
    """

    # Each worker imports TensorFlow at start-up (TF_USE_LEGACY_KERAS set first), in parallel with the
    # driver's set-up; standby workers that replace failed ones have it loaded too.
    _preload_modules = ("trainforge.tensorflow._preload",)
    _framework = "tensorflow"
    _config_cls = TensorflowConfig

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        train_loop_config: dict[str, Any] | None = None,
        tensorflow_config: TensorflowConfig | None = None,
        scaling_config: Any = None,
        run_config: Any = None,
        datasets: dict[str, Any] | None = None,
        dataset_config: Any = None,
        metadata: dict[str, Any] | None = None,
        resume_from_checkpoint: Any = None,
        worker_init_fn: Callable[[], Any] | None = None,
    ):
        self._init_framework(
            train_loop_per_worker, tensorflow_config, train_loop_config=train_loop_config,
            scaling_config=scaling_config, run_config=run_config, datasets=datasets, dataset_config=dataset_config,
            metadata=metadata, resume_from_checkpoint=resume_from_checkpoint, worker_init_fn=worker_init_fn,
        )  # fmt: skip

    def _check_installed(self) -> None:
        check_installed(type(self).__name__)

    def _worker_init(self, backend_config: Any, worker_init_fn: Callable[[], Any] | None) -> Callable[[], Any]:
        # The worker's TensorFlow environment comes first, so the user's function may import it.
        if worker_init_fn is not None and not callable(worker_init_fn):
            raise TypeError(f"worker_init_fn={worker_init_fn!r} must be a function taking no arguments.")
        self._user_worker_init_fn = worker_init_fn
        return functools.partial(
            _init_worker, backend_config.intra_op_threads, backend_config.inter_op_threads, worker_init_fn
        )

    def _backend_state(self) -> dict[str, Any]:
        # restore() passes the user's own worker_init_fn back too (the constructor wraps it again).
        return {**super()._backend_state(), "worker_init_fn": self._user_worker_init_fn}


def _init_worker(
    intra_op_threads: int | None, inter_op_threads: int | None, user_fn: Callable[[], Any] | None
) -> None:
    prepare_worker(intra_op_threads, inter_op_threads)
    if user_fn is not None:
        user_fn()
