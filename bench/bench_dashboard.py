#!/usr/bin/env python
"""Dashboard benchmark: the train server's web pages in a real browser (Debian's Chromium through
Playwright, as the tests drive it).

    python bench/bench_dashboard.py [--jobs 10000] [--tabs 20] [--markdown]

1. first meaningful paint of the jobs page with ``--jobs`` (10,000) jobs in the server's store
   (held script jobs, written to its SQLite before it starts): from the navigation's start to the
   first-contentful-paint of ``/`` (the first 50 rows are in the HTML), or to the first frame with the
   rows in it when the browser does not report that paint; median of 5 page loads. Goal <= 500 ms.
2. ``report()`` -> point on the chart: a 2-worker job reports ``{"step", "t": time.time()}`` every
   50 ms; the job page records (a MutationObserver on the chart's latest-value line) when each step
   appears; latency = seen - reported (same machine clock). p50 / p95. Goal p95 <= 1 s.
3. zoom on a ``--reports`` (1,000,000) report series (written into a seeded job's events file): its
   job page loads it as downsampled buckets; a mouse drag over 10%, 1% or 2% of the chart fetches
   that range in finer buckets and draws them. Time from the mouse release to the frame after the
   finer data is drawn (the page's own ``tf-refined`` event); 5 zooms. Goal <= 100 ms.
   Also: how long that job's page takes to open the first time (the server parses the file once).
4. total static assets (HTML excluded): the dashboard's script and style sheet and the vendored
   uPlot, gzipped. Goal <= 200 KB.
5. server CPU while ``--tabs`` (20) tabs follow a live job (each on its job page, a report every
   50 ms): the server process's CPU time over 10 s, as % of one core.

Results go to ``bench/results/dashboard.json``.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import os
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
    render_markdown,
    render_text,
    status,
    write_json,
)

from trainforge._testing.server import TrainServer
from trainforge._testing.wait import wait_until

DEFAULT_JSON = os.path.join(BENCH_DIR, "results", "dashboard.json")
GOAL_PAINT_MS = 500.0
GOAL_REPORT_P95_S = 1.0
GOAL_ASSETS_KB = 200.0
GOAL_ZOOM_MS = 100.0
REPORT_SCRIPT = """
import sys
import time
import trainforge
from trainforge import DataParallelTrainer, RunConfig, ScalingConfig

def loop(config):
    for step in range(config["steps"]):
        trainforge.report({"step": step, "t": time.time()})
        time.sleep(config["every"])

DataParallelTrainer(loop, train_loop_config={"steps": int(sys.argv[1]), "every": 0.05},
                    scaling_config=ScalingConfig(num_workers=2),
                    run_config=RunConfig(storage_path=STORAGE, verbose=0)).fit()
"""


def seed_jobs(state_dir: str, n: int, script: str, reports: int) -> int:
    """``n`` held jobs, then one more whose events file holds ``reports`` reports (its id returned)."""
    import math
    import random

    from trainforge.server.store.database import JobStore

    os.makedirs(state_dir, exist_ok=True)
    store = JobStore(os.path.join(state_dir, "state.db"))
    spec = {"kind": "script", "path": script, "args": [], "per_worker": {"CPU": 1.0}, "min_workers": 1}
    for i in range(n):
        store.add_job(name=f"seeded-{i}", kind="script", spec=spec, held=True)
    job, _ = store.add_job(name=f"{reports:,}-reports", kind="script", spec=spec, held=True)
    store.close()
    job_dir = os.path.join(state_dir, "jobs", str(job.id))
    os.makedirs(job_dir, exist_ok=True)
    rng = random.Random(0)
    t0 = time.time() - reports * 0.01
    with open(os.path.join(job_dir, "events.jsonl"), "w") as f:
        for i in range(reports):
            loss = 2.0 * math.exp(-i / (reports / 5)) + 0.05 * rng.random() + (5.0 if i % 99_991 == 0 else 0.0)
            f.write(f'{{"type": "report", "t": {t0 + i * 0.01:.3f}, "metrics": {{"loss": {loss:.6f}}}}}\n')
    return job.id


def asset_sizes() -> dict[str, Any]:
    static = os.path.join(REPO_ROOT, "trainforge", "server", "static")
    out: dict[str, Any] = {}
    for rel in ("dashboard.js", "dashboard.css", "vendor/uplot/uPlot.iife.min.js", "vendor/uplot/uPlot.min.css"):
        with open(os.path.join(static, rel), "rb") as f:
            data = f.read()
        out[rel] = {"bytes": len(data), "gzip_bytes": len(gzip.compress(data, 9))}
    out["total_gzip_kb"] = sum(v["gzip_bytes"] for v in out.values() if isinstance(v, dict)) / 1024
    return out


def submit_script(srv: TrainServer, path: str, name: str, steps: int) -> int:
    with srv.http() as http:
        r = http.post("/jobs", json={"kind": "script", "path": path, "args": [str(steps)], "name": name, "workers": 2})
        r.raise_for_status()
        return int(r.json()["id"])


def wait_running(srv: TrainServer, job_id: int, timeout: float = 60.0) -> None:
    with srv.http() as http:
        wait_until(lambda: http.get(f"/jobs/{job_id}").json()["state"] in ("RUNNING",), timeout,
                   f"job {job_id} to start", interval=0.05)  # fmt: skip


def wait_ended(srv: TrainServer, job_id: int, timeout: float = 120.0) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        job: dict[str, Any] = http.get(f"/jobs/{job_id}").json()
        return job if job["state"] in ("SUCCEEDED", "FAILED", "STOPPED") else None

    with srv.http() as http:
        return wait_until(ended, timeout, f"job {job_id} to end", interval=0.1)


OBSERVE = """
() => {
  window.__seen = [];
  const attach = () => {
    const el = document.querySelector('.chart[data-group="step"] .last');
    if (!el) { requestAnimationFrame(attach); return; }
    const record = () => {
      const m = /step: ([0-9.]+)/.exec(el.textContent);
      if (m) window.__seen.push([Number(m[1]), Date.now() / 1000]);
    };
    record();
    new MutationObserver(record).observe(el, { childList: true, characterData: true, subtree: true });
  };
  attach();
}
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument("--tabs", type=int, default=20)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--reports", type=int, default=1_000_000, help="reports in the long series zoomed into")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--json", default=DEFAULT_JSON)
    args = p.parse_args()
    from trainforge._testing.browser import BrowserSession

    work = tempfile.mkdtemp(prefix="tf-bench-dash-")
    env = {**os.environ, "PYTHONPATH": REPO_ROOT}
    res: dict[str, Any] = {"settings": vars(args), "commit": git_commit(), "machine": machine_info(),
                           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    session = BrowserSession.start()
    srv = None
    try:
        reporter = os.path.join(work, "reporter.py")
        with open(reporter, "w") as f:
            f.write(REPORT_SCRIPT.replace("STORAGE", repr(os.path.join(work, "runs"))))
        state = os.path.join(work, "server")
        t = time.time()
        million = seed_jobs(state, args.jobs, reporter, args.reports)
        res["seed_s"] = time.time() - t
        srv = TrainServer(state, "CPU=2", environ=env, cwd=REPO_ROOT, new_session=True)
        srv.start(require_url=True)
        context = session.browser.new_context()
        page = context.new_page()
        page.goto(f"{srv.url}/?token={srv.token}")  # sets the cookie
        # 1. first paint of the jobs page.
        paints = []
        for _ in range(5):
            page.goto(f"{srv.url}/")
            page.locator("#jobs tr").first.wait_for()
            # From the navigation's start to the first frame drawn with the rows in it (FCP when the
            # browser reports it, which headless Chromium does not always do on a reload).
            paints.append(page.evaluate(
                "() => new Promise(r => requestAnimationFrame(() => r(Math.min(performance.now(),"
                " performance.getEntriesByName('first-contentful-paint')[0]?.startTime ?? Infinity))))"
            ))  # fmt: skip
        res["jobs_page_fcp_ms"] = paints
        res["jobs_page_rows"] = page.locator("#jobs tr").count()
        # 3. (before 2, on an idle server) zoom on a long series: open its job page (the server parses the whole events file once),
        # then drag over windows of the chart; each zoom fetches that range in finer buckets.
        t = time.monotonic()
        page.goto(f"{srv.url}/jobs/{million}")
        chart = page.locator('.chart[data-group="loss"]')
        chart.locator(".u-over").wait_for(timeout=120_000)
        page.wait_for_function("() => document.querySelector('.chart[data-group=\"loss\"] .last')"
                               ".textContent.includes('loss: ')", timeout=120_000)  # fmt: skip
        res["long_series_open_s"] = time.monotonic() - t
        chart.evaluate("el => el.addEventListener('tf-refined', (e) => { window.__refined.push(e.detail); })")
        page.evaluate("() => { window.__refined = []; }")
        box = chart.locator(".u-over").bounding_box()
        assert box is not None
        zooms = []
        for left, width in ((0.1, 0.1), (0.45, 0.1), (0.8, 0.1), (0.3, 0.01), (0.6, 0.02)):
            chart.dblclick()  # back to the whole series
            y = box["y"] + box["height"] / 2
            page.mouse.move(box["x"] + box["width"] * left, y)
            page.mouse.down()
            page.mouse.move(box["x"] + box["width"] * (left + width), y, steps=4)
            page.mouse.up()
            page.wait_for_function(f"() => window.__refined.length === {len(zooms) + 1}", timeout=30_000)
            zooms.append(page.evaluate("() => window.__refined[window.__refined.length - 1]"))
        res["zoom"] = zooms
        # 2. report -> chart.
        job_id = submit_script(srv, reporter, "reporter", args.steps)
        page.goto(f"{srv.url}/jobs/{job_id}")
        page.evaluate(OBSERVE)
        wait_ended(srv, job_id)
        page.wait_for_function(f"() => window.__seen.some(([s]) => s === {args.steps - 1})", timeout=30_000)
        seen = dict(page.evaluate("() => window.__seen"))
        with srv.http() as http:
            reports = http.get(f"/jobs/{job_id}/metrics").json()["reports"]
        lat = [seen[r["metrics"]["step"]] - r["metrics"]["t"] for r in reports if r["metrics"]["step"] in seen]
        lat.sort()
        res["report_to_chart_s"] = {"n": len(lat), "p50": statistics.median(lat),
                                    "p95": lat[int(0.95 * (len(lat) - 1))], "max": lat[-1]}  # fmt: skip
        # 4. assets.
        res["assets"] = asset_sizes()
        # 5. server CPU with N tabs following a live job.
        job_id = submit_script(srv, reporter, "followed", 100_000)  # runs until stopped
        wait_running(srv, job_id)
        # A context per tab, as separate users: one browser keeps at most 6 connections to a server
        # over HTTP/1.1, and every job page holds one (its event stream) while open.
        contexts = [session.browser.new_context() for _ in range(args.tabs)]
        tabs = []
        for c in contexts:
            tab = c.new_page()
            tab.goto(f"{srv.url}/?token={srv.token}")
            tabs.append(tab)
        for tab in tabs:
            tab.goto(f"{srv.url}/jobs/{job_id}")
        for tab in tabs:  # every tab is following: its chart shows reports
            tab.locator('.chart[data-group="step"]').wait_for(timeout=60_000)
        import psutil

        assert srv.proc is not None
        proc = psutil.Process(srv.proc.pid)
        c0, t0 = sum(proc.cpu_times()[:2]), time.monotonic()
        time.sleep(3.0)
        c1, t1 = sum(proc.cpu_times()[:2]), time.monotonic()
        res["server_cpu_percent_with_tabs"] = 100 * (c1 - c0) / (t1 - t0)
        res["tabs_following"] = sum(1 for tab in tabs if tab.locator('.chart[data-group="step"]').count())
        for c in contexts:
            c.close()
        with srv.http() as http:
            http.post(f"/jobs/{job_id}/stop", json={}).raise_for_status()
        wait_ended(srv, job_id)
        c0, t0 = sum(proc.cpu_times()[:2]), time.monotonic()
        time.sleep(3.0)
        c1, t1 = sum(proc.cpu_times()[:2]), time.monotonic()
        res["server_cpu_percent_idle"] = 100 * (c1 - c0) / (t1 - t0)
        context.close()
    finally:
        if srv is not None:
            srv.stop(15, kill_after=True)
            res["leftover_job_processes"] = srv.cleanup(kill=True)
        session.stop()
        shutil.rmtree(work, ignore_errors=True)
    fcp = statistics.median(res["jobs_page_fcp_ms"])
    rep = res["report_to_chart_s"]
    kb = res["assets"]["total_gzip_kb"]
    zoom_ms = sorted(z["ms"] for z in res["zoom"])
    header = ["metric", "dashboard", "goal", "met?"]
    rows = [
        [f"jobs page first contentful paint, {args.jobs:,} jobs (ms)", f"{fcp:.0f}", f"<= {GOAL_PAINT_MS:.0f} ms",
         status(fcp <= GOAL_PAINT_MS)],
        [f"report() -> point on the chart, p95 ({rep['n']} reports) (s)", f"{rep['p95']:.3f}",
         f"<= {GOAL_REPORT_P95_S:.0f} s", status(rep["p95"] <= GOAL_REPORT_P95_S)],
        ["  p50 (s)", f"{rep['p50']:.3f}", "-", "-"],
        [f"zoom on a {args.reports:,}-report series, median of {len(zoom_ms)} (ms)", f"{statistics.median(zoom_ms):.0f}",
         f"<= {GOAL_ZOOM_MS:.0f} ms", status(statistics.median(zoom_ms) <= GOAL_ZOOM_MS)],
        ["  slowest zoom (ms)", f"{zoom_ms[-1]:.0f}", "-", "-"],
        ["  opening that job's page, first load (s)", f"{res['long_series_open_s']:.1f}", "(informational)", "-"],
        ["static assets, gzipped (KB)", f"{kb:.1f}", f"<= {GOAL_ASSETS_KB:.0f} KB", status(kb <= GOAL_ASSETS_KB)],
        [f"server CPU, {args.tabs} tabs following a live job (% of a core)", f"{res['server_cpu_percent_with_tabs']:.0f}",
         "(informational)", "-"],
        ["  server CPU, idle after (% of a core)", f"{res['server_cpu_percent_idle']:.1f}", "(informational)", "-"],
    ]  # fmt: skip
    print(render_text(header, rows))
    if args.markdown:
        print("\n" + render_markdown(header, rows))
    write_json(args.json, res)
    print(f"wrote {os.path.relpath(args.json, REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
