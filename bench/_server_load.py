"""Part ``load`` of ``bench_server.py``: the train server under many concurrent readers.

A server whose store holds ``--load-jobs`` jobs (half finished, half held), then for each of
``--load-clients`` (20, then 200) concurrent keep-alive clients: ``GET /api/v1/jobs`` in a loop for
``--load-duration`` s (after 1 s of warm-up), while ``--load-followers`` (20) live ``GET /api/v1/events``
streams are held open and the benchmark submits a held job every 0.5 s (each follower must see every
one of them). The clients and followers run in a separate process (this file run as a script) so that
they do not share the server's interpreter; the benchmark samples the server's RSS, open files,
threads and SQLite connections (its descriptors of ``state.db``) every 50 ms.

Goals: no errors; p95 at 20 clients <= 100 ms; threads and SQLite connections bounded (the same at 200
clients as at 20).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from _common import REPO_ROOT, percentile
from _http_load import HttpConn

GOAL_LOAD_P95_MS = 100.0
WARMUP_S = 1.0
SUBMIT_EVERY_S = 0.5
JOBS_PATH = "/api/v1/jobs"
EVENTS_PATH = "/api/v1/events"


# --------------------------------------------------------------------------------------------------
# The server side: its store, filled before it starts, and a sampler of its resources.
# --------------------------------------------------------------------------------------------------
def seed_jobs(state_dir: str, n: int, script: str) -> None:
    """``n`` jobs in the store of a server that is not running: every other one SUCCEEDED (with
    metrics), the others HELD (so that the server runs none of them)."""
    from trainforge.server.store import database as st

    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    store = st.JobStore(os.path.join(state_dir, "state.db"))
    spec = {"kind": "script", "path": script, "args": [], "min_workers": 1, "max_workers": None,
            "per_worker": {"CPU": 1.0}, "driver": {}, "env": {}, "sys_path": [], "cwd": None, "target": None}  # fmt: skip
    try:
        for i in range(n):
            job, _ = store.add_job(name=f"load-{i}", kind="script", spec=spec, held=i % 2 == 1)
            if i % 2 == 0:
                t = time.time()
                store.update(job.id, "ended", {"exit_code": 0}, state="SUCCEEDED", started_at=t - 60.0, ended_at=t,
                             exit_code=0, attempt=1, reports=100, last_metrics={"loss": 0.1 + i / n, "step": 99})  # fmt: skip
    finally:
        store.close()


class ServerSampler:
    """Every ``interval_s``: the server process's RSS, open descriptors, threads and SQLite
    connections (descriptors of its ``state.db``; each connection holds one)."""

    def __init__(self, pid: int, db_path: str, interval_s: float = 0.05):
        self.pid = pid
        self.db_path = os.path.realpath(db_path)
        self.interval_s = interval_s
        self.samples: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="server-sampler", daemon=True)

    def sample(self) -> dict[str, float]:
        import psutil

        p = psutil.Process(self.pid)
        fd_dir = f"/proc/{self.pid}/fd"
        db = 0
        for name in os.listdir(fd_dir):
            try:
                db += os.readlink(os.path.join(fd_dir, name)) == self.db_path
            except OSError:  # closed meanwhile
                continue
        return {"rss_mb": p.memory_info().rss / 2**20, "fds": p.num_fds(), "threads": p.num_threads(), "db_conns": db}

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.samples.append(self.sample())
            except Exception:  # the server is gone (psutil.NoSuchProcess, OSError): nothing more to sample
                return

    def _cpu(self) -> tuple[float, float]:
        """CPU seconds of the server process, and of the whole machine."""
        import psutil

        t, m = psutil.Process(self.pid).cpu_times(), psutil.cpu_times()
        return t.user + t.system, sum(getattr(m, k, 0.0) for k in ("user", "nice", "system", "irq", "softirq", "steal"))

    def __enter__(self) -> ServerSampler:
        self._cpu0 = self._cpu()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        server, machine = self._cpu()
        self.server_cpu_s = server - self._cpu0[0]
        self.machine_cpu_s = machine - self._cpu0[1]

    def peak(self) -> dict[str, float]:
        return {k: max(s[k] for s in self.samples) for k in self.samples[0]} if self.samples else {}


def run_level(url: str, state_dir: str, pid: int, clients: int, followers: int, duration: float,
              submit: Callable[[int], None]) -> dict[str, Any]:  # fmt: skip
    """One load level: the client process for ``clients`` readers and ``followers`` streams, the
    server sampled meanwhile, ``submit(i)`` called every 0.5 s while the followers are connected."""
    sampler = ServerSampler(pid, os.path.join(state_dir, "state.db"))
    before = sampler.sample()
    t0 = time.monotonic()
    cmd = [sys.executable, os.path.abspath(__file__), "--url", url, "--state-dir", state_dir, "--clients", str(clients),
           "--followers", str(followers), "--duration", str(duration)]  # fmt: skip
    with sampler:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            ready = proc.stdout.readline()  # "ready": every follower has its stream open
            sent = 0
            if ready.startswith("ready"):
                t_end = time.monotonic() + WARMUP_S + duration - 1.0  # the last one has 1 s to arrive
                while time.monotonic() < t_end:
                    submit(sent)
                    sent += 1
                    time.sleep(SUBMIT_EVERY_S)
            out, err = proc.communicate(timeout=WARMUP_S + duration + 120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    after = sampler.sample()
    try:
        res: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": f"the load client failed (exit {proc.returncode})", "output_tail": (ready + out + err)[-3000:]}
    res.update(clients=clients, followers=followers, events_sent=sent, server_before=before, server_after=after,
               server_peak=sampler.peak(), samples=len(sampler.samples), server_cpu_s=sampler.server_cpu_s,
               machine_cpu_s=sampler.machine_cpu_s, wall_s=time.monotonic() - t0)  # fmt: skip
    # CPU the server spent per request (over the whole run, warm-up and the SSE streams included), and
    # what the rest of the machine took beside the server and the client (other programs: noise).
    res["server_cpu_ms_per_request"] = sampler.server_cpu_s / max(1, res["requests"]) * 1e3 * duration / (
        duration + WARMUP_S)
    res["foreign_cpu_s"] = max(0.0, sampler.machine_cpu_s - sampler.server_cpu_s - res["client_cpu_s"])
    res["followers_saw_every_event"] = res["follower_events_min"] == sent and not res["follower_errors"]
    return res


# --------------------------------------------------------------------------------------------------
# The table rows and diagnostics of this part.
# --------------------------------------------------------------------------------------------------
def _f(v: float | None, spec: str) -> str:
    return "-" if v is None or v != v else format(v, spec)


def load_rows(res: dict[str, Any], status: Callable[[bool | None], str]) -> list[list[str]]:
    rows: list[list[str]] = []
    for level in res["levels"]:
        if "error" in level:
            rows.append([f"GET /jobs, {level.get('clients')} clients: p95 (ms)", "-", level["error"][:40], "-", "MISS"])
            continue
        n, p95 = level["clients"], level["p95_ms"]
        ok = level["errors"] == 0 and level["followers_saw_every_event"]
        goal = f"goal <= {GOAL_LOAD_P95_MS:.0f} ms, 0 errors" if n <= 20 else "0 errors"
        met = ok and (p95 is not None and p95 <= GOAL_LOAD_P95_MS if n <= 20 else True)
        rows.append([f"GET /jobs, {n} clients + {level['followers']} SSE followers: p95 (ms)", _f(p95, ".1f"),
                     f"p50 {_f(level['p50_ms'], '.1f')}, {_f(level['rps'], '.0f')} req/s", goal, status(met)])  # fmt: skip
        b, pk, a = level["server_before"], level["server_peak"], level["server_after"]
        rows.append([f"  {n} clients: errors; server threads, SQLite conns, fds (before/peak/after)",
                     f"{level['errors']}", f"{b['threads']}/{pk.get('threads')}/{a['threads']}; "
                     f"{b['db_conns']}/{pk.get('db_conns')}/{a['db_conns']}; {b['fds']}/{pk.get('fds')}/{a['fds']}",
                     f"RSS {b['rss_mb']:.0f}/{_f(pk.get('rss_mb'), '.0f')}/{a['rss_mb']:.0f} MB", "-"])  # fmt: skip
    return rows


def load_diagnostics(res: dict[str, Any]) -> list[str]:
    out = []
    for level in res["levels"]:
        if "error" in level:
            out.append(f"load, {level.get('clients')} clients: {level['error']}: {level.get('output_tail', '')[-500:]}")
            continue
        out.append(f"load, {level['clients']} clients: {level['requests']} requests in {level['duration_s']:.0f} s, "
                   f"p50 {_f(level['p50_ms'], '.1f')} ms, p95 {_f(level['p95_ms'], '.1f')} ms, p99 "
                   f"{_f(level['p99_ms'], '.1f')} ms, max {_f(level['max_ms'], '.0f')} ms, {level['errors']} errors "
                   f"{level['error_samples'][:2]}; followers saw {level['follower_events_min']}-"
                   f"{level['follower_events_max']} of {level['events_sent']} events, errors {level['follower_errors'][:2]}; "
                   f"server CPU {level['server_cpu_ms_per_request']:.2f} ms per request; CPU s of the server "
                   f"{level['server_cpu_s']:.1f}, the client {level['client_cpu_s']:.1f}, other programs "
                   f"{level['foreign_cpu_s']:.1f} over {level['wall_s']:.0f} s")  # fmt: skip
    return out


# --------------------------------------------------------------------------------------------------
# The client process: readers and followers on asyncio.
# --------------------------------------------------------------------------------------------------
async def _follow(host: str, port: int, token: str, opened: asyncio.Queue[bool], stop: asyncio.Event,
                  counts: list[int], errors: list[str], k: int) -> None:  # fmt: skip
    """One ``GET /events`` stream: puts True on ``opened`` once its response began (False if it did
    not), then counts its events until ``stop``."""
    writer = None
    announced = False
    try:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(f"GET {EVENTS_PATH} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {token}\r\n"
                     "Accept: text/event-stream\r\n\r\n".encode())  # fmt: skip
        status_line = await reader.readline()
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        if b" 200 " not in status_line:
            errors.append(f"follower {k}: {status_line!r}")
            return
        announced = True
        await opened.put(True)
        stopped = asyncio.ensure_future(stop.wait())
        while True:
            line = asyncio.ensure_future(reader.readline())
            done, _ = await asyncio.wait({line, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if stopped in done:
                line.cancel()
                return
            data = line.result()
            if not data:
                errors.append(f"follower {k}: the stream ended")
                return
            if data.startswith(b"event:"):
                counts[k] += 1
    except (OSError, asyncio.IncompleteReadError) as exc:
        errors.append(f"follower {k}: {exc!r}")
    finally:
        if not announced:
            await opened.put(False)
        if writer is not None:
            writer.close()


async def _load(host: str, port: int, token: str, clients: int, followers: int, duration: float) -> dict[str, Any]:
    stop = asyncio.Event()
    opened: asyncio.Queue[bool] = asyncio.Queue()
    counts = [0] * followers
    follower_errors: list[str] = []
    streams = [asyncio.ensure_future(_follow(host, port, token, opened, stop, counts, follower_errors, k))
               for k in range(followers)]  # fmt: skip
    for _ in range(followers):
        await opened.get()
    print("ready", flush=True)
    lat: list[float] = []
    errors: list[str] = []
    t_start = time.perf_counter()
    t_measure, t_end = t_start + WARMUP_S, t_start + WARMUP_S + duration

    async def one() -> None:
        conn = HttpConn(host, port, token)
        try:
            while (t0 := time.perf_counter()) < t_end:
                try:
                    code, body = await conn.get(JOBS_PATH)
                    ok = code == 200 and len(json.loads(body)["jobs"]) > 0
                    why = f"HTTP {code}: {body[:200]!r}"
                except (OSError, ValueError, KeyError, asyncio.IncompleteReadError) as exc:  # counted, never raised
                    ok, why = False, f"{type(exc).__name__}: {exc}"
                    await conn.close()
                    conn = HttpConn(host, port, token)
                if t0 < t_measure:
                    continue
                if ok:
                    lat.append(time.perf_counter() - t0)
                else:
                    errors.append(why[:300])
        finally:
            await conn.close()

    await asyncio.gather(*(one() for _ in range(clients)))
    stop.set()
    await asyncio.gather(*streams)
    ms = [x * 1e3 for x in lat]
    return {
        "duration_s": duration, "requests": len(lat), "errors": len(errors), "error_samples": errors[:5],
        "rps": len(lat) / duration, "p50_ms": percentile(ms, 50), "p95_ms": percentile(ms, 95),
        "p99_ms": percentile(ms, 99), "max_ms": max(ms) if ms else None,
        "follower_events_min": min(counts, default=0), "follower_events_max": max(counts, default=0),
        "follower_errors": follower_errors[:5],
    }  # fmt: skip


def client_main(argv: list[str] | None = None) -> int:
    from urllib.parse import urlsplit

    p = argparse.ArgumentParser(description="the load client of bench_server.py's part 'load'")
    p.add_argument("--url", required=True)
    p.add_argument("--state-dir", required=True, help="the server's, for its token")
    p.add_argument("--clients", type=int, required=True)
    p.add_argument("--followers", type=int, required=True)
    p.add_argument("--duration", type=float, required=True)
    args = p.parse_args(argv)
    where = urlsplit(args.url)
    assert where.hostname is not None and where.port is not None
    with open(os.path.join(args.state_dir, "token")) as f:
        token = f.read().strip()
    res = asyncio.run(_load(where.hostname, where.port, token, args.clients, args.followers, args.duration))
    t = os.times()
    res["client_cpu_s"] = t.user + t.system
    print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(client_main())
