"""``LightGBMConfig``, the backend that gives every worker LightGBM's network parameters, and
:func:`get_network_params`.

LightGBM's socket collective is configured by parameters, not by a tracker: every worker listens on
a port of its own (``local_listen_port``) and connects to every other one (``machines``). On every
attempt the backend finds a fresh free port on each worker (distinct among the workers of one host)
and sets those parameters, with ``time_out`` from ``LightGBMConfig.timeout_s`` instead of
LightGBM's two hours: a restart never reuses a port that the killed attempt's sockets may still hold
(lightgbm#4960), and a worker that cannot reach the others fails within minutes, not hours. The port
is free when it is found and bound by LightGBM a moment later; if something takes it in between, the
worker fails with LightGBM's "Binding port ... failed" and the next attempt (``FailureConfig``)
gets new ports.
"""

from __future__ import annotations

import math
import os
import socket
from dataclasses import dataclass
from typing import Any

from trainforge._internal.constants import ENV_RANK
from trainforge._internal.network import all_on_host, node_ip
from trainforge.backend import Backend, BackendConfig

PORT_TRIES = 5


@dataclass
class LightGBMConfig(BackendConfig):
    """How the workers' LightGBM network is set up.

    ``timeout_s`` (trainforge extension): how long a worker waits for the others to connect,
    LightGBM's ``time_out`` (whole minutes, rounded up; LightGBM's own default is 120 minutes).
    """

    timeout_s: int = 120

    def __post_init__(self) -> None:
        t = self.timeout_s
        if isinstance(t, bool) or not isinstance(t, int) or t < 1:
            raise ValueError(f"LightGBMConfig.timeout_s={t!r} is not valid: it must be an int number of seconds >= 1.")

    @property
    def backend_cls(self) -> type[Backend]:
        return _LightGBMBackend

    @property
    def framework(self) -> str | None:
        return "lightgbm"

    def to_dict(self) -> dict[str, Any]:
        return {"timeout_s": self.timeout_s}


class _LightGBMBackend(Backend):
    """Fresh ports and ``machines`` for every attempt's workers."""

    def on_start(self, worker_group: Any, backend_config: BackendConfig) -> None:
        assert isinstance(backend_config, LightGBMConfig)
        local = all_on_host(worker_group, socket.gethostname())
        for _ in range(PORT_TRIES):
            found = worker_group.execute(_find_port, local)
            if len(set(found)) == len(found):  # two workers of one host could draw the same free port
                break
        else:
            raise RuntimeError(f"LightGBM: could not find {len(found)} distinct free ports on the workers: {found}")
        machines = ",".join(f"{host}:{port}" for host, port in found)
        params = {
            "machines": machines,
            "num_machines": len(found),
            "time_out": max(1, math.ceil(backend_config.timeout_s / 60)),
        }
        worker_group.execute(_set_network_params, params, [port for _, port in found])


# -- on the workers ---------------------------------------------------------------------------------
_network_params: dict[str, Any] | None = None


def _find_port(local: bool) -> tuple[str, int]:
    """(address other workers reach this one at, a port free on it now)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1" if local else "", 0))
        port = s.getsockname()[1]
    return ("127.0.0.1" if local else node_ip()), port


def _set_network_params(params: dict[str, Any], ports: list[int]) -> None:
    global _network_params
    _network_params = {**params, "local_listen_port": ports[int(os.environ.get(ENV_RANK, "0"))]}


def get_network_params() -> dict[str, Any]:
    """LightGBM's network parameters for this worker in this attempt: ``machines``, ``num_machines``,
    ``local_listen_port``, ``time_out``. Merge them into the ``params`` of ``lightgbm.train`` in
    the train loop of a :class:`LightGBMTrainer` (with ``tree_learner="data_parallel"`` and
    ``pre_partition=True`` when each worker reads its own shard). Outside one: ``{}``."""
    return dict(_network_params) if _network_params is not None else {}
