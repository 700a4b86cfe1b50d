"""Running a train server process: the lock on its state directory, its token, its address file,
reattaching jobs, then serving the API with uvicorn until SIGTERM/SIGINT.

Files in the state directory (``~/.trainforge/server`` by default):

- ``state.db`` (+ ``-wal``): jobs and events (:mod:`trainforge.server._store`);
- ``token`` (mode 0600): the API token, kept across restarts so clients stay connected;
- ``address``: the URL, for clients on this machine (removed on a clean stop);
- ``server.json``: pid, process start time and URL of the server running now;
- ``server.lock``: held (``flock``) while a server runs, so two never share a state directory;
- ``jobs/<id>/``: each job's spec, trainer, grant, output, events, exit status and result.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import secrets
import socket
import sys
import time
from collections.abc import Callable
from typing import IO, Any

from trainforge.server._config import ServerConfig, effective_capacity, machine_capacity

ADDRESS_FILE = "address"
TOKEN_FILE = "token"
SERVER_FILE = "server.json"
LOCK_FILE = "server.lock"
RAY_KV_KEY = b"trainforge_server_address"


class ServerRunningError(RuntimeError):
    """A server already runs on this state directory."""


def read_token(state_dir: str) -> str | None:
    try:
        with open(os.path.join(state_dir, TOKEN_FILE)) as f:
            return f.read().strip() or None
    except FileNotFoundError:
        return None


def _ensure_token(state_dir: str, given: str | None) -> str:
    path = os.path.join(state_dir, TOKEN_FILE)
    token = given or read_token(state_dir) or secrets.token_urlsafe(32)
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)
    os.chmod(path + ".tmp", 0o600)
    os.replace(path + ".tmp", path)
    return token


def _write_atomic(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def _become_subreaper() -> None:
    """Orphaned processes of our jobs are re-parented to us (and reaped), not to init."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
        except OSError:
            pass


def _lock(state_dir: str) -> IO[str]:
    handle = open(os.path.join(state_dir, LOCK_FILE), "a+")  # noqa: SIM115 (held for the server's life)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        info = read_server_info(state_dir) or {}
        raise ServerRunningError(
            f"a train server already runs with state directory {state_dir} (pid {info.get('pid', '?')}, "
            f"{info.get('url', '?')}): use it, stop it with `trainforge server stop`, or pass another --state-dir"
        ) from None
    return handle


def read_server_info(state_dir: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(state_dir, SERVER_FILE)) as f:
            value = json.load(f)
        return value if isinstance(value, dict) else None
    except (OSError, ValueError):
        return None


def _ray_capacity() -> dict[str, float] | None:
    """The Ray cluster's resources when this process is connected to one or ``$RAY_ADDRESS`` names
    one (and publish nothing yet); None otherwise."""
    from trainforge._internal import ray_utils

    if not (ray_utils.ray_connected() or os.environ.get(ray_utils.ENV_RAY_ADDRESS)):
        return None
    import ray

    if not ray.is_initialized():
        ray.init(address=os.environ.get(ray_utils.ENV_RAY_ADDRESS) or "auto", log_to_driver=False)
    total = ray.cluster_resources()
    return {k: float(v) for k, v in total.items() if k in ("CPU", "GPU", "memory") or not k.startswith("node:")}


def _publish_on_ray(url: str) -> None:
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(RAY_KV_KEY, url.encode(), overwrite=True)


def serve(config: ServerConfig, *, announce: Callable[[str], None] = print) -> None:
    """Run a server in this process until SIGTERM or SIGINT."""
    import uvicorn

    from trainforge.server._app import make_app
    from trainforge.server._service import JobService

    os.makedirs(config.state_dir, mode=0o700, exist_ok=True)
    lock = _lock(config.state_dir)
    _become_subreaper()
    token = _ensure_token(config.state_dir, config.token)
    ray_total = _ray_capacity() if config.capacity is None else None
    capacity = effective_capacity(config, ray_total if ray_total is not None else machine_capacity())
    if ray_total is not None and config.capacity is None:
        capacity = {k: float(v) for k, v in ray_total.items()}  # the cluster's own: no reserve taken off
    service = JobService(config.state_dir, capacity, durable=config.durable, stop_grace_s=config.stop_grace_s)
    t0 = time.perf_counter()
    counts = service.recover()  # before anything is accepted
    recover_s = time.perf_counter() - t0
    service.start()
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((config.host, config.port))
    except OSError as exc:
        service.close()
        lock.close()
        raise OSError(
            f"cannot listen on {config.host}:{config.port} ({exc.strerror}): another program uses the port; "
            "pass --port (0 picks a free one)"
        ) from None
    sock.listen(2048)  # connections queue here until uvicorn accepts them
    port = sock.getsockname()[1]
    host = f"[{config.host}]" if ":" in config.host else config.host
    url = f"http://{host}:{port}"
    import psutil

    _write_atomic(
        os.path.join(config.state_dir, SERVER_FILE),
        json.dumps({"pid": os.getpid(), "create_time": psutil.Process().create_time(), "url": url, "started": time.time()}),
    )
    _write_atomic(os.path.join(config.state_dir, ADDRESS_FILE), url)
    if ray_total is not None:
        _publish_on_ray(url)
    allowed = {"127.0.0.1", "localhost", "::1", config.host.lower()}
    guard, _ = make_app(service, token=token, allowed_hosts=allowed)
    kinds = ", ".join(f"{v:g} {k}" if k != "memory" else f"{v / 2**30:.1f} GiB memory" for k, v in sorted(capacity.items()))
    where = "the Ray cluster's" if ray_total is not None else "capacity"
    announce(f"trainforge server: serving {url} (pid {os.getpid()})")
    announce(f"  token: {os.path.join(config.state_dir, TOKEN_FILE)}   state: {config.state_dir}")
    announce(f"  {where}: {kinds}")
    if any(counts.values()):
        announce(
            f"  recovered in {recover_s * 1e3:.0f} ms: {counts['reattached']} running job(s) reattached, "
            f"{counts['ended']} ended while the server was down, {counts['lost']} lost, {counts['queued']} queued"
        )
    sys.stdout.flush()
    server = uvicorn.Server(
        uvicorn.Config(guard, log_level="warning", lifespan="off", timeout_graceful_shutdown=2, access_log=False)
    )
    try:
        server.run(sockets=[sock])
    finally:
        left = service.active_jobs()
        service.close()
        info = read_server_info(config.state_dir)
        if info and info.get("pid") == os.getpid():
            for name in (ADDRESS_FILE, SERVER_FILE):
                try:
                    os.remove(os.path.join(config.state_dir, name))
                except FileNotFoundError:
                    pass
        lock.close()
        note = f"; {len(left)} job(s) keep running and are reattached when it starts again" if left else ""
        announce(f"trainforge server: stopped{note}")
