"""``trainforge serve MODEL --ray --replicas N``: the model server's engine as a Ray Serve deployment,
on the Ray cluster this process is connected to (``$RAY_ADDRESS``, a running cluster, else a local Ray
instance started for it), scaled by replicas.

    with RayServing(ServeConfig(model="models:/digits@production", port=8300), replicas=2) as serving:
        httpx.post(f"{serving.url}/v1/predict", json={"inputs": [[0.0] * 64]})

One deployment class, :class:`EngineReplica`, wraps the same :class:`~trainforge.serve._engine.ServeEngine`
as ``trainforge serve``: each replica has its own batcher (``max_batch_size`` / ``max_batch_wait_ms``),
follows the alias itself (polls every ``poll_s``, loads a new version off the event loop, swaps it in
between batches: no request fails), answers bad input with 4xx and is guarded like the single-process
server (token, Host, JSON-only POSTs); the app is the same (:func:`~trainforge.serve._app.make_app`),
behind Ray Serve's HTTP proxy at ``http://host:port`` (``route_prefix="/"``). Each answer carries the
replica that gave it (header ``x-trainforge-replica``). Ray Serve spreads requests over the replicas
(at most ``max_ongoing_requests = 2 x max_batch_size`` in flight on one). A ``user_config`` of
``{"max_batch_size", "max_batch_wait_ms", "poll_s"}`` changes those knobs on every replica without a
restart (``reconfigure``).

Needs ``pip install 'trainforge[ray-serve]'`` (``ray[serve]``).
"""

from __future__ import annotations

import time
from typing import Any

from ray import serve

from trainforge._internal.ray_utils import ensure_connected, ray_connected
from trainforge.serve._app import make_app
from trainforge.serve._config import ServeConfig, check_batching
from trainforge.serve._engine import ServeEngine
from trainforge.serve._server import allowed_hosts

REPLICA_HEADER = b"x-trainforge-replica"
# Ray Serve logs a line per request by default (its access log): off, as the single-process server's.
LOGGING = {"enable_access_log": False, "log_level": "WARNING"}


class EngineReplica:
    """One replica of the deployment: a started :class:`ServeEngine` inside the model server's app."""

    async def __init__(self, config: ServeConfig, hosts: list[str]):  # type: ignore[misc]  # Ray Serve awaits it
        self.config = config
        self.hosts = set(hosts)
        self.engine = ServeEngine.from_config(config)
        await self.engine.start()  # loads the model (off the loop); 503 until then
        self.replica = serve.get_replica_context().replica_id.unique_id

    def __serve_build_asgi_app__(self) -> Any:
        app = make_app(self.engine, token=self.config.token, allowed_hosts=self.hosts,
                       max_body_bytes=self.config.max_body_bytes, manage_engine=False)  # fmt: skip
        return _with_header(app, REPLICA_HEADER, self.replica.encode())

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Change the batching knobs and the poll interval (Ray Serve's ``user_config``)."""
        e = self.engine
        knobs = {"max_batch_size": e.max_batch_size, "max_batch_wait_ms": e.max_batch_wait_s * 1e3,
                 "poll_s": e.poll_s, **{k: v for k, v in (user_config or {}).items()}}  # fmt: skip
        unknown = sorted(set(knobs) - {"max_batch_size", "max_batch_wait_ms", "poll_s"})
        if unknown:
            raise ValueError(f"user_config keys {unknown}: give max_batch_size, max_batch_wait_ms or poll_s")
        check_batching("user_config", max_batch_size=knobs["max_batch_size"], max_batch_wait_ms=knobs["max_batch_wait_ms"],
                       poll_s=knobs["poll_s"], max_request_instances=e.max_request_instances, stats_window_s=1.0)  # fmt: skip
        e.max_batch_size, e.max_batch_wait_s, e.poll_s = knobs["max_batch_size"], knobs["max_batch_wait_ms"] / 1e3, knobs["poll_s"]

    async def __del__(self) -> None:
        await self.engine.stop()


def _proxy_port(default: int) -> int:
    """The port of the cluster's Serve HTTP proxy (Ray keeps the first ``serve.start``'s options)."""
    try:
        from ray.serve.context import _get_global_client

        return int(_get_global_client().http_config.port)  # type: ignore[union-attr]
    except Exception:  # Ray moved its private client: assume the port asked for
        return default


def _with_header(app: Any, name: bytes, value: bytes) -> Any:
    """``app`` with one more response header on every HTTP answer."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await app(scope, receive, send)
            return

        async def send_with(message: Any) -> None:
            if message.get("type") == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (name, value)]}
            await send(message)

        await app(scope, receive, send_with)

    return wrapped


EngineDeployment = serve.ingress()(EngineReplica)


class RayServing:
    """A model served by a Ray Serve deployment of ``replicas`` engines (see the module docstring):
    :meth:`start` deploys it and returns once every replica answers; :meth:`stop` deletes it (and
    shuts down the Ray instance it started, if it started one)."""

    def __init__(self, config: ServeConfig, *, replicas: int = 1, name: str | None = None,
                 num_cpus: float | None = None):  # fmt: skip
        if not isinstance(config, ServeConfig) or config.model is None:
            raise ValueError(f"RayServing(config={config!r}): give a ServeConfig with the model to serve")
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
            raise ValueError(f"RayServing(replicas={replicas!r}): give an int >= 1")
        if config.port == 0:
            raise ValueError("RayServing: Ray Serve's HTTP proxy needs a fixed port (ServeConfig.port, default 8280)")
        if num_cpus is not None and (isinstance(num_cpus, bool) or not isinstance(num_cpus, (int, float)) or num_cpus < 0):
            raise ValueError(f"RayServing(num_cpus={num_cpus!r}): give the CPUs each replica reserves (a number >= 0)")
        self.config, self.replicas, self.num_cpus = config, replicas, num_cpus
        self.name = name or "trainforge-" + config.model.removeprefix("models:/").replace("/", "-").replace("@", "-")
        self.port = config.port
        self._started_ray = False

    @property
    def url(self) -> str:
        """Where Ray Serve's HTTP proxy answers (on this node)."""
        host = "127.0.0.1" if self.config.host in ("0.0.0.0", "::", "") else self.config.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    def start(self) -> RayServing:
        self._started_ray = not ray_connected()
        ensure_connected()
        c = self.config
        try:
            serve.start(http_options={"host": c.host, "port": c.port}, logging_config=LOGGING)
            self.port = _proxy_port(c.port)  # Serve already running on the cluster keeps its own proxy's port
            options: dict[str, Any] = {"num_replicas": self.replicas, "max_ongoing_requests": 2 * c.max_batch_size,
                                       "logging_config": LOGGING}
            if self.num_cpus is not None:
                options["ray_actor_options"] = {"num_cpus": self.num_cpus}
            deployment: Any = serve.deployment(EngineDeployment, name="engine", **options)
            app = deployment.bind(c, sorted(allowed_hosts(c)))
            serve.run(app, name=self.name, route_prefix="/")
        except BaseException:
            self.stop()
            raise
        return self

    def status(self) -> Any:
        """Ray Serve's status of this application (``serve.status().applications[name]``)."""
        return serve.status().applications.get(self.name)

    def stop(self) -> None:
        """Delete the application; shut Serve and Ray down if this started the Ray instance."""
        try:
            if self.name in serve.status().applications:
                serve.delete(self.name)
        except Exception:  # Serve never started: nothing to delete
            pass
        if self._started_ray:
            import ray

            serve.shutdown()
            ray.shutdown()
            self._started_ray = False

    def __enter__(self) -> RayServing:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def serve_on_ray(config: ServeConfig, replicas: int, announce: Any = print) -> None:
    """Deploy ``config.model`` on Ray and wait (SIGTERM, Ctrl-C) before deleting the deployment."""
    import signal
    import threading

    serving = RayServing(config, replicas=replicas)
    announce(f"trainforge serve: deploying {config.model} on Ray, {replicas} replica(s)")
    t0 = time.perf_counter()
    stop = threading.Event()
    previous = None
    try:
        serving.start()
        # after ray.init(), which installs a SIGTERM handler of its own: SIGTERM ends the wait below
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
        if serving.port != config.port:
            announce(f"trainforge serve: Ray Serve already runs on this cluster with its HTTP proxy on port "
                     f"{serving.port}: --port {config.port} does not apply")  # fmt: skip
        announce(f"trainforge serve: {replicas} replica(s) up in {time.perf_counter() - t0:.1f} s; POST "
                 f"{serving.url}/v1/predict {{\"inputs\": [...]}}; stats of one replica at {serving.url}/v1/stats")  # fmt: skip
        announce(f"trainforge serve: serving {serving.url} (Ray Serve application {serving.name!r})")
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        serving.stop()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    announce("trainforge serve: stopped")
