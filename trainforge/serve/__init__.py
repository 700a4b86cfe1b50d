"""Model serving: an HTTP endpoint for a registered model, with dynamic batching, statistics and
zero-downtime swaps when an alias moves.

    trainforge serve models:/digits@production [--port 8280] [--max-batch-size 32] [--max-batch-wait-ms 5]
    trainforge serve models:/digits@production --ray --replicas 2     # a Ray Serve deployment (_ray.py)

    from trainforge.serve import ServeConfig, ModelServer, serve

    serve("models:/digits@production")                       # foreground, until Ctrl-C / SIGTERM
    with ModelServer("models:/digits@production", port=0) as server:
        httpx.post(f"{server.url}/v1/predict", json={"inputs": [[0.0] * 64]}).json()
        # {"outputs": [3], "model": {"name": "digits", "version": 4, "uri": "models:/digits/4"}}

Requests are batched (up to ``max_batch_size`` instances, or what arrived within ``max_batch_wait_ms``)
and run through the model object: ``model(batch)`` = preprocess -> forward (eval, no grad) ->
postprocess, in a worker thread; the outputs are split back per request. The registry is polled every
``poll_s``: a moved alias's version is loaded in the background and swapped in between batches, no
request fails. Bad requests get 4xx with the reason, never a 500. ``GET /v1/stats``: requests, errors,
latency p50/p99, throughput, batch sizes, the version answering and its swaps.

Loopback by default; a non-loopback host needs a token (``Authorization: Bearer <token>``). Needs the
``[serve]`` extra (FastAPI, uvicorn) and the model's own (``[torch]`` for a ``trainforge.model.Model``).
"""

# Besides __all__, for the train server (its /api/v1/serve routes), not user API: the engine, its
# error, a registry model as its source, and the predict route's pieces (no web framework imported).
from trainforge.serve._config import ServeConfig
from trainforge.serve._engine import ServeEngine as ServeEngine
from trainforge.serve._engine import ServeError as ServeError
from trainforge.serve._predict import predict_openapi as predict_openapi
from trainforge.serve._predict import predict_response as predict_response
from trainforge.serve._server import ModelServer, serve
from trainforge.serve._source import RegistrySource as RegistrySource

__all__ = ["ModelServer", "ServeConfig", "serve"]
