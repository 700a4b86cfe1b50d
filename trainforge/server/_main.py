"""Running a train server process: the lock on its state directory, its token, its address file,
reattaching jobs, then serving the API with uvicorn until SIGTERM/SIGINT; and starting one in the
background (:func:`start_background_server`).

Files in the state directory (``~/.trainforge/server`` by default):

- ``state.db`` (+ ``-wal``): jobs and events (:mod:`trainforge.server.store.database`);
- ``token`` (mode 0600): the API token (the built-in admin's), kept across restarts so clients stay connected;
- ``scrape_token`` (mode 0600): the token that may read ``/metrics`` and nothing else (for Prometheus);
- ``address``: the URL, for clients on this machine (removed on a clean stop);
- ``server.json``: pid, process start time and URL of the server running now;
- ``server_cert.pem``: with TLS, a copy of the certificate it serves (removed on a clean stop): the
  client on this machine trusts exactly that one for the URL in ``address``, so ``trainforge server
  status``/``stop`` and every command here work with a self-signed certificate or one for another name;
- ``server.lock``: held (``flock``) while a server runs, so two never share a state directory;
- ``jobs/<id>/``: each job's spec, trainer, grant, output, events, exit status and result.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import re
import secrets
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from typing import IO, Any

# The package, then http.listen(): `from trainforge._internal.http import listen` would name the module
# http.listen to import-linter, which is not the named interface.
from trainforge._internal import http
from trainforge._internal.amounts import fmt_resources
from trainforge._internal.constants import (
    RAY_KV_KEY,
    RAY_KV_NAMESPACE,
    SERVER_CERT_FILE,
    SERVER_LOCK_FILE,
    default_state_dir,
)
from trainforge._internal.state_files import DIR_MODE, open_append, read_text, write_atomic
from trainforge.server._config import (
    ServerConfig,
    effective_capacity,
    machine_capacity,
)

ADDRESS_FILE = "address"
TOKEN_FILE = "token"
SCRAPE_TOKEN_FILE = "scrape_token"
SERVER_FILE = "server.json"
LOCK_FILE = SERVER_LOCK_FILE


_CLEAR_TEXT_WARNING = """
trainforge server: ************************************************************************************
trainforge server: WARNING: serving {host} without TLS. Every token (the admin's, each user's) and
trainforge server: every job's code and output cross the network in clear text: anyone on the path can
trainforge server: read them and act as you. Pass --tls-cert CERT.pem --tls-key KEY.pem (see
trainforge server: docs/team-server.md), or bind 127.0.0.1 and reach it through an SSH tunnel.
trainforge server: ************************************************************************************"""


class ServerRunningError(RuntimeError):
    """A server already runs on this state directory."""


class ServerStartError(RuntimeError):
    """A server started in the background exited before it served: why, in its own last line."""


def read_token(state_dir: str) -> str | None:
    try:
        with open(os.path.join(state_dir, TOKEN_FILE)) as f:
            return f.read().strip() or None
    except FileNotFoundError:
        return None


def _ensure_token(state_dir: str, given: str | None, name: str = TOKEN_FILE) -> str:
    path = os.path.join(state_dir, name)
    token = given or read_text(path) or secrets.token_urlsafe(32)
    write_atomic(path, token, mode=0o600)
    return token


def claim_state_dir(state_dir: str) -> str | None:
    """Make ``state_dir`` (created if missing) this user's alone before a server uses it: it holds the
    token and every job's spec, environment and output. One that belongs to another user is refused
    (``PermissionError``, saying what to do); a looser mode (0755, made by hand or by an older
    trainforge) becomes 0700. Returns the line that says so, or None when nothing changed."""
    os.makedirs(state_dir, mode=DIR_MODE, exist_ok=True)
    st = os.stat(state_dir)
    if st.st_uid != os.geteuid():
        raise PermissionError(
            f"the state directory {state_dir} belongs to {_user_name(st.st_uid)}, not to {_user_name(os.geteuid())} "
            "who starts this server: a server's state (its token, its jobs' files) must be its own user's alone. "
            "Start the server as that user, or pass a --state-dir of your own"
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077 == 0:
        return None
    os.chmod(state_dir, DIR_MODE)
    return (f"trainforge server: the state directory {state_dir} was mode {mode:04o}: made it {DIR_MODE:04o} (it holds "
            "the token and every job's files)")


def _user_name(uid: int) -> str:
    try:
        import pwd

        return f"user {pwd.getpwuid(uid).pw_name!r} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


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


def serve(config: ServerConfig, *, announce: Callable[[str], None] = print) -> None:
    """Run a server in this process until SIGTERM or SIGINT."""
    import uvicorn

    from trainforge._internal.ray_utils import ray_connected
    from trainforge.server._app import make_app
    from trainforge.server.isolation.mechanism import Isolation
    from trainforge.server.jobs.service import JobService

    note = claim_state_dir(config.state_dir)
    if note is not None:
        announce(note)
    lock = _lock(config.state_dir)
    _become_subreaper()
    token = _ensure_token(config.state_dir, config.token)
    own_ray = not ray_connected()  # else a driver runs this server in its process: keep its connection
    ray_total = _ray_capacity() if config.capacity is None else None
    capacity = effective_capacity(config, ray_total if ray_total is not None else machine_capacity())
    if ray_total is not None and config.capacity is None:
        capacity = {k: float(v) for k, v in ray_total.items()}  # the cluster's own: no reserve taken off
    scrape_token = _ensure_token(config.state_dir, config.scrape_token, SCRAPE_TOKEN_FILE)
    isolation = Isolation.choose(config.isolation)
    service = JobService(config.state_dir, capacity, durable=config.durable, stop_grace_s=config.stop_grace_s,
                         warm=config.warm, team=config.team, isolation=isolation,
                         secret_files=config.secret_files)  # fmt: skip
    refusal = isolation.refusal(len(service.users.list()))
    if refusal is not None:
        service.close()
        lock.close()
        raise ServerStartError(refusal)
    try:  # bound before jobs are started (recover() may start some): they get the server's address
        sock = http.listen(config.host, config.port)
    except OSError:
        service.close()
        lock.close()
        raise
    port = sock.getsockname()[1]
    host = f"[{config.host}]" if ":" in config.host else config.host
    url = f"{'https' if config.tls else 'http'}://{host}:{port}"
    service.launcher.url = url
    t0 = time.perf_counter()
    counts = service.recover()  # before anything is accepted
    recover_s = time.perf_counter() - t0
    service.start()
    import psutil

    write_atomic(
        os.path.join(config.state_dir, SERVER_FILE),
        json.dumps({"pid": os.getpid(), "create_time": psutil.Process().create_time(), "url": url, "started": time.time()}),
    )
    if config.tls_cert is not None:  # before the address: a client that finds the address finds the certificate
        with open(config.tls_cert) as f:  # its certificates only: a PEM file may hold the key as well
            certs = re.findall(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----\n?", f.read(), re.S)
        write_atomic(os.path.join(config.state_dir, SERVER_CERT_FILE), "".join(certs))
    write_atomic(os.path.join(config.state_dir, ADDRESS_FILE), url)
    ray_entry = _publish_on_ray(url, config.state_dir) if ray_total is not None else None
    allowed = set(http.allowed_hosts(config.host))  # the rule of every trainforge server (trainforge serve's too)
    guard, _ = make_app(service, token=token, allowed_hosts=allowed, registry=config.registry, tls=config.tls,
                        scrape_token=scrape_token, max_body=config.max_body)  # fmt: skip
    kinds = fmt_resources(capacity, "nothing")
    where = "the Ray cluster's" if ray_total is not None else "capacity"
    if any(counts.values()):
        announce(
            f"trainforge server: recovered in {recover_s * 1e3:.0f} ms: {counts['reattached']} running job(s) "
            f"reattached, {counts['ended']} ended while the server was down, {counts['lost']} lost, "
            f"{counts['queued']} queued"
        )
    announce(f"trainforge server: token in {os.path.join(config.state_dir, TOKEN_FILE)}, state in {config.state_dir}")
    users = len(service.users.list())
    announce(f"trainforge server: {users} user(s) besides the admin (`trainforge server users`); /metrics with "
             f"{os.path.join(config.state_dir, SCRAPE_TOKEN_FILE)}")  # fmt: skip
    if not http.is_loopback(config.host) and not config.tls:
        announce(_CLEAR_TEXT_WARNING.format(host=config.host))
    announce(f"trainforge server: {where}: {kinds}")
    for line in isolation.lines():
        announce(f"trainforge server: {line}")
    announce(f"trainforge server: dashboard at {dashboard_url(url, token if own_terminal() else None)}")
    announce(f"trainforge server: serving {url} (pid {os.getpid()})")  # the last line: clients may connect
    sys.stdout.flush()
    # uvicorn re-raises SIGTERM/SIGINT once it has shut down; let that end this function through its
    # `finally` (address file removed, "stopped" printed) instead of killing the process outright.
    signal.signal(signal.SIGTERM, http.exit_on_signal)
    server = uvicorn.Server(
        uvicorn.Config(guard, log_level="warning", lifespan="on", timeout_graceful_shutdown=2, access_log=False,
                       ssl_certfile=config.tls_cert, ssl_keyfile=config.tls_key)
    )
    try:
        server.run(sockets=[sock])
    finally:
        left = service.active_jobs()
        service.close()
        info = read_server_info(config.state_dir)
        if info and info.get("pid") == os.getpid():
            for name in (ADDRESS_FILE, SERVER_FILE, SERVER_CERT_FILE):
                try:
                    os.remove(os.path.join(config.state_dir, name))
                except FileNotFoundError:
                    pass
        if ray_entry is not None:
            _unpublish_on_ray(ray_entry, disconnect=own_ray)
        lock.close()
        note = f"; {len(left)} job(s) keep running and are reattached when it starts again" if left else ""
        announce(f"trainforge server: stopped{note}")


def dashboard_url(url: str, token: str | None) -> str:
    """The URL that opens the dashboard: with the token (which the page turns into a cookie), or
    without it (then where to get it)."""
    if token:
        return f"{url}/?token={token}"
    return f"{url}/ (`trainforge dashboard` prints its URL with the token that opens it)"


def own_terminal() -> bool:
    """Output goes to a terminal, the user's own: there the dashboard's URL may carry the token (as
    Jupyter's does); not to a file or pipe, where logs may keep it. The one rule for every start
    (foreground and ``--detach``); ``trainforge dashboard``, asked for the URL, always prints it."""
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def start_background_server(state_dir: str | None = None, *, extra_args: list[str] | None = None,
                            timeout_s: float = 60.0, announce: Callable[[str], None] = print) -> str:  # fmt: skip
    """Start ``trainforge server start`` detached (output in ``<state_dir>/server.log``) and return
    its URL once it answers. The state directory is claimed first (:func:`claim_state_dir`: a
    mode it changed is told to ``announce``, another user's directory refused)."""
    state_dir = os.path.abspath(os.path.expanduser(state_dir or default_state_dir()))
    note = claim_state_dir(state_dir)
    if note is not None:
        announce(note)
    check_not_running(state_dir)  # a running server's files are left alone
    for stale in (ADDRESS_FILE, SERVER_FILE, SERVER_CERT_FILE):
        try:
            os.remove(os.path.join(state_dir, stale))
        except FileNotFoundError:
            pass
    log_path = os.path.join(state_dir, "server.log")
    env = dict(os.environ)
    if "ray" in sys.modules and not env.get("RAY_ADDRESS"):
        import ray

        if ray.is_initialized():  # a driver connected to Ray: the server schedules on that cluster
            env["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    with open_append(log_path) as log:
        start = log.seek(0, os.SEEK_END)  # this start's output begins here (the log is appended to)
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainforge.server", "start", "--state-dir", state_dir, *(extra_args or [])],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env,
        )  # fmt: skip
    deadline = time.monotonic() + timeout_s
    address_file = os.path.join(state_dir, ADDRESS_FILE)
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            raise ServerStartError(f"the train server exited at start (code {code}): {_last_line(log_path, start)} "
                                   f"(its output: {log_path})")  # fmt: skip
        address = read_text(address_file)
        if address:
            return address
        time.sleep(0.05)  # waiting for another process to write a file: nothing to block on
    raise TimeoutError(f"the train server did not start within {timeout_s:.0f} s; see {state_dir}/server.log")


def _last_line(path: str, start: int) -> str:
    """The last line a server wrote to its log since byte ``start``: its reason for exiting (the
    CLI's one-line error, or a traceback's last line), without the ``trainforge:`` prefix."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            lines = [ln.strip() for ln in f.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    except OSError:
        lines = []
    if not lines:
        return "it printed nothing"
    return lines[-1].removeprefix("trainforge: ")
