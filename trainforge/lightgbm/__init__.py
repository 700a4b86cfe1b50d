"""LightGBM integration (Ray Train's ``lightgbm`` module names): distributed LightGBM on trainforge workers.

    from trainforge.lightgbm import LightGBMConfig, LightGBMTrainer, RayTrainReportCallback, get_network_params

:class:`LightGBMTrainer` runs a train loop (or the built-in one of the ``params=`` form) on every
worker with LightGBM's network parameters for that attempt (:func:`get_network_params`: fresh ports,
a short ``time_out``); :class:`RayTrainReportCallback` reports each round's metrics and checkpoints
the booster. ``import trainforge.lightgbm`` does not import lightgbm: building a trainer or a
callback does, and raises ``ImportError`` naming the extra (``pip install 'trainforge[lightgbm]'``)
when it is missing.
"""

from __future__ import annotations

from trainforge.lightgbm._callback import RayTrainReportCallback
from trainforge.lightgbm._config import LightGBMConfig, get_network_params
from trainforge.lightgbm._trainer import LightGBMTrainer

__all__ = ["LightGBMTrainer", "LightGBMConfig", "RayTrainReportCallback", "get_network_params"]
