"""A real train server for tests: ``python -m trainforge.server start`` on 127.0.0.1, a free port and
the test's own state directory, read until it says where it serves (no polling)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading

import psutil

from trainforge.server import Client

SERVER_ID_ENV = "TRAINFORGE_SERVER_ID"


class ServerProc:
    def __init__(self, state_dir: str, capacity: str | None = "CPU=2", extra: tuple[str, ...] = (),
                 env: dict[str, str] | None = None):  # fmt: skip
        """``capacity`` None: the server measures it (the machine's, or the Ray cluster's with
        ``RAY_ADDRESS`` in ``env``); ``env``: added to this process's environment for the server."""
        self.state_dir = state_dir
        self.capacity = capacity
        self.extra = extra
        self.env = env
        self.proc: subprocess.Popen[str] | None = None
        self.url: str | None = None
        self.lines: list[str] = []
        self._serving = threading.Event()
        self._drainer: threading.Thread | None = None

    def start(self, timeout: float = 60.0) -> ServerProc:
        capacity = ["--capacity", self.capacity] if self.capacity is not None else []
        cmd = [sys.executable, "-m", "trainforge.server", "start", "--state-dir", self.state_dir, "--port", "0",
               *capacity, "--stop-grace", "5", *self.extra]  # fmt: skip
        self._serving.clear()
        env = {**os.environ, **self.env} if self.env is not None else None
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self._drainer = threading.Thread(target=self._drain, args=(self.proc,), daemon=True)
        self._drainer.start()
        if not self._serving.wait(timeout):
            raise TimeoutError("the server did not start:\n" + "".join(self.lines[-30:]))
        return self

    def _drain(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.append(line)
            m = re.search(r"serving (http://\S+)", line)
            if m:
                self.url = m.group(1)
                self._serving.set()
        self._serving.set()  # exited: wake the waiter (it then finds no url)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def client(self) -> Client:
        assert self.url is not None, self.output
        return Client(self.url, state_dir=self.state_dir)

    @property
    def server_id(self) -> str:
        with open(os.path.join(self.state_dir, "server_id")) as f:
            return f.read().strip()

    def job_processes(self, job_id: int | None = None) -> list[psutil.Process]:
        """Live processes of this server's jobs (by their environment), whoever their parent is."""
        sid, found = self.server_id, []
        for p in psutil.process_iter():
            try:
                env = p.environ()
                if env.get(SERVER_ID_ENV) == sid and (job_id is None or env.get("TRAINFORGE_JOB_ID") == str(job_id)):
                    if p.status() != psutil.STATUS_ZOMBIE:
                        found.append(p)
            except (psutil.Error, OSError):
                continue
        return found

    def zygotes(self) -> list[psutil.Process]:
        """The server's warm fork servers, found by the state directory on their command line."""
        found = []
        for p in psutil.process_iter():
            try:
                cmd = p.cmdline()
            except psutil.Error:
                continue
            if "trainforge._internal.zygote" in cmd and any(a.startswith(self.state_dir) for a in cmd):
                found.append(p)
        return found

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=30)
        if self._drainer is not None:
            self._drainer.join(timeout=10)  # all of its output is in .output
        return code

    def cleanup(self) -> list[tuple[int, str]]:
        """Stop the server and kill what is left of its jobs; returns what was left."""
        self.stop()
        left = []
        # The warm fork server winds down once the server is gone and its last child ended.
        _gone, alive = psutil.wait_procs(self.zygotes(), timeout=10)
        for p in alive:
            try:
                left.append((p.pid, " ".join(p.cmdline())[:200]))
                p.kill()
            except psutil.Error:
                pass
        for p in self.job_processes():
            try:
                left.append((p.pid, " ".join(p.cmdline())))
                p.kill()
                p.wait(timeout=10)
            except psutil.Error:
                pass
        return left
