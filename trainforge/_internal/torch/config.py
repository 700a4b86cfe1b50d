"""``TorchConfig`` and the backend that sets up ``torch.distributed`` on every worker.

torch is not imported here at module level: the driver builds a ``TorchConfig`` without importing
torch; the functions run on workers import it when they run.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from typing import Any

from trainforge._internal.backend import Backend, BackendConfig
from trainforge._internal.constants import (
    ENV_CUDA_VISIBLE_DEVICES,
    ENV_LOCAL_RANK,
    ENV_MASTER_ADDR,
    ENV_MASTER_PORT,
    ENV_RANK,
)
from trainforge._internal.exceptions import WorkerGroupError
from trainforge._internal.network import all_on_host, node_ip

logger = logging.getLogger("trainforge")

TORCH_BACKENDS = (None, "gloo", "nccl")
INIT_METHODS = ("env", "tcp")


@dataclass
class TorchConfig(BackendConfig):
    """How the workers' ``torch.distributed`` process group is set up.

    Example::

        TorchTrainer(train_loop, torch_config=TorchConfig(backend="gloo", timeout_s=600), ...)

    ``backend``: ``"nccl"`` or ``"gloo"``; ``None`` picks ``"nccl"`` when every worker has a GPU of
    its own and ``"gloo"`` otherwise (CPU workers, or workers that share a GPU by a fractional
    ``resources_per_worker={"GPU": 0.5}``, which NCCL refuses; gloo takes CUDA tensors too).
    ``init_method``: ``"env"`` or ``"tcp"`` (Ray Train's names); either way the workers rendezvous at a
    TCP store that rank 0 opens before the others join, and ``MASTER_ADDR`` / ``MASTER_PORT`` (its
    address) are set on every worker. ``timeout_s``: seconds a collective may wait before it fails.
    """

    backend: str | None = None
    init_method: str = "env"
    timeout_s: int = 1800

    def __post_init__(self) -> None:
        if self.backend not in TORCH_BACKENDS:
            raise ValueError(
                f"TorchConfig.backend={self.backend!r} is not valid: choose one of {TORCH_BACKENDS} "
                "(None picks 'nccl' on GPU workers, 'gloo' otherwise)."
            )
        if self.init_method not in INIT_METHODS:
            raise ValueError(
                f"TorchConfig.init_method={self.init_method!r} is not valid: choose one of {INIT_METHODS}."
            )
        t = self.timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0:
            raise ValueError(f"TorchConfig.timeout_s={t!r} is not valid: it must be a number of seconds > 0.")

    @property
    def backend_cls(self) -> type[Backend]:
        return _TorchBackend

    @property
    def framework(self) -> str | None:
        return "torch"

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "init_method": self.init_method, "timeout_s": self.timeout_s}


class _TorchBackend(Backend):
    """Creates the process group on ``on_start`` (rendezvous at rank 0) and destroys it on shutdown."""

    def on_start(self, worker_group: Any, backend_config: BackendConfig) -> None:
        assert isinstance(backend_config, TorchConfig)
        timeout_s = backend_config.timeout_s
        backend = backend_config.backend
        if backend != "gloo":  # nccl needs a GPU of its own on every rank: ask each which it would use
            try:
                backend, why = choose_backend(backend, worker_group.execute(_gpu_identity))
            except RuntimeError as exc:  # a failure of this attempt, as when a worker could not join
                raise WorkerGroupError(str(exc)) from exc
            if why:
                logger.info("TorchConfig(backend=None): using %s: %s", backend, why)
        hostname, node_ip, port = worker_group.execute_single(0, _rank0_address_and_port, timeout_s)
        addr = "127.0.0.1" if all_on_host(worker_group, hostname) else _rank0_node_ip(worker_group, node_ip)
        worker_group.execute(
            _setup_process_group,
            addr,
            port,
            backend,
            worker_group.num_workers,
            backend_config.timeout_s,
            backend_config.init_method,
        )

    def on_shutdown(self, worker_group: Any, backend_config: BackendConfig) -> None:
        worker_group.execute(_shutdown)


def choose_backend(requested: str | None, gpus: list[tuple[str, str | None]]) -> tuple[str, str]:
    """The process group's backend for ``requested`` (None or ``"nccl"``), given the GPU each rank
    would use (``(hostname, GPU id)``, the id None on a rank without CUDA; see :func:`_gpu_identity`),
    and why None did not give nccl (empty when it did). NCCL needs a GPU of its own on every rank: two
    ranks on one GPU (a fractional ``resources_per_worker={"GPU": 0.5}``) fail in its first collective
    ("Duplicate GPU detected"), and ranks that resolve different backends wait for each other forever.
    None therefore picks gloo (which takes CUDA tensors too) unless every rank has a GPU of its own;
    an explicit ``"nccl"`` that cannot work raises RuntimeError saying what to change."""
    without = [rank for rank, (_, gpu) in enumerate(gpus) if gpu is None]
    owner: dict[tuple[str, str | None], int] = {}
    shared: tuple[int, int, str] | None = None
    for rank, (host, gpu) in enumerate(gpus):
        if gpu is not None and shared is None:
            first = owner.setdefault((host, gpu), rank)
            if first != rank:
                shared = (first, rank, gpu)
    if requested == "nccl":
        if without:
            raise RuntimeError(
                f"TorchConfig(backend='nccl') needs a GPU on every worker, but rank(s) {without} see none "
                "(torch.cuda.is_available() is False there). Use ScalingConfig(use_gpu=True), or "
                "TorchConfig(backend='gloo') for CPU."
            )
        if shared is not None:
            a, b, gpu = shared
            raise RuntimeError(
                f"TorchConfig(backend='nccl') needs a GPU of its own for every worker, but ranks {a} and {b} share "
                f"GPU {gpu} (a fractional resources_per_worker['GPU'] packs workers onto one GPU), which NCCL "
                "refuses. Use TorchConfig(backend='gloo') (or None, which picks it), or one whole GPU per worker."
            )
        return "nccl", ""
    if not gpus or len(without) == len(gpus):
        return "gloo", ""
    if without:
        return "gloo", f"rank(s) {without} have no GPU"
    if shared is not None:
        a, b, gpu = shared
        return "gloo", f"ranks {a} and {b} share GPU {gpu}, and NCCL needs a GPU of its own for each rank"
    return "nccl", ""


def _rank0_node_ip(worker_group: Any, fallback: str) -> str:
    """Rank 0's address as its cluster knows it (a Ray node IP), else what rank 0 found itself."""
    try:
        ip = worker_group.worker_metadata[0].node_ip
    except Exception:
        return fallback
    return ip if ip and not ip.startswith("127.") else fallback


# -- run on the workers (module-level so they pickle by reference) -------------------------------
def _gpu_identity() -> tuple[str, str | None]:
    """``(hostname, GPU)``: the GPU this worker's process group would use (its UUID, else its
    ``CUDA_VISIBLE_DEVICES`` entry), None without CUDA (see :func:`choose_backend`)."""
    import torch

    if not torch.cuda.is_available():
        return socket.gethostname(), None
    index = int(os.environ.get(ENV_LOCAL_RANK, "0")) % torch.cuda.device_count()
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    if uuid is not None:  # nvidia-smi's form: GPU-<uuid>
        return socket.gethostname(), "GPU-" + str(uuid).removeprefix("GPU-")
    visible = [g.strip() for g in os.environ.get(ENV_CUDA_VISIBLE_DEVICES, "").split(",") if g.strip()]
    return socket.gethostname(), visible[index] if index < len(visible) else str(index)


# Rank 0's rendezvous store (a TCPStore server), from _rank0_address_and_port until _shutdown.
_store: Any = None


def _rank0_address_and_port(timeout_s: float = 1800) -> tuple[str, str, int]:
    """Open rank 0's rendezvous store now, on a port the OS picks, and say where it is. The other
    ranks then find it listening (one that connects before the server is up backs off for up to a
    second) on a port nothing can take in between (as one found free, closed and reopened can be)."""
    from datetime import timedelta

    import torch.distributed as dist

    global _store
    _store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=timeout_s), wait_for_workers=False)
    return socket.gethostname(), node_ip(), int(_store.port)


def _rendezvous_store(master_addr: str, master_port: int, rank: int, timeout_s: float) -> Any:
    """Rank 0: the store _rank0_address_and_port opened (or a new one on ``master_port``); other
    ranks: a client of it."""
    from datetime import timedelta

    import torch.distributed as dist

    global _store
    timeout = timedelta(seconds=timeout_s)
    if rank != 0:
        return dist.TCPStore(master_addr, master_port, None, False, timeout)
    if _store is None or int(_store.port) != master_port:
        _store = dist.TCPStore("127.0.0.1", master_port, None, True, timeout, wait_for_workers=False)
    return _store


def _resolve_torch_backend(backend: str | None) -> str:
    import torch

    if backend is None:
        return "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl" and not torch.cuda.is_available():
        raise RuntimeError(
            "TorchConfig(backend='nccl') needs a GPU on every worker, but torch.cuda.is_available() is "
            "False on this worker. Use ScalingConfig(use_gpu=True), or TorchConfig(backend='gloo') for CPU."
        )
    return backend


def _setup_process_group(
    master_addr: str,
    master_port: int,
    backend: str | None,
    world_size: int,
    timeout_s: float,
    init_method: str = "tcp",
) -> None:
    """Join the process group of ``world_size`` workers whose rendezvous is ``master_addr:master_port``.

    The rank is this worker's ``RANK`` (set by trainforge for every worker). With either ``init_method``
    the ranks meet at rank 0's TCP store (see :func:`_rendezvous_store`).
    """
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    rank = int(os.environ[ENV_RANK])
    os.environ[ENV_MASTER_ADDR] = master_addr
    os.environ[ENV_MASTER_PORT] = str(master_port)
    backend = _resolve_torch_backend(backend)
    if backend == "nccl":
        count = torch.cuda.device_count()
        torch.cuda.set_device(int(os.environ.get(ENV_LOCAL_RANK, "0")) % count)
    # Hugging Face Accelerate (under transformers' Trainer) places the model on get_device(), as with Ray Train.
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        os.environ["ACCELERATE_TORCH_DEVICE"] = f"cuda:{int(os.environ.get(ENV_LOCAL_RANK, '0')) % count}"
    else:
        os.environ["ACCELERATE_TORCH_DEVICE"] = "cpu"
    if dist.is_initialized():  # a previous attempt in this process left one behind
        dist.destroy_process_group()
    dist.init_process_group(
        backend,
        store=_rendezvous_store(master_addr, master_port, rank, timeout_s),
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )


def _shutdown() -> None:
    global _store
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # tearing down: a broken group must not hide the real result
        pass
    _store = None
