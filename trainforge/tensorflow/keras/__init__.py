"""Keras in a trainforge train loop (Ray Train's ``tensorflow.keras`` names): ``model.fit(dataset,
callbacks=[ReportCheckpointCallback()])`` in the train loop of a
:class:`trainforge.tensorflow.TensorflowTrainer` (whose docstring has the whole example) reports
Keras's logs and checkpoints the model.

Keras is tf-keras (Keras 2), whose version matches TensorFlow's minor version (tf-keras 2.21.x for
TensorFlow 2.21): ``pip install 'tf-keras~=2.21.0' --no-deps``. ``import trainforge.tensorflow.keras``
does not import TensorFlow; the first use of ``ReportCheckpointCallback`` does, and raises
``ImportError`` naming what to install when TensorFlow or tf-keras is missing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainforge.tensorflow.keras._callback import ReportCheckpointCallback

__all__ = ["ReportCheckpointCallback"]


def __getattr__(name: str) -> Any:
    if name == "ReportCheckpointCallback":
        from trainforge.tensorflow.keras import _callback

        return _callback.ReportCheckpointCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
