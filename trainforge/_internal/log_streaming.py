"""Stream a worker's stdout/stderr to the driver, line by line, prefixed with its rank, and to a log file."""

from __future__ import annotations

import collections
import sys
import threading
from collections.abc import Callable
from typing import IO, Any


class LogStreamer:
    """Reads one pipe in a thread. Until ``assign`` gives it a rank, lines are held back (a standby
    worker has no rank yet); afterwards each line goes to the rank's log file, the driver's stream
    (prefixed ``(rank=1 pid=4242)``), a short in-memory tail used in failure messages, and
    ``on_line`` (progress for hang detection)."""

    def __init__(self, pipe: IO[bytes], target: str):
        self._pipe = pipe
        self._target = target  # "stdout" or "stderr" of the driver
        self._lock = threading.Lock()
        self._held: list[bytes] = []
        self._assigned = False
        self._prefix = ""
        self._log_file: Any = None
        self._file_lock: threading.Lock | None = None
        self._tail: collections.deque | None = None
        self._to_driver = False
        self._on_line: Callable[[], None] | None = None
        self.thread = threading.Thread(target=self._run, name="trainforge-log", daemon=True)
        self.thread.start()

    def assign(
        self,
        rank: int,
        pid: int,
        log_file: IO[bytes],
        file_lock: threading.Lock,
        tail: collections.deque,
        to_driver: bool,
        on_line: Callable[[], None] | None = None,
    ) -> None:
        with self._lock:
            self._prefix = f"(rank={rank} pid={pid}) "
            self._log_file, self._file_lock, self._tail = log_file, file_lock, tail
            self._to_driver, self._on_line = to_driver, on_line
            self._assigned = True
            held, self._held = self._held, []
            for raw in held:
                self._emit(raw)

    def _run(self) -> None:
        for raw in iter(self._pipe.readline, b""):
            if not raw.endswith(b"\n"):
                raw += b"\n"
            with self._lock:
                if self._assigned:
                    self._emit(raw)
                else:
                    self._held.append(raw)
        try:
            self._pipe.close()
        except OSError:
            pass

    def _emit(self, raw: bytes) -> None:
        line = raw.decode("utf-8", errors="replace")
        if self._on_line is not None:
            self._on_line()
        assert self._file_lock is not None and self._tail is not None
        with self._file_lock:
            try:
                self._log_file.write(raw)
                self._log_file.flush()
            except ValueError:  # file closed during shutdown
                pass
            self._tail.append(line)
        if self._to_driver:
            stream = sys.stdout if self._target == "stdout" else sys.stderr
            try:
                stream.write(self._prefix + line)
                stream.flush()
            except (ValueError, OSError):
                pass

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)
