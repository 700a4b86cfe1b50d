"""``MLflowLoggerCallback`` (driver side) and ``setup_mlflow`` (inside the train loop).

The callback opens one MLflow run per train run; a tuner's trials are nested runs (tag
``mlflow.parentRunId``) under one parent run per experiment, named after it. Each run gets its
config as params (flattened to ``a/b`` keys; keys cut to 250 characters, values to 500) and every
report as metrics at step ``training_iteration``, written with ``log_batch`` (many reports in one
call when the sink is behind). Metrics that are not real numbers, NaN or infinite are left out
(MLflow's UI and search mishandle them). Runs end FINISHED, or FAILED when the run failed.

MLflow 3 keeps its file store (``file://`` URIs, plain paths, ``./mlruns``) working only with
``MLFLOW_ALLOW_FILE_STORE=true``; for a tracking URI that names the file store, the sink and
``setup_mlflow`` set it while MLflow opens the store (unless it is set already), so a file store
works with no server and no setting. ``sqlite:///path.db`` works too (it needs SQLAlchemy).
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import threading
from collections.abc import Iterator
from typing import Any

from trainforge._internal.extras import require
from trainforge._internal.sinks.api import (
    DEFAULT_FLUSH_TIMEOUT_S,
    DEFAULT_QUEUE_SIZE,
    LoggerCallback,
    TrialInfo,
)
from trainforge._internal.sinks.drain import ResultRecord
from trainforge._internal.sinks.values import flatten, numeric_metrics, truncate

PARAM_KEY_LIMIT = 250
PARAM_VALUE_LIMIT = 500
METRIC_KEY_LIMIT = 250
PARAMS_PER_BATCH = 100  # MLflow's log_batch limits
METRICS_PER_BATCH = 1000
EXTRA = "mlflow"
ALLOW_FILE_STORE_ENV = "MLFLOW_ALLOW_FILE_STORE"  # MLflow's own switch
TRACKING_TOKEN_ENV = "MLFLOW_TRACKING_TOKEN"  # MLflow's own: how a token reaches its client
EXPERIMENT_PATH_TAG = "trainforge.experiment_path"  # on a tuner's parent run
RUN_PATH_TAG = "trainforge.run_path"
_BAD_CHARS = re.compile(r"[^/\w.\- :]")
_env_lock = threading.Lock()


def mlflow_key(key: str, limit: int) -> str:
    """``key`` as MLflow accepts it: only alphanumerics, ``_ - . : / space``, no empty or ``..``
    path parts, at most ``limit`` characters."""
    key = _BAD_CHARS.sub("_", key)
    norm = posixpath.normpath(key)
    if norm != key or norm.startswith(("/", "..")) or norm == ".":
        key = key.replace("/", "_")
    return truncate(key, limit) or "_"


def param_items(config: dict[str, Any]) -> list[tuple[str, str]]:
    """The config as MLflow params: flattened, keys and values truncated, first of equal keys kept."""
    seen: dict[str, str] = {}
    for key, value in flatten(config).items():
        name = mlflow_key(key, PARAM_KEY_LIMIT)
        seen.setdefault(name, truncate(str(value), PARAM_VALUE_LIMIT))
    return list(seen.items())


def _is_file_store(uri: str | None) -> bool:
    if uri is None:
        import mlflow

        uri = mlflow.get_tracking_uri()
    scheme = (
        uri.split(":", 1)[0]
        if re.match(r"^[A-Za-z][\w+.-]*:", uri) and not re.match(r"^[A-Za-z]:[\\/]", uri)
        else ""
    )
    return scheme in ("", "file")


@contextlib.contextmanager
def file_store_allowed(uri: str | None) -> Iterator[None]:
    """While MLflow opens a file store: ``MLFLOW_ALLOW_FILE_STORE=true`` (MLflow 3 refuses the file
    store without it; it caches the store it opened, so the setting is needed only here)."""
    if os.environ.get(ALLOW_FILE_STORE_ENV) is not None or not _is_file_store(uri):
        yield
        return
    with _env_lock:
        os.environ[ALLOW_FILE_STORE_ENV] = "true"
        try:
            yield
        finally:
            os.environ.pop(ALLOW_FILE_STORE_ENV, None)


class MLflowLoggerCallback(LoggerCallback):
    """MLflow logging from the driver (Ray's ``MLflowLoggerCallback``, same arguments).

    ``tracking_uri``: where runs go (``file:///abs/path/mlruns`` or a path: a file store, no server;
    ``sqlite:///...``; ``http://...``); None: MLflow's default (``$MLFLOW_TRACKING_URI``, else
    ``sqlite:///mlflow.db``). ``experiment_name``: None: ``$MLFLOW_EXPERIMENT_NAME``, else the
    tuner's experiment name, else MLflow's "Default". ``tags``: set on every run. ``tracking_token``:
    sets ``$MLFLOW_TRACKING_TOKEN`` for the client. ``save_artifact``: copy each run's directory
    (checkpoints included) to the MLflow run's artifacts at its end. ``log_params_on_trial_end``: log
    the config at the end rather than at the start. Needs ``pip install 'trainforge[mlflow]'``.

    Example::

        RunConfig(callbacks=[MLflowLoggerCallback(tracking_uri="file:///tmp/mlruns", experiment_name="digits")])
    """

    transient_attributes = ("_live",)

    def __init__(
        self,
        tracking_uri: str | None = None,
        *,
        registry_uri: str | None = None,
        experiment_name: str | None = None,
        tags: dict[str, Any] | None = None,
        tracking_token: str | None = None,
        save_artifact: bool = False,
        log_params_on_trial_end: bool = False,
        queue_size: int = DEFAULT_QUEUE_SIZE,
        flush_timeout_s: float = DEFAULT_FLUSH_TIMEOUT_S,
    ):
        require("mlflow", EXTRA, "MLflowLoggerCallback")
        for name, value in (("tracking_uri", tracking_uri), ("registry_uri", registry_uri),
                            ("experiment_name", experiment_name), ("tracking_token", tracking_token)):  # fmt: skip
            if value is not None and not isinstance(value, str):
                raise ValueError(f"MLflowLoggerCallback({name}={value!r}) is not valid: use a str or None.")
        if tags is not None and not isinstance(tags, dict):
            raise ValueError(
                f"MLflowLoggerCallback(tags={tags!r}) is not valid: use a dict of tag names to values."
            )
        super().__init__(queue_size=queue_size, flush_timeout_s=flush_timeout_s)
        self.tracking_uri = tracking_uri
        self.registry_uri = registry_uri
        self.experiment_name = experiment_name
        self.tags = {str(k): str(v) for k, v in (tags or {}).items()}
        self.tracking_token = tracking_token
        self.save_artifact = bool(save_artifact)
        self.log_params_on_trial_end = bool(log_params_on_trial_end)

    # -- live state (the sink's thread only) -------------------------------------------------------
    def _state(self) -> _MLflowState:
        state = self.__dict__.get("_live")
        if state is None:
            state = self.__dict__["_live"] = _MLflowState(self)
        return state

    def log_trial_start(self, trial: TrialInfo) -> None:
        self._state().start(trial)

    def log_trial_results(self, trial: TrialInfo, records: list[ResultRecord]) -> None:
        self._state().log(trial, records)

    def log_trial_result(self, iteration: int, trial: TrialInfo, result: dict[str, Any]) -> None:
        import time

        self.log_trial_results(trial, [ResultRecord(iteration, result, time.time())])

    def log_trial_end(self, trial: TrialInfo, failed: bool = False) -> None:
        self._state().end(trial, failed)


class _MLflowState:
    """The client, the experiments, the open runs and the tuners' parent runs of one sink."""

    def __init__(self, sink: MLflowLoggerCallback):
        from mlflow.tracking import MlflowClient

        self.sink = sink
        if sink.tracking_token:
            os.environ[TRACKING_TOKEN_ENV] = sink.tracking_token
        with file_store_allowed(sink.tracking_uri):
            self.client = MlflowClient(tracking_uri=sink.tracking_uri, registry_uri=sink.registry_uri)
        self.experiments: dict[str, str] = {}  # name -> id
        self.runs: dict[TrialInfo, str] = {}  # trial -> run id
        self.parents: dict[str, list[Any]] = {}  # experiment path -> [run id, open children]

    def experiment_id(self, trial: TrialInfo) -> str:
        from mlflow.environment_variables import MLFLOW_EXPERIMENT_NAME
        from mlflow.exceptions import MlflowException

        name = self.sink.experiment_name or MLFLOW_EXPERIMENT_NAME.get() or trial.experiment_name or "Default"
        if name not in self.experiments:
            found = self.client.get_experiment_by_name(name)
            if found is None:
                try:
                    self.experiments[name] = self.client.create_experiment(name)
                except MlflowException:  # created meanwhile (another process)
                    found = self.client.get_experiment_by_name(name)
                    if found is None:
                        raise
            if found is not None:
                self.experiments[name] = found.experiment_id
        return self.experiments[name]

    def parent(self, experiment_id: str, trial: TrialInfo) -> str:
        """The tuner's parent run (one per experiment directory), RUNNING while a trial runs."""
        path = trial.experiment_path or ""
        entry = self.parents.get(path)
        if entry is None:
            run_id = self._find_parent(experiment_id, path)
            if run_id is None:
                tags = {**self.sink.tags, EXPERIMENT_PATH_TAG: path}
                run_id = self.client.create_run(
                    experiment_id, run_name=trial.experiment_name, tags=tags
                ).info.run_id
            entry = self.parents[path] = [run_id, 0]
        if entry[1] == 0:
            self.client.update_run(entry[0], status="RUNNING")
        entry[1] += 1
        return str(entry[0])

    def _find_parent(self, experiment_id: str, path: str) -> str | None:
        """A parent run an earlier process made for this experiment (a restored tuner)."""
        if "'" in path:
            return None
        runs = self.client.search_runs(
            [experiment_id], filter_string=f"tags.`{EXPERIMENT_PATH_TAG}` = '{path}'", max_results=1
        )
        return runs[0].info.run_id if runs else None

    def start(self, trial: TrialInfo) -> None:
        from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

        experiment_id = self.experiment_id(trial)
        tags = {**self.sink.tags, "trial_name": trial.trial_name, RUN_PATH_TAG: trial.path}
        if trial.is_trial:
            tags["trial_id"] = trial.trial_id
            tags[MLFLOW_PARENT_RUN_ID] = self.parent(experiment_id, trial)
        run = self.client.create_run(experiment_id, run_name=trial.trial_name, tags=tags)
        self.runs[trial] = run.info.run_id
        if not self.sink.log_params_on_trial_end:
            self.log_params(run.info.run_id, trial.config)

    def log_params(self, run_id: str, config: dict[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(k, v) for k, v in param_items(config)]
        for i in range(0, len(params), PARAMS_PER_BATCH):
            self.client.log_batch(run_id, params=params[i : i + PARAMS_PER_BATCH])

    def log(self, trial: TrialInfo, records: list[ResultRecord]) -> None:
        from mlflow.entities import Metric

        metrics = [
            Metric(mlflow_key(key, METRIC_KEY_LIMIT), value, int(record.timestamp * 1000), record.iteration)
            for record in records
            for key, value in numeric_metrics(record.metrics, finite_only=True).items()
        ]
        run_id = self.runs[trial]
        for i in range(0, len(metrics), METRICS_PER_BATCH):
            self.client.log_batch(run_id, metrics=metrics[i : i + METRICS_PER_BATCH])

    def end(self, trial: TrialInfo, failed: bool) -> None:
        run_id = self.runs.pop(trial, None)
        if run_id is None:
            return
        try:
            if self.sink.log_params_on_trial_end:
                self.log_params(run_id, trial.config)
            if self.sink.save_artifact and os.path.isdir(trial.local_path):
                self.client.log_artifacts(run_id, trial.local_path)
        finally:
            self.client.set_terminated(run_id, "FAILED" if failed else "FINISHED")
            entry = self.parents.get(trial.experiment_path or "") if trial.is_trial else None
            if entry is not None:
                entry[1] -= 1
                if entry[1] == 0:  # no trial of the experiment runs: FINISHED until another starts
                    self.client.set_terminated(entry[0], "FINISHED")


# -- setup_mlflow: inside the train loop -----------------------------------------------------------
class _NoopModule:
    """What ``setup_mlflow`` returns on ranks > 0: every attribute and call does nothing."""

    def __getattr__(self, item: str) -> Any:
        return _NoopModule()

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None


def setup_mlflow(
    config: dict[str, Any] | None = None,
    tracking_uri: str | None = None,
    registry_uri: str | None = None,
    experiment_id: str | None = None,
    experiment_name: str | None = None,
    tracking_token: str | None = None,
    artifact_location: str | None = None,
    run_name: str | None = None,
    create_experiment_if_not_exists: bool = False,
    tags: dict[str, Any] | None = None,
    rank_zero_only: bool = True,
) -> Any:
    """Start an MLflow run inside the train loop and return the ``mlflow`` module (Ray's
    ``setup_mlflow``, same arguments); ranks > 0 get a module whose every call does nothing unless
    ``rank_zero_only=False``.

    ``config`` is logged as the run's params (flattened, truncated); its ``"mlflow"`` entry, if any,
    supplies arguments not passed here and is not logged. Defaults: the experiment is
    ``$MLFLOW_EXPERIMENT_NAME``, else the tuner's experiment (in a trial), else the run's name,
    created if missing (a name you pass must exist unless ``create_experiment_if_not_exists``); the
    run is named after the trial, else the train run. The run ends when the worker process exits
    (or call ``mlflow.end_run()``).

    Example::

        def train_loop(config):
            mlflow = setup_mlflow(config, tracking_uri="file:///tmp/mlruns")
            for epoch in range(3):
                mlflow.log_metric("loss", 1.0 / (epoch + 1), step=epoch)
    """
    require("mlflow", EXTRA, "setup_mlflow")
    context = _train_context()
    if rank_zero_only and context is not None and context.get_world_rank() != 0:
        return _NoopModule()
    config = dict(config or {})
    settings = config.pop("mlflow", None) or {}
    if not isinstance(settings, dict):
        raise ValueError(
            f"setup_mlflow: config['mlflow']={settings!r} is not valid: use a dict of setup_mlflow arguments."
        )
    tracking_uri = tracking_uri or settings.get("tracking_uri")
    registry_uri = registry_uri or settings.get("registry_uri")
    experiment_id = experiment_id or settings.get("experiment_id")
    experiment_name = experiment_name or settings.get("experiment_name")
    tracking_token = tracking_token or settings.get("tracking_token")
    tune = (context.get_metadata().get("tune") if context is not None else None) or {}

    import mlflow
    from mlflow.environment_variables import MLFLOW_EXPERIMENT_NAME
    from mlflow.exceptions import MlflowException

    if tracking_token:
        os.environ[TRACKING_TOKEN_ENV] = tracking_token
    with file_store_allowed(tracking_uri):
        if tracking_uri:
            mlflow.set_tracking_uri(tracking_uri)
        if registry_uri:
            mlflow.set_registry_uri(registry_uri)
        if experiment_id:
            mlflow.set_experiment(experiment_id=experiment_id)
        else:
            explicit = experiment_name or MLFLOW_EXPERIMENT_NAME.get()
            name = (
                explicit
                or tune.get("experiment_name")
                or (context.get_experiment_name() if context else None)
            )
            if name:
                if mlflow.get_experiment_by_name(name) is None:
                    if explicit and not create_experiment_if_not_exists:
                        raise ValueError(
                            f"setup_mlflow: the MLflow experiment {name!r} does not exist at "
                            f"{mlflow.get_tracking_uri()}: create it, or pass create_experiment_if_not_exists=True."
                        )
                    try:
                        mlflow.create_experiment(name, artifact_location=artifact_location)
                    except MlflowException:
                        if mlflow.get_experiment_by_name(name) is None:  # not another process's
                            raise
                mlflow.set_experiment(name)
        default_run = tune.get("trial_name") or (context.get_experiment_name() if context else None)
        mlflow.start_run(
            run_name=run_name or default_run, tags={str(k): str(v) for k, v in (tags or {}).items()}
        )
        params = param_items(config)
        for i in range(0, len(params), PARAMS_PER_BATCH):
            mlflow.log_params(dict(params[i : i + PARAMS_PER_BATCH]))
    return mlflow


def _train_context() -> Any:
    import trainforge

    try:
        return trainforge.get_context()
    except RuntimeError:  # outside a train worker: a plain MLflow run
        return None
