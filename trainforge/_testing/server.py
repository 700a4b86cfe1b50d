"""Server processes for the tests and benchmarks, read until they say where they serve (no polling).

    srv = ServingProcess([sys.executable, "-m", "trainforge", "serve", uri, "--port", "0"]).start()
    srv.url                     # from its "serving http://..." line
    srv.stop()                  # SIGTERM, then its exit code

    server = TrainServer(state_dir).start()    # ``python -m trainforge.server start`` on a free port
    server.client()                            # a trainforge.server.Client for it
    left = server.cleanup()                    # stop it and kill what is left of its jobs

Both start on port 0 and learn the port from the serving line, so parallel test workers never race
for one. Every start's output is kept (``lines``, ``output``: all starts; ``last_lines``: the latest).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import psutil

from trainforge._internal.constants import API_PREFIX
from trainforge._testing.procs import describe, kill_procs, processes_with_env

if TYPE_CHECKING:
    import httpx

    from trainforge.server import Client

SERVING = re.compile(r"serving (https?://\S+)")
SERVER_ID_ENV = "TRAINFORGE_SERVER_ID"  # in the environment of every process of a train server's jobs
JOB_ID_ENV = "TRAINFORGE_JOB_ID"


class ServingProcess:
    """A process that prints ``serving http://HOST:PORT`` once it serves: started, its output drained
    by a thread into ``lines``, and ``url`` taken from that line.

    ``env``: variables added to the environment, which is ``environ`` (default: this process's);
    ``cwd``, ``new_session``: as ``subprocess.Popen``'s ``cwd`` and ``start_new_session``.
    ``t_launch`` and ``t_serving`` (``time.time()``) are when the latest start launched the command and
    when its serving line came.
    """

    def __init__(self, cmd: Sequence[str], *, env: Mapping[str, str] | None = None,
                 environ: Mapping[str, str] | None = None, cwd: str | None = None,
                 new_session: bool = False) -> None:  # fmt: skip
        self.cmd = list(cmd)
        self.env = dict(env) if env is not None else None
        self.environ = dict(environ) if environ is not None else None
        self.cwd = cwd
        self.new_session = new_session
        self.proc: subprocess.Popen[str] | None = None
        self.url: str | None = None
        self.lines: list[str] = []  # every start's
        self.last_lines: list[str] = []  # the latest start's
        self.t_launch = self.t_serving = float("nan")
        self._drainer: threading.Thread | None = None

    def command(self) -> list[str]:
        """The command line of the next start."""
        return self.cmd

    def start(self, timeout: float = 60.0, *, require_url: bool = False) -> Any:
        """Launch the command and return (self) once it printed its serving line, or exited (then
        ``url`` is None; with ``require_url``, ``RuntimeError``). ``TimeoutError`` if neither came
        within ``timeout`` seconds."""
        env = None
        if self.env is not None or self.environ is not None:
            env = {**(self.environ if self.environ is not None else os.environ), **(self.env or {})}
        # A fresh event and list per start: the previous process's reader may still be finishing.
        serving = threading.Event()
        lines: list[str] = []
        self.url = None
        self.last_lines = lines
        self.t_launch = time.time()
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=env, cwd=self.cwd, start_new_session=self.new_session)  # fmt: skip
        self._drainer = threading.Thread(target=self._drain, args=(self.proc, serving, lines), daemon=True)
        self._drainer.start()
        if not serving.wait(timeout):
            raise TimeoutError(f"{self._name()} did not start within {timeout:g} s:\n" + "".join(lines[-30:]))
        if require_url and self.url is None:
            raise RuntimeError(f"{self._name()} exited before serving:\n" + "".join(lines[-30:]))
        return self

    def _drain(self, proc: subprocess.Popen[str], serving: threading.Event, lines: list[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            self.lines.append(line)
            m = SERVING.search(line)
            if m and not serving.is_set():
                self.t_serving = time.time()
                self.url = m.group(1)
                serving.set()
        serving.set()  # exited: wake the waiter (it then finds no url)

    def _name(self) -> str:
        return " ".join(self.cmd[1:4])

    @property
    def output(self) -> str:
        """All output of every start so far."""
        return "".join(self.lines)

    def kill9(self) -> None:
        """SIGKILL the process (if it runs) and wait for it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self, timeout: float = 30.0, *, kill_after: bool = False) -> int | None:
        """SIGTERM and wait up to ``timeout`` s for the exit code (None if never started); after that
        ``subprocess.TimeoutExpired``, or with ``kill_after`` a SIGKILL. Its output is then complete."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            if not kill_after:
                raise
            self.kill9()
            code = self.proc.returncode
        if self._drainer is not None:
            self._drainer.join(timeout=10)  # all of its output is in .output
        return code


class TrainServer(ServingProcess):
    """``python -m trainforge.server start`` on 127.0.0.1, port 0 and the state directory ``state_dir``.
    ``capacity`` None: the server measures it (the machine's, or the Ray cluster's with ``RAY_ADDRESS``
    in ``env``); ``stop_grace``: its ``--stop-grace`` (None: the server's default); ``extra``: more
    arguments for ``start``."""

    def __init__(self, state_dir: str, capacity: str | None = "CPU=2", extra: Sequence[str] = (), *,
                 stop_grace: str | None = "5", env: Mapping[str, str] | None = None,
                 environ: Mapping[str, str] | None = None, cwd: str | None = None,
                 new_session: bool = False) -> None:  # fmt: skip
        super().__init__([], env=env, environ=environ, cwd=cwd, new_session=new_session)
        self.state_dir = state_dir
        self.capacity = capacity
        self.stop_grace = stop_grace
        self.extra = tuple(extra)

    def command(self) -> list[str]:
        capacity = ["--capacity", self.capacity] if self.capacity is not None else []
        grace = ["--stop-grace", self.stop_grace] if self.stop_grace is not None else []
        return [sys.executable, "-m", "trainforge.server", "start", "--state-dir", self.state_dir, "--port", "0",
                *capacity, *grace, *self.extra]  # fmt: skip

    def _name(self) -> str:
        return "the train server"

    def _read(self, name: str) -> str:
        with open(os.path.join(self.state_dir, name)) as f:
            return f.read().strip()

    @property
    def token(self) -> str:
        return self._read("token")

    @property
    def server_id(self) -> str:
        return self._read("server_id")

    def client(self) -> Client:
        from trainforge.server import Client

        assert self.url is not None, self.output
        return Client(self.url, state_dir=self.state_dir)

    def http(self, timeout: float = 60.0) -> httpx.Client:
        """An ``httpx.Client`` on the server's ``/api/v1`` with its token."""
        import httpx

        assert self.url is not None, self.output
        return httpx.Client(base_url=self.url + API_PREFIX, headers={"Authorization": f"Bearer {self.token}"},
                            timeout=timeout)  # fmt: skip

    def job_processes(self, job_id: int | None = None) -> list[psutil.Process]:
        """Live processes of this server's jobs (by their environment), whoever their parent is."""
        try:
            sid = self.server_id
        except OSError:  # never started far enough to write it
            return []
        procs = processes_with_env(SERVER_ID_ENV, sid)
        if job_id is None:
            return procs
        found = []
        for p in procs:
            try:
                if p.environ().get(JOB_ID_ENV) == str(job_id):
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

    def cleanup(self, *, kill: bool = False) -> list[str]:
        """Stop the server (SIGTERM; with ``kill``, SIGKILL) and kill what is left of its jobs and, 10 s
        on, of its warm fork servers; returns those, described. A sandboxed job's processes are found
        in its cgroup too (one that dropped the job's environment is still there)."""
        if kill:
            self.kill9()
        else:
            self.stop()
        # The warm fork server winds down once the server is gone and its last child ended.
        _gone, alive = psutil.wait_procs(self.zygotes(), timeout=10)
        left = [describe(p, 200) for p in alive]
        kill_procs(alive)
        return left + kill_procs(self.job_processes() + self._cgroup_processes())

    def _cgroup_processes(self) -> list[psutil.Process]:
        """What is alive in the cgroups of this server's jobs (their cgroups are removed once empty)."""
        from trainforge._internal.sandbox import Hierarchies

        try:
            sid = self.server_id
        except OSError:
            return []
        host = Hierarchies.discover()
        found = []
        for name in host.children(f"trainforge-{sid}"):
            group = host.group(f"trainforge-{sid}/{name}")
            for pid in group.pids():
                try:
                    found.append(psutil.Process(pid))
                except psutil.Error:
                    continue
        return found
