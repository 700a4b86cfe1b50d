"""``ServeConfig``: what a model server serves, where, and how it batches."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from trainforge._internal.http import DEFAULT_MAX_BODY, is_loopback

DEFAULT_PORT = 8280  # next to the train server's 8270
ENV_SERVE_TOKEN = "TRAINFORGE_SERVE_TOKEN"  # `trainforge serve`'s token when no --token-file is given


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclasses.dataclass
class ServeConfig:
    """How ``trainforge serve`` (and :class:`ModelServer`) serves a model.

    ``model``: what to serve, a registry URI: ``models:/name@alias`` (follows the alias: a moved alias
    is picked up within ``poll_s`` and swapped in without failing a request), ``models:/name/3`` (one
    version) or ``models:/name`` (the latest version, followed too). ``registry``: the registry's URL
    (default: ``$TRAINFORGE_REGISTRY``, else ``~/trainforge/registry``).

    Batching: requests are queued; a batch is up to ``max_batch_size`` instances, or what arrived within
    ``max_batch_wait_ms`` after the oldest queued request (0: no waiting, whatever is queued). A request
    of more instances than ``max_batch_size`` runs alone, in chunks of ``max_batch_size``; one of more
    than ``max_request_instances`` (or a body over ``max_body_bytes``, default 64 MiB, refused by the
    guard before it is read) is refused with 413.

    ``stats_window_s``: latency percentiles and throughput in ``GET /v1/stats`` are over the requests
    of the last ``stats_window_s`` seconds.

    Access: the server binds ``host`` (default 127.0.0.1). A non-loopback host needs ``token`` (at least
    16 characters; the CLI reads it from ``--token-file`` or ``$TRAINFORGE_SERVE_TOKEN``, never from its
    arguments, which ``ps`` shows); requests then send ``Authorization: Bearer <token>`` (``/healthz``
    excepted). A POST must send JSON and come from no other origin (the guard of the train server). The
    ``Host`` header must name this server (loopback names, ``host``, or one of ``allowed_hosts``; with
    a wildcard bind, 0.0.0.0 or ::, also this machine's names and addresses), as on the train server.

    Example::

        ServeConfig(model="models:/digits@production", port=0, max_batch_size=64)
    """

    model: str | None = None
    registry: str | None = None
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    token: str | None = None
    allowed_hosts: tuple[str, ...] = ()
    max_batch_size: int = 32
    max_batch_wait_ms: float = 5.0
    poll_s: float = 1.0
    max_request_instances: int = 1024
    max_body_bytes: int = DEFAULT_MAX_BODY  # 64 MiB, the train server's default too
    stats_window_s: float = 60.0

    def __post_init__(self) -> None:
        if self.model is not None and (not isinstance(self.model, str) or not self.model.strip()):
            raise ValueError(
                f"ServeConfig.model={self.model!r}: give a registry URI such as 'models:/name@production' or "
                "'models:/name/3'."
            )
        if self.registry is not None and (not isinstance(self.registry, str) or not self.registry):
            raise ValueError(f"ServeConfig.registry={self.registry!r}: give the registry's URL or directory (or None).")
        if not isinstance(self.host, str) or not self.host:
            raise ValueError(f"ServeConfig.host={self.host!r}: give an address to bind, e.g. 127.0.0.1.")
        if not _is_int(self.port) or not 0 <= self.port <= 65535:
            raise ValueError(f"ServeConfig.port={self.port!r}: give a TCP port 0..65535 (0 picks a free one).")
        if self.token is not None and (not isinstance(self.token, str) or len(self.token) < 16):
            raise ValueError("ServeConfig.token: give a string of at least 16 characters (or None on a loopback host).")
        if not is_loopback(self.host) and self.token is None:
            raise ValueError(
                f"ServeConfig.host={self.host!r} is not a loopback address: anyone who can reach it could use the "
                "model. Bind 127.0.0.1 (the default), or give a token (--token / --token-file) to expose it."
            )
        if isinstance(self.allowed_hosts, str) or not all(isinstance(h, str) and h for h in self.allowed_hosts):
            raise ValueError(f"ServeConfig.allowed_hosts={self.allowed_hosts!r}: give a tuple of host names.")
        self.allowed_hosts = tuple(self.allowed_hosts)
        check_batching(
            "ServeConfig",
            max_batch_size=self.max_batch_size,
            max_batch_wait_ms=self.max_batch_wait_ms,
            poll_s=self.poll_s,
            max_request_instances=self.max_request_instances,
            stats_window_s=self.stats_window_s,
        )
        if not _is_int(self.max_body_bytes) or self.max_body_bytes < 1:
            raise ValueError(f"ServeConfig.max_body_bytes={self.max_body_bytes!r}: give a number of bytes >= 1.")


def check_batching(
    who: str,
    *,
    max_batch_size: Any,
    max_batch_wait_ms: Any,
    poll_s: Any,
    max_request_instances: Any,
    stats_window_s: Any,
) -> None:
    """ValueError naming the field if a batching setting is out of range (shared with the engine)."""
    if not _is_int(max_batch_size) or not 1 <= max_batch_size <= 1_000_000:
        raise ValueError(f"{who}.max_batch_size={max_batch_size!r}: give an integer >= 1.")
    if not _is_number(max_batch_wait_ms) or not 0 <= max_batch_wait_ms <= 60_000:
        raise ValueError(f"{who}.max_batch_wait_ms={max_batch_wait_ms!r}: give milliseconds 0..60000.")
    if not _is_number(poll_s) or poll_s < 0:
        raise ValueError(f"{who}.poll_s={poll_s!r}: give seconds >= 0 (0: never look for a moved alias).")
    if not _is_int(max_request_instances) or max_request_instances < 1:
        raise ValueError(f"{who}.max_request_instances={max_request_instances!r}: give an integer >= 1.")
    if not _is_number(stats_window_s) or stats_window_s <= 0:
        raise ValueError(f"{who}.stats_window_s={stats_window_s!r}: give seconds > 0.")
