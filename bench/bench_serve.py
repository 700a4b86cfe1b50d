#!/usr/bin/env python
"""Model serving (``trainforge serve``) vs calling the model directly, and an alias switch under load.

    python bench/bench_serve.py [--duration 5] [--markdown] [--quick]

The model: a ``trainforge.model.Model`` MLP 64-256-256-10 (preprocess: the JSON lists to a float32
tensor; postprocess: the class id), saved and registered in a fresh registry (a temporary directory)
as version 1 (alias ``prod``) and version 2 (other weights). The instances: 1024 random 64-float
vectors, the same for every mode.

- **direct**: this process calls ``model([instance])`` back to back (one instance per call: the
  latency of the model itself, preprocess and postprocess included), and ``model(32 instances)``
  (the throughput a full batch reaches).
- **served**: ``trainforge serve models:/bench-mlp@prod`` in a subprocess on 127.0.0.1 (defaults:
  ``--max-batch-size 32 --max-batch-wait-ms 5``), ``POST /v1/predict`` with one instance per request
  from 1, 8 and 64 concurrent clients (keep-alive HTTP/1.1 connections on asyncio streams, one
  each, in this process) for
  ``--duration`` seconds each after a warm-up; latency is the client's (request sent to answer read),
  throughput the answers per second; the mean batch size is the server's over the run
  (``/v1/stats``).
- **alias switch**: 8 clients send for ``--duration`` s; after a third of it the alias ``prod`` moves
  to version 2 (``Registry.set_alias``); the server polls every 0.5 s. Counted: failed requests (not
  200; goal 0), answers by version, the time from the move to the first answer of version 2, and
  that no client saw version 1 again after version 2.

Client and server share this machine's CPUs: with few cores the clients' own HTTP work limits the
served throughput as much as the server does. Prints a table (``--markdown`` for Markdown) and writes
every number to ``bench/results/serve.json``. ``--quick``: 2 s per run.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import sys
import tempfile
import threading
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
    status,
    wait_for_idle,
)
from _http_load import closed_loop, percentiles  # noqa: E402

from trainforge._testing.server import ServingProcess  # noqa: E402

RESULTS = os.path.join(BENCH_DIR, "results", "serve.json")
NAME = "bench-mlp"
CONCURRENCY = (1, 8, 64)
WAITS_MS = (5.0, 0.0)  # the default max_batch_wait_ms, and none
BATCH = 32


def bench_direct(model: Any, instances: list[list[float]], duration: float) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)  # the server's worker thread runs one batch at a time too
    for i in range(50):
        model([instances[i]])
    lat: list[float] = []
    t_end = time.perf_counter() + duration
    i = 0
    while time.perf_counter() < t_end:
        t0 = time.perf_counter()
        model([instances[i % N_INSTANCES]])
        lat.append(time.perf_counter() - t0)
        i += 1
    single_s = sum(lat)
    batches = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < duration:
        j = (batches * BATCH) % N_INSTANCES
        model(instances[j : j + BATCH])
        batches += 1
    batch_s = time.perf_counter() - t0
    p50, p99 = percentiles(lat)
    return {"calls": len(lat), "p50_ms": p50, "p99_ms": p99, "calls_per_s": len(lat) / single_s,
            "batched_instances_per_s": batches * BATCH / batch_s}  # fmt: skip


def start_server(registry: str, poll_s: float, wait_ms: float) -> ServingProcess:
    """``trainforge serve models:/NAME@prod`` on a free port, once it serves."""
    cmd = [sys.executable, "-m", "trainforge", "serve", f"models:/{NAME}@prod", "--registry", registry,
           "--port", "0", "--poll-s", str(poll_s), "--max-batch-wait-ms", str(wait_ms)]  # fmt: skip
    server = ServingProcess(cmd, cwd=REPO_ROOT)
    try:
        return server.start(120, require_url=True)
    except (TimeoutError, RuntimeError):
        server.stop(kill_after=True)
        raise


def server_stats(url: str) -> dict[str, Any]:
    import httpx

    return httpx.get(f"{url}/v1/stats", timeout=30).json()  # type: ignore[no-any-return]


def mean_batch(before: dict[str, Any], after: dict[str, Any]) -> float | None:
    hist = {int(k): v - before["batch_sizes"].get(k, 0) for k, v in after["batch_sizes"].items()}
    n = sum(hist.values())
    return sum(k * v for k, v in hist.items()) / n if n else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=5.0, help="seconds per measured run")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--quick", action="store_true", help="2 s per run")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--idle-wait", type=float, default=30.0)
    p.add_argument("--json-out", default=RESULTS)
    args = p.parse_args()
    if args.quick:
        args.duration, args.warmup = 2.0, 0.5

    import random

    rng = random.Random(0)
    instances = [[rng.uniform(0, 16) for _ in range(64)] for _ in range(N_INSTANCES)]
    idle_s = wait_for_idle(args.idle_wait)
    failed: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        from trainforge.registry import Registry

        reg = Registry(os.path.join(tmp, "registry"))
        for version in (1, 2):
            path = make_serve_model(seed=version).save(os.path.join(tmp, f"v{version}"))
            reg.register(NAME, path, alias="prod" if version == 1 else None)
        model = reg.load(f"models:/{NAME}/1")
        print("direct calls", file=sys.stderr, flush=True)
        direct = bench_direct(model, instances, args.duration)

        served: dict[tuple[float, int], dict[str, Any]] = {}
        for wait_ms in WAITS_MS:
            server = start_server(reg.uri, poll_s=0.5, wait_ms=wait_ms)
            try:
                assert server.url is not None
                for clients in CONCURRENCY:
                    print(f"served, batch wait {wait_ms:g} ms, {clients} client(s)", file=sys.stderr, flush=True)
                    before = server_stats(server.url)
                    run = asyncio.run(closed_loop(server.url, predict_bodies(instances), clients, args.duration, args.warmup))
                    run["mean_batch"] = mean_batch(before, server_stats(server.url))
                    run.pop("answers")
                    served[wait_ms, clients] = run
            finally:
                if server.stop(kill_after=True) != 0:
                    failed.setdefault("server", []).append({"error": "exit code", "output_tail": server.lines[-20:]})

        server = start_server(reg.uri, poll_s=0.5, wait_ms=WAITS_MS[0])
        try:
            assert server.url is not None
            print("alias switch under load, 8 clients", file=sys.stderr, flush=True)
            moved_at: list[float] = []
            t_start = time.perf_counter()
            switch_after = args.duration / 3

            def move() -> None:
                reg.set_alias(NAME, "prod", 2, by="bench")
                moved_at.append(time.perf_counter())

            mover = threading.Thread(target=move)

            def on_answer(t: float) -> None:
                if mover.ident is None and t - t_start >= switch_after:
                    mover.start()

            switch = asyncio.run(closed_loop(server.url, predict_bodies(instances), 8, args.duration, 0.0, on_answer))
            if mover.ident is not None:
                mover.join()
            stats = server_stats(server.url)
        finally:
            exit_code = server.stop(kill_after=True)
    answers = switch.pop("answers")
    by_version = {str(v): sum(1 for _, _, vv in answers if vv == v) for v in (1, 2)}
    first_v2 = min((t for _, t, v in answers if v == 2), default=None)
    delay = first_v2 - moved_at[0] if first_v2 is not None and moved_at else None
    back = any(v == 1 and any(vv == 2 and tt < t for kk, tt, vv in answers if kk == k) for k, t, v in answers)
    switch.update({"by_version": by_version, "switch_delay_s": delay, "version_1_after_2": back,
                   "server_swaps": stats["swaps"], "server_exit_code": exit_code})  # fmt: skip

    header = ["mode", "clients", "p50 (ms)", "p99 (ms)", "throughput (req/s)", "mean batch", "failed", "goal", "status"]
    rows = [["direct: model([x]) in one process", "1", fmt(direct["p50_ms"], ".3f"), fmt(direct["p99_ms"], ".3f"),
             fmt(direct["calls_per_s"], ".0f"), "1", "0", "-", "-"],
            ["direct: model(32 instances)", "1", "-", "-", fmt(direct["batched_instances_per_s"], ".0f") + " inst/s",
             "32", "0", "-", "-"]]  # fmt: skip
    for (wait_ms, clients), run in served.items():
        rows.append([f"served: POST /v1/predict, 1 instance, batch wait {wait_ms:g} ms", str(clients), fmt(run["p50_ms"], ".2f"),
                     fmt(run["p99_ms"], ".2f"), fmt(run["throughput_rps"], ".0f"), fmt(run["mean_batch"], ".1f"),
                     str(run["failed"]), "0 failed", status(run["failed"] == 0)])  # fmt: skip
    rows.append([f"alias switch under load (v1 {by_version['1']} / v2 {by_version['2']} answers; first v2 "
                 f"{fmt(delay, '.2f')} s after the move, poll 0.5 s)", "8", fmt(switch["p50_ms"], ".2f"),
                 fmt(switch["p99_ms"], ".2f"), fmt(switch["throughput_rps"], ".0f"), "-", str(switch["failed"]),
                 "0 failed", status(switch["failed"] == 0 and by_version["2"] > 0 and not back)])  # fmt: skip
    table = (render_markdown if args.markdown else render_text)(header, rows)
    print(table)
    print(f"\n({args.duration:g} s per run after {args.warmup:g} s warm-up; MLP 64-256-256-10 on CPU; client and "
          f"server on the same {os.cpu_count()} CPUs; server: "
          f"trainforge serve, exit code after SIGTERM: {exit_code})")  # fmt: skip
    if exit_code != 0:
        failed["server"] = [{"error": f"exit code {exit_code}", "output_tail": "".join(server.lines[-20:])}]
    data = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "commit": git_commit(),
        "machine": machine_info(),
        "args": vars(args),
        "idle_wait_s": idle_s,
        "table": {"header": header, "rows": rows},
        "direct": direct,
        "served": {f"wait{w:g}ms_c{c}": v for (w, c), v in served.items()},
        "alias_switch": switch,
        "server_output": server.lines[-20:],
    }
    return finish(args.json_out, data, failed)


if __name__ == "__main__":
    sys.exit(main())
