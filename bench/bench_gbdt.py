#!/usr/bin/env python
"""XGBoost and LightGBM on trainforge vs launching them by hand.

    python bench/bench_gbdt.py [--repeats 3] [--markdown] [--quick] [--frameworks xgboost,lightgbm]

Same data, same 2 CPU workers (``OMP_NUM_THREADS=1``, ``nthread``/``num_threads`` 1), same training:
``--rows`` (100,000) rows of ``sklearn.datasets.make_classification`` (30 features, generated with
the same seed in every process; each worker keeps its half), ``--rounds`` (100) boosting rounds of a
binary classifier, evaluated on its training shard each round, the model saved every 10 rounds by
rank 0.

- **by hand**: the driver starts what the framework needs and two worker processes
  (``python bench_gbdt.py --role worker``). XGBoost: a ``RabitTracker`` in the driver, the workers in
  ``CommunicatorContext(**tracker.worker_args())``. LightGBM: two free ports found by the driver,
  ``machines``/``local_listen_port`` in each worker's params. Rank 0 saves the booster every 10
  rounds (``save_model``) itself.
- **trainforge**: ``XGBoostTrainer`` / ``LightGBMTrainer`` with a train loop doing the same, its
  ``RayTrainReportCallback(frequency=10)`` reporting every round and checkpointing every 10.

Measured, each run in a fresh driver process (``--variant``), variants alternating, medians shown:

1. **overhead**: wall time from just before the launch until it returned (the framework's import in
   the workers, the collective, the training, the checkpoints and the teardown are in both);
   trainforge minus by hand (goal: <= 1 s per run, or <= 5 % of a longer run). Also rank 0's time
   inside ``xgboost.train`` / ``lightgbm.train``.
2. **recovery after a worker kill**: rank 1 SIGKILLs itself once round 55 was evaluated (the last
   checkpoint is at 50), ``FailureConfig(max_failures=1)``; recovery = from the kill (rank 1 records
   the time just before) until rank 0 finished its first round after resuming from the checkpoint.
   Neither framework restarts by itself: the baseline is a cold launch by hand, from the launch to
   the first finished round.
3. **LightGBM back to back** (``--back-to-back``, 20): that many short LightGBM runs in a row on
   trainforge (fresh ports each), against as many by hand reusing the same two ports each time
   (LightGBM's documented way, ``local_listen_port`` fixed): runs that did not finish within
   ``--hang-timeout`` (30) s are counted as hangs (LightGBM's own ``time_out`` is 120 minutes).

Prints a table (``--markdown`` for Markdown) and writes every number to
``bench/results/gbdt.json``. ``--quick``: one repeat, 20,000 rows, 5 back-to-back runs. The
wall-clock figures are only as good as the machine is idle: each run first waits (up to
``--idle-wait`` s) for idle CPUs and the JSON keeps the load average around each run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH_DIR)

from _common import (  # noqa: E402
    finish,
    fmt,
    free_port,
    git_commit,
    machine_info,
    median,
    render_markdown,
    render_text,
    run_script_variant,
    status,
)

RESULTS = os.path.join(BENCH_DIR, "results", "gbdt.json")
EVERY, KILL_ROUND = 10, 55


# --------------------------------------------------------------------------------------------------
# Worker side: the same training for both launchers. Events (rank, attempt, name, time) go to a JSON
# lines file.
# --------------------------------------------------------------------------------------------------
def _event(cfg: dict, rank: int, attempt: int, name: str, **extra: Any) -> None:
    line = json.dumps({"rank": rank, "attempt": attempt, "name": name, "t": time.time(), **extra})
    with open(cfg["events"], "a") as f:
        f.write(line + "\n")


def _shard(cfg: dict, rank: int, world: int) -> tuple[Any, Any]:
    from sklearn.datasets import make_classification

    x, y = make_classification(n_samples=cfg["rows"], n_features=30, n_informative=12, random_state=0)
    return x[rank::world], y[rank::world]


def work(cfg: dict, rank: int, world: int, attempt: int, trainforge: bool, network: dict | None = None) -> None:
    """One worker's training. ``network``: by hand, the framework's collective arguments."""
    x, y = _shard(cfg, rank, world)
    framework = cfg["framework"]
    state = {"first": True}

    def after_round(rounds_done: int, save: Any) -> None:
        if state["first"]:
            state["first"] = False
            _event(cfg, rank, attempt, "first_round", rounds=rounds_done)
        if cfg["kill"] and attempt == 0 and rank == 1 and rounds_done == KILL_ROUND:
            _event(cfg, rank, attempt, "killed")
            os.kill(os.getpid(), signal.SIGKILL)
        if not trainforge and rank == 0 and rounds_done % EVERY == 0:
            save(os.path.join(cfg["output_dir"], f"model-{rounds_done}"))

    _event(cfg, rank, attempt, "train_start")
    if framework == "xgboost":
        import xgboost

        class Probe(xgboost.callback.TrainingCallback):
            def after_iteration(self, model: Any, epoch: int, evals_log: Any) -> bool:
                after_round(model.num_boosted_rounds(), model.save_model)
                return False

        params = {"objective": "binary:logistic", "eval_metric": "logloss", "tree_method": "hist",
                  "max_depth": 6, "nthread": 1}  # fmt: skip
        dtrain = xgboost.DMatrix(x, label=y)
        callbacks: list[Any] = [Probe()]
        start, rounds = None, cfg["rounds"]
        if trainforge:
            import trainforge as train
            from trainforge.xgboost import RayTrainReportCallback

            callbacks.append(RayTrainReportCallback(frequency=EVERY))
            if train.get_checkpoint():
                start = RayTrainReportCallback.get_model(train.get_checkpoint())
                rounds -= start.num_boosted_rounds()

        def run() -> None:
            xgboost.train(params, dtrain, num_boost_round=rounds, evals=[(dtrain, "train")], xgb_model=start,
                          verbose_eval=False, callbacks=callbacks)  # fmt: skip

        if network is not None:
            with xgboost.collective.CommunicatorContext(**network):
                run()
        else:
            run()
    else:
        import lightgbm

        class LgbProbe:
            order, before_iteration = 5, False

            def __call__(self, env: Any) -> None:
                after_round(env.iteration + 1, env.model.save_model)

        params = {"objective": "binary", "metric": "binary_logloss", "num_leaves": 63, "num_threads": 1,
                  "verbose": -1, "tree_learner": "data_parallel", "pre_partition": True, **(network or {})}  # fmt: skip
        start, rounds = None, cfg["rounds"]
        lgb_callbacks: list[Any] = [LgbProbe()]
        if trainforge:
            import trainforge as train
            from trainforge.lightgbm import RayTrainReportCallback, get_network_params

            params.update(get_network_params())
            lgb_callbacks.append(RayTrainReportCallback(frequency=EVERY))
            if train.get_checkpoint():
                start = RayTrainReportCallback.get_model(train.get_checkpoint())
                rounds -= start.current_iteration()
        dtrain = lightgbm.Dataset(x, label=y)
        lightgbm.train(params, dtrain, num_boost_round=rounds, valid_sets=[dtrain], valid_names=["train"],
                       init_model=start, callbacks=lgb_callbacks)  # fmt: skip
    _event(cfg, rank, attempt, "train_end")


def trainforge_loop(cfg: dict) -> None:
    import trainforge as train

    ctx = train.get_context()
    work(cfg, ctx.get_world_rank(), ctx.get_world_size(), ctx.get_attempt(), True)


# --------------------------------------------------------------------------------------------------
# Driver side: one variant per fresh process.
# --------------------------------------------------------------------------------------------------
def launch_by_hand(cfg: dict, timeout: float, ports: list[int] | None = None) -> float | str:
    """Start the collective and 2 worker processes; return the wall time, or why it failed."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    tracker = None
    t0 = time.time()
    if cfg["framework"] == "xgboost":
        from xgboost.tracker import RabitTracker

        tracker = RabitTracker(n_workers=2, host_ip="127.0.0.1", sortby="task")
        tracker.start()
        networks = [{**tracker.worker_args(), "dmlc_task_id": f"[rank={r:08d}]"} for r in range(2)]
    else:
        ports = ports or [free_port(), free_port()]
        machines = ",".join(f"127.0.0.1:{p}" for p in ports)
        networks = [{"machines": machines, "local_listen_port": p, "num_machines": 2} for p in ports]
    procs = [
        subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--role", "worker",
             "--role-config", json.dumps({**cfg, "rank": r, "network": networks[r]})],
            env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        for r in range(2)
    ]
    outcome: float | str = 0.0
    try:
        for p in procs:
            remaining = max(0.1, timeout - (time.time() - t0))
            _, err = p.communicate(timeout=remaining)
            if p.returncode != 0:
                outcome = f"a worker exited with {p.returncode}: {err[-2000:]}"
    except subprocess.TimeoutExpired:
        outcome = f"hung: not done after {timeout:g} s"
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        if tracker is not None:
            try:
                tracker.free()
            except Exception:
                pass
    return time.time() - t0 if outcome == 0.0 else outcome


def run_trainforge(cfg: dict, workdir: str, kill: bool, name: str = "bench") -> tuple[float, int]:
    from trainforge import FailureConfig, RunConfig, ScalingConfig

    trainer_cls: Any
    if cfg["framework"] == "xgboost":
        from trainforge.xgboost import XGBoostTrainer as trainer_cls
    else:
        from trainforge.lightgbm import LightGBMTrainer as trainer_cls
    t0 = time.time()
    fit = trainer_cls(
        trainforge_loop, train_loop_config=cfg, scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=os.path.join(workdir, "runs"), name=name, verbose=0,
                             failure_config=FailureConfig(max_failures=1 if kill else 0)),
    ).fit()  # fmt: skip
    return time.time() - t0, len(fit.failures)


def run_variant(variant: str, out: str, workdir: str, args: argparse.Namespace) -> None:
    framework, launcher = variant.split(":")
    kill = launcher.endswith("-kill")
    cfg = {"events": os.path.join(workdir, "events.jsonl"), "output_dir": os.path.join(workdir, "output"),
           "rows": args.rows, "rounds": args.rounds, "kill": kill, "framework": framework}  # fmt: skip
    os.makedirs(cfg["output_dir"], exist_ok=True)
    load_before = os.getloadavg()
    result: dict[str, Any] = {}
    if launcher.startswith("back-to-back"):  # LightGBM: many short runs in a row, counting hangs
        short = {**cfg, "rows": 2000, "rounds": 5}
        same_ports = [free_port(), free_port()]
        outcomes = []
        for i in range(args.back_to_back):
            if launcher == "back-to-back-trainforge":
                t = time.time()
                run_trainforge(short, workdir, False, name=f"b2b{i}")
                outcomes.append(time.time() - t)
            else:
                outcomes.append(launch_by_hand(short, args.hang_timeout, ports=same_ports))
        result["outcomes"] = outcomes
        result["t0"] = time.time()
        result["wall_s"] = sum(o for o in outcomes if isinstance(o, float))
        result["events"] = []
    else:
        if launcher.startswith("trainforge"):
            t0 = time.time()
            wall, result["failures"] = run_trainforge(cfg, workdir, kill)
        else:
            t0 = time.time()
            outcome = launch_by_hand(cfg, args.launch_timeout)
            if not isinstance(outcome, float):
                raise RuntimeError(f"by hand: {outcome}")
            wall = outcome
        events = [json.loads(line) for line in open(cfg["events"])]
        result.update({"wall_s": wall, "t0": t0, "events": events})
    result.update({"loadavg_before": load_before, "loadavg_after": os.getloadavg()})
    with open(out, "w") as f:
        json.dump(result, f)


def _first(events: list[dict], name: str, rank: int = 0, attempt: int | None = None) -> float | None:
    times = [e["t"] for e in events
             if e["name"] == name and e["rank"] == rank and (attempt is None or e["attempt"] == attempt)]  # fmt: skip
    return min(times) if times else None


def summarize(run: dict) -> dict:
    """Per-run figures: first round after t0, rank 0's time in train(), recovery after the kill."""
    if "outcomes" in run:
        hangs = [o for o in run["outcomes"] if not isinstance(o, float)]
        return {"runs": len(run["outcomes"]), "hangs": len(hangs), "failed": hangs[:3],
                "median_s": median(o for o in run["outcomes"] if isinstance(o, float))}  # fmt: skip
    ev, t0 = run["events"], run["t0"]
    first = _first(ev, "first_round", attempt=0)
    start, end = _first(ev, "train_start", attempt=0), _first(ev, "train_end")
    out = {"wall_s": run["wall_s"], "first_round_s": None if first is None else first - t0}
    if start is not None and end is not None:
        out["train_s"] = end - start
    killed = _first(ev, "killed", rank=1, attempt=0)
    again = _first(ev, "first_round", attempt=1)
    if killed is not None and again is not None:
        out["recovery_s"] = again - killed
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--frameworks", default="xgboost,lightgbm")
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--back-to-back", type=int, default=20)
    p.add_argument("--hang-timeout", type=float, default=30.0)
    p.add_argument("--quick", action="store_true", help="1 repeat, 20,000 rows, 5 back-to-back runs")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--idle-wait", type=float, default=30.0)
    p.add_argument("--timeout", type=float, default=1200.0)
    p.add_argument("--launch-timeout", type=float, default=240.0, help="a launch by hand is killed after this")
    p.add_argument("--json-out", default=RESULTS)
    p.add_argument("--variant", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--workdir", help=argparse.SUPPRESS)
    p.add_argument("--role", help=argparse.SUPPRESS)
    p.add_argument("--role-config", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role == "worker":  # a worker launched by hand
        cfg = json.loads(args.role_config)
        work(cfg, cfg["rank"], 2, 0, False, network=cfg["network"])
        return 0
    if args.variant:
        run_variant(args.variant, args.out, args.workdir, args)
        return 0
    if args.quick:
        args.repeats, args.rows, args.back_to_back = 1, 20_000, 5

    frameworks = [f for f in args.frameworks.split(",") if f]
    extra = ["--rows", str(args.rows), "--rounds", str(args.rounds), "--back-to-back", str(args.back_to_back),
             "--hang-timeout", str(args.hang_timeout), "--launch-timeout", str(args.launch_timeout)]  # fmt: skip
    runs: dict[str, list[dict]] = {}
    failed: dict[str, list[dict]] = {}
    variants = [f"{fw}:{launcher}" for fw in frameworks for launcher in ("hand", "trainforge", "trainforge-kill")]
    for repeat in range(args.repeats):
        todo = list(variants)
        if repeat == 0 and "lightgbm" in frameworks and args.back_to_back > 0:
            todo += ["lightgbm:back-to-back-trainforge", "lightgbm:back-to-back-hand"]
        for variant in todo:
            print(f"[{repeat + 1}/{args.repeats}] {variant}", file=sys.stderr, flush=True)
            run = run_script_variant(__file__, variant, extra, args.idle_wait, args.timeout)
            if "error" in run:
                failed.setdefault(variant, []).append(run)
                continue
            run["summary"] = summarize(run)
            runs.setdefault(variant, []).append(run)

    def med(variant: str, key: str) -> float | None:
        return median(r["summary"].get(key) for r in runs.get(variant, []))

    header = ["metric", "by hand", "trainforge", "difference", "goal", "status"]
    rows = []
    for fw in frameworks:
        hand, tf = med(f"{fw}:hand", "wall_s"), med(f"{fw}:trainforge", "wall_s")
        diff = None if hand is None or tf is None else tf - hand
        ok = None if diff is None or hand is None else (diff <= 1.0 or diff <= 0.05 * hand)
        rows.append([f"{fw}: run wall time (s)", fmt(hand, ".2f"), fmt(tf, ".2f"), fmt(diff, "+.2f"),
                     "<= +1 s or +5 %", status(ok)])  # fmt: skip
        for key, label in (("first_round_s", "launch -> first round (s)"), ("train_s", "rank 0 in train() (s)")):
            h, t = med(f"{fw}:hand", key), med(f"{fw}:trainforge", key)
            rows.append([f"{fw}: {label}", fmt(h, ".2f"), fmt(t, ".2f"),
                         fmt(None if h is None or t is None else t - h, "+.2f"), "(info)", "-"])  # fmt: skip
        base, rec = med(f"{fw}:hand", "first_round_s"), med(f"{fw}:trainforge-kill", "recovery_s")
        rows.append([f"{fw}: kill -> first round after restart (s); by hand = cold launch", fmt(base, ".2f"),
                     fmt(rec, ".2f"), fmt(None if base is None or rec is None else rec - base, "+.2f"),
                     "<= by hand", status(None if base is None or rec is None else rec <= base)])  # fmt: skip
    b2b = {k: runs.get(f"lightgbm:back-to-back-{k}", [{}])[0].get("summary") for k in ("hand", "trainforge")}
    if b2b["hand"] or b2b["trainforge"]:
        def hangs(s: dict | None) -> str:
            return "-" if not s else f"{s['hangs']} of {s['runs']}"

        rows.append(["lightgbm: hung back-to-back runs (by hand: same ports)", hangs(b2b["hand"]),
                     hangs(b2b["trainforge"]), "", "0", status(None if not b2b["trainforge"] else
                                                                b2b["trainforge"]["hangs"] == 0)])  # fmt: skip
    table = (render_markdown if args.markdown else render_text)(header, rows)
    print(table)
    print(f"\n(medians of {args.repeats} run(s) each; {args.rows} rows, {args.rounds} rounds, 2 CPU workers)")
    data = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "commit": git_commit(),
        "machine": machine_info(),
        "args": {k: v for k, v in vars(args).items() if k not in ("variant", "out", "workdir", "role", "role_config")},
        "table": {"header": header, "rows": rows},
        "runs": {v: [{k: r[k] for k in ("summary", "loadavg_before", "loadavg_after", "failures", "idle_wait_s")
                      if k in r} for r in rs] for v, rs in runs.items()},  # fmt: skip
        "failures": {v: [r.get("error") for r in rs] for v, rs in failed.items()},
    }
    return finish(args.json_out, data, failed)


if __name__ == "__main__":
    sys.exit(main())
