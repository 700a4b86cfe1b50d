"""Ray, imported lazily: whether this process is connected, and connecting.

trainforge uses Ray core only (actors, placement groups, the object store) and Ray Data when a
``ray.data.Dataset`` is given; it never imports ``ray.train``, ``ray.tune`` or ``ray.air``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

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
        ray.init(address=os.environ.get(ENV_RAY_ADDRESS) or None)
    return ray
