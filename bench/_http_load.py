"""The benchmarks' HTTP load client: closed-loop clients on keep-alive connections.

    run = asyncio.run(closed_loop(url, bodies, clients=8, duration=5.0, warmup=1.0))
    run["p50_ms"], run["p99_ms"], run["throughput_rps"]

``HttpConn`` is one HTTP/1.1 connection on asyncio streams, far lighter than a full HTTP client
library, so that the clients' own work disturbs the server they measure less. Standard library only,
and outside the trainforge package on purpose: a load-client process's own CPU time is measured
(``_server_load.py``'s ``client_cpu_s``), and importing anything under ``trainforge`` runs its
``__init__`` first.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit


class HttpConn:
    """One keep-alive HTTP/1.1 connection on asyncio streams (``token``: sent as a bearer token)."""

    def __init__(self, host: str, port: int, token: str | None = None):
        self.host, self.port = host, port
        self.auth = f"Authorization: Bearer {token}\r\n" if token else ""
        self.reader: Any = None
        self.writer: Any = None

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                f"{self.auth}Content-Length: {len(body)}\r\n\r\n").encode()  # fmt: skip
        return await self._exchange(head + body)

    async def get(self, path: str) -> tuple[int, bytes]:
        return await self._exchange(f"GET {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n{self.auth}\r\n".encode())

    async def _exchange(self, request: bytes) -> tuple[int, bytes]:
        """Send ``request`` and read the response (its body by Content-Length): (status, body)."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        self.writer.write(request)
        status_line = await self.reader.readline()
        length = 0
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        data = await self.reader.readexactly(length)
        return int(status_line.split()[1]), data

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            await self.writer.wait_closed()


def percentiles(latencies: Sequence[float]) -> tuple[float | None, float | None]:
    """(p50, p99) of ``latencies`` (seconds) in milliseconds, nearest rank; (None, None) for none."""
    if not latencies:
        return None, None
    s = sorted(latencies)
    return s[max(0, round(0.5 * len(s)) - 1)] * 1e3, s[max(0, -(-99 * len(s) // 100) - 1)] * 1e3


async def closed_loop(url: str, bodies: Sequence[bytes], clients: int, duration: float, warmup: float,
                      on_answer: Callable[[float], Any] | None = None, *, path: str = "/v1/predict",
                      token: str | None = None) -> dict[str, Any]:  # fmt: skip
    """``clients`` concurrent loops of POST ``path`` (the JSON ``bodies`` in turn, one connection per
    client, ``token`` as a bearer token) for ``duration`` s after ``warmup`` s. Each answer must be
    JSON with ``model.version``. A failed request is counted, never raised: returns the requests, the
    failures (the first 5 of them), p50/p99 latency (ms), throughput and every answer's
    ``(client, time, version)``; ``on_answer(time)`` is called after each request."""
    where = urlsplit(url)
    assert where.hostname is not None and where.port is not None
    host, port = where.hostname, where.port
    lat: list[float] = []
    failed: list[str] = []
    answers: list[tuple[int, float, int]] = []  # (client, time, version)
    t_start = time.perf_counter()
    t_measure, t_end = t_start + warmup, t_start + warmup + duration

    async def one(k: int) -> None:
        conn = HttpConn(host, port, token)
        i = k * 37
        try:
            while True:
                t0 = time.perf_counter()
                if t0 >= t_end:
                    return
                try:
                    code, data = await conn.post(path, bodies[i % len(bodies)])
                    body = json.loads(data)
                except Exception as exc:  # a failed request is counted, never raised
                    code, body = 0, {"detail": f"{type(exc).__name__}: {exc}"}
                    await conn.close()
                    conn = HttpConn(host, port, token)
                t1 = time.perf_counter()
                if code != 200:
                    failed.append(f"{code}: {str(body.get('detail'))[:200]}")
                elif t0 >= t_measure:
                    lat.append(t1 - t0)
                    answers.append((k, t1, body["model"]["version"]))
                if on_answer is not None:
                    on_answer(t1)
                i += 1
        finally:
            await conn.close()

    await asyncio.gather(*(one(k) for k in range(clients)))
    p50, p99 = percentiles(lat)
    return {"requests": len(lat), "failed": len(failed), "failures": failed[:5], "p50_ms": p50, "p99_ms": p99,
            "throughput_rps": len(lat) / duration, "answers": answers}  # fmt: skip
