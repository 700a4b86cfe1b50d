"""trainforge.tune: hyperparameter search with the Ray Tune API, where every trial is a train run.

``from ray import tune`` -> ``from trainforge import tune``. Tune is a client of trainforge's public
training API; trainforge's training core never imports tune.
"""

__all__: list[str] = []
