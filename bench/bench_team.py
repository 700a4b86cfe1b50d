#!/usr/bin/env python
"""Train server shared by a team: fair share, preemption and operator metrics.

    python bench/bench_team.py [--parts fairshare,preempt,metrics] [--repeats 3] [--markdown]

1. fairshare: three users submit at unequal rates (6, 2 and 1 one-CPU jobs per step, each running 2-6
   steps, on 8 CPUs: the queue never drains) with configured shares 1:1:2; the scheduler's own
   ``decide()`` and the server's usage accounting, stepped in simulated time. Each user's share of
   the usage after N finished jobs, with fair share and with it off (submission order), against the
   configured shares. Goal: every user within 5 points of their share after 400 jobs. Also the cost of
   the team's rules in ``decide()`` with 10,000 queued jobs of 3 users (fair share, a quota,
   preemptible running jobs) against the same call without them (bench_server.py's part 4 queue).
2. preempt: a real server (2 CPUs); a low-priority ``--preemptible`` 2-worker job that checkpoints every
   10 steps runs ~10 s; a priority-5 2-worker job is submitted once it has started: time from that
   submission to the high job's first step, with preemption (the low job stops at Ctrl-C, is requeued,
   and resumes from its checkpoint) and with ``--no-preemption`` (it waits for the low job's end).
   Goal: with preemption <= 5 s. Also the low job's steps run again after resuming (lost work).
3. metrics: ``GET /metrics`` (the scrape token) of a server restarted onto 10,000 jobs of 3 users
   (half queued, half held, behind a running job): first scrape, then the median and p95 of 20
   scrapes, the bytes and the number of series. Goal: median <= 50 ms.

Everything runs in temporary directories; servers and job processes are killed at the end. Results
go to ``bench/results/team.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

from _common import (
    BENCH_DIR,
    REPO_ROOT,
    git_commit,
    machine_info,
    percentile,
    render_markdown,
    render_text,
    status,
    write_json,
)

DEFAULT_JSON = os.path.join(BENCH_DIR, "results", "team.json")
PARTS = ("fairshare", "preempt", "metrics")
MARK_ENV = "TRAINFORGE_BENCH_MARK"
GOAL_SHARE_ERROR = 0.05
GOAL_PREEMPT_FIRST_STEP_S = 5.0
GOAL_SCRAPE_MS = 50.0
SLEEP_SCRIPT = "import sys, time\ntime.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0.0)\n"


# --------------------------------------------------------------------------------------------------
# Part 1: fair share in simulated time, with the scheduler's decide() and the server's accounting.
# --------------------------------------------------------------------------------------------------
def simulate(fair_share: bool, steps: int, seed: int = 0) -> dict[str, Any]:
    from trainforge.server.scheduling.accounting import Accounting
    from trainforge.server.scheduling.rule import JobRequest, RunningJob, Team, decide

    rng = random.Random(seed)
    rates, shares = {"ann": 6, "bob": 2, "cat": 1}, {"ann": 1.0, "bob": 1.0, "cat": 2.0}
    cap = {"CPU": 8.0}
    acct = Accounting(None, cap, half_life_s=float("inf"))
    queue: list[Any] = []
    running: dict[int, tuple[str, dict[str, float], int]] = {}
    done: list[str] = []
    cpu_s: dict[str, float] = {u: 0.0 for u in rates}
    marks: dict[int, dict[str, float]] = {}
    seq = 0
    for t in range(steps):
        for job_id in [j for j, (_, _, end) in running.items() if end <= t]:
            done.append(running.pop(job_id)[0])
            if len(done) in (100, 200, 400, 800):
                total = sum(cpu_s.values())
                marks[len(done)] = {u: cpu_s[u] / total for u in rates}
        for user, rate in rates.items():
            for _ in range(rate):
                seq += 1
                queue.append(JobRequest(seq, seq=seq, per_worker={"CPU": 1.0}, user=user))
        acct.sync({j: (u, g) for j, (u, g, _) in running.items()}, float(t))
        team = Team(usage=acct.usage(float(t)), shares=shares, fair_share=fair_share)
        decision = decide(queue, [RunningJob(j, g, user=u) for j, (u, g, _) in running.items()], cap, team)
        started = {s.job_id: s for s in decision.starts}
        for job in [j for j in queue if j.job_id in started]:
            running[job.job_id] = (job.user, started[job.job_id].grant, t + rng.randint(2, 6))
        queue = [j for j in queue if j.job_id not in started]
        for user, _, _ in running.values():
            cpu_s[user] += 1.0
    total_share = sum(shares.values())
    return {"configured": {u: s / total_share for u, s in shares.items()}, "after_jobs": marks,
            "jobs_done": len(done), "queued_at_end": len(queue)}  # fmt: skip


def team_decide_cost(n: int, calls: int) -> dict[str, Any]:
    """decide() on bench_server.py's mixed 10,000-job queue, without and with the team's rules: on the
    WaitingQueue the server keeps (built off the clock), and on a plain list (sorted at each call)."""
    import dataclasses

    from bench_server import make_queue

    from trainforge.server.scheduling.rule import RunningJob, Team, WaitingQueue, decide

    queue, running, capacity = make_queue(n)
    users = ("ann", "bob", "cat")
    team_queue = [dataclasses.replace(j, user=users[j.job_id % 3]) for j in queue]
    team_running = [RunningJob(100_000 + i, g, user=users[i % 3], preemptible=i % 2 == 0, run_s=600.0)
                    for i, g in enumerate(running)]  # fmt: skip
    team = Team(usage={"ann": 3.0, "bob": 1.0, "cat": 0.5}, shares={"cat": 2.0}, quotas={"bob": {"GPU": 2.0}},
                exempt_s=60.0, cooldown_s=600.0)  # fmt: skip

    def timed(fn: Any) -> dict[str, float]:
        fn()
        times = []
        for _ in range(calls):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return {"median_ms": statistics.median(times) * 1e3, "min_ms": min(times) * 1e3}

    waiting, team_waiting = WaitingQueue(queue), WaitingQueue(team_queue)
    return {"queued": n, "calls": calls,
            "without_team": timed(lambda: decide(waiting, running, capacity)),
            "with_team": timed(lambda: decide(team_waiting, team_running, capacity, team)),
            "from_a_list": {"without_team": timed(lambda: decide(queue, running, capacity)),
                            "with_team": timed(lambda: decide(team_queue, team_running, capacity, team))}}  # fmt: skip


def part_fairshare(args: argparse.Namespace) -> dict[str, Any]:
    return {"fair_share": simulate(True, args.sim_steps), "submission_order": simulate(False, args.sim_steps),
            "decide": team_decide_cost(args.queued, args.decide_calls)}  # fmt: skip


# --------------------------------------------------------------------------------------------------
# Part 2: a high-priority submission's first step, with and without preemption (real processes).
# --------------------------------------------------------------------------------------------------
def bench_loop(config: dict) -> None:
    import os
    import tempfile
    import time

    import trainforge as train

    start = 0
    ckpt = train.get_checkpoint()
    if ckpt is not None:
        with open(os.path.join(ckpt.path, "step")) as f:
            start = int(f.read()) + 1
    for step in range(start, config["steps"]):
        checkpoint = None
        every = config.get("checkpoint_every")
        if every and step % every == every - 1 and train.get_context().get_world_rank() == 0:
            d = tempfile.mkdtemp()
            with open(os.path.join(d, "step"), "w") as f:
                f.write(str(step))
            checkpoint = train.Checkpoint.from_directory(d)
        train.report({"step": step, "t": time.time(), "start": start}, checkpoint=checkpoint)
        time.sleep(config.get("sleep_s", 0.0))


def _spec(work: str, name: str, **config: Any) -> dict[str, Any]:
    from trainforge import DataParallelTrainer, RunConfig, ScalingConfig
    from trainforge._internal.trainer_job import trainer_job

    trainer = DataParallelTrainer(bench_loop, train_loop_config=config,
                                  scaling_config=ScalingConfig(num_workers=2, executor="local"),
                                  run_config=RunConfig(name=name, storage_path=os.path.join(work, "runs"), verbose=0))  # fmt: skip
    return trainer_job(trainer, name=name, cannot_send="bench", fix="")


def _one_preemption(work: str, env: dict[str, str], servers: list[Any], preempt: bool, i: int) -> dict[str, Any]:
    from bench_server import new_server

    from trainforge.server import Client

    extra = ("--preempt-exempt", "0") if preempt else ("--no-preemption",)
    srv = new_server(os.path.join(work, f"preempt-{preempt}-{i}"), "CPU=2", env, extra)
    servers.append(srv)
    srv.start(require_url=True)
    try:
        client = Client(srv.url, state_dir=srv.state_dir)
        low = client.submit({**_spec(work, f"low-{preempt}-{i}", steps=200, sleep_s=0.05, checkpoint_every=10),
                             "preemptible": True})  # fmt: skip
        next(iter(low.reports()))  # it runs
        t0 = time.time()
        high = client.submit({**_spec(work, f"high-{preempt}-{i}", steps=3), "priority": 5})
        first = next(iter(high.reports()))
        first_step_s = first.metrics["t"] - t0
        high.result(timeout=120)
        low_result = low.result(timeout=120)
        frame = low_result.metrics_dataframe
        status = low.status()
        return {"first_step_s": first_step_s, "low_preemptions": status.raw["preemptions"],
                "low_steps": int(len(frame)), "low_steps_run_twice": int(status.raw["reports"] - len(frame))}  # fmt: skip
    finally:
        srv.stop(15, kill_after=True)


def part_preempt(args: argparse.Namespace, work: str, env: dict[str, str], servers: list[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for preempt in (True, False):
        runs = [_one_preemption(work, env, servers, preempt, i) for i in range(args.repeats)]
        out["with_preemption" if preempt else "without_preemption"] = {
            "runs": runs, "median_first_step_s": statistics.median(r["first_step_s"] for r in runs)}  # fmt: skip
    return out


# --------------------------------------------------------------------------------------------------
# Part 3: /metrics with 10,000 jobs.
# --------------------------------------------------------------------------------------------------
def part_metrics(args: argparse.Namespace, work: str, env: dict[str, str], servers: list[Any]) -> dict[str, Any]:
    import httpx
    from bench_server import new_server

    from trainforge.server.store.database import JobStore

    state = os.path.join(work, "server-metrics")
    script = os.path.join(work, "sleep_job.py")
    srv = new_server(state, "CPU=2", env)
    servers.append(srv)
    srv.start(require_url=True)
    with srv.http() as http:
        r = http.post("/jobs", json={"kind": "script", "path": script, "args": ["300"], "workers": 2,
                                     "per_worker": {"CPU": 1}, "name": "blocker"})  # fmt: skip
        r.raise_for_status()
    srv.stop(15, kill_after=True)
    store = JobStore(os.path.join(state, "state.db"))
    users = ("ann", "bob", "cat")
    spec = {"kind": "script", "path": script, "args": [], "min_workers": 1, "max_workers": None,
            "per_worker": {"CPU": 1.0}, "driver": {}, "env": {}, "sys_path": [], "cwd": None, "target": None}  # fmt: skip

    def place(job_id: int) -> None:  # the job's directory and spec, as a submission leaves them
        os.makedirs(os.path.join(state, "jobs", str(job_id)), exist_ok=True)
        with open(os.path.join(state, "jobs", str(job_id), "spec.json"), "w") as f:
            json.dump(spec, f)

    for i in range(args.queued):
        store.add_job(name=f"queued-{i}", kind="script", spec=spec, held=i % 2 == 0, owner=users[i % 3],
                      materialize=place)  # fmt: skip
    store.close()
    srv.start(require_url=True)
    with open(os.path.join(state, "scrape_token")) as f:
        scrape = f.read().strip()
    res: dict[str, Any] = {"jobs": args.queued + 1,
                           "recovered": next((ln.strip() for ln in srv.last_lines if "recovered" in ln), None)}
    with httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {scrape}"}, timeout=60) as http:
        t = time.perf_counter()
        first = http.get("/metrics")
        res["first_scrape_ms"] = (time.perf_counter() - t) * 1e3
        first.raise_for_status()
        times = []
        for _ in range(args.scrapes):
            t = time.perf_counter()
            r = http.get("/metrics")
            times.append((time.perf_counter() - t) * 1e3)
            r.raise_for_status()
        res.update(median_ms=statistics.median(times), p95_ms=percentile(times, 95), scrapes=args.scrapes,
                   bytes=len(r.content), series=sum(1 for line in r.text.splitlines() if line and line[0] != "#"),
                   forbidden_elsewhere=http.get("/api/v1/jobs").status_code)  # fmt: skip
    srv.kill9()  # not stopped: a stop would start queued jobs whose directories were never made
    res["leftover"] = srv.cleanup(kill=True)
    return res


# --------------------------------------------------------------------------------------------------
def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def table(data: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["metric", "value", "anchor / goal", "met?"]
    rows: list[list[str]] = []
    fs = data.get("fairshare")
    if fs:
        conf = fs["fair_share"]["configured"]
        for n, fractions in sorted(fs["fair_share"]["after_jobs"].items(), key=lambda kv: int(kv[0])):
            fifo = fs["submission_order"]["after_jobs"].get(n, {})
            worst = max(abs(fractions[u] - conf[u]) for u in conf)
            rows.append([f"usage shares after {n} jobs (ann/bob/cat)",
                         " / ".join(_pct(fractions[u]) for u in conf),
                         "configured " + " / ".join(_pct(conf[u]) for u in conf) + "; submission order "
                         + " / ".join(_pct(fifo.get(u, 0.0)) for u in conf),
                         status(worst <= GOAL_SHARE_ERROR) if int(n) >= 400 else ""])  # fmt: skip
        d = fs["decide"]
        rows.append([f"decide() with {d['queued']} queued, with the team's rules",
                     f"{d['with_team']['median_ms']:.2f} ms", f"without {d['without_team']['median_ms']:.2f} ms", ""])  # fmt: skip
    pre = data.get("preempt")
    if pre:
        w, wo = pre["with_preemption"], pre["without_preemption"]
        rows.append(["high-priority submit -> its first step, with preemption", f"{w['median_first_step_s']:.2f} s",
                     f"without {wo['median_first_step_s']:.2f} s; goal <= {GOAL_PREEMPT_FIRST_STEP_S:g} s",
                     status(w["median_first_step_s"] <= GOAL_PREEMPT_FIRST_STEP_S)])  # fmt: skip
        rows.append(["preempted job: steps run again after resuming (median)",
                     f"{statistics.median(r['low_steps_run_twice'] for r in w['runs']):g}",
                     "checkpoint every 10 steps", ""])  # fmt: skip
    m = data.get("metrics")
    if m:
        rows.append([f"GET /metrics with {m['jobs']} jobs (median of {m['scrapes']})", f"{m['median_ms']:.1f} ms",
                     f"first {m['first_scrape_ms']:.1f} ms, p95 {m['p95_ms']:.1f} ms; goal <= {GOAL_SCRAPE_MS:g} ms",
                     status(m["median_ms"] <= GOAL_SCRAPE_MS)])  # fmt: skip
        rows.append(["/metrics size", f"{m['bytes'] / 1024:.1f} KiB", f"{m['series']} series", ""])
    return header, rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma list of {','.join(PARTS)}")
    p.add_argument("--repeats", type=int, default=3, help="runs of each part-2 variant (median reported)")
    p.add_argument("--sim-steps", type=int, default=300, help="simulated steps of part 1")
    p.add_argument("--queued", type=int, default=10_000, help="queued jobs of parts 1 (decide) and 3")
    p.add_argument("--decide-calls", type=int, default=20, help="decide() calls timed in part 1")
    p.add_argument("--scrapes", type=int, default=20, help="/metrics scrapes timed in part 3")
    p.add_argument("--markdown", action="store_true", help="also print the table as Markdown")
    p.add_argument("--json-out", default=DEFAULT_JSON, help="where to write the JSON results")
    args = p.parse_args(argv)
    parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    bad = sorted(set(parts) - set(PARTS))
    if bad:
        p.error(f"--parts: unknown {bad}; choose from {','.join(PARTS)}")
    work = tempfile.mkdtemp(prefix="tfb-team-")
    with open(os.path.join(work, "sleep_job.py"), "w") as f:
        f.write(SLEEP_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "TRAINFORGE_ADDRESS", "TRAINFORGE_TOKEN",
                                                               "TRAINFORGE_SERVER_DIR")}  # fmt: skip
    env["PYTHONPATH"] = os.pathsep.join(x for x in (REPO_ROOT, BENCH_DIR, env.get("PYTHONPATH")) if x)
    env[MARK_ENV] = f"team-bench-{os.getpid()}"
    servers: list[Any] = []
    data: dict[str, Any] = {"settings": vars(args)}
    errors: dict[str, str] = {}
    t_start = time.time()
    try:
        for part in parts:
            print(f"part {part} ...", file=sys.stderr, flush=True)
            try:
                if part == "fairshare":
                    data[part] = part_fairshare(args)
                elif part == "preempt":
                    data[part] = part_preempt(args, work, env, servers)
                else:
                    data[part] = part_metrics(args, work, env, servers)
            except Exception as exc:
                import traceback

                errors[part] = f"{type(exc).__name__}: {exc}"
                print(f"  !! part {part} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
    finally:
        from trainforge._testing.procs import kill_procs, processes_with_env

        leftovers: list[str] = []
        for srv in servers:
            leftovers += srv.cleanup(kill=True)
        leftovers += kill_procs(processes_with_env(MARK_ENV, env[MARK_ENV]))
        shutil.rmtree(work, ignore_errors=True)
    commit, date = git_commit(), datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    info = machine_info()
    header, rows = table(data)
    print(f"\ntrainforge team-server benchmark  {date}  commit {commit}  python {info['python']}  "
          f"{info['cpu_count']} CPUs  load {os.getloadavg()[0]:.1f}  {time.time() - t_start:.0f} s\n")  # fmt: skip
    print(render_text(header, rows))
    if args.markdown:
        print("\n" + render_markdown(header, rows))
    if errors:
        print("\nfailed parts:\n" + "\n".join(f"- {k}: {v}" for k, v in errors.items()))
    os.makedirs(os.path.dirname(os.path.abspath(args.json_out)), exist_ok=True)
    write_json(args.json_out, {
        "benchmark": "team", "date": date, "git_commit": commit, "machine": info,
        "goals": {"share_error": GOAL_SHARE_ERROR, "preempt_first_step_s": GOAL_PREEMPT_FIRST_STEP_S,
                  "scrape_ms": GOAL_SCRAPE_MS},
        "table": {"header": header, "rows": rows}, "errors": errors, "leftovers_killed": leftovers, **data,
    })  # fmt: skip
    print(f"\nwrote {os.path.relpath(args.json_out)}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
