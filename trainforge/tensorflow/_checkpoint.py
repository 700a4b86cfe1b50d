"""``TensorflowCheckpoint``: a checkpoint that holds a Keras model (tf-keras), and loads it back."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from trainforge import Checkpoint
from trainforge.tensorflow.env import import_tf_keras


class TensorflowCheckpoint(Checkpoint):
    """A :class:`trainforge.Checkpoint` holding a Keras model, as Ray Train's ``TensorflowCheckpoint``.

    Example::

        # in the train loop (what ReportCheckpointCallback does at each epoch's end)
        checkpoint = TensorflowCheckpoint.from_model(model)

        # after fit(), on the driver: the model of the run's latest checkpoint
        ckpt = result.checkpoint
        model = TensorflowCheckpoint(ckpt.path, ckpt.filesystem).get_model()

    The model is a tf-keras (Keras 2) model, saved in the Keras format (``model.keras``, or the file
    or directory given to :meth:`from_h5` / :meth:`from_saved_model`); the file's name is in the
    checkpoint's metadata under ``MODEL_FILENAME_KEY``. Loading needs tf-keras, not
    ``TF_USE_LEGACY_KERAS``: :meth:`get_model` calls ``tf_keras.models.load_model``.
    """

    MODEL_FILENAME_KEY = "_model_filename"
    MODEL_FILENAME = "model.keras"

    @classmethod
    def from_model(cls, model: Any) -> TensorflowCheckpoint:
        """Save ``model`` (a compiled tf-keras model keeps its optimizer state) into a new temporary
        directory and return it as a checkpoint; delete the directory once it was reported. Under
        ``MultiWorkerMirroredStrategy`` saving is a collective: call it on every worker."""
        directory = tempfile.mkdtemp(prefix="trainforge_keras_")
        try:
            model.save(os.path.join(directory, cls.MODEL_FILENAME))
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        return cls._with_model_file(directory, cls.MODEL_FILENAME)

    @classmethod
    def from_h5(cls, file_path: str | os.PathLike) -> TensorflowCheckpoint:
        """A checkpoint (a new temporary directory) holding a copy of the HDF5 model file ``file_path``."""
        file_path = os.fspath(file_path)
        if not os.path.isfile(file_path) or not file_path.endswith(".h5"):
            raise ValueError(f"TensorflowCheckpoint.from_h5({file_path!r}): not an existing .h5 file.")
        directory = tempfile.mkdtemp(prefix="trainforge_keras_")
        shutil.copy(file_path, directory)
        return cls._with_model_file(directory, os.path.basename(file_path))

    @classmethod
    def from_saved_model(cls, exported_model_dir: str | os.PathLike) -> TensorflowCheckpoint:
        """A checkpoint (a new temporary directory) holding a copy of the SavedModel directory
        ``exported_model_dir`` (what ``model.save(path, save_format="tf")`` writes)."""
        src = os.fspath(exported_model_dir)
        if not os.path.isfile(os.path.join(src, "saved_model.pb")):
            raise ValueError(
                f"TensorflowCheckpoint.from_saved_model({src!r}): no saved_model.pb in that directory."
            )
        directory = tempfile.mkdtemp(prefix="trainforge_keras_")
        shutil.copytree(src, directory, dirs_exist_ok=True)
        return cls._with_model_file(directory, None)  # a SavedModel is the directory itself

    @classmethod
    def _with_model_file(cls, directory: str, filename: str | None) -> TensorflowCheckpoint:
        checkpoint = cls.from_directory(directory)
        assert isinstance(checkpoint, TensorflowCheckpoint)
        if filename is not None:
            checkpoint.update_metadata({cls.MODEL_FILENAME_KEY: filename})
        return checkpoint

    def get_model(self, **load_model_kwargs: Any) -> Any:
        """The model, loaded with ``tf_keras.models.load_model`` (``load_model_kwargs`` go to it, e.g.
        ``custom_objects=``). In a train loop, call it inside ``strategy.scope()`` to continue training
        it distributed."""
        tf_keras: Any = import_tf_keras()
        filename = self.get_metadata().get(self.MODEL_FILENAME_KEY)
        with self.as_directory() as directory:
            if filename:
                return tf_keras.models.load_model(os.path.join(directory, filename), **load_model_kwargs)
            if os.path.isfile(os.path.join(directory, "saved_model.pb")):
                return tf_keras.models.load_model(directory, **load_model_kwargs)
            raise ValueError(
                f"{self!r} holds no Keras model: its metadata has no {self.MODEL_FILENAME_KEY!r} and it is not "
                "a SavedModel directory. Make it with TensorflowCheckpoint.from_model(model) (or "
                "ReportCheckpointCallback)."
            )
