"""``prepare_dataset_shard``: a ``tf.data.Dataset`` built from this worker's shard, for distributed fit."""

from __future__ import annotations

from typing import Any

from trainforge.tensorflow.env import check_installed


def prepare_dataset_shard(tf_dataset_shard: Any) -> Any:
    """``tf_dataset_shard`` (a ``tf.data.Dataset`` of this worker's rows only, e.g. built from
    ``trainforge.get_dataset_shard("train")``) with TensorFlow's auto-sharding turned off (the rows are
    split across workers already) and prefetching on (``tf.data.AUTOTUNE``), as Ray Train's.

    ``tf.distribute`` still divides each batch among all the run's replicas: a batch of ``B`` rows of
    this shard is read as ``num_workers`` steps of ``B / num_workers`` rows. A dataset whose length
    TensorFlow knows (``from_tensor_slices``) makes ``model.fit`` count one step per batch, so it would
    read ``1/num_workers`` of the shard per epoch: build it with ``tf.data.Dataset.from_generator``
    (length unknown, as Ray Data's ``to_tf``), which ``fit`` reads to its end.
    """
    check_installed("prepare_dataset_shard")
    import tensorflow as tf

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return tf_dataset_shard.with_options(options).prefetch(tf.data.AUTOTUNE)
