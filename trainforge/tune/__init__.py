"""trainforge.tune: hyperparameter search with the Ray Tune API, where every trial is a train run.

``from ray import tune`` -> ``from trainforge import tune``. Tune is a client of trainforge's
training API (a trial is a ``fit_iter()`` of a trainer); trainforge's training core never imports
tune. Optuna (``pip install "trainforge[tune]"``) drives ``OptunaSearch`` and the pruners behind
``ASHAScheduler``/``HyperBandScheduler``; random and grid search, FIFO, the median rule and PBT need
nothing more.
"""

from trainforge import Checkpoint, CheckpointConfig, FailureConfig
from trainforge.tune._config import RunConfig, TuneConfig
from trainforge.tune._context import TuneContext, get_checkpoint, get_context, report
from trainforge.tune._controller import TrialError
from trainforge.tune._result import Result, ResultGrid
from trainforge.tune._sample import (
    choice,
    grid_search,
    lograndint,
    loguniform,
    qlograndint,
    qloguniform,
    qrandint,
    qrandn,
    quniform,
    randint,
    randn,
    sample_from,
    uniform,
)
from trainforge.tune._stopper import Stopper
from trainforge.tune._trainable import with_parameters, with_resources
from trainforge.tune._tuner import Tuner

__all__ = [
    "Checkpoint",
    "CheckpointConfig",
    "FailureConfig",
    "Result",
    "ResultGrid",
    "RunConfig",
    "Stopper",
    "TrialError",
    "TuneConfig",
    "TuneContext",
    "Tuner",
    "choice",
    "get_checkpoint",
    "get_context",
    "grid_search",
    "lograndint",
    "loguniform",
    "qlograndint",
    "qloguniform",
    "qrandint",
    "qrandn",
    "quniform",
    "randint",
    "randn",
    "report",
    "sample_from",
    "uniform",
    "with_parameters",
    "with_resources",
]
