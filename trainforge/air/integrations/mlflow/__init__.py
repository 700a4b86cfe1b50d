"""MLflow (Ray's integration of the same name): ``MLflowLoggerCallback`` logs every report of a run
or of each tuner trial (nested under one parent run per experiment) from the driver, off the
training path; ``setup_mlflow`` starts a run inside the train loop (rank 0 only by default).

Needs ``pip install 'trainforge[mlflow]'`` (mlflow-skinny); imported only when a run starts. A file
store (``file:///abs/path`` or a path) works with no server.
"""

from trainforge._internal.sinks.mlflow import MLflowLoggerCallback, setup_mlflow

__all__ = ["MLflowLoggerCallback", "setup_mlflow"]
