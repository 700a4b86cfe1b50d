"""``XGBoostConfig`` and the backend that joins the workers into XGBoost's collective.

On every attempt the driver starts a fresh tracker (XGBoost's ``RabitTracker``, a C++ thread in the
driver process) for exactly that attempt's workers, and each worker runs the train loop inside
``xgboost.collective.CommunicatorContext`` pointed at it, with a task id that makes XGBoost's rank
the worker's trainforge rank. When the attempt ends, however it ends, the tracker is freed
(``Backend.on_attempt_end``): a restart never meets a tracker still waiting for a dead worker.
A worker that dies ends the attempt at once: trainforge sees the process exit and stops the other
workers, which would otherwise wait in an allreduce for XGBoost's timeouts (dmlc/xgboost#1612).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from trainforge._internal.constants import ENV_RANK
from trainforge._internal.network import all_on_host, node_ip
from trainforge.backend import Backend, BackendConfig

COMMUNICATORS = ("rabit",)


@dataclass
class XGBoostConfig(BackendConfig):
    """How the workers' XGBoost collective is set up.

    ``xgboost_communicator``: ``"rabit"`` (XGBoost's tracker-based collective; the only one).
    ``timeout_s`` (trainforge extension): seconds the tracker and the workers wait for each other
    while the collective is being set up or torn down (XGBoost's ``dmlc_timeout``); a worker that
    fails during training is detected by trainforge without waiting for it.
    """

    xgboost_communicator: str = "rabit"
    timeout_s: int = 300

    def __post_init__(self) -> None:
        if self.xgboost_communicator not in COMMUNICATORS:
            raise ValueError(
                f"XGBoostConfig.xgboost_communicator={self.xgboost_communicator!r} is not valid: use one of "
                f"{COMMUNICATORS}."
            )
        t = self.timeout_s
        if isinstance(t, bool) or not isinstance(t, int) or t < 1:
            raise ValueError(f"XGBoostConfig.timeout_s={t!r} is not valid: it must be an int number of seconds >= 1.")

    @property
    def backend_cls(self) -> type[Backend]:
        return _XGBoostBackend

    @property
    def framework(self) -> str | None:
        return "xgboost"

    def to_dict(self) -> dict[str, Any]:
        return {"xgboost_communicator": self.xgboost_communicator, "timeout_s": self.timeout_s}

    @property
    def train_func_context(self) -> Callable[[], contextlib.AbstractContextManager[Any]]:
        return collective_context


class _XGBoostBackend(Backend):
    """Starts a tracker per attempt in the driver; frees it when the attempt's workers are gone."""

    def __init__(self) -> None:
        self._tracker: Any = None

    def on_start(self, worker_group: Any, backend_config: BackendConfig) -> None:
        assert isinstance(backend_config, XGBoostConfig)
        from trainforge._internal.extras import import_xgboost

        import_xgboost()
        from xgboost.tracker import RabitTracker

        self.on_attempt_end(backend_config)  # one an earlier attempt left behind
        host = "127.0.0.1" if all_on_host(worker_group, socket.gethostname()) else node_ip()
        tracker = RabitTracker(
            n_workers=worker_group.num_workers, host_ip=host, sortby="task", timeout=backend_config.timeout_s
        )
        tracker.start()
        self._tracker = tracker
        args = {**tracker.worker_args(), "dmlc_timeout": backend_config.timeout_s}
        worker_group.execute(_set_worker_args, args)

    def on_attempt_end(self, backend_config: BackendConfig) -> None:
        tracker, self._tracker = self._tracker, None
        if tracker is not None:
            with contextlib.suppress(Exception):  # freeing a tracker whose workers are gone reports it
                tracker.free()


# -- on the workers ---------------------------------------------------------------------------------
_worker_args: dict[str, Any] | None = None


def _set_worker_args(args: dict[str, Any]) -> None:
    global _worker_args
    _worker_args = dict(args)


@contextlib.contextmanager
def collective_context() -> Iterator[None]:
    """Run the train loop in XGBoost's collective (``CommunicatorContext``), as this worker's rank."""
    if _worker_args is None:  # not started by the backend (a loop run outside XGBoostTrainer)
        yield
        return
    from xgboost.collective import CommunicatorContext

    rank = int(os.environ.get(ENV_RANK, "0"))
    # The tracker sorts workers by task id: zero-padded ranks keep XGBoost's ranks equal to ours.
    with CommunicatorContext(**_worker_args, dmlc_task_id=f"[xgboost.trainforge-rank={rank:08d}]"):
        yield
