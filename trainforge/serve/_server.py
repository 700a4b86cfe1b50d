"""``ModelServer`` (a model server in a background thread, or in the foreground) and ``serve``."""

from __future__ import annotations

import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

# The package, then http.listen(): `from trainforge._internal.http import listen` names the module
# http.listen to import-linter, which is not the named interface.
from trainforge._internal import http
from trainforge._internal.amounts import fmt_bytes, fmt_number
from trainforge.serve._config import ServeConfig
from trainforge.serve._engine import ServeEngine
from trainforge.serve._source import ModelSource


def allowed_hosts(config: ServeConfig) -> set[str]:
    """Host header names this server answers to (see ServeConfig): the rule of every trainforge
    server (:func:`trainforge._internal.http.allowed_hosts`), with ``config.allowed_hosts``."""
    return set(http.allowed_hosts(config.host, config.allowed_hosts))


class ModelServer:
    """An HTTP model server (see ``trainforge.serve``).

    ``config``: a :class:`ServeConfig` or the model's URI (then ``**settings`` are ServeConfig's
    fields); ``source``: serve this :class:`~trainforge.serve._source.ModelSource` instead of
    ``config.model`` (e.g. ``StaticSource(model)``); ``on_event``: called with a line for each swap.

    Example::

        with ModelServer("models:/digits@production", port=0) as server:
            httpx.post(f"{server.url}/v1/predict", json={"inputs": [[0.0] * 64]}).json()
    """

    def __init__(self, config: ServeConfig | str | None = None, *, source: ModelSource | None = None,
                 on_event: Callable[[str], None] | None = None, **settings: Any):  # fmt: skip
        if isinstance(config, str) or config is None:
            config = ServeConfig(model=config, **settings)
        elif settings:
            raise TypeError(f"ModelServer(config, {', '.join(settings)}=...): give the settings in the ServeConfig")
        self.config = config
        self.engine = ServeEngine.from_config(config, source=source, on_event=on_event)
        self.url: str | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def _uvicorn(self, sock: socket.socket, on_ready: Callable[[BaseException | None], None]) -> Any:
        import uvicorn

        from trainforge.serve._app import make_app

        app = make_app(self.engine, token=self.config.token, allowed_hosts=allowed_hosts(self.config),
                       max_body_bytes=self.config.max_body_bytes, on_ready=on_ready)  # fmt: skip
        port = sock.getsockname()[1]
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        if self.config.host in http.WILDCARDS:
            host = "127.0.0.1"
        self.url = f"http://{host}:{port}"
        return uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False,
                                             timeout_graceful_shutdown=5))  # fmt: skip

    def _on_ready(self, error: BaseException | None) -> None:
        self._error = error
        self._ready.set()

    def start(self, timeout: float = 120.0) -> ModelServer:
        """Load the model and serve it from a background thread; returns once requests are answered.
        Raises what stopped the model from loading."""
        if self._thread is not None:
            raise RuntimeError("ModelServer.start() was called twice")
        sock = http.listen(self.config.host, self.config.port)  # first: a taken port fails before a model loads
        if self.engine.current is None:  # load here: a missing model raises in the caller, not in uvicorn
            try:
                self.engine.load_now()
            except Exception as exc:
                sock.close()
                raise RuntimeError(f"cannot load {self.engine.source.describe()}: {type(exc).__name__}: {exc}") from exc
        self._server = self._uvicorn(sock, self._on_ready)

        def run() -> None:
            try:
                self._server.run(sockets=[sock])
            except BaseException as exc:  # noqa: BLE001 - handed to start()
                if self._error is None:
                    self._error = exc
            finally:
                sock.close()
                self._ready.set()

        self._thread = threading.Thread(target=run, name="trainforge-serve", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            self.stop()
            raise TimeoutError(f"the model server did not start within {fmt_number(timeout)} s (still loading the model?)")
        if self._error is not None or not self._thread.is_alive():
            error = self._error
            self.stop()
            raise RuntimeError(f"the model server did not start: {error}") from error
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stop serving (requests in flight are answered first) and wait for the thread."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> ModelServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def run(self, announce: Callable[[str], None] = print, *, sock: socket.socket | None = None) -> None:
        """Serve in this thread until SIGTERM or SIGINT (Ctrl-C), then stop cleanly. Load the model
        first (``engine.load_now()``, or let the app load it). ``sock``: a socket already listening
        (:func:`serve` binds before it loads, so a taken port fails at once); else it binds here."""
        if sock is None:
            sock = http.listen(self.config.host, self.config.port)
        info_note = ""

        def on_ready(error: BaseException | None) -> None:
            self._on_ready(error)
            if error is None:
                info = self.engine.current
                nonlocal info_note
                info_note = f" ({info.uri})" if info is not None else ""
                auth = "; send 'Authorization: Bearer <token>'" if self.config.token else ""
                announce(f"trainforge serve: POST {self.url}/v1/predict {{\"inputs\": [...]}}; stats at "
                         f"{self.url}/v1/stats{auth}")  # fmt: skip
                announce(f"trainforge serve: serving {self.url}{info_note}")  # the last line: clients may connect
                sys.stdout.flush()

        self._server = self._uvicorn(sock, on_ready)
        previous = signal.signal(signal.SIGTERM, http.exit_on_signal)
        try:
            self._server.run(sockets=[sock])
        except (KeyboardInterrupt, SystemExit):  # Ctrl-C, SIGTERM: uvicorn has shut down first
            pass
        finally:
            signal.signal(signal.SIGTERM, previous)
            sock.close()
        if self._error is not None:
            raise RuntimeError(f"the model server did not start: {self._error}") from self._error
        announce("trainforge serve: stopped")


def serve(config: ServeConfig | str, *, announce: Callable[[str], None] = print, **settings: Any) -> None:
    """Serve ``config.model`` in the foreground until SIGTERM or Ctrl-C: load it (showing progress),
    print the URL, answer requests, pick up moved aliases. ``config`` may be the model's URI, with
    ``**settings`` ServeConfig's fields.

    Example::

        serve("models:/digits@production", port=8280, max_batch_size=64)
    """
    server = ModelServer(config, on_event=lambda line: announce(f"trainforge serve: {line}"), **settings)
    sock = http.listen(server.config.host, server.config.port)  # first: a taken port fails before the model loads
    try:
        model, info = _load(server, announce)
    except BaseException:
        sock.close()
        raise
    server.engine.preload(info, model)
    server.run(announce, sock=sock)


def _load(server: ModelServer, announce: Callable[[str], None]) -> tuple[Any, Any]:
    """The model ``server`` serves and its version's info, loaded with progress told to ``announce``."""
    source = server.engine.source
    announce(f"trainforge serve: resolving {source.describe()}")
    info = source.resolve()
    size = f", {fmt_bytes(info.size)}" if info.size else ""
    announce(f"trainforge serve: loading {info.uri}{size}")
    done = threading.Event()
    t0 = time.perf_counter()

    def ticker() -> None:  # progress while a large model loads
        while not done.wait(5.0):
            announce(f"trainforge serve: still loading {info.uri} ({time.perf_counter() - t0:.0f} s)")

    thread = threading.Thread(target=ticker, name="trainforge-serve-progress", daemon=True)
    thread.start()
    try:
        model = source.load(info)
    finally:
        done.set()
        thread.join()
    announce(f"trainforge serve: loaded {info.uri} in {time.perf_counter() - t0:.2f} s ({type(model).__qualname__})")
    return model, info
