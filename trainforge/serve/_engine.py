"""The serving engine: a dynamic batcher, a model swapper and the statistics, on one asyncio loop.
Usable inside any ASGI app (``trainforge serve``'s own, the train server's ``/api/v1/serve`` route)::

    engine = ServeEngine(RegistrySource("models:/digits@production"), max_batch_size=32)
    await engine.start()                      # loads the model in a worker thread
    status, body = await engine.handle(raw)   # POST body {"inputs": [...]} -> (HTTP status, JSON bytes)
    await engine.stop()

**Batching.** Requests go to a queue; the batcher takes the oldest, waits until ``max_batch_size``
instances are queued or ``max_batch_wait_ms`` have passed since that request arrived, and runs whole
requests, up to ``max_batch_size`` instances, as one ``model(instances)`` call in a worker thread (one
batch at a time; meanwhile the loop keeps accepting and queueing). Under load the wait is the previous
batch's run time, so batches fill up by themselves. The outputs (first dimension: one per instance)
are split back per request and encoded as JSON in the worker thread (tensors and arrays as lists,
NaN and infinities as null).

**Errors.** A batch whose call raises is run again one request at a time, so one bad instance fails
only its own request: 422 with the exception's type and text (whether ``preprocess``, ``forward`` or
``postprocess`` raised it). Bad bodies get 400 (not JSON, or nested deeper than
:data:`~trainforge._internal.json_depth.MAX_DEPTH` levels), 422 (no ``"inputs"`` list, or an empty one)
or 413 (too many instances): never a 500.

**Swapping.** Every ``poll_s`` the source is asked which version is current (``resolve``, in the loader
thread); a new one is loaded there in the background and then swapped in on the loop. A batch holds
the model it started with, so the old version finishes its batch and the next batch runs the new one:
no request fails or waits for the load. A version that fails to load is retried with a back-off (up
to a minute) and the old one keeps serving; ``stats()["last_error"]`` says why.

Every method must be called on the loop that ran :meth:`start`. The statistics are
:mod:`~trainforge.serve._stats`'s; the model's inputs and outputs as JSON, :mod:`~trainforge.serve._encode`'s.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import json
import time
from collections.abc import Callable
from typing import Any

from trainforge._internal.http import json_detail
from trainforge._internal.json_depth import body_too_deep, too_deep_detail
from trainforge.serve._config import ServeConfig, check_batching
from trainforge.serve._encode import encode_outputs, infer, json_type
from trainforge.serve._source import ModelGoneError, ModelInfo, ModelSource, RegistrySource
from trainforge.serve._stats import Stats

_MAX_BACKOFF_S = 60.0


class ServeError(Exception):
    """A request that cannot be answered: ``status`` (4xx, or 503 while no model is loaded) and
    ``detail`` (the reason, sent as ``{"detail": ...}``)."""

    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status = status
        self.detail = detail


class _Request:
    __slots__ = ("instances", "future", "t0")

    def __init__(self, instances: list[Any], future: asyncio.Future[Any], t0: float):
        self.instances = instances
        self.future = future
        self.t0 = t0


class ServeEngine:
    """Batches requests for a model from ``source`` and swaps in new versions; see the module docstring.
    The settings are :class:`~trainforge.serve.ServeConfig`'s of the same names."""

    def __init__(
        self,
        source: ModelSource,
        *,
        max_batch_size: int = 32,
        max_batch_wait_ms: float = 5.0,
        poll_s: float = 1.0,
        max_request_instances: int = 1024,
        stats_window_s: float = 60.0,
        on_event: Callable[[str], None] | None = None,
    ):
        if not isinstance(source, ModelSource):
            raise TypeError(f"ServeEngine(source={source!r}): give a ModelSource (RegistrySource, StaticSource).")
        check_batching("ServeEngine", max_batch_size=max_batch_size, max_batch_wait_ms=max_batch_wait_ms,
                       poll_s=poll_s, max_request_instances=max_request_instances,
                       stats_window_s=stats_window_s)  # fmt: skip
        self.source = source
        self.max_batch_size = max_batch_size
        self.max_batch_wait_s = max_batch_wait_ms / 1e3
        self.poll_s = poll_s
        self.max_request_instances = max_request_instances
        self._on_event = on_event
        self._stats = Stats(stats_window_s)
        self._current: tuple[ModelInfo, Callable[[Any], Any], bytes] | None = None
        self._loaded_at: float | None = None
        self._queue: collections.deque[_Request] = collections.deque()
        self._queued_instances = 0
        self._wake: asyncio.Event | None = None
        self._idle: asyncio.Event | None = None  # set while the batcher waits on an empty queue
        self._loop: asyncio.AbstractEventLoop | None = None
        self._worker: concurrent.futures.ThreadPoolExecutor | None = None
        self._loader: concurrent.futures.ThreadPoolExecutor | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._refresh_lock: asyncio.Lock | None = None
        self._loading: ModelInfo | None = None
        self._failed: dict[str, tuple[float, int]] = {}  # uri -> (retry after, failures)
        self._last_error: str | None = None
        self._gone: str | None = None  # why it answers 404: what it serves was deleted from the registry
        self._stopping = False

    @classmethod
    def from_config(cls, config: ServeConfig, *, source: ModelSource | None = None,
                    on_event: Callable[[str], None] | None = None) -> ServeEngine:  # fmt: skip
        """An engine with ``config``'s settings, for ``source`` (default: ``config.model`` in
        ``config.registry``)."""
        if source is None:
            if config.model is None:
                raise ValueError("ServeConfig.model is None: give the model to serve, e.g. 'models:/name@production'.")
            source = RegistrySource(config.model, config.registry)
        return cls(source, max_batch_size=config.max_batch_size, max_batch_wait_ms=config.max_batch_wait_ms,
                   poll_s=config.poll_s, max_request_instances=config.max_request_instances,
                   stats_window_s=config.stats_window_s, on_event=on_event)  # fmt: skip

    # -- lifecycle --------------------------------------------------------------------------------
    def load_now(self) -> ModelInfo:
        """Resolve and load the model in this thread, before :meth:`start` (the CLI does it to show
        progress and fail before it listens). Raises the source's error."""
        info = self.source.resolve()
        self._set_current(info, self.source.load(info))
        return info

    def preload(self, info: ModelInfo, model: Callable[[Any], Any]) -> None:
        """Serve ``model`` as ``info`` from the start (before :meth:`start`)."""
        if self._loop is not None:
            raise RuntimeError("ServeEngine.preload() after start(): versions change through the source")
        self._set_current(info, model)

    def refuse(self, status: int) -> None:
        """Count a request the app refused before it reached :meth:`handle` (e.g. 413 for its size)."""
        self._stats.record(status, None)

    @property
    def started(self) -> bool:
        return self._loop is not None

    async def start(self) -> None:
        """Start on the running loop: load the model (unless :meth:`load_now` did) in a worker thread,
        then the batcher and, for a source that can move, the poller. ServeError(503) if the model
        cannot be loaded."""
        if self._loop is not None:
            raise RuntimeError("ServeEngine.start() was called twice")
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._refresh_lock = asyncio.Lock()
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="trainforge-serve-model")
        self._loader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="trainforge-serve-loader")
        if self._current is None:
            try:
                await self._loop.run_in_executor(self._loader, self.load_now)
            except Exception as exc:
                await self.stop()
                raise ServeError(503, f"cannot load {self.source.describe()}: {type(exc).__name__}: {exc}") from exc
        self._tasks.append(asyncio.create_task(self._batcher(), name="trainforge-serve-batcher"))
        if self.poll_s > 0 and self.source.watched:
            self._tasks.append(asyncio.create_task(self._poller(), name="trainforge-serve-poller"))

    async def stop(self, drain_s: float = 10.0) -> None:
        """Refuse new requests (503), answer the queued ones (for up to ``drain_s``; what is left then
        gets 503), stop the poller and the batcher. Safe to call twice."""
        self._stopping = True
        if self._tasks and self._idle is not None and not self._idle.is_set():
            try:
                await asyncio.wait_for(self._idle.wait(), drain_s)
            except asyncio.TimeoutError:
                pass
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
        self._tasks.clear()
        while self._queue:
            self._fail(self._queue.popleft(), ServeError(503, "the model server is stopping"))
        self._queued_instances = 0
        for pool in (self._worker, self._loader):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)

    # -- requests ---------------------------------------------------------------------------------
    async def handle(self, body: bytes) -> tuple[int, bytes]:
        """Answer one POST body ``{"inputs": [instance, ...]}``: ``(200, {"outputs": [...], "model":
        {"name", "version", "uri"}})`` or ``(status, {"detail": reason})``, as JSON bytes. Never raises
        for bad input."""
        try:
            instances = self._parse(body)
        except ServeError as exc:
            self._stats.record(exc.status, None)
            return exc.status, json_detail(exc.detail)
        return await self._submit(instances)

    async def predict(self, instances: list[Any]) -> dict[str, Any]:
        """``{"outputs": [...], "model": {...}}`` for ``instances``, as over HTTP; ServeError otherwise."""
        try:
            self._check_instances(instances)
        except ServeError as exc:
            self._stats.record(exc.status, None)
            raise
        status, body = await self._submit(list(instances))
        out: dict[str, Any] = json.loads(body)
        if status != 200:
            raise ServeError(status, out["detail"])
        return out

    def _parse(self, body: bytes) -> list[Any]:
        if body_too_deep(body):
            raise ServeError(400, too_deep_detail())
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ServeError(400, f'the body is not JSON ({exc}): send {{"inputs": [instance, ...]}}') from None
        except RecursionError:  # a limit above what this stack can decode (the check above keeps it from here)
            raise ServeError(400, too_deep_detail()) from None
        if not isinstance(data, dict):
            raise ServeError(422, f'the body is a JSON {json_type(data)}: send an object {{"inputs": [instance, ...]}}')
        if "inputs" not in data:
            raise ServeError(422, f'the body has no "inputs" (keys: {sorted(data)[:10]}): send {{"inputs": [instance, ...]}}')
        instances = data["inputs"]
        self._check_instances(instances)
        return instances  # type: ignore[no-any-return]

    def _check_instances(self, instances: Any) -> None:
        if not isinstance(instances, list):
            raise ServeError(422, f'"inputs" is a JSON {json_type(instances)}: give a list of instances, one per input')
        if not instances:
            raise ServeError(422, '"inputs" is empty: give at least one instance')
        if len(instances) > self.max_request_instances:
            raise ServeError(413, f'"inputs" has {len(instances)} instances, more than this server takes in one request '
                                  f"({self.max_request_instances}): split it")  # fmt: skip

    async def _submit(self, instances: list[Any]) -> tuple[int, bytes]:
        if self._loop is None or self._stopping or self._wake is None:
            self._stats.record(503, None)
            return 503, json_detail("the model server is not running (starting or stopping)")
        if self._gone is not None:
            self._stats.record(404, None)
            return 404, json_detail(self._gone)
        loop = self._loop
        request = _Request(instances, loop.create_future(), loop.time())
        self._queue.append(request)
        self._queued_instances += len(instances)
        self._wake.set()
        status, body = await request.future
        self._stats.record(status, loop.time() - request.t0 if status in (200, 422) else None)
        return status, body

    def _fail(self, request: _Request, exc: ServeError) -> None:
        if not request.future.done():
            request.future.set_result((exc.status, json_detail(exc.detail)))

    # -- the batcher ------------------------------------------------------------------------------
    async def _batcher(self) -> None:
        assert self._loop is not None and self._wake is not None and self._idle is not None
        loop, wake, idle = self._loop, self._wake, self._idle
        while True:
            while not self._queue:
                wake.clear()
                idle.set()
                await wake.wait()
            idle.clear()
            if self._queued_instances < self.max_batch_size and self.max_batch_wait_s > 0:
                deadline = self._queue[0].t0 + self.max_batch_wait_s
                while self._queued_instances < self.max_batch_size:
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        break
                    wake.clear()
                    try:
                        await asyncio.wait_for(wake.wait(), remaining)
                    except asyncio.TimeoutError:
                        break
            batch = self._take()
            assert self._current is not None
            info, model, model_json = self._current  # this batch runs on this version, whatever swaps meanwhile
            size = sum(len(r.instances) for r in batch)
            self._stats.batch(size)
            try:
                results, retried = await loop.run_in_executor(self._worker, self._run_batch, model, model_json, batch)
            except asyncio.CancelledError:
                for request in batch:
                    self._fail(request, ServeError(503, "the model server is stopping"))
                raise
            except Exception as exc:  # the executor itself failed (shut down): nothing the model did
                results = [(503, json_detail(f"the model server cannot run the model: {exc}"))] * len(batch)
                retried = False
            self._stats.retried_batches += retried
            for request, result in zip(batch, results, strict=True):
                if not request.future.done():
                    request.future.set_result(result)

    def _take(self) -> list[_Request]:
        """Whole requests from the front of the queue, up to max_batch_size instances (a larger
        request alone)."""
        batch: list[_Request] = []
        size = 0
        while self._queue:
            n = len(self._queue[0].instances)
            if batch and size + n > self.max_batch_size:
                break
            batch.append(self._queue.popleft())
            size += n
            if size >= self.max_batch_size:
                break
        self._queued_instances -= size
        return batch

    def _run_batch(self, model: Callable[[Any], Any], model_json: bytes,
                   batch: list[_Request]) -> tuple[list[tuple[int, bytes]], bool]:  # fmt: skip
        """In the worker thread: the batch as one call; if that raises, each request alone."""
        if len(batch) == 1:
            return [self._run_one(model, model_json, batch[0].instances)], False
        instances = [x for r in batch for x in r.instances]
        try:
            outputs = infer(model, instances)
        except Exception:
            return [self._run_one(model, model_json, r.instances) for r in batch], True
        results, start = [], 0
        for r in batch:
            end = start + len(r.instances)
            results.append(encode_outputs(outputs[start:end], model_json))
            start = end
        return results, False

    def _run_one(self, model: Callable[[Any], Any], model_json: bytes, instances: list[Any]) -> tuple[int, bytes]:
        try:
            outputs: list[Any] = []
            for i in range(0, len(instances), self.max_batch_size):
                outputs.extend(infer(model, instances[i : i + self.max_batch_size]))
        except Exception as exc:
            return 422, json_detail(f"the model failed on these inputs: {type(exc).__name__}: {exc}")
        return encode_outputs(outputs, model_json)

    # -- swapping ---------------------------------------------------------------------------------
    def _set_current(self, info: ModelInfo, model: Callable[[Any], Any]) -> None:
        self._current = (info, model, json.dumps(info.to_dict(), separators=(",", ":")).encode())
        self._loaded_at = time.time()

    async def _poller(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            await self.refresh()

    async def refresh(self) -> bool:
        """Look for a new version now (the poller does it every ``poll_s``); load and swap it in.
        True if a new version now answers."""
        assert self._loop is not None and self._refresh_lock is not None, "start() the engine first"
        async with self._refresh_lock:
            loop = self._loop
            try:
                info = await loop.run_in_executor(self._loader, self.source.resolve)
            except ModelGoneError as exc:  # deleted: not found here either, at once
                if self._gone is None:
                    self._event(f"{self.source.describe()} is gone from the registry ({exc}): answering 404")
                self._gone = f"{self.source.describe()} is no longer in the registry: {exc}"
                return False
            except Exception as exc:
                self._last_error = f"cannot resolve {self.source.describe()}: {type(exc).__name__}: {exc}"
                return False
            self._gone = None
            assert self._current is not None
            current = self._current[0]
            if (info.name, info.version) == (current.name, current.version):
                return False
            retry_at, failures = self._failed.get(info.uri, (0.0, 0))
            if time.monotonic() < retry_at:
                return False
            self._loading = info
            self._event(f"loading {info.uri} (was version {current.version})")
            t0 = time.perf_counter()
            try:
                model = await loop.run_in_executor(self._loader, self.source.load, info)
            except Exception as exc:
                backoff = min(_MAX_BACKOFF_S, max(self.poll_s, 1.0) * 2**failures)
                self._failed[info.uri] = (time.monotonic() + backoff, failures + 1)
                self._last_error = f"cannot load {info.uri}: {type(exc).__name__}: {exc} (retry in {backoff:.0f} s)"
                self._event(self._last_error + f"; version {current.version} goes on serving")
                return False
            finally:
                self._loading = None
            load_s = time.perf_counter() - t0
            self._failed.pop(info.uri, None)
            self._last_error = None
            self._set_current(info, model)  # the next batch runs it; the one running finishes on the old
            self._stats.swap(current.version, info.version, load_s)
            self._event(f"now serving {info.uri} (loaded in {load_s:.2f} s)")
            return True

    def _event(self, message: str) -> None:
        if self._on_event is not None:
            self._on_event(message)

    # -- what it serves ---------------------------------------------------------------------------
    @property
    def current(self) -> ModelInfo | None:
        return self._current[0] if self._current is not None else None

    def model_info(self) -> dict[str, Any]:
        """The version answering now, what is served, and the batching settings."""
        info = self.current
        return {
            **(info.to_dict() if info is not None else {"name": None, "version": None, "uri": None}),
            "source": self.source.describe(),
            "follows": self.source.follows and self.poll_s > 0,
            "loaded_at": self._loaded_at,
            "loading": self._loading.uri if self._loading is not None else None,
            "model_class": type(self._current[1]).__qualname__ if self._current is not None else None,
            "max_batch_size": self.max_batch_size,
            "max_batch_wait_ms": self.max_batch_wait_s * 1e3,
            "max_request_instances": self.max_request_instances,
            "poll_s": self.poll_s,
        }

    def stats(self) -> dict[str, Any]:
        """Requests, errors by status, latency p50/p99 (ms) and throughput over the window, batch
        sizes, the version answering and its swaps."""
        info = self.current
        return {
            "model": info.to_dict() if info is not None else None,
            "current_version": info.version if info is not None else None,
            **self._stats.snapshot(),
            "queued_requests": len(self._queue),
            "queued_instances": self._queued_instances,
            "loading": self._loading.uri if self._loading is not None else None,
            "last_error": self._last_error,
            "gone": self._gone,
        }
