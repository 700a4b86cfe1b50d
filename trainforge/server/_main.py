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
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import IO, Any

from trainforge._internal.state_files import open_append, write_atomic
from trainforge.server._config import ServerConfig, effective_capacity, machine_capacity

ADDRESS_FILE = "address"
TOKEN_FILE = "token"
SERVER_FILE = "server.json"
LOCK_FILE = "server.lock"
RAY_KV_KEY = b"trainforge_server_address"
RAY_KV_NAMESPACE = b"trainforge"


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
    write_atomic(path, token, mode=0o600)
    return token


def _become_subreaper() -> None:
    """Orphaned processes of our jobs are re-parented to us (and reaped), not to init."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
        except OSError:
            pass


def _lock(state_dir: str) -> IO[str]:
    handle = open_append(os.path.join(state_dir, LOCK_FILE), "utf-8")  # held for the server's life; 0600
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


def check_not_running(state_dir: str) -> None:
    """Raise :class:`ServerRunningError` if a server holds ``state_dir`` now."""
    path = os.path.join(state_dir, LOCK_FILE)
    if os.path.exists(path):
        _lock(state_dir).close()


def read_server_info(state_dir: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(state_dir, SERVER_FILE)) as f:
            value = json.load(f)
        return value if isinstance(value, dict) else None
    except (OSError, ValueError):
        return None


def _ray_capacity() -> dict[str, float] | None:
    """The Ray cluster's resources when this process is connected to one or ``$RAY_ADDRESS`` names
    one (connecting to it: as a driver of its own, which only ever disconnects, never stops the
    cluster); None otherwise. Node-address resources (``node:...``) are left out; custom ones stay,
    so jobs may ask for them."""
    from trainforge._internal import ray_utils

    address = os.environ.get(ray_utils.ENV_RAY_ADDRESS)
    if not (ray_utils.ray_connected() or address):
        return None
    import ray

    if not ray.is_initialized():
        try:
            ray.init(address=address or "auto", log_to_driver=False, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise RuntimeError(
                f"cannot join the Ray cluster at ${ray_utils.ENV_RAY_ADDRESS}={address!r} ({exc}): start it "
                "(`ray start --head`), fix RAY_ADDRESS, or unset it (or pass --capacity) to serve without Ray"
            ) from exc
    total = ray.cluster_resources()
    return {str(k): float(v) for k, v in total.items() if not str(k).startswith("node:")}


def _ray_entry(url: str, state_dir: str) -> bytes:
    """What the server publishes in the cluster's KV: its URL, and its state directory, where a
    driver on this machine (as the same user) reads the token; a driver elsewhere passes the token
    (``$TRAINFORGE_TOKEN``). The token itself is not published."""
    return json.dumps({"url": url, "state_dir": state_dir, "pid": os.getpid()}).encode()


def _publish_on_ray(url: str, state_dir: str) -> bytes:
    from ray.experimental import internal_kv

    entry = _ray_entry(url, state_dir)
    internal_kv._internal_kv_put(RAY_KV_KEY, entry, overwrite=True, namespace=RAY_KV_NAMESPACE)
    return entry


def _unpublish_on_ray(entry: bytes, *, disconnect: bool) -> None:
    """Remove our entry (not one a newer server wrote over it); with ``disconnect`` (the connection
    is the server's own, made by :func:`_ray_capacity`) disconnect from the cluster: a driver's
    ``ray.shutdown()`` only disconnects, the cluster and its other drivers go on."""
    import ray
    from ray.experimental import internal_kv

    try:
        if internal_kv._internal_kv_get(RAY_KV_KEY, namespace=RAY_KV_NAMESPACE) == entry:
            internal_kv._internal_kv_del(RAY_KV_KEY, namespace=RAY_KV_NAMESPACE)
    except Exception as exc:  # the cluster went away first: nothing left to clean
        print(f"trainforge server: could not remove its address from the Ray cluster: {exc}", flush=True)
    if disconnect:
        ray.shutdown()


def _exit_on_signal(signum: int, frame: Any) -> None:
    raise SystemExit(0)


def serve(config: ServerConfig, *, announce: Callable[[str], None] = print) -> None:
    """Run a server in this process until SIGTERM or SIGINT."""
    import uvicorn

    from trainforge._internal.ray_utils import ray_connected
    from trainforge.server._app import make_app
    from trainforge.server._service import JobService

    os.makedirs(config.state_dir, mode=0o700, exist_ok=True)
    lock = _lock(config.state_dir)
    _become_subreaper()
    token = _ensure_token(config.state_dir, config.token)
    own_ray = not ray_connected()  # else a driver runs this server in its process: keep its connection
    ray_total = _ray_capacity() if config.capacity is None else None
    capacity = effective_capacity(config, ray_total if ray_total is not None else machine_capacity())
    if ray_total is not None and config.capacity is None:
        capacity = {k: float(v) for k, v in ray_total.items()}  # the cluster's own: no reserve taken off
    service = JobService(config.state_dir, capacity, durable=config.durable, stop_grace_s=config.stop_grace_s,
                         warm=config.warm)  # fmt: skip
    t0 = time.perf_counter()
    counts = service.recover()  # before anything is accepted
    recover_s = time.perf_counter() - t0
    service.start()
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on such sockets' connections (without it every
    # response waited ~40 ms for the client's delayed ACK).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
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

    write_atomic(
        os.path.join(config.state_dir, SERVER_FILE),
        json.dumps({"pid": os.getpid(), "create_time": psutil.Process().create_time(), "url": url, "started": time.time()}),
    )
    write_atomic(os.path.join(config.state_dir, ADDRESS_FILE), url)
    ray_entry = _publish_on_ray(url, config.state_dir) if ray_total is not None else None
    allowed = {"127.0.0.1", "localhost", "::1", config.host.lower()}
    guard, _ = make_app(service, token=token, allowed_hosts=allowed, registry=config.registry)
    kinds = ", ".join(f"{v:g} {k}" if k != "memory" else f"{v / 2**30:.1f} GiB memory" for k, v in sorted(capacity.items()))
    where = "the Ray cluster's" if ray_total is not None else "capacity"
    if any(counts.values()):
        announce(
            f"trainforge server: recovered in {recover_s * 1e3:.0f} ms: {counts['reattached']} running job(s) "
            f"reattached, {counts['ended']} ended while the server was down, {counts['lost']} lost, "
            f"{counts['queued']} queued"
        )
    announce(f"trainforge server: token in {os.path.join(config.state_dir, TOKEN_FILE)}, state in {config.state_dir}")
    announce(f"trainforge server: {where}: {kinds}")
    announce(f"trainforge server: dashboard at {url}/ (`trainforge dashboard` prints its URL with the token)")
    announce(f"trainforge server: serving {url} (pid {os.getpid()})")  # the last line: clients may connect
    sys.stdout.flush()
    # uvicorn re-raises SIGTERM/SIGINT once it has shut down; let that end this function through its
    # `finally` (address file removed, "stopped" printed) instead of killing the process outright.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    server = uvicorn.Server(
        uvicorn.Config(guard, log_level="warning", lifespan="on", timeout_graceful_shutdown=2, access_log=False)
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
        if ray_entry is not None:
            _unpublish_on_ray(ray_entry, disconnect=own_ray)
        lock.close()
        note = f"; {len(left)} job(s) keep running and are reattached when it starts again" if left else ""
        announce(f"trainforge server: stopped{note}")
