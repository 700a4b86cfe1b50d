"""Ray Train 1.x's callbacks (``ray.train.callbacks`` -> ``trainforge.v1.callbacks``): pass them in
``trainer.run(..., callbacks=[...])``.

- :class:`TrainingCallback`: the base class (``handle_result``, ``start_training``, ``finish_training``).
- :class:`JsonLoggerCallback`: ``{run_dir}/results.json``.
- :class:`TBXLoggerCallback`: TensorBoard event files in the run's directory (tensorboardX).
- :class:`MLflowLoggerCallback`: an MLflow run per ``run()`` (MLflow).
- :class:`PrintCallback`: each result on stdout.
"""

from trainforge.v1.callbacks._callback import TrainingCallback
from trainforge.v1.callbacks._logging import JsonLoggerCallback, PrintCallback, TBXLoggerCallback
from trainforge.v1.callbacks._mlflow import MLflowLoggerCallback

__all__ = ["JsonLoggerCallback", "MLflowLoggerCallback", "PrintCallback", "TBXLoggerCallback", "TrainingCallback"]
