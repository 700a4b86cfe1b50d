"""What the train server puts in the core's tables (:mod:`trainforge._internal.extensions`):
``trainer.submit()``, a trainer queued as a job of the server."""

from __future__ import annotations

from typing import Any


def submit(trainer: Any, **options: Any) -> Any:
    """Queue ``trainer`` on a train server (see ``DataParallelTrainer.submit``); returns the job handle."""
    from trainforge.server._submission import submit_trainer

    return submit_trainer(trainer, **options)
