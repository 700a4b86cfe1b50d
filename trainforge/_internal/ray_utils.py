"""Ray, imported lazily: whether this process is connected, and connecting.

trainforge uses Ray core only (actors, placement groups, the object store) and Ray Data when a
``ray.data.Dataset`` is given; it never imports ``ray.train``, ``ray.tune`` or ``ray.air``.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from typing import Any

logger = logging.getLogger("trainforge")

# Ray's own variable: the address of the cluster ``ray.init()`` joins.
ENV_RAY_ADDRESS = "RAY_ADDRESS"


def ray_connected() -> bool:
    """True when this process called ``ray.init()`` (checked without importing ray)."""
    ray = sys.modules.get("ray")
    is_initialized = getattr(ray, "is_initialized", None)
    return bool(is_initialized is not None and is_initialized())


def import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError(
            "ScalingConfig(executor='ray') needs Ray, which is not installed: pip install 'trainforge[ray]'."
        ) from exc
    return ray


def ensure_connected() -> Any:
    """The ray module, connected: joins ``$RAY_ADDRESS`` or starts a local Ray instance if needed."""
    ray = import_ray()
    if not ray.is_initialized():
        address = os.environ.get(ENV_RAY_ADDRESS) or None
        stale = stale_ray_address() if address is None else None
        if stale is not None:
            logger.warning(
                "Ray's address file names %s (the cluster of the last `ray start`), but nothing listens there: "
                "starting a local Ray instance instead. To join a cluster, set RAY_ADDRESS; `ray stop` clears the file.",
                stale,
            )
            address = "local"
        ray.init(address=address)
    return ray


def stale_ray_address(probe_timeout_s: float = 2.0) -> str | None:
    """The address in Ray's address file (``$RAY_TMPDIR/ray/ray_current_cluster``) when nothing listens
    there, else None.

    ``ray.init()`` without an address joins the cluster the last ``ray start`` (or a test's
    ``ray.cluster_utils.Cluster``) recorded in that file, and when that cluster is gone but the file
    was left behind it retries the dead address for minutes instead of starting a local instance.
    """
    try:
        from ray._private.utils import read_ray_address

        address = read_ray_address()
    except Exception:  # Ray moved its private helper: keep Ray's own behaviour
        return None
    if not address:
        return None
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=probe_timeout_s):
            return None
    except (OSError, ValueError):
        return address
