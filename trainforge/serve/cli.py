"""``trainforge serve MODEL_URI``: serve a registered model over HTTP until Ctrl-C or SIGTERM; with
``--ray --replicas N``, as a Ray Serve deployment of N replicas on the Ray cluster (``_ray.py``)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from trainforge._internal.http import DEFAULT_MAX_BODY
from trainforge._internal.key_values import size_arg
from trainforge.serve._config import DEFAULT_PORT, ENV_SERVE_TOKEN


def add_commands(sub: Any) -> None:
    p = sub.add_parser("serve", help="serve a registered model over HTTP (batched; follows a moved alias)",
                       description="Serve models:/NAME@ALIAS (or /VERSION) over HTTP: POST /v1/predict "
                       '{"inputs": [...]}, GET /v1/model, /v1/stats, /healthz. Stops on Ctrl-C or SIGTERM.')  # fmt: skip
    p.add_argument("model", metavar="MODEL_URI", help="models:/name@alias, models:/name/3 or models:/name (latest)")
    p.add_argument("--registry", help="the registry's URL or directory (default: $TRAINFORGE_REGISTRY, "
                   "else ~/trainforge/registry)")  # fmt: skip
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; another needs a token)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free)")
    p.add_argument("--token-file", help="require 'Authorization: Bearer TOKEN', TOKEN read from this file (16+ "
                   f"characters; needed off loopback); or set ${ENV_SERVE_TOKEN}")  # fmt: skip
    p.add_argument("--token", help=argparse.SUPPRESS)  # refused: a token in argv is visible to every user in ps
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="another name clients reach this server by (Host header); repeatable")  # fmt: skip
    p.add_argument("--max-batch-size", type=int, default=32, help="instances per model call (default 32)")
    p.add_argument("--max-batch-wait-ms", type=float, default=5.0,
                   help="how long a batch waits to fill after its first request (default 5)")  # fmt: skip
    p.add_argument("--max-request-instances", type=int, default=1024, help="instances one request may send")
    p.add_argument("--poll-s", type=float, default=1.0, help="seconds between looks at the alias (0: never)")
    p.add_argument("--max-body", type=size_arg, default=DEFAULT_MAX_BODY, metavar="SIZE",
                   help="the largest request body it takes, e.g. 64Mi (the default), 1G, 500M")  # fmt: skip
    p.add_argument("--ray", action="store_true", help="deploy on the Ray cluster this process connects to "
                   "($RAY_ADDRESS, a running cluster, else a local Ray instance) as a Ray Serve deployment")  # fmt: skip
    p.add_argument("--replicas", type=int, help="with --ray: replicas of the engine (default 1)")
    p.set_defaults(func=_serve)


def _serve(args: Any) -> int:
    from trainforge.serve._config import ServeConfig
    from trainforge.serve._server import serve

    if args.token is not None:
        print(f"trainforge serve: --token is not taken (a token on the command line is visible to every user in "
              f"`ps`): put it in a file for --token-file, or in ${ENV_SERVE_TOKEN}", file=sys.stderr)  # fmt: skip
        return 2
    token = os.environ.get(ENV_SERVE_TOKEN) or None
    if args.token_file:
        try:
            with open(args.token_file) as f:
                token = f.read().strip()
        except OSError as exc:
            print(f"trainforge serve: cannot read --token-file {args.token_file!r}: {exc.strerror}", file=sys.stderr)
            return 2
    config = ServeConfig(model=args.model, registry=args.registry, host=args.host, port=args.port, token=token,
                         allowed_hosts=tuple(args.allowed_host), max_batch_size=args.max_batch_size,
                         max_batch_wait_ms=args.max_batch_wait_ms, poll_s=args.poll_s,
                         max_request_instances=args.max_request_instances, max_body_bytes=args.max_body)  # fmt: skip
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        print(f"trainforge serve: the model server needs FastAPI and uvicorn ({exc}): pip install 'trainforge[serve]'",
              file=sys.stderr)  # fmt: skip
        return 1
    if args.replicas is not None and not args.ray:
        print("trainforge serve: --replicas needs --ray (one process serves without it)", file=sys.stderr)
        return 2
    if args.ray:
        return _serve_on_ray(config, args.replicas if args.replicas is not None else 1, args.model)
    try:
        serve(config, announce=lambda line: print(line, flush=True))
    except Exception as exc:  # the model cannot be found or loaded, the port is taken: one line, no traceback
        print(f"trainforge serve: cannot serve {args.model}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


def _serve_on_ray(config: Any, replicas: int, model: str) -> int:
    if replicas < 1:
        print(f"trainforge serve: --replicas {replicas}: give a number >= 1", file=sys.stderr)
        return 2
    try:
        from trainforge.serve._ray import serve_on_ray
    except ImportError as exc:
        print(f"trainforge serve --ray needs Ray Serve ({exc}): pip install 'trainforge[ray-serve]'", file=sys.stderr)
        return 1
    try:
        serve_on_ray(config, replicas, announce=lambda line: print(line, flush=True))
    except Exception as exc:  # the model cannot be found or loaded, the port is taken: one line, no traceback
        print(f"trainforge serve: cannot serve {model} on Ray: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0
