"""Stream a worker's stdout/stderr to the driver, line by line, prefixed with its rank, and to a log file."""

from __future__ import annotations

import collections
import sys
import threading
from collections.abc import Callable
from typing import IO, Any


class LogStreamer:
    """Reads one pipe in a thread; each line goes to the rank's log file, the driver's stream
    (prefixed ``(rank=1 pid=4242)``) and a short in-memory tail used in failure messages."""

    def __init__(
        self,
        pipe: IO[bytes],
        rank: int,
        pid: int,
        log_file: IO[bytes],
        lock: threading.Lock,
        tail: collections.deque,
        to_driver: Any | None,
        on_line: Callable[[], None] | None = None,
    ):
        self._pipe = pipe
        self._prefix = f"(rank={rank} pid={pid}) "
        self._log_file = log_file
        self._lock = lock
        self._tail = tail
        self._to_driver = to_driver  # "stdout" / "stderr" / None
        self._on_line = on_line
        self.thread = threading.Thread(target=self._run, name=f"trainforge-log-{rank}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        for raw in iter(self._pipe.readline, b""):
            if not raw.endswith(b"\n"):
                raw += b"\n"
            line = raw.decode("utf-8", errors="replace")
            if self._on_line is not None:
                self._on_line()
            with self._lock:
                try:
                    self._log_file.write(raw)
                    self._log_file.flush()
                except ValueError:  # file closed during shutdown
                    pass
                self._tail.append(line)
            if self._to_driver is not None:
                stream = sys.stdout if self._to_driver == "stdout" else sys.stderr
                try:
                    stream.write(self._prefix + line)
                    stream.flush()
                except (ValueError, OSError):
                    pass
        try:
            self._pipe.close()
        except OSError:
            pass

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)
