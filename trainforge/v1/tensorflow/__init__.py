"""Ray Train 1.x's TensorFlow names (``ray.train.tensorflow`` -> ``trainforge.v1.tensorflow``).
``Trainer(backend="tensorflow")`` gives every worker its ``TF_CONFIG``, so
``tf.distribute.MultiWorkerMirroredStrategy()`` built in the train function joins them; the workers
run tf-keras (Keras 2) as ``tf.keras`` (see ``trainforge.tensorflow``). ``import
trainforge.v1.tensorflow`` does not import TensorFlow."""

from trainforge.tensorflow import TensorflowConfig, prepare_dataset_shard

__all__ = ["TensorflowConfig", "prepare_dataset_shard"]
