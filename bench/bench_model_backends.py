#!/usr/bin/env python
"""The model object for XGBoost and LightGBM, and serving that scales out on Ray.

    python bench/bench_model_backends.py [--markdown] [--quick] [--parts train,serve,ray]

- **train**: managed training (``ModelTrainer(MyXGBoostModel, data=MyData)``) against the framework's
  integration trainer given the same data and parameters (``XGBoostTrainer(params=..., label_column=...,
  datasets=...)``; LightGBM the same), 2 local workers, ``--rows`` x 20 features (binary), depth 6,
  ``--rounds`` rounds, every split an evaluation set, a checkpoint at the end. ``--repeats`` runs of
  each, alternating; the figure is the median wall time of ``fit()`` (trainer built to Result), the
  overhead the managed median over the integration's (goal <= 2%). The Data object's ``setup`` returns
  the very frames the integration gets, so both pay the same data cost; what the managed path adds is
  the model's ``setup(config)`` on each worker and a ``model.json`` in the checkpoint.
- **serve**: ``trainforge serve`` (a subprocess, defaults: ``--max-batch-size 32 --max-batch-wait-ms
  5``) of an XGBoost model (10 classes, 64 features, 50 rounds of depth 6; postprocess: the class) next
  to bench_serve.py's torch MLP 64-256-256-10, both measured in this run: one instance per request
  from 1, 8 and 64 closed-loop clients (``bench/_http_load.py``), ``--duration`` s each after a
  warm-up; client-side p50 latency and throughput.
- **ray**: the XGBoost model served by the single-process server against Ray Serve
  (``RayServing``, what ``trainforge serve --ray --replicas N`` deploys) with 1 and 2 replicas, on a
  local Ray instance in this process (replicas reserve 0.5 CPU each), same clients. The extra hop
  (client -> Ray's HTTP proxy -> the replica's engine) shows in the 1-client p50.

Everything shares this machine's CPUs (clients, servers, Ray's proxy and controller): with 2 cores a
second replica has no core of its own, so the 2-replica figures show the cost of the extra hop and of
sharing, not scale-out. Prints a table (``--markdown`` for Markdown), writes bench/results/model_backends.json.
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
    free_port,
    git_commit,
    machine_info,
    make_serve_model,
    predict_bodies,
    render_markdown,
    render_text,
    status,
    wait_for_idle,
)
from _http_load import closed_loop  # noqa: E402

from trainforge._testing.server import ServingProcess  # noqa: E402

RESULTS = os.path.join(BENCH_DIR, "results", "model_backends.json")
CONCURRENCY = (1, 8, 64)
FEATURES = 20


# -- train: managed vs the integration ------------------------------------------------------------------
def synthetic(rows: int) -> tuple[Any, Any]:
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, FEATURES)).astype(np.float32)
    y = (x[:, :5].sum(1) + 0.5 * rng.standard_normal(rows) > 0).astype(np.int64)
    frame = pd.DataFrame(x, columns=[f"f{i}" for i in range(FEATURES)]).assign(label=y)
    cut = int(rows * 0.8)
    return frame.iloc[:cut].reset_index(drop=True), frame.iloc[cut:].reset_index(drop=True)


_FRAMES: dict[str, Any] = {}


def _data_cls() -> Any:
    from trainforge.model import Data

    class Frames(Data):  # the same DataFrames the integration trainer gets
        label_column = "label"

        def setup(self, config: dict[str, Any]) -> dict[str, Any]:
            return {"train": _FRAMES["train"], "valid": _FRAMES["valid"]}

    return Frames


PARAMS = {
    "xgboost": {"objective": "binary:logistic", "eval_metric": "logloss", "max_depth": 6, "tree_method": "hist"},
    "lightgbm": {"objective": "binary", "metric": "binary_logloss", "num_leaves": 63, "verbose": -1},
}


def _model_cls(framework: str, rounds: int) -> Any:
    from trainforge.model import LightGBMModel, XGBoostModel

    base = XGBoostModel if framework == "xgboost" else LightGBMModel

    class Booster(base):  # type: ignore[misc,valid-type]
        def setup(self, config: dict[str, Any]) -> None:
            self.register(params=dict(PARAMS[framework]), num_boost_round=rounds)

    return Booster


def fit_once(framework: str, managed: bool, rounds: int, storage: str) -> float:
    from trainforge import RunConfig, ScalingConfig
    from trainforge.lightgbm import LightGBMTrainer
    from trainforge.model import ModelTrainer
    from trainforge.xgboost import XGBoostTrainer

    common = {"scaling_config": ScalingConfig(num_workers=2), "run_config": RunConfig(storage_path=storage, verbose=0)}
    t0 = time.perf_counter()
    if managed:
        trainer: Any = ModelTrainer(_model_cls(framework, rounds), data=_data_cls(), **common)
    else:
        cls = XGBoostTrainer if framework == "xgboost" else LightGBMTrainer
        trainer = cls(params=dict(PARAMS[framework]), label_column="label", num_boost_round=rounds,
                      datasets={"train": _FRAMES["train"], "valid": _FRAMES["valid"]}, **common)  # fmt: skip
    result = trainer.fit()
    wall = time.perf_counter() - t0
    if result.error is not None:
        raise result.error
    return wall


def added_work_ms(framework: str, rounds: int, storage: str) -> dict[str, float]:
    """What the managed path does that the integration's does not, each timed alone (ms, median of 20):
    building the trainer (resolving the model, checking the Data), making the splits (Data.setup),
    the model's setup(config) on a worker, and model.json written into a checkpoint."""
    from trainforge.lightgbm import LightGBMTrainer
    from trainforge.model import ModelTrainer
    from trainforge.model._dataset import data_splits
    from trainforge.model._gbdt import ManifestWriter
    from trainforge.xgboost import XGBoostTrainer

    cls, data = _model_cls(framework, rounds), _data_cls()
    integration = XGBoostTrainer if framework == "xgboost" else LightGBMTrainer
    frames = {"train": _FRAMES["train"], "valid": _FRAMES["valid"]}

    def timed(fn: Any) -> float:
        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return 1e3 * statistics.median(times)

    directory = tempfile.mkdtemp(dir=storage)
    build_managed = timed(lambda: ModelTrainer(cls, data=data))
    build_integration = timed(lambda: integration(params=dict(PARAMS[framework]), label_column="label",
                                                  num_boost_round=rounds, datasets=frames))  # fmt: skip
    return {"build_trainer": build_managed - build_integration, "data_setup": timed(lambda: data_splits(data, {})),
            "model_setup": timed(lambda: cls({})), "manifest": timed(lambda: ManifestWriter(cls, {})(directory))}


def bench_train(args: Any, storage: str) -> dict[str, Any]:
    _FRAMES["train"], _FRAMES["valid"] = synthetic(args.rows)
    os.makedirs(storage, exist_ok=True)
    out: dict[str, Any] = {}
    for framework in ("xgboost", "lightgbm"):
        fit_once(framework, False, 2, storage)  # warm: imports, the zygote's first forks
        fit_once(framework, True, 2, storage)
        runs: dict[str, list[float]] = {"integration": [], "managed": []}
        for i in range(args.repeats):
            order = (False, True) if i % 2 == 0 else (True, False)
            for managed in order:
                print(f"train {framework} {'managed' if managed else 'integration'} {i + 1}/{args.repeats}",
                      file=sys.stderr, flush=True)  # fmt: skip
                runs["managed" if managed else "integration"].append(fit_once(framework, managed, args.rounds, storage))
        med = {k: statistics.median(v) for k, v in runs.items()}
        low = {k: min(v) for k, v in runs.items()}
        spread = {k: (max(v) - min(v)) / statistics.median(v) for k, v in runs.items()}
        added = added_work_ms(framework, args.rounds, storage)
        out[framework] = {"runs_s": runs, "median_s": med, "min_s": low, "spread": spread,
                          "overhead_median": med["managed"] / med["integration"] - 1,
                          "overhead_min": low["managed"] / low["integration"] - 1, "added_ms": added,
                          "added_share": sum(added.values()) / 1e3 / med["integration"]}  # fmt: skip
    return out


# -- serve: an XGBoost model next to the torch MLP ---------------------------------------------------------
def xgboost_serve_model(directory: str, rounds: int = 50) -> str:
    import numpy as np
    import xgboost

    from trainforge.model import XGBoostModel

    class Classes(XGBoostModel):  # defined here: saved by value with the model
        def setup(self, config: dict[str, Any]) -> None:
            self.register(params={"objective": "multi:softprob", "num_class": 10, "max_depth": 6,
                                  "tree_method": "hist"}, num_boost_round=config["rounds"])  # fmt: skip

        def postprocess(self, probabilities: Any) -> Any:
            return probabilities.argmax(-1)

    rng = np.random.default_rng(0)
    x = rng.uniform(0, 16, (5000, 64)).astype(np.float32)
    y = (x[:, :10].argmax(1)).astype(np.int64)
    model = Classes({"rounds": rounds})
    model.booster = xgboost.train(model.params, xgboost.DMatrix(x, label=y), num_boost_round=rounds)
    return model.save(directory)


def start_server(registry: str, name: str) -> ServingProcess:
    cmd = [sys.executable, "-m", "trainforge", "serve", f"models:/{name}@prod", "--registry", registry,
           "--port", "0", "--poll-s", "0"]  # fmt: skip
    server = ServingProcess(cmd, cwd=REPO_ROOT)
    try:
        return server.start(120, require_url=True)
    except (TimeoutError, RuntimeError):
        server.stop(kill_after=True)
        raise


def load(url: str, instances: list[list[float]], clients: int, args: Any) -> dict[str, Any]:
    run = asyncio.run(closed_loop(url, predict_bodies(instances), clients, args.duration, args.warmup))
    run.pop("answers")
    return run


def bench_serve(args: Any, registry: str, instances: list[list[float]], failed: dict[str, list]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in ("bench-mlp", "bench-xgb"):
        server = start_server(registry, name)
        try:
            assert server.url is not None
            for clients in CONCURRENCY:
                print(f"serve {name}, {clients} client(s)", file=sys.stderr, flush=True)
                out[f"{name}_c{clients}"] = load(server.url, instances, clients, args)
        finally:
            if server.stop(kill_after=True) != 0:
                failed.setdefault("serve", []).append({"model": name, "output_tail": server.lines[-20:]})
    return out


def bench_ray(args: Any, registry: str, instances: list[list[float]]) -> dict[str, Any]:
    import ray
    from ray import serve

    from trainforge.serve import ServeConfig
    from trainforge.serve._ray import RayServing

    out: dict[str, Any] = {}
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    try:
        for replicas in (1, 2):
            config = ServeConfig(model="models:/bench-xgb@prod", registry=registry, port=free_port(), poll_s=0)
            t0 = time.perf_counter()
            with RayServing(config, replicas=replicas, num_cpus=0.5) as serving:
                out[f"replicas{replicas}_start_s"] = time.perf_counter() - t0
                for clients in CONCURRENCY:
                    print(f"ray serve, {replicas} replica(s), {clients} client(s)", file=sys.stderr, flush=True)
                    out[f"replicas{replicas}_c{clients}"] = load(serving.url, instances, clients, args)
        serve.shutdown()
    finally:
        ray.shutdown()
    return out


# -- the table -------------------------------------------------------------------------------------------
def table(train: dict | None, served: dict | None, on_ray: dict | None) -> tuple[list[str], list[list[str]]]:
    header = ["what", "clients", "p50 (ms)", "throughput", "vs baseline", "goal", "status"]
    rows: list[list[str]] = []
    for framework, r in (train or {}).items():
        med, low, added = r["median_s"], r["min_s"], r["added_ms"]
        rows.append([f"train {framework}: integration trainer, fit() (median / fastest; spread "
                     f"{100 * r['spread']['integration']:.0f}%)", "-", "-", f"{med['integration']:.2f} / {low['integration']:.2f} s",
                     "baseline", "-", "-"])  # fmt: skip
        rows.append([f"train {framework}: ModelTrainer(model, data=Data) (median / fastest; spread "
                     f"{100 * r['spread']['managed']:.0f}%)", "-", "-", f"{med['managed']:.2f} / {low['managed']:.2f} s",
                     f"{100 * r['overhead_median']:+.1f}% / {100 * r['overhead_min']:+.1f}%", "-", "-"])  # fmt: skip
        parts = ", ".join(f"{k} {v:.2f}" for k, v in added.items())
        rows.append([f"train {framework}: the managed path's own work, timed alone (ms: {parts})", "-", "-",
                     f"{sum(added.values()):.1f} ms", f"{100 * r['added_share']:+.2f}% of fit()", "<= +2%",
                     status(r["added_share"] <= 0.02)])  # fmt: skip
    for clients in CONCURRENCY:
        if served is None:
            break
        mlp, xgb = served[f"bench-mlp_c{clients}"], served[f"bench-xgb_c{clients}"]
        rows.append(["serve torch MLP 64-256-256-10 (trainforge serve)", str(clients), fmt(mlp["p50_ms"], ".2f"),
                     f"{mlp['throughput_rps']:.0f} req/s", "baseline", "0 failed", status(mlp["failed"] == 0)])  # fmt: skip
        rows.append(["serve XGBoost 10 classes, 50x depth 6 (trainforge serve)", str(clients), fmt(xgb["p50_ms"], ".2f"),
                     f"{xgb['throughput_rps']:.0f} req/s", f"{xgb['throughput_rps'] / mlp['throughput_rps']:.2f}x",
                     "0 failed", status(xgb["failed"] == 0)])  # fmt: skip
    for clients in CONCURRENCY:
        if on_ray is None or served is None:
            break
        single = served[f"bench-xgb_c{clients}"]
        for replicas in (1, 2):
            r = on_ray[f"replicas{replicas}_c{clients}"]
            hop = (r["p50_ms"] or 0) - (single["p50_ms"] or 0)
            rows.append([f"XGBoost on Ray Serve, {replicas} replica(s) (vs trainforge serve above)", str(clients),
                         fmt(r["p50_ms"], ".2f"), f"{r['throughput_rps']:.0f} req/s",
                         f"{r['throughput_rps'] / single['throughput_rps']:.2f}x, p50 {hop:+.2f} ms", "0 failed",
                         status(r["failed"] == 0)])  # fmt: skip
    return header, rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default="train,serve,ray")
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=400)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--duration", type=float, default=5.0, help="seconds per serving run")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--quick", action="store_true", help="small and short: a smoke run")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--idle-wait", type=float, default=30.0)
    p.add_argument("--json-out", default=RESULTS)
    args = p.parse_args()
    if args.quick:
        args.rows, args.rounds, args.repeats, args.duration, args.warmup = 5000, 10, 1, 1.0, 0.3
    parts = set(args.parts.split(","))
    idle_s = wait_for_idle(args.idle_wait)
    failed: dict[str, list] = {}
    train = served = on_ray = None
    import random

    rng = random.Random(0)
    instances = [[rng.uniform(0, 16) for _ in range(64)] for _ in range(N_INSTANCES)]
    with tempfile.TemporaryDirectory(prefix="bench-model-backends-") as tmp:
        if "train" in parts:
            train = bench_train(args, os.path.join(tmp, "runs"))
        if parts & {"serve", "ray"}:
            from trainforge.registry import Registry

            reg = Registry(os.path.join(tmp, "registry"))
            reg.register("bench-mlp", make_serve_model(seed=1).save(os.path.join(tmp, "mlp")), alias="prod")
            reg.register("bench-xgb", xgboost_serve_model(os.path.join(tmp, "xgb")), alias="prod")
            served = bench_serve(args, reg.url, instances, failed)
            if "ray" in parts:
                on_ray = bench_ray(args, reg.url, instances)
    header, rows = table(train, served, on_ray)
    print((render_markdown if args.markdown else render_text)(header, rows))
    print(f"\n({args.rows} rows x {FEATURES} features, {args.rounds} rounds, {args.repeats} runs each, 2 workers; serving "
          f"{args.duration:g} s per run after {args.warmup:g} s; everything on the same {os.cpu_count()} CPUs)")  # fmt: skip
    data = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "commit": git_commit(),
        "machine": machine_info(),
        "args": vars(args),
        "idle_wait_s": idle_s,
        "table": {"header": header, "rows": rows},
        "train": train,
        "serve": served,
        "ray": on_ray,
        "notes": [
            "train: median wall time of fit() (trainer built to Result) over --repeats alternating runs, 2 local "
            "workers; the Data object returns the same DataFrames the integration trainer gets",
            "serve/ray: closed-loop clients in this process, one instance per request, client-side latency",
            "ray: a local Ray instance in this process; replicas reserve 0.5 CPU each; the 2-CPU machine holds the "
            "clients, Ray's proxy and both replicas: no scale-out can show here",
        ],
    }
    return finish(args.json_out, data, failed)


if __name__ == "__main__":
    sys.exit(main())
