"""``Result`` (what ``fit()`` returns) and ``TrainingReport`` (what ``fit_iter()`` yields)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from trainforge._internal.checkpoint import Checkpoint
from trainforge._internal.config import CheckpointConfig


@dataclass
class TrainingReport:
    """One report that every rank has made. ``metrics`` is rank 0's; ``all_metrics[r]`` is rank r's;
    ``checkpoint`` is the committed checkpoint of this report, if any rank passed one."""

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
    """

    metrics: dict[str, Any] | None
    checkpoint: Checkpoint | None
    error: BaseException | None
    path: str
    best_checkpoints: list[tuple[Checkpoint, dict[str, Any]]] = field(default_factory=list)
    metrics_history: list[dict[str, Any]] = field(default_factory=list, repr=False)
    filesystem: Any = field(default=None, repr=False)

    @property
    def metrics_dataframe(self) -> Any:
        import pandas as pd

        return pd.DataFrame(self.metrics_history)

    @classmethod
    def from_path(cls, path: str, storage_filesystem: Any = None) -> Result:
        """Rebuild the Result of a run from its directory (local path or fsspec URL)."""
        from trainforge._internal.checkpoint_manager import CheckpointManager
        from trainforge._internal.exceptions import TrainingFailedError
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
        error = TrainingFailedError(state["error"]) if state.get("error") else None
        return cls(
            metrics=history[-1] if history else None,
            checkpoint=manager.latest,
            error=error,
            path=storage.run_path,
            best_checkpoints=manager.best_checkpoints,
            metrics_history=history,
            filesystem=storage.fs,
        )
