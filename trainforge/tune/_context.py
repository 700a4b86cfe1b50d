"""What a trial's code calls: ``report``, ``get_checkpoint``, ``get_context`` (Ray Tune's names).

A trial is a train run, so these are train's session functions seen through the trial: ``report``
is ``trainforge.report`` (the tuner counts it as one ``training_iteration``), the trial's identity
rides in the run's metadata (``get_context().get_metadata()["tune"]``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import trainforge

TUNE_KEY = "tune"  # the run metadata key holding the trial's identity


def report(metrics: dict[str, Any], *, checkpoint: trainforge.Checkpoint | None = None) -> None:
    """One result of the trial (one ``training_iteration``); a checkpoint is persisted before this
    returns and becomes the trial's latest (a retry, restore or PBT exploit continues from it)."""
    _trial_info("report")
    trainforge.report(metrics, checkpoint=checkpoint)


def get_checkpoint() -> trainforge.Checkpoint | None:
    """None in a fresh trial; else the checkpoint it continues from (retry, restore, PBT exploit)."""
    _trial_info("get_checkpoint")
    return trainforge.get_checkpoint()


@dataclass(frozen=True)
class TrialResources:
    required_resources: dict[str, float]


class TuneContext:
    """The running trial, as Ray Tune's ``TuneContext``."""

    def __init__(self, info: dict[str, Any], train_context: Any):
        self._info = info
        self._train = train_context

    def get_trial_id(self) -> str:
        return str(self._info["trial_id"])

    def get_trial_name(self) -> str:
        return str(self._info["trial_name"])

    def get_experiment_name(self) -> str:
        return str(self._info["experiment_name"])

    def get_trial_dir(self) -> str:
        return str(self._train.get_trial_dir())

    def get_trial_resources(self) -> TrialResources:
        return TrialResources({k: float(v) for k, v in self._info["resources"].items()})

    def get_world_rank(self) -> int:
        return int(self._train.get_world_rank())

    def get_world_size(self) -> int:
        return int(self._train.get_world_size())


def get_context() -> TuneContext:
    """The running trial's identity and resources (only inside a trial)."""
    return TuneContext(_trial_info("get_context"), trainforge.get_context())


def _trial_info(what: str) -> dict[str, Any]:
    try:
        info = trainforge.get_context().get_metadata().get(TUNE_KEY)
    except RuntimeError:
        info = None
    if info is None:
        raise RuntimeError(
            f"trainforge.tune.{what}() works only inside a trial (a function or trainer that "
            "Tuner(...).fit() runs); call trainforge.report() in a plain train loop."
        )
    return dict(info)
