"""XGBoost integration (Ray Train's ``xgboost`` module names): distributed XGBoost on trainforge workers.

    from trainforge.xgboost import RayTrainReportCallback, XGBoostConfig, XGBoostTrainer

:class:`XGBoostTrainer` runs a train loop (or the built-in one of the ``params=`` form) on every
worker inside XGBoost's collective; :class:`RayTrainReportCallback` reports each round's metrics and
checkpoints the booster. ``import trainforge.xgboost`` does not import xgboost: building a trainer
or using the callback does, and raises ``ImportError`` naming the extra
(``pip install 'trainforge[xgboost]'``) when it is missing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainforge.xgboost._config import XGBoostConfig
from trainforge.xgboost._trainer import XGBoostTrainer

if TYPE_CHECKING:
    from trainforge.xgboost._callback import RayTrainReportCallback

__all__ = ["XGBoostTrainer", "XGBoostConfig", "RayTrainReportCallback"]


def __getattr__(name: str) -> Any:
    if name == "RayTrainReportCallback":
        from trainforge.xgboost import _callback

        return _callback.RayTrainReportCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
