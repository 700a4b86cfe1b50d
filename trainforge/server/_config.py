"""``ServerConfig`` and the server's capacity (what it may hand out to jobs)."""

from __future__ import annotations

import dataclasses
import math
import os

from trainforge._internal.amounts import size_text
from trainforge._internal.constants import default_state_dir
from trainforge._internal.http import DEFAULT_MAX_BODY, is_loopback
from trainforge.server.isolation.config import IsolationConfig
from trainforge.server.scheduling.team_policy import TeamPolicy

DEFAULT_PORT = 8270  # not Ray's 6379 / 8265 (dashboard) / 8266 / 10001 (client)
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


@dataclasses.dataclass
class ServerConfig:
    """How a train server runs.

    ``capacity``: what jobs may be granted, by kind (``{"CPU": 8, "GPU": 2, "memory": 32e9}``); None
    measures this machine and takes off ``reserve`` (or takes the Ray cluster's resources whole). ``reserve``: None keeps 1 CPU
    on machines with 8 or more CPUs (none on smaller ones, where it would be most of the machine) and
    min(2 GiB, 10%) of memory for the server and the rest of the system. ``stop_grace_s``: how long a
    stopped job has to end cleanly (as after Ctrl-C) before what remains of it is killed.
    ``durable``: SQLite ``synchronous=FULL`` (survives a power loss, slower submissions).
    ``warm``: keep a warm fork server that jobs' runners and local workers are forked from (trainforge
    and, once an earlier job needed them, torch and the like already imported), so a job's processes
    start in milliseconds instead of a fresh interpreter's import time each; False starts fresh ones.
    ``registry``: the model registry its Models page, ``/api/v1/models`` and ``/api/v1/serve`` use
    (a path or fsspec URL; None: ``Registry()``'s default, ``$TRAINFORGE_REGISTRY`` or ``~/trainforge/registry``).
    A non-loopback ``host`` is refused unless ``token`` is given (the token is otherwise random, in
    ``<state_dir>/token``, mode 0600), and warned about loudly without TLS. ``tls_cert``/``tls_key``:
    serve HTTPS with this certificate chain and key (PEM files; both or neither). ``scrape_token``:
    the token that may read ``/metrics`` and nothing else (None: random, in ``<state_dir>/scrape_token``).
    ``team``: the rules of a server several users share (fair share, preemption, quotas, what
    members may do: :class:`~trainforge.server.scheduling.team_policy.TeamPolicy`). ``max_body``: the most bytes
    a request's body may have (default 64 MiB; 413 beyond, before it is read): a job's code and
    config fit many times over, and data goes by reference (a path or URL the server reads).
    ``isolation``: how the jobs of a server with users are kept apart
    (:class:`~trainforge.server.isolation.mechanism.IsolationConfig`). ``secret_files``: files the server read
    secrets from (``--token-file``, the TLS key): hidden from every job's sandbox, wherever they are.

    Example::

        ServerConfig(state_dir="/tmp/tf", port=0, capacity={"CPU": 4})
    """

    state_dir: str = dataclasses.field(default_factory=default_state_dir)
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    capacity: dict[str, float] | None = None
    reserve: dict[str, float] | None = None
    stop_grace_s: float = 10.0
    durable: bool = False
    token: str | None = None
    warm: bool = True
    registry: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    scrape_token: str | None = None
    team: TeamPolicy = dataclasses.field(default_factory=TeamPolicy)
    isolation: IsolationConfig = dataclasses.field(default_factory=IsolationConfig)
    secret_files: tuple[str, ...] = ()
    max_body: int = DEFAULT_MAX_BODY

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    def __post_init__(self) -> None:
        self.state_dir = os.path.abspath(os.path.expanduser(self.state_dir))
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ValueError(f"ServerConfig.port={self.port!r}: give a TCP port 0..65535 (0 picks a free one).")
        for field in ("capacity", "reserve"):
            value = getattr(self, field)
            if value is None:
                continue
            if not isinstance(value, dict):
                raise ValueError(f"ServerConfig.{field}={value!r}: give a dict such as {{'CPU': 8, 'GPU': 1}}.")
            for kind, amount in value.items():
                if not (isinstance(amount, (int, float)) and math.isfinite(amount) and amount >= 0):
                    raise ValueError(f"ServerConfig.{field}[{kind!r}]={amount!r}: must be a finite number >= 0.")
        if not (isinstance(self.stop_grace_s, (int, float)) and self.stop_grace_s >= 0):
            raise ValueError(f"ServerConfig.stop_grace_s={self.stop_grace_s!r}: must be a number of seconds >= 0.")
        if self.token is not None and (not isinstance(self.token, str) or len(self.token) < 16):
            raise ValueError("ServerConfig.token: give a string of at least 16 characters (or None for a random one).")
        if self.registry is not None and (not isinstance(self.registry, str) or not self.registry.strip()):
            raise ValueError(f"ServerConfig.registry={self.registry!r}: give the model registry's path or URL "
                             "(e.g. '/data/registry' or 's3://bucket/registry'), or None for Registry()'s default.")
        if self.registry is not None and "://" not in self.registry:
            self.registry = os.path.abspath(os.path.expanduser(self.registry))
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError(f"ServerConfig.tls_cert={self.tls_cert!r}, tls_key={self.tls_key!r}: give both (the "
                             "certificate chain and its private key, PEM files) or neither")  # fmt: skip
        for field in ("tls_cert", "tls_key"):
            value = getattr(self, field)
            if value is not None:
                setattr(self, field, os.path.abspath(os.path.expanduser(value)))
                if not os.path.isfile(getattr(self, field)):
                    raise ValueError(f"ServerConfig.{field}={value!r}: no such file (a PEM file, e.g. made with "
                                     "`openssl req -x509 ...` or from your certificate authority)")  # fmt: skip
        if self.scrape_token is not None and (not isinstance(self.scrape_token, str) or len(self.scrape_token) < 16):
            raise ValueError("ServerConfig.scrape_token: give a string of at least 16 characters (or None for a random one).")
        if isinstance(self.max_body, bool) or not isinstance(self.max_body, int) or self.max_body < 1024:
            raise ValueError(f"ServerConfig.max_body={self.max_body!r}: give a number of bytes >= 1024 (default "
                             f"{size_text(DEFAULT_MAX_BODY)}; --max-body takes 64Mi, 1G, ...)")  # fmt: skip
        if not isinstance(self.team, TeamPolicy):
            raise ValueError(f"ServerConfig.team={self.team!r}: give a TeamPolicy(...)")
        if not isinstance(self.isolation, IsolationConfig):
            raise ValueError(f"ServerConfig.isolation={self.isolation!r}: give an IsolationConfig(...)")
        self.secret_files = tuple(os.path.abspath(os.path.expanduser(p)) for p in self.secret_files)
        if self.tls_key is not None and self.tls_key not in self.secret_files:
            self.secret_files += (self.tls_key,)
        if not is_loopback(self.host) and self.token is None:
            raise ValueError(
                f"ServerConfig.host={self.host!r} is not a loopback address: anyone who can reach it could run "
                "code as you. Bind 127.0.0.1 (the default), or configure a token (--token-file) to expose it."
            )


def machine_capacity() -> dict[str, float]:
    """This machine's CPUs, GPUs (``CUDA_VISIBLE_DEVICES`` or nvidia-smi) and memory in bytes."""
    import psutil

    from trainforge._internal.devices import local_gpu_ids

    return {
        "CPU": float(os.cpu_count() or 1),
        "GPU": float(len(local_gpu_ids())),
        "memory": float(psutil.virtual_memory().total),
    }


def default_reserve(total: dict[str, float]) -> dict[str, float]:
    cpus = total.get("CPU", 0.0)
    return {"CPU": 1.0 if cpus >= 8 else 0.0, "memory": min(2.0 * 2**30, 0.1 * total.get("memory", 0.0))}


def effective_capacity(config: ServerConfig, measured: dict[str, float] | None = None) -> dict[str, float]:
    if config.capacity is not None:
        return {k: float(v) for k, v in config.capacity.items()}
    total = measured if measured is not None else machine_capacity()
    reserve = config.reserve if config.reserve is not None else default_reserve(total)
    return {k: max(0.0, v - reserve.get(k, 0.0)) for k, v in total.items()}
