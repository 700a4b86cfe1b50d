"""The zygote a local worker pool starts for its standby workers.

Why: standby workers (see local_pool.py) each imported torch and ``torch._dynamo`` themselves, ~1.7 s
of CPU apiece. Started once a run trains, on a small machine they compete with the running workers
for the cores; a worker that dies in the first seconds found both standbys still importing, and
the restart waited for the slower of them. One process that imports once and forks a standby per
request does half that work for two workers (a third of it for three), and the forks share its
memory until they write to it. The pool starts it with a run that may restart, before the first
group, whose workers it forks too (so the imports are done once, not once more beside theirs).

:class:`StandbyZygote` is that process: a :mod:`trainforge._internal.zygote` of the pool's own
(not the train server's: a job of a warm server already forks every worker from the server's).
It serves once its imports are done (:meth:`StandbyZygote.wait_ready`); a zygote that cannot serve
here (no ``/proc`` environment marking, say) says so at once, and the pool starts fresh processes
as before. :meth:`StandbyZygote.close` ends it; the pool does so once its last forked worker is
reaped.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import tempfile
import time

from trainforge._internal import zygote
from trainforge._internal.zygote.launcher import TMP_PREFIX


class StandbyZygote:
    """A zygote importing ``preload`` in the environment ``env`` (the one the pool spawns workers with)."""

    def __init__(self, preload: tuple[str, ...], env: dict[str, str]):
        self.preload = preload
        self._dir = tempfile.mkdtemp(prefix=TMP_PREFIX)
        self.path = os.path.join(self._dir, "z.sock")
        self._ready: bool | None = None  # None: still importing
        try:
            self.proc, self._ready_fd = zygote.launch(self.path, log_path=os.devnull, preload=preload, env=env)
        except BaseException:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def serving(self) -> bool:
        """Whether :meth:`wait_ready` saw it serve."""
        return self._ready is True

    def wait_ready(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for it to serve; False if it will not (or not in time).
        Called by one thread (the pool's warmer) until it returns."""
        if self._ready is not None:
            return self._ready
        deadline = time.monotonic() + timeout
        line = b""
        while not line.endswith(b"\n"):
            ready, _, _ = select.select([self._ready_fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return False  # not in time: maybe later
            chunk = os.read(self._ready_fd, 64)
            if not chunk:
                break  # EOF without the line: it will not serve
            line += chunk
        self._ready = line.startswith(b"ready")
        os.close(self._ready_fd)
        return self._ready

    def kill(self) -> None:
        """SIGKILL it (not its forked workers: each has a session of its own); a :meth:`wait_ready`
        under way returns False."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        """Kill it and remove its socket (once no thread is in :meth:`wait_ready`)."""
        self.kill()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILLed
            pass
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        if self._ready is None:
            os.close(self._ready_fd)
            self._ready = False
        shutil.rmtree(self._dir, ignore_errors=True)
