"""``WandbLoggerCallback`` (driver side) and ``setup_wandb`` (inside the train loop).

The callback opens one W&B run per train run, named after it (a tuner's trial: its name, in the
``group`` of its experiment), with the config as the run's config and every report logged at step
``training_iteration``. Offline mode (``WANDB_MODE=offline``, or ``mode="offline"``) needs no login
and no network: each run is written under ``<run dir>/wandb/offline-run-*`` (``wandb sync`` uploads
it later). W&B requires steps to grow: reports redone after a restart from a checkpoint are dropped
by W&B (it warns).
"""

from __future__ import annotations

import os
import re
from typing import Any

from trainforge._internal.extras import require
from trainforge._internal.sinks.api import DEFAULT_QUEUE_SIZE, LoggerCallback, TrialInfo
from trainforge._internal.sinks.drain import ResultRecord
from trainforge._internal.sinks.values import as_number, flatten

EXTRA = "wandb"
DEFAULT_UPLOAD_TIMEOUT_S = 1800  # Ray's upload_timeout: how long a run's end waits for its results
# For a logger on the driver: no capture of the driver's console, no system metrics of the driver
# process, no banner per run. A ``settings=`` argument replaces these.
DRIVER_SETTINGS = {"console": "off", "x_disable_stats": True, "silent": True}


def _api_key(owner: str, api_key: str | None, api_key_file: str | None) -> str | None:
    if api_key is not None:
        return api_key
    if api_key_file is None:
        return None
    try:
        with open(os.path.expanduser(api_key_file), encoding="utf-8") as f:
            return f.read().strip()
    except OSError as exc:
        raise ValueError(
            f"{owner}(api_key_file={api_key_file!r}): cannot read it ({exc}); pass an existing file."
        ) from exc


def _settings(user: Any, defaults: dict[str, Any], api_key: str | None) -> Any:
    """``settings=`` for ``wandb.init``: the user's (a ``wandb.Settings`` or a dict) or ``defaults``,
    with ``api_key`` added when given."""
    import wandb

    if user is None:
        user = dict(defaults)
    if api_key is None:
        return user
    if isinstance(user, dict):
        return {**user, "api_key": api_key}
    return user.model_copy(update={"api_key": api_key}) if isinstance(user, wandb.Settings) else user


def _loggable(value: Any) -> Any:
    """A value W&B logs as it is (a number, a string, one of its media objects), or None."""
    from wandb.sdk.data_types.base_types.wb_value import WBValue

    if isinstance(value, (str, WBValue)):
        return value
    if isinstance(value, bool):
        return int(value)
    number = as_number(value)
    if number is not None:
        return value if isinstance(value, (int, float)) else number
    return None


class WandbLoggerCallback(LoggerCallback):
    """Weights & Biases logging from the driver (Ray's ``WandbLoggerCallback``, same arguments).

    ``project``/``group``: where runs go (``group`` defaults to the tuner's experiment name, so
    each trial is a run of that group; a plain run has none). ``api_key``/``api_key_file``: the key,
    if not logged in (not needed offline). ``excludes``: metric names (flattened, ``a/b``) not to
    log. ``log_config``: a reported ``"config"`` dict updates the run's config (PBT). ``upload_checkpoints``
    (``save_checkpoints``, Ray's older name): each committed checkpoint is logged as a "model"
    artifact. ``upload_timeout``: how long a run's end waits for its results to be written (the
    sink's ``flush_timeout_s``). ``video_kwargs``/``image_kwargs`` are accepted and unused (only
    numbers, strings and W&B media objects are logged). Other keyword arguments go to ``wandb.init``
    (``entity``, ``tags``, ``mode="offline"``, ``dir``, ``settings``...). Needs
    ``pip install 'trainforge[wandb]'``.

    Example::

        RunConfig(callbacks=[WandbLoggerCallback(project="digits", mode="offline")])
    """

    transient_attributes = ("_runs",)

    def __init__(
        self,
        project: str | None = None,
        group: str | None = None,
        api_key_file: str | None = None,
        api_key: str | None = None,
        excludes: list[str] | None = None,
        log_config: bool = False,
        upload_checkpoints: bool = False,
        save_checkpoints: bool = False,
        upload_timeout: float = DEFAULT_UPLOAD_TIMEOUT_S,
        video_kwargs: dict[str, Any] | None = None,
        image_kwargs: dict[str, Any] | None = None,
        *,
        queue_size: int = DEFAULT_QUEUE_SIZE,
        **kwargs: Any,
    ):
        require("wandb", EXTRA, "WandbLoggerCallback")
        for name, value in (("project", project), ("group", group)):
            if value is not None and not isinstance(value, str):
                raise ValueError(f"WandbLoggerCallback({name}={value!r}) is not valid: use a str or None.")
        if excludes is not None and (
            isinstance(excludes, str) or not all(isinstance(e, str) for e in excludes)
        ):
            raise ValueError(
                f"WandbLoggerCallback(excludes={excludes!r}) is not valid: use a list of metric names."
            )
        super().__init__(queue_size=queue_size, flush_timeout_s=kwargs.pop("flush_timeout_s", upload_timeout))
        self.project = project
        self.group = group
        self.api_key = _api_key("WandbLoggerCallback", api_key, api_key_file)
        self.excludes = set(excludes or [])
        self.log_config = bool(log_config)
        self.upload_checkpoints = bool(upload_checkpoints or save_checkpoints)
        self.video_kwargs = dict(video_kwargs or {})
        self.image_kwargs = dict(image_kwargs or {})
        self.init_kwargs = kwargs

    def _trial_runs(self) -> dict[TrialInfo, Any]:
        return self.__dict__.setdefault("_runs", {})

    def log_trial_start(self, trial: TrialInfo) -> None:
        import wandb

        init: dict[str, Any] = {
            "project": self.project,
            "group": self.group or trial.experiment_name,
            "name": trial.trial_name,
            "config": trial.config or None,
            "dir": trial.local_path,
            "reinit": "create_new",  # the trials of a tuner are runs open at the same time
            "allow_val_change": True,
        }
        init.update(self.init_kwargs)
        init["settings"] = _settings(self.init_kwargs.get("settings"), DRIVER_SETTINGS, self.api_key)
        if init.get("dir"):
            os.makedirs(init["dir"], exist_ok=True)
        self._trial_runs()[trial] = wandb.init(**init)

    def log_trial_results(self, trial: TrialInfo, records: list[ResultRecord]) -> None:
        run = self._trial_runs()[trial]
        for record in records:
            metrics = dict(record.metrics)
            config = metrics.pop("config", None) if self.log_config else None
            if isinstance(config, dict):
                run.config.update(config, allow_val_change=True)
            data = {}
            for key, value in flatten(metrics).items():
                if key in self.excludes:
                    continue
                loggable = _loggable(value)
                if loggable is not None:
                    data[key] = loggable
            run.log(data, step=record.iteration)

    def log_trial_result(self, iteration: int, trial: TrialInfo, result: dict[str, Any]) -> None:
        self.log_trial_results(trial, [ResultRecord(iteration, result, 0.0)])

    def log_trial_save(self, trial: TrialInfo) -> None:
        if not self.upload_checkpoints or trial.checkpoint is None:
            return
        import wandb

        name = re.sub(r"[^\w.-]", "_", f"checkpoint_{trial.trial_name}")
        artifact = wandb.Artifact(name=name, type="model")
        with trial.checkpoint.as_directory() as directory:
            artifact.add_dir(directory)
            self._trial_runs()[trial].log_artifact(artifact)

    def log_trial_end(self, trial: TrialInfo, failed: bool = False) -> None:
        run = self._trial_runs().pop(trial, None)
        if run is not None:
            run.finish(exit_code=1 if failed else 0)


class _DisabledRun:
    """What ``setup_wandb`` returns on ranks > 0: every attribute and call does nothing."""

    def __getattr__(self, item: str) -> Any:
        return _DisabledRun()

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None


def setup_wandb(
    config: dict[str, Any] | None = None,
    api_key: str | None = None,
    api_key_file: str | None = None,
    rank_zero_only: bool = True,
    **kwargs: Any,
) -> Any:
    """Start a W&B run inside the train loop and return it (Ray's ``setup_wandb``, same arguments);
    ranks > 0 get a run whose every call does nothing unless ``rank_zero_only=False``.

    ``config`` becomes the run's config; its ``"wandb"`` entry, if any, holds ``wandb.init``
    arguments and is not logged. Defaults: the run is named after the trial (else the train run), in
    the group of the tuner's experiment. Keyword arguments go to ``wandb.init`` and win. The run
    ends when the worker process exits (or call ``run.finish()``).

    Example::

        def train_loop(config):
            run = setup_wandb(config, project="digits", mode="offline")
            for epoch in range(3):
                run.log({"loss": 1.0 / (epoch + 1)})
    """
    require("wandb", EXTRA, "setup_wandb")
    from trainforge._internal.sinks.mlflow import _train_context

    context = _train_context()
    if rank_zero_only and context is not None and context.get_world_rank() != 0:
        return _DisabledRun()
    config = dict(config or {})
    settings = config.pop("wandb", None) or {}
    if not isinstance(settings, dict):
        raise ValueError(
            f"setup_wandb: config['wandb']={settings!r} is not valid: use a dict of wandb.init arguments."
        )
    tune = (context.get_metadata().get("tune") if context is not None else None) or {}
    init: dict[str, Any] = {
        "name": tune.get("trial_name") or (context.get_experiment_name() if context is not None else None),
        "group": tune.get("experiment_name"),
        "config": config,
    }
    init.update(settings)
    init.update(kwargs)
    key = _api_key(
        "setup_wandb", api_key or settings.get("api_key"), api_key_file or settings.get("api_key_file")
    )
    init.pop("api_key", None)
    init.pop("api_key_file", None)
    if key is not None:
        init["settings"] = _settings(init.get("settings"), {}, key)

    import wandb

    return wandb.init(**init)
