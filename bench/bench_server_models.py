#!/usr/bin/env python
"""The train server's model registry routes and its serving route, against the same work done directly.

    python bench/bench_server_models.py [--versions 100] [--duration 5] [--markdown] [--quick]

A train server (``python -m trainforge.server start --registry R``, 1 CPU of capacity, no warm pool)
on 127.0.0.1; a fresh registry R in a temporary directory, written by this process.

1. **REST**: model ``bench-many`` with ``--versions`` (100) versions (two small files each, metrics and
   tags) and 2 x ``--versions`` alias moves. Each of ``GET /api/v1/models``, ``GET
   /api/v1/models/bench-many/versions``, ``GET .../aliases/history`` and the dashboard page
   ``/models/bench-many`` is requested 20 times (one keep-alive connection); shown: the median and the
   slowest, next to the same registry call made in this process (``Registry.list_models``,
   ``.versions``, ``.alias_history``): what the server adds (HTTP, JSON, the job lookup of each
   version's lineage).
2. **Serving route**: a ``trainforge.model.Model`` MLP 64-256-256-10 registered as ``bench-mlp``
   (alias ``prod``); ``POST /api/v1/serve/bench-mlp@prod/predict`` with one instance per request
   from 1, 8 and 64 concurrent clients (one keep-alive connection each, asyncio streams in this
   process) for ``--duration`` s after a warm-up; the first request (which loads the model) is timed
   apart. The direct reference: ``model([x])`` in this process, back to back.

Client and server share this machine's CPUs. Prints a table (``--markdown`` for Markdown) and writes
every number to ``bench/results/server_models.json``. ``--quick``: 30 versions, 2 s per run.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import statistics
import sys
import tempfile
import time
from typing import Any

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH_DIR)

from _common import (  # noqa: E402
    N_INSTANCES,
    REPO_ROOT,
    finish,
    fmt,
    git_commit,
    machine_info,
    make_serve_model,
    predict_bodies,
    render_markdown,
    render_text,
    wait_for_idle,
)
from _http_load import closed_loop, percentiles  # noqa: E402  (bench_serve.py's model and clients)

from trainforge._testing.server import TrainServer  # noqa: E402

RESULTS = os.path.join(BENCH_DIR, "results", "server_models.json")
CONCURRENCY = (1, 8, 64)
REPEATS = 20


def start_train_server(state_dir: str, registry: str) -> TrainServer:
    """The train server (capacity 1 CPU, no warm pool) on the registry, once it serves."""
    server = TrainServer(state_dir, "CPU=1", ("--no-warm", "--registry", registry), stop_grace=None, cwd=REPO_ROOT)
    try:
        return server.start(120, require_url=True)
    except (TimeoutError, RuntimeError):
        server.stop(kill_after=True)
        raise


def timed(fn: Any, repeats: int = REPEATS) -> dict[str, float]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return {"median_ms": statistics.median(times) * 1e3, "max_ms": max(times) * 1e3}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--versions", type=int, default=100)
    p.add_argument("--duration", type=float, default=5.0, help="seconds per measured serving run")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--quick", action="store_true", help="30 versions, 2 s per run")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--idle-wait", type=float, default=30.0)
    p.add_argument("--json-out", default=RESULTS)
    args = p.parse_args()
    if args.quick:
        args.versions, args.duration, args.warmup = 30, 2.0, 0.5

    import random

    import httpx

    from trainforge.registry import Registry

    rng = random.Random(0)
    instances = [[rng.uniform(0, 16) for _ in range(64)] for _ in range(N_INSTANCES)]
    failed: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-server-models-") as tmp:
        reg = Registry(os.path.join(tmp, "registry"))
        print(f"registering {args.versions} versions", file=sys.stderr, flush=True)
        for v in range(1, args.versions + 1):
            d = os.path.join(tmp, "src", str(v))
            os.makedirs(d)
            with open(os.path.join(d, "weights.bin"), "wb") as f:
                f.write(os.urandom(4096))
            with open(os.path.join(d, "config.json"), "w") as f:
                f.write("{}")
            reg.register("bench-many", d, metrics={"acc": v / args.versions, "loss": 1 / v}, tags={"i": str(v)},
                         lineage={"run_path": os.path.join(tmp, "runs", str(v))})  # fmt: skip
        for i in range(2 * args.versions):
            reg.set_alias("bench-many", ("production", "staging")[i % 2], i % args.versions + 1, by="bench")
        reg.register("bench-mlp", make_serve_model(1).save(os.path.join(tmp, "mlp")), alias="prod")
        idle_s = wait_for_idle(args.idle_wait)
        server = start_train_server(os.path.join(tmp, "state"), reg.uri)
        rest: dict[str, dict[str, Any]] = {}
        served: dict[int, dict[str, Any]] = {}
        try:
            assert server.url is not None
            with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.token}"},
                              timeout=60) as http:  # fmt: skip
                def get(path: str) -> Any:
                    r = http.get(path)
                    r.raise_for_status()
                    return r

                for label, path, direct in (
                    ("GET /api/v1/models", "/api/v1/models", reg.list_models),
                    ("GET /api/v1/models/{name}/versions", "/api/v1/models/bench-many/versions",
                     lambda: reg.versions("bench-many")),
                    ("GET /api/v1/models/{name}/aliases/history", "/api/v1/models/bench-many/aliases/history",
                     lambda: reg.alias_history("bench-many")),
                    ("page /models/{name}", "/models/bench-many", lambda: (reg.versions("bench-many"),
                                                                          reg.alias_history("bench-many"))),
                ):  # fmt: skip
                    print(label, file=sys.stderr, flush=True)
                    get(path)  # warm
                    rest[label] = {"server": timed(lambda path=path: get(path)), "direct": timed(direct),
                                   "bytes": len(get(path).content)}  # fmt: skip
                print("first predict (loads the model)", file=sys.stderr, flush=True)
                t0 = time.perf_counter()
                r = http.post("/api/v1/serve/bench-mlp@prod/predict", json={"inputs": [instances[0]]})
                first_s = time.perf_counter() - t0
                r.raise_for_status()
            for clients in CONCURRENCY:
                print(f"serving route, {clients} client(s)", file=sys.stderr, flush=True)
                served[clients] = asyncio.run(closed_loop(server.url, predict_bodies(instances), clients, args.duration,
                                                          args.warmup, path="/api/v1/serve/bench-mlp@prod/predict",
                                                          token=server.token))  # fmt: skip
                served[clients].pop("answers")
        finally:
            exit_code = server.stop(kill_after=True)
        import torch

        torch.set_num_threads(1)
        model = reg.load("models:/bench-mlp/1")
        for i in range(50):
            model([instances[i]])
        lat = []
        t_end = time.perf_counter() + args.duration
        while time.perf_counter() < t_end:
            t0 = time.perf_counter()
            model([instances[len(lat) % N_INSTANCES]])
            lat.append(time.perf_counter() - t0)
        direct_p50, direct_p99 = percentiles(lat)

    header = ["what", "through the train server", "directly in this process", "note"]
    rows = []
    for label, m in rest.items():
        rows.append([label, f"{fmt(m['server']['median_ms'], '.1f')} ms (max {fmt(m['server']['max_ms'], '.1f')})",
                     f"{fmt(m['direct']['median_ms'], '.1f')} ms (max {fmt(m['direct']['max_ms'], '.1f')})",
                     f"{m['bytes'] / 1e3:.1f} kB; {args.versions} versions, {2 * args.versions} alias moves"])  # fmt: skip
    rows.append(["first predict (loads the model)", f"{first_s * 1e3:.0f} ms", "-", "once per model reference"])
    for clients, run in served.items():
        rows.append([f"POST /api/v1/serve/bench-mlp@prod/predict, {clients} client(s)",
                     f"p50 {fmt(run['p50_ms'], '.2f')} / p99 {fmt(run['p99_ms'], '.2f')} ms, "
                     f"{run['throughput_rps']:.0f} req/s",
                     f"model([x]): p50 {fmt(direct_p50, '.3f')} / p99 {fmt(direct_p99, '.3f')} ms",
                     f"{run['failed']} failed"])  # fmt: skip
        if run["failed"]:
            failed.setdefault("serving", []).append({"clients": clients, "failures": run["failures"]})
    table = (render_markdown if args.markdown else render_text)(header, rows)
    print(table)
    print(f"\n(median and max of {REPEATS} requests; serving: {args.duration:g} s per run after {args.warmup:g} s "
          f"warm-up, one instance per request, MLP 64-256-256-10 on CPU; client and server on the same "
          f"{os.cpu_count()} CPUs; server exit code after SIGTERM: {exit_code})")  # fmt: skip
    if exit_code != 0:
        failed["server"] = [{"error": f"exit code {exit_code}", "output_tail": "".join(server.lines[-20:])}]
    data = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "commit": git_commit(),
        "machine": machine_info(),
        "args": vars(args),
        "idle_wait_s": idle_s,
        "table": {"header": header, "rows": rows},
        "rest": rest,
        "first_predict_s": first_s,
        "served": {f"c{c}": v for c, v in served.items()},
        "direct": {"p50_ms": direct_p50, "p99_ms": direct_p99, "calls": len(lat)},
        "server_output": server.lines[-20:],
    }
    return finish(args.json_out, data, failed)


if __name__ == "__main__":
    sys.exit(main())
