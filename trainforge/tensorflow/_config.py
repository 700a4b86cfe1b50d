"""``TensorflowConfig`` and the backend that gives every worker its ``TF_CONFIG``.

TensorFlow is not imported here: the driver builds the config without it, and the functions run on
the workers only set environment variables that ``MultiWorkerMirroredStrategy`` reads when the train
loop creates it.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from typing import Any

from trainforge._internal.constants import ENV_RANK
from trainforge.backend import Backend, BackendConfig
from trainforge.tensorflow.env import ENV_TF_CONFIG, prepare_worker


@dataclass
class TensorflowConfig(BackendConfig):
    """How the workers of a :class:`TensorflowTrainer` are set up.

    Example::

        TensorflowTrainer(train_loop, tensorflow_config=TensorflowConfig(intra_op_threads=4), ...)

    Every worker gets ``TF_CONFIG`` (the cluster: each worker's address and a port free on its host,
    new at every attempt; its task: ``{"type": "worker", "index": rank}``), so that
    ``tf.distribute.MultiWorkerMirroredStrategy()`` built in the train loop joins them, and
    ``TF_USE_LEGACY_KERAS=1`` (``tf.keras`` is tf-keras, Keras 2; see ``trainforge.tensorflow``).

    ``intra_op_threads`` / ``inter_op_threads``: the sizes of each worker's TensorFlow thread pools
    (``TF_NUM_INTRAOP_THREADS`` / ``TF_NUM_INTEROP_THREADS``); 0 lets TensorFlow use one thread per
    core. ``None`` (default): the environment variable if you set it, else the CPUs reserved per worker
    (``ScalingConfig.resources_per_worker["CPU"]``, 1 by default, as trainforge sets
    ``OMP_NUM_THREADS``), so that workers sharing a machine do not each start a pool as large as it.
    """

    intra_op_threads: int | None = None
    inter_op_threads: int | None = None

    def __post_init__(self) -> None:
        for name in ("intra_op_threads", "inter_op_threads"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(
                    f"TensorflowConfig.{name}={value!r} is not valid: use a number of threads >= 1, 0 for "
                    "TensorFlow's default (one per core), or None for the CPUs reserved per worker."
                )

    @property
    def backend_cls(self) -> type[Backend]:
        return _TensorflowBackend

    @property
    def framework(self) -> str | None:
        return "tensorflow"

    def to_dict(self) -> dict[str, Any]:
        return {"intra_op_threads": self.intra_op_threads, "inter_op_threads": self.inter_op_threads}


class _TensorflowBackend(Backend):
    """On every attempt: check each worker's install, then find a free port on each worker and give
    every worker the cluster in ``TF_CONFIG``."""

    def on_start(self, worker_group: Any, backend_config: BackendConfig) -> None:
        assert isinstance(backend_config, TensorflowConfig)
        # Also done by TensorflowTrainer's worker_init_fn (before the user's); here for a
        # DataParallelTrainer given a TensorflowConfig.
        worker_group.execute(prepare_worker, backend_config.intra_op_threads, backend_config.inter_op_threads)
        found = worker_group.execute(_host_and_free_port)
        worker_group.execute(_set_tf_config, cluster_addresses(worker_group, found))


def cluster_addresses(worker_group: Any, found: list[tuple[str, str, int]]) -> list[str]:
    """``host:port`` of each rank, from what each found (hostname, address, free port): the loopback
    address when every worker runs on one host, else each worker's node address (as its cluster knows
    it, e.g. a Ray node IP, or the one it found itself)."""
    if len({hostname for hostname, _, _ in found}) == 1:
        return [f"127.0.0.1:{port}" for _, _, port in found]
    try:
        known = [m.node_ip for m in worker_group.worker_metadata]
    except Exception:  # a group that cannot say where its workers are
        known = [""] * len(found)
    addresses = []
    for (_, ip, port), node_ip in zip(found, known, strict=True):
        host = node_ip if node_ip and not node_ip.startswith("127.") else ip
        addresses.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    return addresses


# -- run on the workers (module-level so they pickle by reference) -------------------------------
def _host_and_free_port() -> tuple[str, str, int]:
    """This worker's hostname, an address other hosts can reach it at, and a port free now. The port
    is closed again: TensorFlow's server binds it when the strategy is created (a port taken in
    between fails that attempt, and the next attempt finds new ones)."""
    from trainforge._internal.network import free_port, node_ip

    return socket.gethostname(), node_ip(), free_port()


def _set_tf_config(addresses: list[str]) -> None:
    rank = int(os.environ[ENV_RANK])
    os.environ[ENV_TF_CONFIG] = json.dumps(
        {"cluster": {"worker": list(addresses)}, "task": {"type": "worker", "index": rank}}
    )
