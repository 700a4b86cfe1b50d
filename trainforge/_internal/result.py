"""``Result`` (what ``fit()`` returns) and ``TrainingReport`` (what ``fit_iter()`` yields)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from trainforge._internal.checkpoint import Checkpoint
from trainforge._internal.config import CheckpointConfig
from trainforge._internal.exceptions import WorkerFailure
from trainforge._internal.metric_path import flat_keys, lookup


@dataclass
class TrainingReport:
    """One report that every rank has made. ``metrics`` is rank 0's; ``all_metrics[r]`` is rank r's;
    ``checkpoint`` is the committed checkpoint of this report, if any rank passed one.

    ``index`` is the report's row in ``Result.metrics_dataframe`` (and the ``[report N]`` of the
    console): the history continues across restarts from the latest checkpoint, so a report redone
    after a restart has the number of the one it replaces. ``attempt`` is the attempt that made it,
    as ``get_context().get_attempt()`` (0 for the first; n after n restarts or resizes)."""

    index: int
    metrics: dict[str, Any]
    all_metrics: list[dict[str, Any]]
    checkpoint: Checkpoint | None
    attempt: int = 0


@dataclass
class Result:
    """The outcome of a run.

    ``metrics``: the last metrics rank 0 reported. ``metrics_dataframe``: every report of rank 0, in
    order (pandas). ``checkpoint``: the latest committed checkpoint. ``best_checkpoints``: the
    checkpoints kept by ``CheckpointConfig`` with their metrics, in the order they were reported.
    ``path``: the run directory. ``error``: the exception that ended the run, or None.
    :meth:`get_best_checkpoint` picks one of ``best_checkpoints`` by a reported metric.

    ``failures`` (trainforge extension): every worker failure of the run, oldest first, those it
    recovered from included, as :class:`WorkerFailure` records whose ``attempt`` says in which attempt
    (as ``get_context().get_attempt()``) it happened; also kept in ``run_state.json`` (``"failures"``).
    """

    metrics: dict[str, Any] | None
    checkpoint: Checkpoint | None
    error: BaseException | None
    path: str
    best_checkpoints: list[tuple[Checkpoint, dict[str, Any]]] = field(default_factory=list)
    metrics_history: list[dict[str, Any]] = field(default_factory=list, repr=False)
    filesystem: Any = field(default=None, repr=False)
    failures: list[WorkerFailure] = field(default_factory=list, repr=False)

    @property
    def metrics_dataframe(self) -> Any:
        import pandas as pd

        return pd.DataFrame(self.metrics_history)

    def get_best_checkpoint(self, metric: str, mode: str) -> Checkpoint | None:
        """The checkpoint of ``best_checkpoints`` whose reported ``metric`` is the highest
        (``mode="max"``) or lowest (``mode="min"``); the first one reported on a tie.

        ``metric`` is a key of the reported metrics; ``"a/b"`` also finds a nested ``{"a": {"b": ...}}``
        (as Ray Train). Checkpoints whose metrics lack it (or hold None) are skipped; if none has it,
        ValueError names the metrics they have. Returns None when the run committed no checkpoint
        (Ray Train raises RuntimeError there).

        Example::

            best = result.get_best_checkpoint(metric="val_loss", mode="min")
        """
        if mode not in ("max", "min"):
            raise ValueError(f"Result.get_best_checkpoint(mode={mode!r}): mode must be 'max' or 'min'.")
        if not self.best_checkpoints:
            return None
        scored = [(c, v) for c, m in self.best_checkpoints if (v := lookup(m, metric)) is not None]
        if not scored:
            names = sorted({k for _, m in self.best_checkpoints for k in flat_keys(m)})
            raise ValueError(
                f"Result.get_best_checkpoint(metric={metric!r}): none of the {len(self.best_checkpoints)} "
                f"checkpoints was reported with metric {metric!r}. Metrics reported with them: {names}."
            )
        pick = max if mode == "max" else min
        return pick(scored, key=lambda item: item[1])[0]

    @classmethod
    def from_path(cls, path: str, storage_filesystem: Any = None) -> Result:
        """Rebuild the Result of a run from its directory (local path or fsspec URL)."""
        from trainforge._internal.checkpoint_manager import CheckpointManager
        from trainforge._internal.exceptions import TrainingFailedError
        from trainforge._internal.failure_log import failure_from_json, group_by_attempt
        from trainforge._internal.metrics_log import MetricsLog
        from trainforge._internal.storage import RUN_STATE_FILE, StorageContext

        parent, _, name = str(path).rstrip("/").rpartition("/")
        storage = StorageContext(parent or ".", name, storage_filesystem)
        state_text = storage.read_text(RUN_STATE_FILE)
        if state_text is None:
            raise ValueError(
                f"Result.from_path({path!r}): {storage.path(RUN_STATE_FILE)} does not exist; pass the directory "
                "of a trainforge run (result.path)."
            )
        state = json.loads(state_text)
        manager = CheckpointManager(CheckpointConfig(**state.get("checkpoint_config", {})))
        manager.load(storage.list_checkpoints())
        history = MetricsLog(storage).rows
        failures = [failure_from_json(f) for f in state.get("failures", [])]
        error = TrainingFailedError(state["error"], group_by_attempt(failures)) if state.get("error") else None
        return cls(
            metrics=history[-1] if history else None,
            checkpoint=manager.latest,
            error=error,
            path=storage.run_path,
            best_checkpoints=manager.best_checkpoints,
            metrics_history=history,
            filesystem=storage.fs,
            failures=failures,
        )
