"""``TrialInfo``: the run a sink logs (one tuner trial, or a plain ``fit()``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainforge._internal.checkpoint import Checkpoint


@dataclass(eq=False)
class TrialInfo:
    """The run a sink logs: one tuner trial (``experiment_name`` set), or a plain ``fit()``.

    ``trial_id``/``trial_name``: the tuner's (a plain run: its name). ``config``: the run's
    ``train_loop_config`` (a tuner's function trial: the trial's config; a trainer trial: its merged
    ``train_loop_config``), its settings only: scalars, short lists and nested dicts of them (arrays
    and data sets passed in it are left out). ``path``: the run directory (as the storage names it);
    ``local_path``: a local directory for the sink's files -- the run directory itself on local
    storage; on remote storage a temporary directory whose files are copied into the run directory
    when the run ends. ``experiment_path``: the tuner's experiment directory (None for a plain run).
    ``checkpoint``: the latest committed checkpoint (set before ``log_trial_save``). ``str(trial)``
    is its name, as Ray's ``Trial``.
    """

    trial_id: str
    trial_name: str
    experiment_name: str | None
    config: dict[str, Any]
    path: str
    local_path: str
    experiment_path: str | None = None
    num_workers: int | tuple[int, int] = 1
    run_name: str = ""
    metadata: dict[str, Any] = field(default_factory=dict, repr=False)
    checkpoint: Checkpoint | None = None

    @property
    def is_trial(self) -> bool:
        """True for a tuner's trial, False for a plain ``fit()``."""
        return self.experiment_name is not None

    def __str__(self) -> str:
        return self.trial_name
