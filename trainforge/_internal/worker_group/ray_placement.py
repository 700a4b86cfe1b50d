"""Placement of Ray workers: the bundle of one worker, whether a request can ever fit the cluster,
waiting for a placement group, and Ray's resource view.

Requests the cluster can never hold (more CPUs, GPUs or custom resources per worker than any node
has, or in all than the cluster has; STRICT_PACK beyond the largest node; STRICT_SPREAD with more
workers than nodes that can hold one) fail before any actor starts with a ``ValueError`` naming the
request and the cluster. A request that fits but is not placed yet is waited for (logged) up to
``$TRAINFORGE_RESOURCE_WAIT_S``, then the attempt fails with ``WorkerStartError``.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import ray

from trainforge._internal import constants
from trainforge._internal.config import ScalingConfig
from trainforge._internal.exceptions import WorkerStartError
from trainforge._internal.resources import per_worker

logger = logging.getLogger("trainforge")


def bundle_of(scaling: ScalingConfig) -> dict[str, float]:
    """One worker's placement group bundle: CPU (1 by default), GPU and custom resources."""
    need = per_worker(scaling)
    first: dict[str, float] = {k: need.pop(k) for k in ("CPU", "GPU") if k in need}
    return {**first, **need}


def alive_nodes() -> list[dict[str, Any]]:
    return [n for n in ray.nodes() if n.get("Alive")]


def describe_nodes(nodes: list[dict[str, Any]]) -> str:
    parts = []
    for n in nodes:
        res = {k: v for k, v in n.get("Resources", {}).items() if not k.startswith(("node:", "memory", "object_store"))}
        parts.append(f"{n.get('NodeManagerAddress')}: {res}")
    return "; ".join(parts) or "no alive nodes"


def infeasibility(bundle: dict[str, float], n: int, strategy: str, nodes: list[dict[str, Any]]) -> str | None:
    """Why ``n`` bundles can never be placed on ``nodes`` (their total resources) with ``strategy``,
    or None if they can (once the resources are free)."""
    if not bundle:
        return "each worker asks for no resources at all; give it some (e.g. resources_per_worker={'CPU': 1})"
    totals = [n_.get("Resources", {}) for n_ in nodes]
    for name, amount in bundle.items():
        largest = max((t.get(name, 0.0) for t in totals), default=0.0)
        if largest + 1e-9 < amount:
            return (f"each worker asks for {name}={amount:g}, but the largest node has {name}={largest:g}")  # fmt: skip
    per_node = [min(int(math.floor(t.get(k, 0.0) / v + 1e-9)) for k, v in bundle.items()) for t in totals]
    if strategy == "STRICT_SPREAD":
        holding = sum(1 for c in per_node if c >= 1)
        if holding < n:
            return (f"STRICT_SPREAD puts each of the {n} workers on a different node, but only {holding} node(s) "
                    "can hold one")  # fmt: skip
    elif strategy == "STRICT_PACK":
        if max(per_node, default=0) < n:
            return (f"STRICT_PACK puts all {n} workers on one node, but the largest holds "
                    f"{max(per_node, default=0)}")  # fmt: skip
    elif sum(per_node) < n:
        need = {k: v * n for k, v in bundle.items()}
        have = {k: sum(t.get(k, 0.0) for t in totals) for k in bundle}
        return f"{n} workers need {need} in all, but the cluster has {have} (as whole bundles: {sum(per_node)})"
    return None


def check_feasible(scaling: ScalingConfig, n: int) -> None:
    """ValueError now if the cluster can never hold ``n`` workers of ``scaling``."""
    nodes = alive_nodes()
    why = infeasibility(bundle_of(scaling), n, scaling.placement_strategy, nodes)
    if why is not None:
        raise ValueError(
            f"ScalingConfig asks for {n} worker(s) with {bundle_of(scaling)} each "
            f"(placement_strategy={scaling.placement_strategy!r}), which this Ray cluster can never hold: {why}. "
            f"Cluster nodes: {describe_nodes(nodes)}. Use fewer workers or smaller resources_per_worker, "
            "or add nodes with these resources."
        )


def wait_placement_group(pg: Any, n: int, bundle: dict[str, float], strategy: str) -> None:
    timeout = constants.resource_wait_s()
    deadline = time.monotonic() + timeout
    if pg.wait(timeout_seconds=min(2.0, timeout)):
        return
    logger.warning(
        "waiting up to %.0fs for Ray to place %d worker(s) of %s (%s); the cluster has available %s",
        timeout, n, bundle, strategy, free_resources(ray.available_resources()),
    )
    while time.monotonic() < deadline:
        if pg.wait(timeout_seconds=min(1.0, max(0.01, deadline - time.monotonic()))):
            return
    raise WorkerStartError(
        f"Ray did not place {n} worker(s) of {bundle} ({strategy}) within {timeout:.0f}s; the cluster has "
        f"available {free_resources(ray.available_resources())} (nodes: {describe_nodes(alive_nodes())}). Free resources, "
        f"ask for fewer, or raise ${constants.ENV_RESOURCE_WAIT_S}."
    )


def free_resources(resources: dict[str, float]) -> dict[str, float]:
    """Ray's resource view without its bookkeeping entries (node:..., ..._group_...)."""
    return {
        k: v
        for k, v in resources.items()
        if not k.startswith(("node:", "memory", "object_store_memory")) and "_group_" not in k
    }
