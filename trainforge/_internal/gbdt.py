"""What the XGBoost and LightGBM integrations share: the trainer with its two forms, the report
callbacks' metric and checkpoint rules, and reading a dataset shard into a DataFrame.

Two forms of the trainer, as Ray Train documents them:

- a train loop (``XGBoostTrainer(train_fn, train_loop_config=..., datasets=...)``): the loop builds
  its ``DMatrix`` / ``lightgbm.Dataset`` from ``get_dataset_shard("train")`` and calls the framework's
  ``train`` with the report callback; the backend joins the workers into the framework's collective.
- ``params=`` / ``label_column=`` / ``num_boost_round=`` with ``datasets={"train": ..., ...}``: a
  built-in loop does exactly that, every dataset becoming an evaluation set named by its key,
  checkpointing every ``CheckpointConfig.checkpoint_frequency`` rounds and at the end (unless
  ``checkpoint_at_end=False``), resuming from the latest checkpoint. XGBoost sums its evaluation
  metrics over the workers, so there every dataset is split across them (``datasets_to_split="all"``);
  LightGBM evaluates each worker's own data, so there only "train" is split and every worker
  evaluates the whole of the other datasets (the reported "train-..." metrics are rank 0's shard's).
  ``dataset_config`` overrides either.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from trainforge._internal.checkpoint import Checkpoint
from trainforge._internal.framework_trainer import FrameworkTrainer
from trainforge._internal.session import get_checkpoint, get_context, report

TRAIN_KEY = "train"


class GBDTTrainer(FrameworkTrainer):
    """Base of ``XGBoostTrainer`` and ``LightGBMTrainer`` (see the module docstring)."""

    _legacy_loop: Callable[[dict[str, Any]], None]  # the built-in loop of the params= form
    _legacy_split: str | list[str] = "all"  # datasets_to_split of the params= form

    def _init_gbdt(
        self,
        train_loop_per_worker: Callable[..., Any] | None,
        legacy: dict[str, Any],
        backend_config: Any,
        *,
        train_loop_config: dict[str, Any] | None,
        datasets: dict[str, Any] | None,
        dataset_config: Any,
        run_config: Any,
        **common: Any,
    ) -> None:
        """The constructor's body: ``legacy`` holds the arguments of the form without a train loop."""
        given = {k: v for k, v in legacy.items() if v is not None and v != {}}
        if train_loop_per_worker is not None:
            if given:
                raise ValueError(
                    f"{type(self).__name__}: pass either train_loop_per_worker or "
                    f"{', '.join(f'{k}=' for k in sorted(given))} (the form without a train loop), not both. "
                    "With a train loop, build the model inside it and read parameters from train_loop_config."
                )
        else:
            train_loop_config, dataset_config = self._legacy_form(legacy, train_loop_config, datasets, dataset_config, run_config)
            train_loop_per_worker = type(self)._legacy_loop
        self._init_framework(
            train_loop_per_worker,
            backend_config,
            train_loop_config=train_loop_config,
            datasets=datasets,
            dataset_config=dataset_config,
            run_config=run_config,
            **common,
        )

    def _legacy_form(
        self,
        legacy: dict[str, Any],
        train_loop_config: dict[str, Any] | None,
        datasets: dict[str, Any] | None,
        dataset_config: Any,
        run_config: Any,
    ) -> tuple[dict[str, Any], Any]:
        """The built-in loop's config, from the ``params=`` form's arguments (checked here)."""
        name = type(self).__name__
        if train_loop_config is not None:
            raise ValueError(
                f"{name}: train_loop_config={train_loop_config!r} needs a train_loop_per_worker; without one, "
                "pass the model's parameters as params={...}."
            )
        label, params, rounds = legacy.get("label_column"), legacy.get("params"), legacy.get("num_boost_round")
        if not isinstance(label, str) or not label:
            raise ValueError(
                f"{name}: without a train_loop_per_worker, label_column= (the name of the label column, a str) "
                f"is required, got {label!r}. Or pass a train loop: {name}(train_fn, datasets=...)."
            )
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise ValueError(f"{name}: params={params!r} is not valid: it must be a dict of {self._framework} parameters.")
        if rounds is None:
            rounds = 10  # Ray Train's default
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
            raise ValueError(f"{name}: num_boost_round={rounds!r} is not valid: it must be an int >= 1.")
        if not datasets or TRAIN_KEY not in datasets:
            raise ValueError(
                f"{name}: without a train_loop_per_worker, datasets must hold a {TRAIN_KEY!r} dataset with the "
                f"features and the {label!r} column (got {sorted(datasets or {})}). Other datasets are "
                "evaluation sets, named by their key."
            )
        cc = getattr(run_config, "checkpoint_config", None)
        config = {
            **legacy,
            "label_column": label,
            "params": dict(params),
            "num_boost_round": rounds,
            # train first, then the others in the order given: the frameworks log evals in this order
            "dataset_names": [TRAIN_KEY, *(k for k in datasets if k != TRAIN_KEY)],
            "checkpoint_frequency": getattr(cc, "checkpoint_frequency", 0) or 0,
            "checkpoint_at_end": getattr(cc, "checkpoint_at_end", None) is not False,
        }
        return config, dataset_config if dataset_config is not None else {"datasets_to_split": self._legacy_split}

    # param_space keys a tuner merges into train_loop_config for this trainer (the params= form:
    # Tuner(XGBoostTrainer(params=..., ...), param_space={"params": {"max_depth": tune.randint(2, 8)}}).
    _param_space_keys = ("params", "num_boost_round")


def import_in_background(module: str) -> None:
    """Start importing ``module`` on a daemon thread, so that the driver's later import of it (the
    XGBoost tracker, about a second with the scikit-learn it pulls in) overlaps the workers' start.
    A failed import is left for the later one to raise."""
    if module not in sys.modules:
        threading.Thread(target=_try_import, args=(module,), name=f"trainforge-import-{module}", daemon=True).start()


def _try_import(module: str) -> None:
    try:
        importlib.import_module(module)
    except Exception:  # the import on the driver's path raises it, with its message
        pass


def shard_frame(name: str) -> Any:
    """This worker's part of ``datasets[name]`` as one pandas DataFrame."""
    import pandas as pd

    from trainforge._internal.session import get_dataset_shard

    batches = list(get_dataset_shard(name).iter_batches(batch_size=None, batch_format="pandas"))
    return pd.concat(batches, ignore_index=True) if len(batches) != 1 else batches[0]


def split_label(frame: Any, label: str, dataset: str) -> tuple[Any, Any]:
    """(features, label) of ``frame``; a missing label column says which columns there are."""
    if label not in frame.columns:
        raise ValueError(
            f"label_column={label!r} is not a column of datasets[{dataset!r}]; its columns are "
            f"{list(frame.columns)}. Pass the name of the label column."
        )
    return frame.drop(columns=[label]), frame[label]


def report_dict(
    evals: Iterable[tuple[str, str, Any]],
    metrics: str | list[str] | dict[str, str] | None,
    postprocess: Callable[[dict[str, Any]], dict[str, Any]] | None,
) -> dict[str, Any]:
    """The metrics to report from ``(dataset, metric, value)`` triples: keys ``"<dataset>-<metric>"``
    (``train-rmse``); ``metrics`` keeps only the keys listed (a str or list) or reports
    ``{name: key}`` under new names (a dict); ``postprocess`` then maps the dict."""
    values = {f"{data}-{metric}": _scalar(value) for data, metric, value in evals}
    if metrics is None:
        out = values
    elif isinstance(metrics, dict):
        out = {name: values[key] for name, key in metrics.items() if key in values}
    else:
        keys = [metrics] if isinstance(metrics, str) else list(metrics)
        out = {key: values[key] for key in keys if key in values}
    return postprocess(out) if postprocess is not None else out


def _scalar(value: Any) -> Any:
    """A logged value: xgboost's cv logs (mean, std) pairs; the mean is reported."""
    if isinstance(value, (tuple, list)):
        value = value[0]
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


class ReportCallback:
    """What the XGBoost and LightGBM ``RayTrainReportCallback`` share: their arguments (checked here)
    and saving the booster into a checkpoint directory. ``filename`` None: the class's
    ``CHECKPOINT_NAME``. Subclasses report from the framework's callback hook."""

    CHECKPOINT_NAME = ""  # the booster's file in a checkpoint: "model.ubj" (XGBoost), "model.txt" (LightGBM)

    def __init__(
        self,
        metrics: str | list[str] | dict[str, str] | None = None,
        filename: str | None = None,
        frequency: int = 0,
        checkpoint_at_end: bool = True,
        results_postprocessing_fn: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        name = type(self).__name__
        if metrics is not None and not isinstance(metrics, (str, list, tuple, dict)):
            raise ValueError(
                f"{name}(metrics={metrics!r}) is not valid: use None (every logged metric), a metric key "
                "such as 'train-rmse', a list of them, or a dict {reported_name: metric_key}."
            )
        if isinstance(frequency, bool) or not isinstance(frequency, int) or frequency < 0:
            raise ValueError(
                f"{name}(frequency={frequency!r}) is not valid: it must be an int >= 0 (checkpoint every that "
                "many boosting rounds; 0: only at the end)."
            )
        self._import_framework()  # a missing framework raises here, naming the extra to install
        super().__init__()  # the framework's callback base, where it has one (XGBoost's TrainingCallback)
        self._metrics = metrics
        self._filename = filename if filename is not None else self.CHECKPOINT_NAME
        self._frequency = frequency
        self._checkpoint_at_end = checkpoint_at_end
        self._postprocess = results_postprocessing_fn
        # Files to write beside the booster in each checkpoint (the params= form's "model_files": the
        # model object's model.json, so that a checkpoint of ModelTrainer is a model directory).
        self._model_files: Callable[[str], None] | None = None

    @classmethod
    def get_model(cls, checkpoint: Checkpoint) -> Any:
        """The booster saved in ``checkpoint``."""
        raise NotImplementedError

    @staticmethod
    def rounds_of(booster: Any) -> int:
        """The boosting rounds ``booster`` holds."""
        raise NotImplementedError

    @staticmethod
    def _import_framework() -> None:
        """Import the framework (ImportError naming the extra when it is missing); by default it is
        imported with the subclass's module."""

    def _save(self, model: Any, directory: str) -> None:
        model.save_model(os.path.join(directory, self._filename))
        if self._model_files is not None:
            self._model_files(directory)


def legacy_start(config: dict[str, Any], callback_cls: type[ReportCallback]) -> tuple[Any, int, Any]:
    """Where the built-in loop of the ``params=`` form starts: the booster of the latest checkpoint
    (None on a first attempt), the rounds still to boost, and the report callback checkpointing as
    the run config says."""
    start, rounds = None, config["num_boost_round"]
    checkpoint = get_checkpoint()
    if checkpoint is not None:
        start = callback_cls.get_model(checkpoint)
        rounds = max(0, rounds - callback_cls.rounds_of(start))
    callback = callback_cls(frequency=config["checkpoint_frequency"], checkpoint_at_end=config["checkpoint_at_end"])
    callback._model_files = config.get("model_files")
    return start, rounds, callback


def report_with_model(metrics: dict[str, Any], save: Callable[[str], None] | None) -> None:
    """``report(metrics)`` on every rank; with ``save``, rank 0 first saves the model into a fresh
    directory with ``save(directory)`` and hands it over as the checkpoint (the model is the same
    on every rank: it is persisted once)."""
    if save is None or get_context().get_world_rank() != 0:
        report(metrics)
        return
    directory = tempfile.mkdtemp(prefix="trainforge-model-")
    try:
        save(directory)
        report(metrics, checkpoint=Checkpoint.from_directory(directory))
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def checkpoint_file(checkpoint: Checkpoint, filename: str, who: str) -> Iterator[str]:
    """The path of ``filename`` in ``checkpoint`` (downloaded if it is remote) while in the block."""
    with checkpoint.as_directory() as directory:
        path = os.path.join(directory, filename)
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"{who}: {checkpoint!r} has no file {filename!r} (it holds {sorted(os.listdir(directory))}). "
                "Pass the filename the model was saved under (RayTrainReportCallback(filename=...))."
            )
        yield path
