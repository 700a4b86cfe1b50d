"""The model object for Keras (tf-keras, on TensorFlow): :class:`KerasModel`, and the managed trainer
``ModelTrainer`` hands it to.

``setup(config)`` builds and compiles a tf-keras model and registers it
(``self.register(model=..., epochs=..., batch_size=...)``); ``forward(inputs)`` is the model's
prediction. Build it with :attr:`KerasModel.keras` (the ``tf_keras`` module: Keras 2, what
``tf.keras`` is on the workers, where ``MultiWorkerMirroredStrategy`` needs it).

Training is the TensorFlow integration's: the managed trainer is a ``TensorflowTrainer`` whose train
loop, on each worker, builds the model inside ``MultiWorkerMirroredStrategy``'s scope (restoring the
latest checkpoint's model after a restart, from the epoch after it), reads this worker's shard of the
``"train"`` split (and ``"valid"`` whole) as a ``tf.data`` pipeline of ``(features, label)`` batches
(``prepare_dataset_shard``), and runs ``fit`` with the integration's ``ReportCheckpointCallback``:
every epoch's logs reported (``loss``, ``val_loss``, the compiled metrics), a checkpoint per epoch
holding ``model.keras`` and ``model.json`` (a model directory). ``batch_size`` is the global batch,
divided among the workers by ``tf.distribute``.
"""

from __future__ import annotations

import os
from typing import Any

from trainforge.model._base import FRAMEWORK_BASES, TRAINERS, BaseModel
from trainforge.model._dataset import TRAIN, VALID, label_column
from trainforge.model._gbdt import ManifestWriter
from trainforge.model._managed import ManagedTrainer
from trainforge.tensorflow import TensorflowTrainer

FILENAME = "model.keras"  # TensorflowCheckpoint.MODEL_FILENAME


class KerasModel(BaseModel):
    """A Keras model: ``setup(config)`` builds and compiles one and calls ``self.register(model=...)``.

    Example::

        class Digits(KerasModel):
            def setup(self, config):
                keras = self.keras
                model = keras.Sequential([keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
                model.compile(optimizer=keras.optimizers.Adam(config["lr"]), metrics=["accuracy"],
                              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
                self.register(model=model, epochs=config.get("epochs", 5), batch_size=64)

            def postprocess(self, logits):
                return logits.argmax(-1)

        ModelTrainer(Digits, data=DigitsData, config={"lr": 1e-3}).fit()
    """

    framework = "keras"

    def _init_state(self) -> None:
        self.model: Any = None
        self.epochs = 1
        self.batch_size = 32
        self.fit_kwargs: dict[str, Any] = {}

    @property
    def keras(self) -> Any:
        """The ``tf_keras`` module (Keras 2) to build the model with."""
        from trainforge.tensorflow.env import import_tf_keras

        return import_tf_keras()

    def register(self, *, model: Any, epochs: int = 1, batch_size: int = 32,
                 fit_kwargs: dict[str, Any] | None = None) -> None:  # fmt: skip
        """Register the compiled model (call it in ``setup``), the epochs ``fit`` runs, the global
        ``batch_size``, and more keyword arguments for ``model.fit``."""
        who = type(self).__name__
        if not callable(getattr(model, "fit", None)):
            raise ValueError(f"{who}.register(model={model!r}) is not valid: give a compiled tf-keras model")
        for name, value in (("epochs", epochs), ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{who}.register({name}={value!r}) is not valid: give an int >= 1")
        if fit_kwargs is not None and not isinstance(fit_kwargs, dict):
            raise ValueError(f"{who}.register(fit_kwargs={fit_kwargs!r}) is not valid: give a dict (or None)")
        self.model, self.epochs, self.batch_size, self.fit_kwargs = model, epochs, batch_size, dict(fit_kwargs or {})

    def forward(self, inputs: Any) -> Any:
        """The model's prediction for ``inputs`` (a numpy array), as a numpy array."""
        if self.model is None:
            raise RuntimeError(f"{type(self).__name__}.setup() registered no model: call self.register(model=...)")
        return self.model(inputs, training=False).numpy()

    # -- the backend ------------------------------------------------------------------------------
    def _save_files(self, directory: str) -> None:
        self.model.save(os.path.join(directory, FILENAME))

    def _load_files(self, directory: str) -> None:
        self.model = self.keras.models.load_model(os.path.join(directory, FILENAME))

    def _default_input(self, instances: list[Any]) -> Any:
        import numpy as np

        try:
            return np.asarray(instances, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"the inputs are not a numeric array ({exc}); {type(self).__name__} has no "
                             "preprocess(), so send numeric instances of one shape") from None  # fmt: skip

    @classmethod
    def _framework_versions(cls) -> dict[str, str]:
        from trainforge.tensorflow.env import tensorflow_version

        return {"tensorflow": tensorflow_version() or "unknown"}


FRAMEWORK_BASES.add(KerasModel)


def split_features(batch: dict[str, Any], label: str) -> tuple[Any, Any]:
    """(features, label) of a numpy batch: the other columns stacked as float32 (one column as it is)."""
    import numpy as np

    if label not in batch:
        raise ValueError(f"Data.label_column={label!r} is not a column of the split; its columns are {list(batch)}")
    rest = [k for k in batch if k != label]
    x = batch[rest[0]] if len(rest) == 1 else np.stack([batch[k] for k in rest], axis=1)
    return x.astype(np.float32, copy=False), batch[label]


def shard_dataset(shard: Any, label: str, batch_size: int) -> Any:
    """A ``tf.data`` pipeline of ``(features, label)`` batches over ``shard`` (length unknown, as
    ``prepare_dataset_shard`` asks)."""
    import tensorflow as tf

    from trainforge.tensorflow import prepare_dataset_shard

    def batches() -> Any:
        for batch in shard.iter_batches(batch_size=batch_size, batch_format="numpy"):
            yield split_features(batch, label)

    x, y = next(batches())
    signature = (tf.TensorSpec((None, *x.shape[1:]), tf.as_dtype(x.dtype)),
                 tf.TensorSpec((None, *y.shape[1:]), tf.as_dtype(y.dtype)))  # fmt: skip
    return prepare_dataset_shard(tf.data.Dataset.from_generator(batches, output_signature=signature))


class KerasModelLoop:
    """The train loop of a Keras model's managed trainer, on each worker (see the module docstring)."""

    def __init__(self, model_cls: type[KerasModel], names: list[str] | None = None, label: str | None = None):
        self.model_cls, self.names, self.label = model_cls, names, label

    def __call__(self, config: dict[str, Any]) -> None:
        import tensorflow as tf

        import trainforge
        from trainforge.tensorflow.keras import ReportCheckpointCallback

        assert self.names is not None and self.label is not None, "the run's data was not set up"
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        initial_epoch = 0
        with strategy.scope():
            model = self.model_cls(config)
            if model.model is None:
                raise ValueError(f"{self.model_cls.__qualname__}.setup() registered no model: call "
                                 "self.register(model=...) there")  # fmt: skip
            checkpoint = trainforge.get_checkpoint()
            if checkpoint is not None:  # a restart, or resume_from_checkpoint: that model, the epochs after it
                with checkpoint.as_directory() as directory:
                    model._load_files(directory)
                initial_epoch = int(checkpoint.get_metadata().get("epoch", -1)) + 1
        train = shard_dataset(trainforge.get_dataset_shard(TRAIN), self.label, model.batch_size)
        valid = None
        if VALID in self.names:
            valid = shard_dataset(trainforge.get_dataset_shard(VALID), self.label, model.batch_size)
        callback = ReportCheckpointCallback()
        callback._model_files = ManifestWriter(self.model_cls, config)
        model.model.fit(train, epochs=model.epochs, initial_epoch=initial_epoch, validation_data=valid,
                        callbacks=[callback], verbose=0, **model.fit_kwargs)  # fmt: skip

    def __repr__(self) -> str:
        return f"<keras loop of {self.model_cls.__qualname__}>"


class KerasModelTrainer(ManagedTrainer, TensorflowTrainer):
    """``ModelTrainer(a KerasModel)``: a ``TensorflowTrainer`` (see the module docstring)."""

    _allowed_splits = (TRAIN, VALID)
    train_loop_per_worker: Any

    def __init__(self, model_cls: Any, *, config: dict[str, Any] | None = None, data: Any = None,
                 scaling_config: Any = None, run_config: Any = None, metadata: dict[str, Any] | None = None,
                 resume_from_checkpoint: Any = None, worker_init_fn: Any = None, tensorflow_config: Any = None,
                 **torch_only: Any):  # fmt: skip
        given = sorted(k for k, v in torch_only.items() if v is not None)
        if given:
            raise TypeError(f"ModelTrainer: {given} are not arguments for a Keras model (it takes config, data, "
                            "scaling_config, run_config, metadata, resume_from_checkpoint, worker_init_fn and "
                            "tensorflow_config)")  # fmt: skip
        config, metadata = self._init_managed(model_cls, config, data, metadata, None, "ModelTrainer")
        if self.data is None or label_column(self.data) is None:
            raise ValueError("ModelTrainer: a Keras model trains on data=: give a trainforge.model.Data whose "
                             "setup(config) returns {'train': ..., 'valid': ...} and whose label_column names the label")
        super().__init__(
            KerasModelLoop(self.model_cls), train_loop_config=config, tensorflow_config=tensorflow_config,
            scaling_config=scaling_config, run_config=run_config, metadata=metadata,
            resume_from_checkpoint=resume_from_checkpoint, worker_init_fn=worker_init_fn,
        )  # fmt: skip

    def _use_splits(self, splits: dict[str, Any]) -> dict[str, Any]:
        self.train_loop_per_worker = KerasModelLoop(self.model_cls, sorted(splits), label_column(self.data))
        return splits

    def _constructor_state(self) -> dict[str, Any]:
        return {"trainer_cls": type(self), **self._managed_state(), "scaling_config": self.scaling_config,
                "run_config": self.run_config, "metadata": self.metadata, **self._backend_state()}  # fmt: skip


TRAINERS["keras"] = KerasModelTrainer
