"""``TrainingIterator``: what ``Trainer.run_iterator()`` returns, one run's results as they arrive."""

from __future__ import annotations

import logging
from typing import Any

from trainforge.v1._checkpoint import CheckpointManager
from trainforge.v1._group import Answer, WorkerGroup
from trainforge.v1._protocol import CHECKPOINT, DONE, ERROR, RESULT

logger = logging.getLogger("trainforge")


class TrainingIterator:
    """An iterator over a run's results: each item is a list with one dict per worker (what each
    passed to ``train.report()``). Checkpoints are kept as they arrive (``trainer.latest_checkpoint``).
    After the last one, :meth:`get_final_results` returns each worker's return value.

    Example::

        iterator = trainer.run_iterator(train_func, config={"epochs": 3})
        for results in iterator:
            print(results[0]["loss"])
        values = iterator.get_final_results()
    """

    def __init__(self, group: WorkerGroup, checkpoints: CheckpointManager):
        self._group = group
        self._checkpoints = checkpoints
        self._final_results: list[Any] | None = None
        self._finished = False

    def __iter__(self) -> TrainingIterator:
        return self

    def __next__(self) -> list[dict[str, Any]]:
        if self._finished:
            raise StopIteration
        answer = self._next_answer()
        if answer.kind == RESULT:
            return answer.values
        raise StopIteration  # DONE: the return values are in get_final_results()

    def _next_answer(self) -> Answer:
        """The next result or the end (checkpoints are processed on the way)."""
        while True:
            try:
                answer = self._group.next_answer()
                if answer.kind == CHECKPOINT:
                    self._checkpoints.process(answer.values[0])  # rank 0's dict
                    continue
            except BaseException:
                self.abandon()
                raise
            if answer.kind in (DONE, ERROR):
                self._finished = True
            if answer.kind == DONE:
                self._final_results = answer.values
            if answer.kind == ERROR:
                raise answer.error()
            return answer

    def is_finished(self) -> bool:
        return self._finished

    def get_final_results(self, force: bool = False) -> list[Any] | None:
        """Each worker's return value of the train function, in rank order. Before the iteration
        ended: None (and a log line), or with ``force=True`` run to the end first (the remaining
        results are dropped, their checkpoints kept)."""
        if not self._finished:
            if not force:
                logger.info(
                    "Please finish iterating through the intermediate results before getting the final returns. If "
                    "you would like training to finish immediately and get the final returns, then set `force=True`."
                )
                return None
            while self._next_answer().kind != DONE:
                pass
        return self._final_results

    def abandon(self) -> None:
        """Stop the run where it is (the worker group stops; the trainer starts a new one next run)."""
        if not self._finished:
            self._finished = True
            self._group.abort()
