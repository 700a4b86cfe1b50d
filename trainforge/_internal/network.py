"""Network facts about this machine and a worker group, for backends that set up their own
rendezvous (torch, XGBoost, LightGBM, TensorFlow): the named internal interface they share."""

from __future__ import annotations

import socket
from typing import Any


def all_on_host(worker_group: Any, hostname: str) -> bool:
    """True when every worker runs on ``hostname``, so rank 0 is reachable on the loopback address."""
    try:
        hosts = {m.hostname for m in worker_group.worker_metadata}
    except Exception:  # a group that cannot say where its workers are: compare with the driver
        hosts = {socket.gethostname()}
    return hosts <= {hostname}


def node_ip() -> str:
    """An address of this machine that other machines can reach (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            return s.getsockname()[0]
    except OSError:
        pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def free_port() -> int:
    """A TCP port free now (another process may take it before it is used: bind 0 where you can)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]
