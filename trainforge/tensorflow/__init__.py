"""TensorFlow integration (Ray Train's ``tensorflow`` names): ``MultiWorkerMirroredStrategy`` on
trainforge's workers.

Example::

    import trainforge
    from trainforge import ScalingConfig
    from trainforge.tensorflow import TensorflowCheckpoint, TensorflowTrainer
    from trainforge.tensorflow.keras import ReportCheckpointCallback

    def train_loop(config):
        import tensorflow as tf

        strategy = tf.distribute.MultiWorkerMirroredStrategy()  # joins the workers (TF_CONFIG)
        with strategy.scope():
            model = build_and_compile_model()
        model.fit(dataset, epochs=config["epochs"], callbacks=[ReportCheckpointCallback()])

    result = TensorflowTrainer(train_loop, train_loop_config={"epochs": 5},
                               scaling_config=ScalingConfig(num_workers=2)).fit()
    model = TensorflowCheckpoint(result.checkpoint.path, result.checkpoint.filesystem).get_model()

Keras: the workers run tf-keras (Keras 2), whose version matches TensorFlow's minor version
(tf-keras 2.21.x for TensorFlow 2.21), with ``TF_USE_LEGACY_KERAS=1`` set before TensorFlow is
imported, so ``tf.keras`` is tf-keras: Keras 3, which TensorFlow 2.16+ ships, does not work with
``MultiWorkerMirroredStrategy``. Install: ``pip install 'trainforge[tensorflow]'``, or
``pip install tensorflow-cpu==2.21.0`` then ``pip install tf-keras==2.21.0 --no-deps``.

``import trainforge.tensorflow`` does not import TensorFlow. A ``TensorflowTrainer`` raises
``ImportError`` naming what to install when TensorFlow or tf-keras is missing.
"""

from __future__ import annotations

from typing import Any

from trainforge.tensorflow._checkpoint import TensorflowCheckpoint
from trainforge.tensorflow._config import TensorflowConfig
from trainforge.tensorflow._trainer import TensorflowTrainer

__all__ = ["TensorflowTrainer", "TensorflowConfig", "TensorflowCheckpoint", "prepare_dataset_shard"]


def prepare_dataset_shard(tf_dataset_shard: Any) -> Any:
    """``tf_dataset_shard`` (a ``tf.data.Dataset`` of this worker's rows only) with TensorFlow's
    auto-sharding off and prefetching on, as Ray Train's. See
    ``trainforge.tensorflow._dataset.prepare_dataset_shard`` for how ``tf.distribute`` batches it."""
    from trainforge.tensorflow import _dataset

    return _dataset.prepare_dataset_shard(tf_dataset_shard)
