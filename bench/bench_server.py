#!/usr/bin/env python
"""Train server benchmark: how fast the train server (``trainforge server start``) starts, queues,
schedules and recovers jobs, against a local ``fit()`` of the same job and against Ray Jobs.

    python bench/bench_server.py [--repeats 3] [--markdown] [--parts submit,handoff,burst,decide,restart,load]

1. submit -> rank-0 first step: a 2-worker ``DataParallelTrainer`` (CPU, local executor, a loop that
   reports ``{"step", "t": time.time()}`` every step), from a fresh driver process each time:
   ``trainer.submit()`` to a server with its warm pool (its zygote ready; one job ran before the clock),
   and to a ``--no-warm`` server (fresh runner and worker processes per job) vs a local
   ``trainer.fit()`` (clock from the call to rank 0's first report, all) vs Ray Jobs: ``ray job submit
   --no-wait`` (CLI, clock started before the command) and ``POST /api/jobs/`` (what the Ray SDK sends)
   of a script that runs the same trainer with a local ``fit()``, on a Ray instance this benchmark starts
   (``ray start --head --include-dashboard=true``, 2 CPUs, 127.0.0.1 only). Goals: fresh processes <=
   fit() + 0.5 s; warm pool <= 0.5x fit() ("well under a cold fit()"). Then the same submissions by a
   member of a server with users (``--parts sandbox``: the job sandboxed, issue 34), warm and fresh,
   side by side with the admin's unsandboxed ones from the same run: goal, the sandbox adds <= 50 ms to
   a fresh start; and the median time between two of rank 0's reports (a report every step), with and
   without the sandbox: goal, the same.
2. freed capacity -> next queued job's runner started: capacity CPU=2, a chain of script jobs asking 2
   CPUs each; from job N's ``ended`` event (its grant released) to job N+1's ``running`` event (its runner
   process exists), and from the moment N's runner process exited (seen through a pidfd). Goal <= 100 ms.
3. submissions persisted per second: ``--submissions`` (1000) ``POST /api/v1/jobs`` of held script jobs
   from ``--threads`` (4) clients, then the same number of ``POST /jobs/{id}/stop``. Goal >= 200/s.
4. the scheduler's decision with 10,000 queued jobs: ``_scheduler.decide`` called directly, as the server
   calls it (on the ``WaitingQueue`` it keeps up to date), on a mixed queue (CPU, GPU and memory requests,
   some fitting, 10% elastic, 10% held, a few priorities) and on a CPU-only queue (half held, every CPU
   granted); then a server that restarts onto 10,000 such CPU-only jobs (written to its store with their
   files while it is down) behind a running one: its ``decision_ms`` (``GET /api/v1/resources``) after
   each of ``--decide-submits`` submissions, their latency, and ``GET /api/v1/queue`` page by page.
   Goals: <= 5 ms per decision, <= 10 ms per submission, <= 100 ms per page of the queue.
5. ``kill -9`` of the server -> serving again: 3 running 2-worker trainer jobs (capacity CPU=6), the server
   SIGKILLed, restarted on its state directory: time to its "serving" line and to ``GET /health``; every job
   RUNNING with the same runner pid and still reporting; then all stopped and no process of theirs left.
   Goal <= 2 s.
6. idle server RSS (psutil) after start, and with the 10,000 queued jobs of part 4. Goal <= 100 MB.
7. under load (``--parts load``, see ``_server_load.py``): 20, then 200 concurrent clients of ``GET /api/v1/jobs``
   (200 jobs in the store) beside 20 live ``GET /api/v1/events`` streams, from a separate process: p50/p95,
   errors, requests/s, and the server's RSS, open files, threads and SQLite connections before, at peak and
   after. Goals: 0 errors, p95 at 20 clients <= 100 ms, threads and SQLite connections bounded.

Everything lives in temporary directories; every server, job process and Ray process the benchmark
started is killed at the end (Ray's by the benchmark's own marker in their environment or their
temporary directory, never ``ray stop``, which would also stop other Ray instances of this user).
Results go to ``bench/results/server.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

from _common import (
    BENCH_DIR,
    RAY_ENV,
    REPO_ROOT,
    free_port,
    git_commit,
    machine_info,
    median,
    proc_start_wall,
    render_markdown,
    render_text,
    status,
    wait_for_idle,
    write_json,
)
from _server_load import GOAL_LOAD_P95_MS, load_diagnostics, load_rows, run_level, seed_jobs

if TYPE_CHECKING:
    from trainforge._testing.server import TrainServer

DEFAULT_JSON = os.path.join(BENCH_DIR, "results", "server.json")
PARTS = ("submit", "sandbox", "handoff", "burst", "decide", "restart", "load")
GOAL_SANDBOX_FRESH_MS = 50.0  # what a job's sandbox may add to a fresh start

GOAL_SUBMIT_EXTRA_S = 0.5  # server submit -> first step, at most local fit() + this
GOAL_WARM_FRACTION = 0.5  # with the warm pool, "well under a cold fit()": at most this fraction of it
GOAL_HANDOFF_MS = 100.0
GOAL_SUBMIT_RATE = 200.0
GOAL_DECIDE_MS = 5.0
GOAL_SUBMIT_WITH_QUEUE_MS = 10.0  # a submission to a server with 10,000 queued jobs
GOAL_QUEUE_PAGE_MS = 100.0  # a page of GET /queue, as one of the dashboard's other lists
GOAL_RESTART_S = 2.0
GOAL_IDLE_RSS_MB = 100.0

MARK_ENV = "TRAINFORGE_BENCH_MARK"  # in the environment of every process this benchmark starts
WORLD_SIZE = 2

SERVER_ID_ENV = "TRAINFORGE_SERVER_ID"  # trainforge._testing.server.SERVER_ID_ENV
SLEEP_SCRIPT = "import sys, time\ntime.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0.0)\n"


# --------------------------------------------------------------------------------------------------
# The job: a trivial 2-worker loop (shipped to the workers by cloudpickle).
# --------------------------------------------------------------------------------------------------
def bench_loop(config: dict) -> None:
    import time

    import trainforge as train

    rank = train.get_context().get_world_rank()
    for step in range(config["steps"]):
        train.report({"step": step, "t": time.time(), "rank": rank})
        if config.get("sleep_s"):
            time.sleep(config["sleep_s"])


def make_trainer(storage_path: str | None, steps: int, sleep_s: float = 0.0, name: str | None = None) -> Any:
    from trainforge import DataParallelTrainer, RunConfig, ScalingConfig

    # executor="local" everywhere: under Ray Jobs $RAY_ADDRESS is set, which would pick the Ray executor.
    return DataParallelTrainer(
        bench_loop,
        train_loop_config={"steps": steps, "sleep_s": sleep_s},
        scaling_config=ScalingConfig(num_workers=WORLD_SIZE, executor="local"),
        run_config=RunConfig(storage_path=storage_path, name=name, verbose=0),
    )


def run_variant_here(args: argparse.Namespace) -> None:
    """One driver of part 1 in this fresh process: ``fit`` or ``submit``."""
    t_proc = proc_start_wall()
    t_import0 = time.time()
    import trainforge  # noqa: F401 (the import is part of neither clock)

    t_import = time.time() - t_import0
    # A sandboxed job writes its runs to its user's home (the benchmark's directory is not its to write).
    trainer = make_trainer(None if args.sandboxed else os.path.join(args.workdir, "runs"), args.steps)
    out: dict[str, Any] = {"variant": args.variant, "t_proc": t_proc, "import_s": t_import, "pid": os.getpid()}
    if args.variant == "fit":
        out["t0"] = time.time()
        result = trainer.fit()
        out["t_returned"] = time.time()
        out["first_step_t"] = result.metrics_history[0]["t"]
        out["reports"] = len(result.metrics_history)
        out["run_error"] = None if result.error is None else repr(result.error)
    elif args.variant == "submit":
        sink = io.StringIO()
        with contextlib.redirect_stdout(sink):
            out["t0"] = time.time()
            job = trainer.submit(address=args.url)
            out["t_submit_returned"] = time.time()
            for _ in job.reports():
                out["t_first_report_seen"] = time.time()
                break
            result = job.result(timeout=120)
        out["t_returned"] = time.time()
        out["job_id"] = job.id
        out["first_step_t"] = result.metrics_history[0]["t"]
        out["reports"] = len(result.metrics_history)
        times = [m["t"] for m in result.metrics_history]
        out["step_ms"] = statistics.median(b - a for a, b in zip(times, times[1:], strict=False)) * 1e3 if len(times) > 1 else None
        out["client_output"] = sink.getvalue()[-2000:]
    else:
        raise SystemExit(f"unknown variant {args.variant!r}")
    write_json(args.out, out)


# --------------------------------------------------------------------------------------------------
# Processes: servers, job processes, Ray.
# --------------------------------------------------------------------------------------------------
def new_server(state_dir: str, capacity: str, env: dict[str, str], extra: tuple[str, ...] = ()) -> TrainServer:
    """A train server as this benchmark runs it (not started): trainforge._testing's ``TrainServer`` with
    the benchmark's environment, the repository as its working directory, a session of its own and
    ``--stop-grace 5``. The benchmark starts it with ``start(require_url=True)``, stops it with
    ``stop(15, kill_after=True)`` and cleans up with ``cleanup(kill=True)``. (Imported here, not at the
    top: a ``--variant`` process of this script imports no more than it did.)"""
    from trainforge._testing.server import TrainServer

    return TrainServer(state_dir, capacity, extra, environ=env, cwd=REPO_ROOT, new_session=True)


class LocalRay:
    """``ray start --head`` with the dashboard (for Ray Jobs), 2 CPUs, every port free and on 127.0.0.1,
    its own temp dir; stopped by killing exactly its processes."""

    def __init__(self, env: dict[str, str], extra_pythonpath: str | None):
        self.ray = os.path.join(os.path.dirname(sys.executable), "ray")
        self.temp_dir = tempfile.mkdtemp(prefix="tfb-ray-", dir="/tmp")  # short: Ray's socket paths
        self.mark = f"ray-{uuid.uuid4().hex[:10]}"
        self.env = {**env, **RAY_ENV, MARK_ENV: self.mark}
        if extra_pythonpath:
            self.env["PYTHONPATH"] = os.pathsep.join(p for p in (self.env.get("PYTHONPATH"), extra_pythonpath) if p)
        self.dashboard = f"http://127.0.0.1:{free_port()}"
        self.start_s = float("nan")

    def start(self) -> None:
        ports = {k: free_port() for k in ("port", "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                                          "metrics-export-port", "runtime-env-agent-port", "object-manager-port",
                                          "node-manager-port", "ray-client-server-port")}  # fmt: skip
        cmd = [self.ray, "start", "--head", "--node-ip-address=127.0.0.1", "--include-dashboard=true",
               "--dashboard-host=127.0.0.1", f"--dashboard-port={self.dashboard.rsplit(':', 1)[1]}",
               f"--num-cpus={WORLD_SIZE}", f"--temp-dir={self.temp_dir}", "--disable-usage-stats",
               *(f"--{k}={v}" for k, v in ports.items())]  # fmt: skip
        t = time.time()
        out = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=180)
        self.start_s = time.time() - t
        if out.returncode != 0:
            tail = (out.stdout + out.stderr)[-1500:]
            hint = ""
            if "missing packages" in tail:
                hint = ("the dashboard (Ray Jobs) needs ray[default]'s packages: install them, or pass --ray-pythonpath "
                        "DIR holding them (pip install --target DIR aiohttp_cors colorful grpcio opencensus "
                        "opentelemetry-sdk opentelemetry-exporter-prometheus prometheus_client smart_open virtualenv "
                        "py-spy)\n")  # fmt: skip
            raise RuntimeError(f"ray start failed (exit {out.returncode}): {hint}{tail}")

    def processes(self) -> list[Any]:
        import psutil

        from trainforge._testing.procs import pid_alive

        found = []
        for p in psutil.process_iter():
            if p.pid == os.getpid():
                continue
            try:
                if p.environ().get(MARK_ENV) == self.mark or self.temp_dir in " ".join(p.cmdline()):
                    found.append(p)
                    continue
                # Ray's workers and agents rewrite their title (and with it their environment): by their open logs.
                if p.name().startswith(("ray::", "ray_", "raylet", "gcs_server")) or "ray" in p.name():
                    if any(f.path.startswith(self.temp_dir) for f in p.open_files()):
                        found.append(p)
            except (psutil.Error, OSError):
                continue
        return [p for p in found if pid_alive(p.pid)]

    def stop(self) -> list[str]:
        from trainforge._testing.procs import kill_procs

        killed: list[str] = []
        for _ in range(3):
            procs = self.processes()
            if not procs:
                break
            killed += kill_procs(procs)
            time.sleep(0.5)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        return killed

    # Ray Jobs over its REST API (what `ray job submit` and the SDK call).
    def job_status(self, submission_id: str) -> str | None:
        import httpx

        try:
            r = httpx.get(f"{self.dashboard}/api/jobs/{submission_id}", timeout=10)
            return r.json().get("status") if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None


def _rss_mb(pid: int | None) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).memory_info().rss / 2**20 if pid else None
    except psutil.Error:
        return None


def _events(http: Any, job_id: int) -> dict[str, float]:
    """The first ts of each event type of a job (its lifecycle, from the server's store)."""
    out: dict[str, float] = {}
    for e in http.get(f"/jobs/{job_id}/events").json():
        out.setdefault(e["type"], e["ts"])
    return out


def _run_start_t(state_dir: str, job_id: int) -> float:
    """When the job's run began (its runner started, loaded the trainer and called into the core): the
    ``run_start`` line of the job's events file."""
    try:
        with open(os.path.join(state_dir, "jobs", str(job_id), "events.jsonl")) as f:
            for line in f:
                event = json.loads(line)
                if event.get("type") == "run_start":
                    return float(event["t"])
    except (OSError, ValueError, KeyError):
        pass
    return float("nan")


def _wait_state(http: Any, job_ids: list[int], states: set[str], timeout: float) -> dict[int, dict]:
    from trainforge._testing.wait import wait_until

    jobs: dict[int, dict] = {}

    def reached() -> bool:
        jobs.update({j: http.get(f"/jobs/{j}").json() for j in job_ids})
        return all(j["state"] in states for j in jobs.values())

    try:
        wait_until(reached, timeout, f"jobs {job_ids} to be {states}", interval=0.05)
    except TimeoutError:
        raise TimeoutError(f"jobs not {states} after {timeout}s: {[(j, d['state']) for j, d in jobs.items()]}") from None
    return jobs


# --------------------------------------------------------------------------------------------------
# Part 1: submit -> rank-0 first step.
# --------------------------------------------------------------------------------------------------
def _run_driver(variant: str, work: str, args: argparse.Namespace, env: dict[str, str], extra: list[str]) -> dict:
    out = os.path.join(work, f"{variant}-{uuid.uuid4().hex[:6]}.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--variant", variant, "--out", out, "--workdir", work,
           "--steps", str(args.steps), *extra]  # fmt: skip
    t = time.time()
    proc = subprocess.Popen(cmd, env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        output, _ = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        output = "timed out"
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    if proc.returncode != 0 or not os.path.exists(out):
        return {"error": f"exit {proc.returncode}", "output_tail": output[-3000:]}
    with open(out) as f:
        data = json.load(f)
    data["subprocess_wall_s"] = time.time() - t
    data["first_step_s"] = data["first_step_t"] - data["t0"]
    return data


def _ray_job(ray: LocalRay, how: str, work: str, args: argparse.Namespace) -> dict:
    import httpx

    out = os.path.join(work, f"ray-{how}-{uuid.uuid4().hex[:6]}.json")
    entry = [sys.executable, os.path.abspath(__file__), "--variant", "fit", "--out", out, "--workdir", work,
             "--steps", str(args.steps)]  # fmt: skip
    rec: dict[str, Any] = {"how": how}
    t0 = time.time()
    if how == "cli":
        cli = subprocess.run([ray.ray, "job", "submit", "--address", ray.dashboard, "--no-wait", "--", *entry],
                             env=ray.env, capture_output=True, text=True, timeout=120)  # fmt: skip
        rec["t_cli_returned"] = time.time()
        m = re.search(r"(raysubmit_\w+)", cli.stdout + cli.stderr)
        if cli.returncode != 0 or not m:
            return {"error": f"ray job submit exit {cli.returncode}", "output_tail": (cli.stdout + cli.stderr)[-2000:]}
        sid = m.group(1)
    else:
        r = httpx.post(f"{ray.dashboard}/api/jobs/", json={"entrypoint": " ".join(entry)}, timeout=60)
        rec["t_post_returned"] = time.time()
        if r.status_code != 200:
            return {"error": f"POST /api/jobs/ -> {r.status_code}", "output_tail": r.text[-2000:]}
        sid = r.json()["submission_id"]
    rec["submission_id"] = sid
    deadline = time.time() + 120
    final = None
    while time.time() < deadline:
        final = ray.job_status(sid)
        if final in ("SUCCEEDED", "FAILED", "STOPPED"):
            break
        time.sleep(0.05)
    rec["ray_status"] = final
    if not os.path.exists(out):
        try:
            logs = httpx.get(f"{ray.dashboard}/api/jobs/{sid}/logs", timeout=10).json().get("logs", "")
        except (httpx.HTTPError, ValueError):
            logs = ""
        return {**rec, "error": f"the job wrote no result (Ray status {final})", "output_tail": logs[-3000:]}
    with open(out) as f:
        inner = json.load(f)
    rec.update(t0=t0, first_step_t=inner["first_step_t"], first_step_s=inner["first_step_t"] - t0,
               driver_proc_start_s=inner["t_proc"] - t0, driver_fit_call_s=inner["t0"] - t0,
               driver_first_step_s=inner["first_step_t"] - inner["t0"])  # fmt: skip
    return rec


def part_submit(args: argparse.Namespace, work: str, env: dict[str, str], servers: list[TrainServer],
                rays: list[LocalRay]) -> dict:  # fmt: skip
    state = os.path.join(work, "server-submit")
    srv = new_server(state, "CPU=2", env)
    cold_state = os.path.join(work, "server-submit-cold")
    cold_srv = new_server(cold_state, "CPU=2", env, extra=("--no-warm",))
    servers += [srv, cold_srv]
    srv.start(require_url=True)
    cold_srv.start(require_url=True)
    client_env = {**env, "TRAINFORGE_SERVER_DIR": state}
    cold_env = {**env, "TRAINFORGE_SERVER_DIR": cold_state}
    res: dict[str, Any] = {"runs": {"fit": [], "submit": [], "submit_cold": [], "ray_cli": [], "ray_rest": []}}
    from trainforge._testing.wait import wait_until

    with srv.http() as http:
        with contextlib.suppress(TimeoutError):  # not ready in time: the part goes on, and says so below
            wait_until(lambda: http.get("/health").json()["warm_pool"]["ready"], 60, "the warm pool", interval=0.05)
        res["warm_pool"] = http.get("/health").json()["warm_pool"]
    # Warm-up: each server's first job (its imports, the first requests) is off the clock.
    warm = _run_driver("submit", work, args, client_env, ["--url", srv.url or ""])
    res["cold_server_submit"] = warm
    res["no_warm_first_submit"] = _run_driver("submit", work, args, cold_env, ["--url", cold_srv.url or ""])
    ray = None
    if args.ray:
        ray = LocalRay(env, args.ray_pythonpath)
        rays.append(ray)
        try:
            ray.start()
            res["ray_start_s"] = ray.start_s
            res["ray_warmup"] = _ray_job(ray, "rest", work, args)  # off the clock, as the server's first job
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            res["ray_error"] = str(exc)
            print(f"  !! Ray Jobs not measured: {str(exc)[:400]}", file=sys.stderr, flush=True)
            ray.stop()
            ray = None
    else:
        res["ray_error"] = "not run (--no-ray)"
    with srv.http() as http:
        for rep in range(args.repeats):
            order = ["fit", "submit", "submit_cold"] + (["ray_cli", "ray_rest"] if ray is not None else [])
            for variant in order:
                if args.idle_wait > 0:
                    wait_for_idle(args.idle_wait)
                print(f"  [{rep + 1}/{args.repeats}] submit: {variant} ...", file=sys.stderr, flush=True)
                if variant == "fit":
                    run = _run_driver("fit", work, args, env, [])
                elif variant == "submit_cold":
                    run = _run_driver("submit", work, args, cold_env, ["--url", cold_srv.url or ""])
                elif variant == "submit":
                    run = _run_driver("submit", work, args, client_env, ["--url", srv.url or ""])
                    if "job_id" in run:
                        ev = _events(http, run["job_id"])
                        run["events"] = ev
                        run_start = _run_start_t(state, run["job_id"])
                        nan = float("nan")
                        run["phases"] = {
                            "client_to_submitted_s": ev.get("submitted", nan) - run["t0"],
                            "submitted_to_running_s": ev.get("running", nan) - ev.get("submitted", nan),
                            "running_to_run_start_s": run_start - ev.get("running", nan),
                            "run_start_to_first_step_s": run["first_step_t"] - run_start,
                        }  # fmt: skip
                else:
                    assert ray is not None
                    run = _ray_job(ray, variant.split("_")[1], work, args)
                if "error" in run:
                    print(f"  !! {variant} failed: {run['error']}\n{run.get('output_tail', '')[-1500:]}",
                          file=sys.stderr, flush=True)  # fmt: skip
                res["runs"][variant].append(run)
    res["warm_pool_rss_mb"] = _rss_mb(res["warm_pool"].get("pid"))
    srv.stop(15, kill_after=True)
    cold_srv.stop(15, kill_after=True)
    res["leftover_job_processes"] = srv.cleanup(kill=True) + cold_srv.cleanup(kill=True)
    med = {v: median(r.get("first_step_s") for r in rs) for v, rs in res["runs"].items()}
    res["median_first_step_s"] = med
    phases = [r["phases"] for r in res["runs"]["submit"] if "phases" in r]
    res["median_submit_phases_s"] = {k: median(p[k] for p in phases) for k in (phases[0] if phases else {})}
    res["median_ray_cli_driver_fit_call_s"] = median(r.get("driver_fit_call_s") for r in res["runs"]["ray_cli"])
    res["median_ray_rest_driver_fit_call_s"] = median(r.get("driver_fit_call_s") for r in res["runs"]["ray_rest"])
    if ray is not None:
        res["ray_processes_killed"] = len(ray.stop())
    return res


def part_sandbox(args: argparse.Namespace, work: str, env: dict[str, str], servers: list[TrainServer]) -> dict:
    """Part 1's submission by a member of a server with users (sandboxed) and by the admin of one
    without (not), warm and fresh, interleaved in one run: first step and the time between reports."""
    from trainforge._testing.wait import wait_until

    variants = {"plain_warm": (), "plain_fresh": ("--no-warm",), "sandboxed_warm": (), "sandboxed_fresh": ("--no-warm",)}
    started: dict[str, tuple[TrainServer, dict[str, str], list[str]]] = {}
    for name, extra in variants.items():
        state = os.path.join(work, f"server-{name}")
        srv = new_server(state, "CPU=2", env, extra=extra)
        servers.append(srv)
        srv.start(require_url=True)
        driver_env = {**env, "TRAINFORGE_SERVER_DIR": state}
        flags = ["--url", srv.url or ""]
        if name.startswith("sandboxed"):
            out = subprocess.run([sys.executable, "-m", "trainforge", "server", "users", "add", "bench", "--role",
                                  "member", "--state-dir", state], env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
            token = re.search(r"(tfu\.\S+)", out.stdout)
            if token is None:
                raise RuntimeError(f"users add failed: {out.stdout}{out.stderr}")
            driver_env = {**env, "TRAINFORGE_ADDRESS": srv.url or "", "TRAINFORGE_TOKEN": token.group(1)}
            flags.append("--sandboxed")
        if not extra:
            with srv.http() as http, contextlib.suppress(TimeoutError):
                wait_until(lambda http=http: http.get("/health").json()["warm_pool"]["ready"], 60, "the warm pool",
                           interval=0.05)  # fmt: skip
        started[name] = (srv, driver_env, flags)
        warmup = _run_driver("submit", work, args, driver_env, flags)  # each server's first job: off the clock
        if "error" in warmup:
            raise RuntimeError(f"{name}: {warmup['error']}\n{warmup.get('output_tail', '')[-1500:]}")
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    for rep in range(args.repeats):
        for name, (_srv, driver_env, flags) in started.items():
            if args.idle_wait > 0:
                wait_for_idle(args.idle_wait)
            print(f"  [{rep + 1}/{args.repeats}] sandbox: {name} ...", file=sys.stderr, flush=True)
            run = _run_driver("submit", work, args, driver_env, flags)
            if "error" in run:
                print(f"  !! {name} failed: {run['error']}\n{run.get('output_tail', '')[-1500:]}", file=sys.stderr,
                      flush=True)  # fmt: skip
            runs[name].append(run)
    for srv, _, _ in started.values():
        srv.stop(15, kill_after=True)
    first = {name: median(r.get("first_step_s") for r in rs) for name, rs in runs.items()}
    step = {name: median(r.get("step_ms") for r in rs) for name, rs in runs.items()}
    return {"runs": runs, "median_first_step_s": first, "median_step_ms": step,
            "sandbox_cost_ms": {kind: None if first[f"sandboxed_{kind}"] is None or first[f"plain_{kind}"] is None
                                else (first[f"sandboxed_{kind}"] - first[f"plain_{kind}"]) * 1e3
                                for kind in ("warm", "fresh")}}  # fmt: skip


# --------------------------------------------------------------------------------------------------
# Part 2: freed capacity -> next queued job's runner.
# --------------------------------------------------------------------------------------------------
class RunnerExits:
    """Records when each runner process of a server's jobs exits: a scan for them (by their
    environment) every 5 ms, and a pidfd per runner found (the server is their parent, not us)."""

    def __init__(self, server_id: str):
        self.server_id = server_id
        self.exits: dict[int, float] = {}  # job id -> exit time
        self._seen: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._scan, daemon=True)

    def __enter__(self) -> RunnerExits:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _scan(self) -> None:
        import select

        import psutil

        while not self._stop.wait(0.005):
            for p in psutil.process_iter():
                if p.pid in self._seen:
                    continue
                try:
                    env = p.environ()
                    if env.get(SERVER_ID_ENV) != self.server_id or "trainforge.server.jobs.runner" not in p.cmdline():
                        continue
                    job_id = int(env["TRAINFORGE_JOB_ID"])
                    fd = os.pidfd_open(p.pid)
                except (psutil.Error, OSError, KeyError, ValueError, AttributeError):
                    continue
                self._seen.add(p.pid)

                def wait(fd: int = fd, job_id: int = job_id) -> None:
                    select.select([fd], [], [])
                    self.exits[job_id] = time.time()
                    os.close(fd)

                threading.Thread(target=wait, daemon=True).start()


def part_handoff(args: argparse.Namespace, work: str, env: dict[str, str], servers: list[TrainServer]) -> dict:
    state = os.path.join(work, "server-handoff")
    script = os.path.join(work, "sleep_job.py")
    srv = new_server(state, "CPU=2", env)
    servers.append(srv)
    srv.start(require_url=True)
    n = args.handoffs + 1
    with srv.http() as http, RunnerExits(srv.server_id) as runners:
        ids = []
        for i in range(n):
            body = {"kind": "script", "path": script, "args": ["1.5" if i == 0 else "0.5"], "workers": 2,
                    "per_worker": {"CPU": 1}, "name": f"handoff-{i}"}  # fmt: skip
            r = http.post("/jobs", json=body)
            r.raise_for_status()
            ids.append(r.json()["id"])
        jobs = _wait_state(http, ids, {"SUCCEEDED", "FAILED", "STOPPED"}, timeout=60 + 5 * n)
        ev = {j: _events(http, j) for j in ids}
    gaps = []
    nan = float("nan")
    for a, b in zip(ids, ids[1:], strict=False):
        try:
            exit_mtime = os.stat(os.path.join(state, "jobs", str(a), "exit.json")).st_mtime
        except OSError:
            exit_mtime = nan
        exited = runners.exits.get(a, nan)
        gaps.append({
            "from_job": a, "to_job": b, "from_state": jobs[a]["state"],
            "ended_to_starting_ms": (ev[b]["starting"] - ev[a]["ended"]) * 1e3,
            "ended_to_running_ms": (ev[b]["running"] - ev[a]["ended"]) * 1e3,
            "exit_file_to_runner_exit_ms": (exited - exit_mtime) * 1e3,
            "runner_exit_to_ended_ms": (ev[a]["ended"] - exited) * 1e3,
            "runner_exit_to_running_ms": (ev[b]["running"] - exited) * 1e3,
            "exit_file_to_running_ms": (ev[b]["running"] - exit_mtime) * 1e3,
        })  # fmt: skip
    srv.stop(15, kill_after=True)
    left = srv.cleanup(kill=True)
    keys = [k for k in gaps[0] if k.endswith("_ms")] if gaps else []
    return {"gaps": gaps, "median": {k: median(g[k] for g in gaps) for k in keys},
            "max": {k: max(g[k] for g in gaps) for k in keys}, "leftover_job_processes": left}  # fmt: skip


# --------------------------------------------------------------------------------------------------
# Part 3: a burst of submissions, then of stops (+ idle memory, part 6).
# --------------------------------------------------------------------------------------------------
def _burst(srv: TrainServer, n: int, threads: int, make: Any) -> tuple[float, list[float], list[Any], list[str]]:
    """``make(i, http)`` for i in 0..n-1 over ``threads`` keep-alive clients: (wall s, latencies, results, errors)."""
    lat: list[float] = [0.0] * n
    results: list[Any] = [None] * n
    errors: list[str] = []
    nxt = iter(range(n))
    lock = threading.Lock()

    def worker() -> None:
        with srv.http() as http:
            while True:
                with lock:
                    i = next(nxt, None)
                if i is None:
                    return
                t = time.perf_counter()
                try:
                    results[i] = make(i, http)
                except Exception as exc:
                    errors.append(f"{i}: {exc!r}"[:300])
                lat[i] = time.perf_counter() - t

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return time.perf_counter() - t0, lat, results, errors


def part_burst(args: argparse.Namespace, work: str, env: dict[str, str], servers: list[TrainServer]) -> dict:
    state = os.path.join(work, "server-burst")
    script = os.path.join(work, "sleep_job.py")
    srv = new_server(state, "CPU=2", env)
    servers.append(srv)
    srv.start(require_url=True)
    res: dict[str, Any] = {"start_to_serving_s": srv.t_serving - srv.t_launch}
    with srv.http() as http:
        http.get("/health").raise_for_status()
        time.sleep(1.0)  # let it settle (lazy imports, first request done)
        res["idle_rss_mb"] = _rss_mb(srv.proc.pid if srv.proc else None)
        lat = []
        for _ in range(20):
            t = time.perf_counter()
            http.get("/health").raise_for_status()
            lat.append(time.perf_counter() - t)
        res["health_latency_ms_p50"] = statistics.median(lat) * 1e3
        import psutil

        server_proc = psutil.Process(srv.proc.pid)  # type: ignore[union-attr]

        def cpu_s() -> float:
            t = server_proc.cpu_times()
            return t.user + t.system

        def submit(i: int, h: Any) -> int:
            r = h.post("/jobs", json={"kind": "script", "path": script, "hold": True, "name": f"burst-{i}",
                                      "per_worker": {"CPU": 1}})  # fmt: skip
            if r.status_code != 201:
                raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
            return int(r.json()["id"])

        n = args.submissions
        c0 = cpu_s()
        wall, lat, ids, errors = _burst(srv, n, args.threads, submit)
        res["submit"] = _rate(n, wall, lat, errors)
        res["submit"]["server_cpu_ms_each"] = (cpu_s() - c0) / n * 1e3
        res["rss_after_submissions_mb"] = _rss_mb(srv.proc.pid if srv.proc else None)
        res["held_after_submissions"] = http.get("/health").json()["jobs"].get("HELD")
        good = [j for j in ids if j is not None]

        def stop(i: int, h: Any) -> str:
            r = h.post(f"/jobs/{good[i]}/stop", json={})
            if r.status_code != 200:
                raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
            return str(r.json()["state"])

        c0 = cpu_s()
        wall, lat, states, errors = _burst(srv, len(good), args.threads, stop)
        res["stop"] = _rate(len(good), wall, lat, errors)
        res["stop"]["server_cpu_ms_each"] = (cpu_s() - c0) / max(1, len(good)) * 1e3
        res["stop"]["states"] = {s: states.count(s) for s in set(states) if s}
        res["jobs_after_stops"] = http.get("/health").json()["jobs"]
    srv.stop(15, kill_after=True)
    res["leftover_job_processes"] = srv.cleanup(kill=True)
    return res


def _rate(n: int, wall: float, lat: list[float], errors: list[str]) -> dict:
    ok = n - len(errors)
    tenth = max(1, n // 10)
    return {
        "n": n, "ok": ok, "wall_s": wall, "per_s": ok / wall if wall > 0 else None,
        "latency_ms_p50": statistics.median(lat) * 1e3 if lat else None,
        "latency_ms_p99": sorted(lat)[int(0.99 * (len(lat) - 1))] * 1e3 if lat else None,
        "latency_ms_first_tenth_p50": statistics.median(lat[:tenth]) * 1e3 if lat else None,
        "latency_ms_last_tenth_p50": statistics.median(lat[-tenth:]) * 1e3 if lat else None,
        "errors": errors[:20], "n_errors": len(errors),
    }  # fmt: skip


# --------------------------------------------------------------------------------------------------
# Part 4: the scheduler with 10,000 queued jobs (+ memory with them, part 6).
# --------------------------------------------------------------------------------------------------
def make_queue(n: int, seed: int = 0) -> tuple[list[Any], list[dict[str, float]], dict[str, float]]:
    """A mixed queue: CPU jobs (some small enough to fit), GPU jobs, 10% elastic, 10% held, a few
    priorities, on a 64 CPU / 8 GPU / 256 GB capacity mostly granted (8 CPUs, 1 GPU, 96 GB free)."""
    from trainforge.server.scheduling.rule import JobRequest

    rng = random.Random(seed)
    capacity = {"CPU": 64.0, "GPU": 8.0, "memory": 256e9}
    running = [{"CPU": 16.0, "memory": 64e9}, {"CPU": 24.0, "GPU": 4.0, "memory": 64e9},
               {"CPU": 16.0, "GPU": 3.0, "memory": 32e9}]  # fmt: skip
    queue = []
    for i in range(n):
        r = rng.random()
        if r < 0.05:  # small CPU jobs: some of them fit
            per = {"CPU": 1.0}
            workers = 1
        elif r < 0.70:
            per = {"CPU": float(rng.choice((1, 2, 4))), "memory": rng.choice((2e9, 4e9, 8e9))}
            workers = rng.choice((2, 4, 8))
        else:
            per = {"CPU": 2.0, "GPU": 1.0, "memory": 16e9}
            workers = rng.choice((1, 2, 4))
        elastic = rng.random() < 0.1
        queue.append(JobRequest(
            job_id=i + 1, seq=i + 1, per_worker=per, min_workers=workers,
            max_workers=workers * 2 if elastic else None, driver={"CPU": 1.0} if rng.random() < 0.3 else {},
            priority=rng.choice((0, 0, 0, 1, 5)), held=rng.random() < 0.1,
        ))  # fmt: skip
    return queue, running, capacity


def make_cpu_queue(n: int) -> tuple[list[Any], list[dict[str, float]], dict[str, float]]:
    """The server's queue of part 4: CPU-only jobs, half held, behind a job holding every CPU."""
    from trainforge.server.scheduling.rule import JobRequest

    queue = [JobRequest(job_id=i, seq=i, per_worker={"CPU": 1.0}, min_workers=1 + i % 2, held=i % 2 == 0)
             for i in range(1, n + 1)]  # fmt: skip
    return queue, [{"CPU": 2.0}], {"CPU": 2.0}


def _time_decide(queue: list[Any], running: list[dict[str, float]], capacity: dict[str, float], calls: int) -> dict:
    """decide() as the server calls it: on the WaitingQueue it keeps (in start order, grouped by the
    kinds its jobs ask for, updated as jobs come and go; built here off the clock). Also: on a plain
    list (sorted and grouped at each call), a page of reasons at the queue's end, and every reason."""
    from trainforge.server.scheduling.rule import WaitingQueue, decide

    waiting = WaitingQueue(queue)
    decide(waiting, running, capacity)  # warm
    times, full, listed, last_page = [], [], [], []
    for _ in range(calls):
        t = time.perf_counter()
        d = decide(waiting, running, capacity)
        times.append(time.perf_counter() - t)
        t = time.perf_counter()
        d.page(d.waiting - 50, 50)  # the last 50 waiting jobs' reasons (what a GET /queue page works out)
        last_page.append(time.perf_counter() - t)
        t = time.perf_counter()
        pending = decide(waiting, running, capacity).pending  # every waiting job's reason
        full.append(time.perf_counter() - t)
        t = time.perf_counter()
        decide(queue, running, capacity)
        listed.append(time.perf_counter() - t)
    return {"queued": len(queue), "calls": calls, "median_ms": statistics.median(times) * 1e3,
            "min_ms": min(times) * 1e3, "max_ms": max(times) * 1e3,
            "with_all_reasons_median_ms": statistics.median(full) * 1e3,
            "last_page_of_50_reasons_median_ms": statistics.median(last_page) * 1e3,
            "from_a_list_median_ms": statistics.median(listed) * 1e3, "starts": len(d.starts),
            "pending": len(pending)}  # fmt: skip


def part_decide(args: argparse.Namespace, work: str, env: dict[str, str], servers: list[TrainServer]) -> dict:
    n = args.queued
    res: dict[str, Any] = {
        "direct": _time_decide(*make_queue(n), args.decide_calls),
        "direct_cpu_only": _time_decide(*make_cpu_queue(n), args.decide_calls),
    }
    # In a server: a running job holding all 2 CPUs, then n jobs (half held) written to its store while it
    # is down, so that the restarted server loads them all (and reattaches the running one).
    state = os.path.join(work, "server-decide")
    script = os.path.join(work, "sleep_job.py")
    srv = new_server(state, "CPU=2", env)
    servers.append(srv)
    srv.start(require_url=True)
    with srv.http() as http:
        r = http.post("/jobs", json={"kind": "script", "path": script, "args": ["300"], "workers": 2,
                                     "per_worker": {"CPU": 1}, "name": "blocker"})  # fmt: skip
        r.raise_for_status()
        blocker = r.json()["id"]
        _wait_state(http, [blocker], {"RUNNING"}, 30)
    srv.stop(15, kill_after=True)
    from trainforge.server.jobs.files import JobFiles
    from trainforge.server.store.database import JobStore

    t = time.perf_counter()
    store = JobStore(os.path.join(state, "state.db"))
    files = JobFiles(os.path.join(state, "jobs"))
    for i in range(n):
        spec = {"kind": "script", "path": script, "args": [], "min_workers": 1 + i % 2, "max_workers": None,
                "per_worker": {"CPU": 1.0}, "driver": {}, "env": {}, "sys_path": [], "cwd": None, "target": None}  # fmt: skip
        with files.staged(spec, None) as staging:  # the job's spec.json, as a submission puts it in place
            store.add_job(name=f"queued-{i}", kind="script", spec=spec, held=i % 2 == 0,
                          materialize=lambda job_id, staging=staging: files.place(staging, job_id))  # fmt: skip
    store.close()
    res["store_add_jobs_per_s"] = n / (time.perf_counter() - t)
    srv.start(require_url=True)
    res["restart_with_queue_to_serving_s"] = srv.t_serving - srv.t_launch
    res["restart_with_queue_recovered_line"] = next((ln.strip() for ln in srv.last_lines if "recovered" in ln), None)
    with srv.http() as http:
        t = time.perf_counter()
        health = http.get("/health").json()
        res["health_first_ms"] = (time.perf_counter() - t) * 1e3
        res["server_jobs"] = health["jobs"]
        waiting = health["jobs"].get("QUEUED", 0) + health["jobs"].get("HELD", 0)
        if waiting < n:  # e.g. jobs failed at recovery for want of their files: nothing below would mean anything
            raise RuntimeError(f"the restarted server has {waiting} waiting jobs, not {n}: "
                               f"{res['restart_with_queue_recovered_line']}")  # fmt: skip
        res["server_decision_ms_at_recover"] = http.get("/resources").json()["decision_ms"]
        lat, dms = [], []
        for i in range(args.decide_submits):
            t = time.perf_counter()
            r = http.post("/jobs", json={"kind": "script", "path": script, "hold": i % 2 == 0, "name": f"probe-{i}",
                                         "per_worker": {"CPU": 1}})  # fmt: skip
            lat.append(time.perf_counter() - t)
            r.raise_for_status()
            dms.append(http.get("/resources").json()["decision_ms"])
        res["server_decision_ms"] = statistics.median(dms)
        res["server_decision_ms_all"] = dms
        res["submit_latency_ms_with_queue"] = statistics.median(lat) * 1e3
        res["submit_latency_ms_with_queue_all"] = [x * 1e3 for x in lat]
        # GET /queue, a page at a time, as `trainforge queue` reads it (1000 a page), and the first page
        # the API gives by default (50, as the dashboard's other lists).
        pages, entries, offset = [], 0, 0
        t0 = time.perf_counter()
        while offset is not None:
            t = time.perf_counter()
            page = http.get("/queue", params={"offset": offset, "limit": 1000}).json()
            pages.append((time.perf_counter() - t) * 1e3)
            entries += len(page["entries"])
            offset = page["next_offset"]
        res["get_queue_all_pages_ms"] = (time.perf_counter() - t0) * 1e3
        res["get_queue_page_ms"] = pages
        res["get_queue_page_max_ms"] = max(pages)
        res["get_queue_entries"] = entries
        t = time.perf_counter()
        http.get("/queue").raise_for_status()
        res["get_queue_first_page_ms"] = (time.perf_counter() - t) * 1e3
        time.sleep(0.5)
        res["rss_with_queue_mb"] = _rss_mb(srv.proc.pid if srv.proc else None)
    # Killed, not stopped: a stop would hand the CPUs to a queued job (whose directory was never made).
    srv.kill9()
    res["blocker_processes_killed"] = len(srv.cleanup(kill=True))
    return res


# --------------------------------------------------------------------------------------------------
# Part 5: kill -9 of the server with 3 running jobs.
# --------------------------------------------------------------------------------------------------
def part_restart(args: argparse.Namespace, work: str, env: dict[str, str], servers: list[TrainServer]) -> dict:
    state = os.path.join(work, "server-restart")
    srv = new_server(state, "CPU=6", env)
    servers.append(srv)
    srv.start(require_url=True)
    res: dict[str, Any] = {}
    os.environ["TRAINFORGE_SERVER_DIR"] = state  # trainer.submit() reads the token there
    try:
        ids = []
        for i in range(3):
            trainer = make_trainer(os.path.join(work, "runs"), steps=int(args.restart_job_s / 0.1), sleep_s=0.1,
                                   name=f"restart-{i}-{uuid.uuid4().hex[:6]}")  # fmt: skip
            with contextlib.redirect_stdout(io.StringIO()):
                ids.append(trainer.submit(address=srv.url).id)
    finally:
        os.environ.pop("TRAINFORGE_SERVER_DIR", None)
    from trainforge._testing.wait import wait_until

    with srv.http() as http:
        jobs: dict[int, dict] = {}

        def reporting() -> bool:
            jobs.update({j: http.get(f"/jobs/{j}").json() for j in ids})
            return all(d["state"] == "RUNNING" and d["reports"] > 0 for d in jobs.values())

        try:
            wait_until(reporting, 90, "the jobs to run and report", interval=0.1)
        except TimeoutError:
            raise TimeoutError(f"jobs not all running and reporting: {[(j, d['state']) for j, d in jobs.items()]}") from None
    before = {j: {"pid": d["pid"], "reports": d["reports"]} for j, d in jobs.items()}
    res["before"] = before
    srv.kill9()
    t_kill = time.time()
    srv.start(require_url=True)  # the clock: from launching the command
    res["kill_to_restart_cmd_s"] = srv.t_launch - t_kill
    res["restart_to_serving_s"] = srv.t_serving - srv.t_launch
    res["recovered_line"] = next((ln.strip() for ln in srv.last_lines if "recovered" in ln), None)
    import httpx

    t_health = None
    with srv.http(timeout=5) as http:
        while time.time() - srv.t_launch < 30:
            try:
                if http.get("/health").status_code == 200:
                    t_health = time.time()
                    break
            except httpx.HTTPError:
                time.sleep(0.01)
        res["restart_to_health_s"] = None if t_health is None else t_health - srv.t_launch
        after = {j: http.get(f"/jobs/{j}").json() for j in ids}
        res["after"] = {j: {"state": d["state"], "pid": d["pid"], "reports": d["reports"]} for j, d in after.items()}
        res["reattached"] = sum(
            1 for j, d in after.items() if d["state"] == "RUNNING" and d["pid"] == before[j]["pid"]
        )
        # Still followed: their reports keep arriving in the restarted server.
        time.sleep(1.0)
        later = {j: http.get(f"/jobs/{j}").json()["reports"] for j in ids}
        res["reports_grew_after_restart"] = sum(1 for j in ids if later[j] > after[j]["reports"])
        stops: dict[int, Any] = {}

        def stop(j: int) -> None:
            with srv.http() as h:
                r = h.post(f"/jobs/{j}/stop", json={})
                stops[j] = r.json().get("state") if r.status_code == 200 else f"HTTP {r.status_code}"

        t = time.time()
        threads = [threading.Thread(target=stop, args=(j,)) for j in ids]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        res["stop_all_s"] = time.time() - t
        res["stop_states"] = stops
    left = [f"{p.pid} {' '.join(p.cmdline())[:120]}" for p in srv.job_processes()]
    res["job_processes_after_stop"] = left
    srv.stop(15, kill_after=True)
    res["leftover_job_processes"] = srv.cleanup(kill=True)
    return res


# --------------------------------------------------------------------------------------------------
# Orchestrator.
# --------------------------------------------------------------------------------------------------
# --------------------------------------------------------------------------------------------------
# Part 7: under load (the load client and the sampling are in _server_load.py).
# --------------------------------------------------------------------------------------------------
def part_load(args: argparse.Namespace, work: str, env: dict[str, str], servers: list[TrainServer]) -> dict:
    state = os.path.join(work, "server-load")
    script = os.path.join(work, "sleep_job.py")
    seed_jobs(state, args.load_jobs, script)
    srv = new_server(state, "CPU=2", env)
    servers.append(srv)
    srv.start(require_url=True)
    assert srv.proc is not None and srv.url is not None
    res: dict[str, Any] = {"jobs": args.load_jobs, "levels": []}
    with srv.http() as http:
        http.get("/jobs").raise_for_status()  # the first request (lazy imports) off the clock

        def submit(i: int) -> None:
            http.post("/jobs", json={"kind": "script", "path": script, "hold": True, "name": f"load-probe-{i}",
                                     "per_worker": {"CPU": 1}}).raise_for_status()  # fmt: skip

        for clients in (int(x) for x in args.load_clients.split(",")):
            print(f"  load: {clients} clients, {args.load_followers} followers ...", file=sys.stderr, flush=True)
            res["levels"].append(run_level(srv.url, state, srv.proc.pid, clients, args.load_followers,
                                           args.load_duration, submit))  # fmt: skip
    srv.stop(15, kill_after=True)
    res["leftover_job_processes"] = srv.cleanup(kill=True)
    return res


def _f(v: float | None, spec: str, suffix: str = "") -> str:
    return "-" if v is None or v != v else format(v, spec) + suffix


def table(data: dict) -> tuple[list[str], list[list[str]]]:
    header = ["metric", "trainforge server", "anchor", "ratio / goal", "met?"]
    rows: list[list[str]] = []
    sub = data.get("submit")
    if sub:
        med = sub["median_first_step_s"]
        srv, fit, cold = med.get("submit"), med.get("fit"), med.get("submit_cold")
        ok = None if cold is None or fit is None else cold <= fit + GOAL_SUBMIT_EXTRA_S
        rows.append(["submit -> rank-0 first step, fresh processes (--no-warm) (s)", _f(cold, ".3f"),
                     f"local fit() {_f(fit, '.3f')}",
                     f"+{_f(None if ok is None else cold - fit, '.3f')} s (goal <= +{GOAL_SUBMIT_EXTRA_S} s)", status(ok)])  # fmt: skip
        ok = None if srv is None or fit is None else srv <= GOAL_WARM_FRACTION * fit
        rows.append(["submit -> rank-0 first step, warm pool (s)", _f(srv, ".3f"), f"local fit() {_f(fit, '.3f')}",
                     f"{_f(None if ok is None else srv / fit, '.2f')}x (goal <= {GOAL_WARM_FRACTION}x)", status(ok)])  # fmt: skip
        for key, label in (("ray_cli", "`ray job submit`"), ("ray_rest", "Ray Jobs POST /api/jobs/")):
            ray = med.get(key)
            if ray is None:
                note = sub.get("ray_error") or "failed"
                rows.append([f"  vs Ray Jobs ({label})", _f(srv, ".3f"), f"not measured ({str(note)[:40]})", "-", "-"])
                continue
            rows.append([f"  vs Ray Jobs ({label})", _f(srv, ".3f"), f"{ray:.3f}",
                         f"{_f(None if srv is None else srv / ray, '.2f')}x", "-"])  # fmt: skip
    sb = data.get("sandbox")
    if sb:
        first, step, cost = sb["median_first_step_s"], sb["median_step_ms"], sb["sandbox_cost_ms"]
        for kind in ("fresh", "warm"):
            extra = cost.get(kind)
            ok = None if extra is None else extra <= GOAL_SANDBOX_FRESH_MS if kind == "fresh" else None
            rows.append([f"submit -> first step, sandboxed member's job, {kind} (s)", _f(first.get(f'sandboxed_{kind}'), '.3f'),
                         f"admin's, unsandboxed {_f(first.get(f'plain_{kind}'), '.3f')}",
                         f"{'+' if (extra or 0) >= 0 else ''}{_f(extra, '.0f')} ms"
                         + (f" (goal <= +{GOAL_SANDBOX_FRESH_MS:.0f} ms)" if kind == "fresh" else ""), status(ok)])  # fmt: skip
        for kind in ("warm", "fresh"):
            rows.append([f"  time between two reports, sandboxed, {kind} (ms)", _f(step.get(f'sandboxed_{kind}'), '.2f'),
                         f"unsandboxed {_f(step.get(f'plain_{kind}'), '.2f')}", "(informational)", "-"])  # fmt: skip
    h = data.get("handoff")
    if h:
        v = h["median"]["ended_to_running_ms"]
        rows.append(["freed capacity -> next job's runner (ms)", _f(v, ".1f"), "-", f"goal <= {GOAL_HANDOFF_MS:.0f} ms",
                     status(None if v is None else v <= GOAL_HANDOFF_MS)])  # fmt: skip
        v2 = h["median"]["runner_exit_to_running_ms"]
        rows.append(["  from the previous runner's exit (ms)", _f(v2, ".1f"), "-", f"goal <= {GOAL_HANDOFF_MS:.0f} ms",
                     status(None if v2 is None else v2 <= GOAL_HANDOFF_MS)])  # fmt: skip
    b = data.get("burst")
    if b:
        v = b["submit"]["per_s"]
        ok = None if v is None else v >= GOAL_SUBMIT_RATE and b["submit"]["n_errors"] == 0
        rows.append([f"submissions persisted /s ({b['submit']['n']}, {data['settings']['threads']} clients)",
                     _f(v, ".0f"), "-", f"goal >= {GOAL_SUBMIT_RATE:.0f}/s", status(ok)])  # fmt: skip
        rows.append(["  stops of held jobs /s", _f(b["stop"]["per_s"], ".0f"), "-", "(informational)",
                     "-" if b["stop"]["n_errors"] == 0 else f"{b['stop']['n_errors']} errors"])  # fmt: skip
    d = data.get("decide")
    if d:
        v = d["direct"]["median_ms"]
        rows.append([f"decide(), {d['direct']['queued']:,} queued, mixed CPU/GPU (ms)", _f(v, ".2f"), "-",
                     f"goal <= {GOAL_DECIDE_MS:.0f} ms", status(v <= GOAL_DECIDE_MS)])  # fmt: skip
        v = d["direct_cpu_only"]["median_ms"]
        rows.append([f"  decide(), {d['direct']['queued']:,} queued, CPU only, half held", _f(v, ".2f"), "-",
                     f"goal <= {GOAL_DECIDE_MS:.0f} ms", status(v <= GOAL_DECIDE_MS)])  # fmt: skip
        v = d.get("server_decision_ms")
        rows.append([f"  server decision_ms, {d['direct']['queued']:,} queued", _f(v, ".2f"), "-",
                     f"goal <= {GOAL_DECIDE_MS:.0f} ms", status(None if v is None else v <= GOAL_DECIDE_MS)])  # fmt: skip
        v = d.get("submit_latency_ms_with_queue")
        rows.append([f"  a submission, {d['direct']['queued']:,} queued (ms)", _f(v, ".1f"), "-",
                     f"goal <= {GOAL_SUBMIT_WITH_QUEUE_MS:.0f} ms",
                     status(None if v is None else v <= GOAL_SUBMIT_WITH_QUEUE_MS)])  # fmt: skip
        v = d.get("get_queue_page_max_ms")
        rows.append([f"  GET /queue, {_f(d.get('get_queue_entries'), ',')} waiting, slowest page of 1000 (ms)",
                     _f(v, ".0f"), "-", f"goal <= {GOAL_QUEUE_PAGE_MS:.0f} ms",
                     status(None if v is None else v <= GOAL_QUEUE_PAGE_MS)])  # fmt: skip
    r = data.get("restart")
    if r:
        v = r.get("restart_to_serving_s")
        rows.append(["kill -9 -> serving again (s)", _f(v, ".2f"), "-", f"goal <= {GOAL_RESTART_S:.0f} s",
                     status(None if v is None else v <= GOAL_RESTART_S and r["reattached"] == 3)])  # fmt: skip
        v = r.get("restart_to_health_s")
        rows.append([f"  -> /health answers, {r['reattached']}/3 reattached (same pid)", _f(v, ".2f"), "-",
                     f"goal <= {GOAL_RESTART_S:.0f} s", status(None if v is None else v <= GOAL_RESTART_S and r["reattached"] == 3)])  # fmt: skip
        n_left = len(r["job_processes_after_stop"])
        rows.append(["  stop the 3 jobs: processes left", str(n_left), "-", f"stop took {r['stop_all_s']:.1f} s",
                     status(n_left == 0)])  # fmt: skip
    if d and "restart_with_queue_to_serving_s" in d:
        rows.append([f"  restart onto {d['direct']['queued']:,} queued jobs -> serving (s)",
                     _f(d["restart_with_queue_to_serving_s"], ".2f"), "-", "(informational)", "-"])  # fmt: skip
    if b:
        v = b["idle_rss_mb"]
        rows.append(["idle server RSS (MB)", _f(v, ".0f"), "-", f"goal <= {GOAL_IDLE_RSS_MB:.0f} MB",
                     status(v <= GOAL_IDLE_RSS_MB)])  # fmt: skip
    if sub and sub.get("warm_pool_rss_mb") is not None:
        rows.append(["  warm pool (zygote) RSS, after the runs (MB)", _f(sub["warm_pool_rss_mb"], ".0f"), "-",
                     "(informational; shared with its children)", "-"])  # fmt: skip
    if d and "rss_with_queue_mb" in d:
        rows.append([f"  RSS with {d['direct']['queued']:,} queued jobs (MB)", _f(d["rss_with_queue_mb"], ".0f"), "-",
                     "(informational)", "-"])  # fmt: skip
    if data.get("load"):
        rows += load_rows(data["load"], status)
    return header, rows


def diagnostics(data: dict) -> list[str]:
    out = []
    sub = data.get("submit")
    if sub:
        ph = sub.get("median_submit_phases_s") or {}
        if ph:
            out.append("server submit, medians: trainer.submit() called -> 'submitted' event "
                       f"{_f(ph.get('client_to_submitted_s'), '.3f')} s; 'submitted' -> 'running' (runner process "
                       f"started) {_f(ph.get('submitted_to_running_s'), '.3f')} s; 'running' -> run_start (runner boot: "
                       f"interpreter, imports, unpickling) {_f(ph.get('running_to_run_start_s'), '.3f')} s; run_start -> "
                       f"rank-0 first step {_f(ph.get('run_start_to_first_step_s'), '.3f')} s")  # fmt: skip
        cold = sub.get("cold_server_submit") or {}
        if "first_step_s" in cold:
            out.append(f"first job of a freshly started server (off the clock): {cold['first_step_s']:.3f} s to first step")
        for key in ("ray_cli", "ray_rest"):
            v = sub.get(f"median_{key}_driver_fit_call_s")
            if v is not None:
                out.append(f"Ray Jobs ({key}): submit -> the job's driver calls fit() {v:.3f} s (median)")
        if "ray_start_s" in sub:
            out.append(f"`ray start --head` (with dashboard) took {sub['ray_start_s']:.1f} s (off the clock)")
    h = data.get("handoff")
    if h:
        m = h["median"]
        out.append(f"handoff, medians over {len(h['gaps'])}: runner wrote exit.json -> runner process gone "
                   f"{_f(m.get('exit_file_to_runner_exit_ms'), '.1f')} ms -> 'ended' event (grant released) "
                   f"{_f(m.get('runner_exit_to_ended_ms'), '.1f')} ms -> next job 'starting' {_f(m.get('ended_to_starting_ms'), '.1f')} ms, "
                   f"'running' {_f(m.get('ended_to_running_ms'), '.1f')} ms (max {_f(h['max'].get('ended_to_running_ms'), '.1f')} ms)")  # fmt: skip
    b = data.get("burst")
    if b:
        s = b["submit"]
        out.append(f"submit latency p50 {_f(s['latency_ms_p50'], '.1f')} ms, p99 {_f(s['latency_ms_p99'], '.1f')} ms; "
                   f"first tenth p50 {_f(s['latency_ms_first_tenth_p50'], '.1f')} ms, last tenth "
                   f"{_f(s['latency_ms_last_tenth_p50'], '.1f')} ms; errors {s['n_errors']}; stops: {b['stop']['states']}, "
                   f"errors {b['stop']['n_errors']}")  # fmt: skip
        out.append(f"server CPU per submission {_f(s.get('server_cpu_ms_each'), '.2f')} ms, per stop "
                   f"{_f(b['stop'].get('server_cpu_ms_each'), '.2f')} ms (what the rate would be with a free core: "
                   f"{_f(1e3 / s['server_cpu_ms_each'] if s.get('server_cpu_ms_each') else None, '.0f')}/s); "
                   f"sequential GET /health p50 {_f(b.get('health_latency_ms_p50'), '.1f')} ms"
                   + (" (over 30 ms for a request of a few ms of CPU: the mark of a ~40 ms TCP delayed-ACK stall, "
                      "i.e. no TCP_NODELAY on the server's connections)"
                      if (b.get("health_latency_ms_p50") or 0) > 30 else ""))  # fmt: skip
        out.append(f"server RSS after {s['n']} submissions {b['rss_after_submissions_mb']:.0f} MB; start -> serving "
                   f"{b['start_to_serving_s']:.2f} s")  # fmt: skip
    d = data.get("decide")
    if d:
        for key, label in (("direct", "mixed"), ("direct_cpu_only", "CPU only")):
            x = d[key]
            out.append(f"decide(), {label}, medians: on a plain list (sorted and grouped at each call) "
                       f"{_f(x.get('from_a_list_median_ms'), '.2f')} ms; with every waiting job's reason "
                       f"{x['with_all_reasons_median_ms']:.1f} ms; the last 50 reasons (a page at the queue's end) "
                       f"{_f(x.get('last_page_of_50_reasons_median_ms'), '.2f')} ms")  # fmt: skip
    if d and "server_jobs" in d:
        out.append(f"server with {d['direct']['queued']:,} queued: decision_ms at recover "
                   f"{_f(d.get('server_decision_ms_at_recover'), '.1f')}; a submission takes "
                   f"{_f(d.get('submit_latency_ms_with_queue'), '.1f')} ms (median of {len(d.get('server_decision_ms_all', []))}); "
                   f"GET /queue: first page (50) {_f(d.get('get_queue_first_page_ms'), '.1f')} ms, all "
                   f"{d.get('get_queue_entries')} entries in {len(d.get('get_queue_page_ms', []))} pages of 1000 "
                   f"{_f(d.get('get_queue_all_pages_ms'), '.0f')} ms; JobStore.add_job (with the job's files) "
                   f"{d['store_add_jobs_per_s']:.0f}/s; {d.get('restart_with_queue_recovered_line')}")  # fmt: skip
    r = data.get("restart")
    if r:
        out.append(f"restart: {r.get('recovered_line')}; reports grew after the restart in "
                   f"{r['reports_grew_after_restart']}/3 jobs; stop states {r['stop_states']}")  # fmt: skip
    if data.get("load"):
        out += load_diagnostics(data["load"])
    left = {k: v.get("leftover_job_processes") for k, v in data.items() if isinstance(v, dict) and v.get("leftover_job_processes")}
    if left:
        out.append(f"job processes left behind and killed by the benchmark: {left}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3, help="runs per part-1 variant (median reported)")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma list of {','.join(PARTS)}")
    p.add_argument("--steps", type=int, default=5, help="steps of the part-1 job's loop")
    p.add_argument("--handoffs", type=int, default=5, help="queued-job handoffs timed in part 2")
    p.add_argument("--submissions", type=int, default=1000, help="held jobs submitted (then stopped) in part 3")
    p.add_argument("--threads", type=int, default=4, help="client threads in part 3")
    p.add_argument("--queued", type=int, default=10_000, help="queued jobs in part 4")
    p.add_argument("--decide-calls", type=int, default=20, help="decide() calls timed in part 4")
    p.add_argument("--decide-submits", type=int, default=5, help="submissions to the server with the big queue")
    p.add_argument("--restart-job-s", type=float, default=30.0, help="how long part 5's jobs would run")
    p.add_argument("--load-jobs", type=int, default=200, help="jobs in the store of part 7's server")
    p.add_argument("--load-clients", default="20,200", help="concurrent GET /jobs clients of part 7, one run each")
    p.add_argument("--load-followers", type=int, default=20, help="live GET /events streams during each run of part 7")
    p.add_argument("--load-duration", type=float, default=10.0, help="seconds measured per run of part 7")
    p.add_argument("--no-ray", dest="ray", action="store_false", help="skip Ray Jobs")
    p.add_argument("--ray-pythonpath", default=os.environ.get("TRAINFORGE_BENCH_RAY_PYTHONPATH"),
                   help="extra PYTHONPATH for the Ray processes (e.g. a dir holding ray[default]'s dashboard packages)")  # fmt: skip
    p.add_argument("--idle-wait", type=float, default=2.0, help="before each part-1 run, wait up to this long for idle CPUs")
    p.add_argument("--markdown", action="store_true", help="also print the table as Markdown")
    p.add_argument("--json-out", default=DEFAULT_JSON, help="where to write the JSON results")
    p.add_argument("--variant", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--workdir", help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--sandboxed", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.variant:
        run_variant_here(args)
        return 0
    parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    bad = sorted(set(parts) - set(PARTS))
    if bad:
        p.error(f"--parts: unknown {bad}; choose from {','.join(PARTS)}")

    import psutil

    t_start = time.time()
    load0 = os.getloadavg()
    psutil.cpu_percent()
    work = tempfile.mkdtemp(prefix="tfb-server-")
    with open(os.path.join(work, "sleep_job.py"), "w") as f:
        f.write(SLEEP_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "TRAINFORGE_ADDRESS", "TRAINFORGE_TOKEN",
                                                               "TRAINFORGE_SERVER_DIR")}  # fmt: skip
    env["PYTHONPATH"] = os.pathsep.join(x for x in (REPO_ROOT, env.get("PYTHONPATH")) if x)
    env["TRAINFORGE_STORAGE_PATH"] = os.path.join(work, "runs")
    env[MARK_ENV] = f"server-bench-{os.getpid()}"
    os.environ.pop("RAY_ADDRESS", None)
    servers: list[TrainServer] = []
    rays: list[LocalRay] = []
    data: dict[str, Any] = {}
    errors: dict[str, str] = {}
    runners = {
        "submit": lambda: part_submit(args, work, env, servers, rays),
        "sandbox": lambda: part_sandbox(args, work, env, servers),
        "handoff": lambda: part_handoff(args, work, env, servers),
        "burst": lambda: part_burst(args, work, env, servers),
        "decide": lambda: part_decide(args, work, env, servers),
        "restart": lambda: part_restart(args, work, env, servers),
        "load": lambda: part_load(args, work, env, servers),
    }
    part_s: dict[str, float] = {}
    data["settings"] = {k: v for k, v in vars(args).items() if k not in ("variant", "out", "workdir", "url", "sandboxed")}
    try:
        for part in parts:
            print(f"part {part} ...", file=sys.stderr, flush=True)
            t = time.time()
            try:
                data[part] = runners[part]()
            except Exception as exc:
                import traceback

                errors[part] = f"{type(exc).__name__}: {exc}"
                print(f"  !! part {part} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
            part_s[part] = time.time() - t
    finally:
        from trainforge._testing.procs import kill_procs, processes_with_env

        leftovers: list[str] = []
        for srv in servers:
            leftovers += srv.cleanup(kill=True)
        for ray in rays:
            leftovers += [f"ray: {x}" for x in ray.stop()]
        # Anything else this benchmark started (a driver of part 1 killed mid-run, its workers).
        leftovers += kill_procs(processes_with_env(MARK_ENV, env[MARK_ENV]))
        shutil.rmtree(work, ignore_errors=True)

    commit, date = git_commit(), datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    info = machine_info()
    header, rows = table(data)
    print(f"\ntrainforge server benchmark  {date}  commit {commit}  python {info['python']}  {info['cpu_count']} CPUs  "
          f"repeats={args.repeats}\n")  # fmt: skip
    print(render_text(header, rows))
    diag = diagnostics(data)
    busy = psutil.cpu_percent()
    load1 = os.getloadavg()
    diag.append(f"machine: {busy:.0f}% CPU busy on average over the run, load {load0[0]:.1f} -> {load1[0]:.1f}; "
                f"parts took {', '.join(f'{k} {v:.0f} s' for k, v in part_s.items())}; total {time.time() - t_start:.0f} s")  # fmt: skip
    if leftovers:
        diag.append(f"killed at the end: {leftovers}")
    print("\ndiagnostics:\n" + "\n".join(f"- {x}" for x in diag))
    if errors:
        print("\nfailed parts:\n" + "\n".join(f"- {k}: {v}" for k, v in errors.items()))
    if args.markdown:
        print("\n" + render_markdown(header, rows))
    os.makedirs(os.path.dirname(os.path.abspath(args.json_out)), exist_ok=True)
    write_json(args.json_out, {
        "benchmark": "server", "date": date, "git_commit": commit, "machine": info,
        "goals": {"submit_extra_s": GOAL_SUBMIT_EXTRA_S, "handoff_ms": GOAL_HANDOFF_MS, "submit_rate": GOAL_SUBMIT_RATE,
                  "decide_ms": GOAL_DECIDE_MS, "submit_with_queue_ms": GOAL_SUBMIT_WITH_QUEUE_MS,
                  "queue_page_ms": GOAL_QUEUE_PAGE_MS, "restart_s": GOAL_RESTART_S, "idle_rss_mb": GOAL_IDLE_RSS_MB,
                  "load_p95_ms": GOAL_LOAD_P95_MS},
        "table": {"header": header, "rows": rows}, "diagnostics": diag, "part_s": part_s,
        "cpu_busy_percent": busy, "loadavg": [load0, load1], "leftovers_killed": leftovers, "errors": errors,
        **data,
    })  # fmt: skip
    print(f"\nwrote {os.path.relpath(args.json_out)}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
