"""The functions a Ray Train 1.x train function calls on a worker (``train.report``,
``train.save_checkpoint``, ``train.load_checkpoint``, ``train.world_rank`` ...), and the line
between the 1.x and 2.x APIs.

While a train function runs under ``trainforge.v1`` (:func:`activated`), the worker has a
:class:`WorkerSession` and the core's session is swapped for a guard whose ``report``,
``get_checkpoint`` and ``get_dataset_shard`` raise an error naming the 1.x function to call (its
``context`` stays, so ``trainforge.torch.prepare_model`` and friends work). In a 2.x train loop
(a core session but no 1.x one) the 1.x functions raise an error naming the 2.x function. Outside
any run they warn and return Ray's default, as Ray Train 1.x did (so a train function can be called
directly to debug it).
"""

from __future__ import annotations

import contextlib
import os
import platform
import time
import warnings
from collections.abc import Iterator
from datetime import datetime
from typing import Any, Protocol

from trainforge._internal import session as core_session
from trainforge.v1._constants import (
    DATE,
    HOSTNAME,
    NODE_IP,
    PID,
    TIME_THIS_ITER_S,
    TIME_TOTAL_S,
    TIMESTAMP,
    TRAINING_ITERATION,
    detailed_autofilled_metrics,
)

# What a 2.x train loop calls instead of each 1.x function.
_TWO_X = {
    "report": "trainforge.report({...})",
    "save_checkpoint": "trainforge.report(metrics, checkpoint=trainforge.Checkpoint.from_directory(dir))",
    "load_checkpoint": "trainforge.get_checkpoint()",
    "world_rank": "trainforge.get_context().get_world_rank()",
    "local_rank": "trainforge.get_context().get_local_rank()",
    "world_size": "trainforge.get_context().get_world_size()",
    "get_dataset_shard": "trainforge.get_dataset_shard(name)",
}


class Sink(Protocol):
    """Where a worker session's results and checkpoints go (the driven run, or a tuner's trial)."""

    def result(self, metrics: dict[str, Any]) -> None: ...

    def checkpoint(self, data: dict[str, Any]) -> None: ...


class WorkerSession:
    """One train function's run on one worker."""

    def __init__(self, context: Any, checkpoint: dict[str, Any] | None, shard: Any, sink: Sink):
        self.context = context
        self.loaded_checkpoint = checkpoint
        self.dataset_shard = shard
        self._sink = sink
        self._detailed = detailed_autofilled_metrics()
        self._iteration = 0
        self._time_total = 0.0
        self._last_report = time.time()

    def report(self, metrics: dict[str, Any]) -> None:
        self._sink.result(self._autofill(metrics))

    def save_checkpoint(self, data: dict[str, Any]) -> None:
        self.loaded_checkpoint = data  # as 1.x: load_checkpoint() now returns what this worker saved
        self._sink.checkpoint({**data, TIMESTAMP: int(time.mktime(datetime.now().timetuple()))})

    def _autofill(self, result: dict[str, Any]) -> dict[str, Any]:
        now, when = time.time(), datetime.now()
        this_iter = result.get(TIME_THIS_ITER_S, now - self._last_report)
        self._iteration += 1
        self._time_total += this_iter
        self._last_report = now
        filled = {TIMESTAMP: int(time.mktime(when.timetuple())), TIME_THIS_ITER_S: this_iter,
                  TRAINING_ITERATION: self._iteration}  # fmt: skip
        if self._detailed:
            filled.update({DATE: when.strftime("%Y-%m-%d_%H-%M-%S"), TIME_TOTAL_S: self._time_total,
                           PID: os.getpid(), HOSTNAME: platform.node(), NODE_IP: _node_ip()})  # fmt: skip
        return {**result, **filled}


def _node_ip() -> str:
    from trainforge._internal.network import node_ip

    return node_ip()


class _Guard(core_session.Session):
    """The core session as a 1.x train function sees it: its context, and errors for the 2.x calls."""

    def __init__(self, real: core_session.Session):
        super().__init__(real.context, _refuse, storage=None, checkpoint=None, dataset_shards={})

    def report(self, metrics: dict[str, Any], checkpoint: Any = None, checkpoint_upload_mode: Any = None) -> None:
        raise RuntimeError(
            "trainforge.report() is Ray Train 2.x's API, but this function runs under Ray Train 1.x's "
            "(trainforge.v1.Trainer): call trainforge.v1.report(**metrics), and "
            "trainforge.v1.save_checkpoint(**state) for a checkpoint."
        )

    def get_checkpoint(self) -> Any:
        raise RuntimeError(
            "trainforge.get_checkpoint() is Ray Train 2.x's API, but this function runs under Ray Train 1.x's "
            "(trainforge.v1.Trainer): call trainforge.v1.load_checkpoint() (the dict of the last save_checkpoint)."
        )

    def get_dataset_shard(self, name: str) -> Any:
        raise RuntimeError(
            "trainforge.get_dataset_shard() is Ray Train 2.x's API, but this function runs under Ray Train 1.x's "
            "(trainforge.v1.Trainer): call trainforge.v1.get_dataset_shard(name) for the dataset passed to run()."
        )


def _refuse(*args: Any, **kwargs: Any) -> None:
    raise RuntimeError("a Ray Train 1.x train function cannot report through Ray Train 2.x's session")


_current: WorkerSession | None = None


@contextlib.contextmanager
def activated(session: WorkerSession) -> Iterator[None]:
    """Run a train function under ``session``, the core's session guarded (see the module docstring)."""
    global _current
    real = core_session.get_session()
    core_session.set_session(_Guard(real))
    _current = session
    try:
        yield
    finally:
        _current = None
        core_session.set_session(real)


def _session(name: str) -> WorkerSession | None:
    if _current is not None:
        return _current
    if core_session.in_session():
        raise RuntimeError(
            f"trainforge.v1.{name}() is Ray Train 1.x's API and works in a function run by "
            f"trainforge.v1.Trainer.run(); this is a Ray Train 2.x train loop: call {_TWO_X[name]} instead."
        )
    warnings.warn(
        f"`trainforge.v1.{name}()` is meant to only be called inside a training function that is executed by "
        "`Trainer.run`; here it does nothing.",
        stacklevel=3,
    )
    return None


# -- Ray Train 1.x's functions (re-exported from trainforge.v1) ------------------------------------
def report(**kwargs: Any) -> None:
    """Report the current results (one dict per worker reaches the driver: ``run_iterator`` yields
    the list, callbacks' ``handle_result`` get it). Call it the same number of times on every worker.

    Example::

        train.report(loss=loss, epoch=epoch)
    """
    session = _session("report")
    if session is not None:
        session.report(kwargs)


def save_checkpoint(**kwargs: Any) -> None:
    """Save a checkpoint: a dict of picklable values. Call it on every worker; rank 0's is kept
    (``{logdir}/run_NNN/checkpoints/checkpoint_NNNNNN``) and is what a restart resumes from.

    Example::

        train.save_checkpoint(epoch=epoch, model=model.state_dict())
    """
    session = _session("save_checkpoint")
    if session is not None:
        session.save_checkpoint(kwargs)


def load_checkpoint() -> dict[str, Any] | None:
    """The checkpoint to start from: ``run(checkpoint=...)``, or after a restart the latest one this
    run saved (None if there is none)."""
    session = _session("load_checkpoint")
    return None if session is None else session.loaded_checkpoint


def world_rank() -> int:
    """This worker's rank among all workers (0 outside a run)."""
    session = _session("world_rank")
    return 0 if session is None else int(session.context.get_world_rank())


def local_rank() -> int:
    """This worker's rank among the workers of its machine (0 outside a run)."""
    session = _session("local_rank")
    return 0 if session is None else int(session.context.get_local_rank())


def world_size() -> int:
    """The number of workers (1 outside a run)."""
    session = _session("world_size")
    return 1 if session is None else int(session.context.get_world_size())


def get_dataset_shard(dataset_name: str | None = None) -> Any:
    """This worker's shard of ``run(dataset=...)``: of the dataset, or with a dict of datasets of the
    one named ``dataset_name``. None (with a warning) when no dataset was passed."""
    session = _session("get_dataset_shard")
    if session is None:
        return None
    shard = session.dataset_shard
    if shard is None:
        warnings.warn("No dataset passed in. Returning None. Make sure to pass in a dataset to Trainer.run to use "
                      "this function.", stacklevel=2)  # fmt: skip
        return None
    if isinstance(shard, dict):
        if not dataset_name:
            raise RuntimeError(
                f"Multiple datasets were passed into ``Trainer`` ({sorted(shard)}), but no ``dataset_name`` is "
                "passed into ``get_dataset_shard``. Please specify which dataset shard to retrieve."
            )
        return shard.get(dataset_name)
    return shard
