"""Trial schedulers: decide on every reported result whether a trial continues, stops or exploits.

``TrialScheduler`` documents the calls the tuner makes. ``FIFOScheduler`` (the default),
``MedianStoppingRule`` and ``PopulationBasedTraining`` are pure Python; ``ASHAScheduler`` (alias
``AsyncHyperBandScheduler``) and ``HyperBandScheduler`` decide with Optuna's pruners
(``pip install "trainforge[tune]"``).
"""

from trainforge.tune.schedulers._hyperband import ASHAScheduler, AsyncHyperBandScheduler, HyperBandScheduler
from trainforge.tune.schedulers._median import MedianStoppingRule
from trainforge.tune.schedulers._pbt import PopulationBasedTraining
from trainforge.tune.schedulers._scheduler import Exploit, FIFOScheduler, TrialScheduler

__all__ = [
    "ASHAScheduler",
    "AsyncHyperBandScheduler",
    "Exploit",
    "FIFOScheduler",
    "HyperBandScheduler",
    "MedianStoppingRule",
    "PopulationBasedTraining",
    "TrialScheduler",
]
