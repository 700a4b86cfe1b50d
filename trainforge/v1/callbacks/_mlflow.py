"""``MLflowLoggerCallback``: Ray Train 1.x's MLflow callback, on MLflow's client (imported when a run
starts; ``pip install 'trainforge[mlflow]'``)."""

from __future__ import annotations

import contextlib
import numbers
import os
from collections.abc import Iterator
from typing import Any

from trainforge.v1._constants import ENV_MLFLOW_ALLOW_FILE_STORE, TRAIN_CHECKPOINT_SUBDIR, TRAINING_ITERATION
from trainforge.v1.callbacks._callback import TrainingCallback, TrainingLogdirMixin, worker_index


class MLflowLoggerCallback(TrainingLogdirMixin, TrainingCallback):
    """Logs a run's config as MLflow params and one worker's numeric results as metrics (step
    ``_training_iteration``), one MLflow run per ``Trainer.run()``.

    ``tracking_uri`` / ``registry_uri``: default ``{run_dir}/mlruns`` (MLflow's file store, as 1.x;
    or ``sqlite:///...``, ``http://...``). One of
    ``experiment_id`` (an existing experiment) or ``experiment_name`` (created if missing) is needed.
    ``save_artifact``: log the run's checkpoint directory as artifacts at the end.
    """

    def __init__(
        self,
        tracking_uri: str | None = None,
        registry_uri: str | None = None,
        experiment_id: str | None = None,
        experiment_name: str | None = None,
        tags: dict[str, Any] | None = None,
        save_artifact: bool = False,
        logdir: str | None = None,
        worker_to_log: int = 0,
    ):
        if experiment_id is None and experiment_name is None:
            raise ValueError("MLflowLoggerCallback(): pass experiment_id= (an existing experiment) or experiment_name= "
                             "(created if it does not exist).")  # fmt: skip
        if tags is not None and not isinstance(tags, dict):
            raise TypeError(f"MLflowLoggerCallback(tags={tags!r}) must be a dict of tag names to values.")
        self._logdir = logdir
        self._worker_to_log = worker_index(worker_to_log, "MLflowLoggerCallback")
        self.tracking_uri = tracking_uri
        self.registry_uri = registry_uri
        self.experiment_id = experiment_id
        self.experiment_name = experiment_name
        self.tags = dict(tags or {})
        self.save_artifact = save_artifact
        self._client: Any = None
        self.run_id: str | None = None

    def start_training(self, logdir: str, config: dict[str, Any] | None = None, **info: Any) -> None:
        self.start_training_logdir(logdir)
        try:
            from mlflow.tracking import MlflowClient
        except ImportError as exc:
            raise ImportError("MLflowLoggerCallback needs MLflow: pip install 'trainforge[mlflow]'") from exc
        default = os.path.join(str(self.logdir), "mlruns")
        tracking_uri = self.tracking_uri or default
        with _file_store_allowed(tracking_uri):
            self._client = client = MlflowClient(tracking_uri=tracking_uri, registry_uri=self.registry_uri or default)
        experiment_id = self.experiment_id
        if experiment_id is None:
            name = str(self.experiment_name)
            found = client.get_experiment_by_name(name)
            experiment_id = found.experiment_id if found is not None else client.create_experiment(name)
        run = client.create_run(experiment_id, tags={k: str(v) for k, v in self.tags.items()})
        self.run_id = run.info.run_id
        for key, value in (config or {}).items():
            client.log_param(self.run_id, key, value)

    def handle_result(self, results: list[dict[str, Any]], **info: Any) -> None:
        result = results[self._worker_to_log]
        step = int(result.get(TRAINING_ITERATION, 0))
        for key, value in result.items():
            if isinstance(value, numbers.Number) and not isinstance(value, bool):
                self._client.log_metric(self.run_id, key, float(value), step=step)  # type: ignore[arg-type]

    def finish_training(self, error: bool = False, **info: Any) -> None:
        if self._client is None or self.run_id is None:
            return
        checkpoints = os.path.join(str(self.logdir), TRAIN_CHECKPOINT_SUBDIR)
        if self.save_artifact and os.path.isdir(checkpoints):
            self._client.log_artifacts(self.run_id, checkpoints)
        self._client.set_terminated(self.run_id, status="FAILED" if error else "FINISHED")


@contextlib.contextmanager
def _file_store_allowed(uri: str) -> Iterator[None]:
    """While the client opens the store: MLflow 3 refuses its file store (a path or ``file:`` URI, 1.x's
    default) unless ``MLFLOW_ALLOW_FILE_STORE`` is set; the store stays open once made. A value you
    set is left alone."""
    scheme = uri.split(":", 1)[0] if "://" in uri or uri.startswith("file:") else ""
    if scheme not in ("", "file") or ENV_MLFLOW_ALLOW_FILE_STORE in os.environ:
        yield
        return
    os.environ[ENV_MLFLOW_ALLOW_FILE_STORE] = "true"
    try:
        yield
    finally:
        os.environ.pop(ENV_MLFLOW_ALLOW_FILE_STORE, None)
