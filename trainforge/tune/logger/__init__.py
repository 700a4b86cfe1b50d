"""Tracker sinks for train runs and tuner trials, under the names of Ray Tune's ``logger`` module
(port by changing the import to ``trainforge.tune.logger``).

Pass them in ``trainforge.RunConfig(callbacks=[...])`` (a ``fit()``) or in
``trainforge.tune.RunConfig(callbacks=[...])`` (a ``Tuner``: one file set per trial, in its
directory). They run on the driver, each on its own thread: ``report()`` never waits for them, and
one that fails or falls behind is logged and counted, never fails training.

- :class:`JsonLoggerCallback`: ``result.json`` (a JSON line per report) and ``params.json``.
- :class:`CSVLoggerCallback`: ``progress.csv`` (nested metrics as ``a/b`` columns).
- :class:`TBXLoggerCallback`: TensorBoard event files (``pip install 'trainforge[tensorboard]'``).
- :class:`LoggerCallback`: the base to write your own (``log_trial_start/result/save/end``).

MLflow and Weights & Biases are in ``trainforge.air.integrations.mlflow`` / ``.wandb``.
"""

from trainforge._internal.sinks.api import LoggerCallback, TrialInfo
from trainforge._internal.sinks.drain import ResultRecord, SinkStats
from trainforge._internal.sinks.files import CSVLoggerCallback, JsonLoggerCallback
from trainforge._internal.sinks.tensorboard import TBXLoggerCallback

__all__ = [
    "CSVLoggerCallback",
    "JsonLoggerCallback",
    "LoggerCallback",
    "ResultRecord",
    "SinkStats",
    "TBXLoggerCallback",
    "TrialInfo",
]
