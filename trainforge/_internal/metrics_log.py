"""The run's metrics history (every report of rank 0), kept in memory and in ``metrics.jsonl``."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from trainforge._internal.state_files import data_modes
from trainforge._internal.storage import METRICS_FILE, StorageContext, dumps

_FLUSH_INTERVAL_S = 1.0


class MetricsLog:
    def __init__(self, storage: StorageContext):
        self._storage = storage
        self.rows: list[dict[str, Any]] = []
        self._unwritten: list[str] = []
        self._last_flush = time.monotonic()
        text = storage.read_text(METRICS_FILE)
        if text:
            self.rows = [json.loads(line) for line in text.splitlines() if line.strip()]

    def append(self, metrics: dict[str, Any]) -> None:
        self.rows.append(metrics)
        self._unwritten.append(dumps(metrics))
        if time.monotonic() - self._last_flush > _FLUSH_INTERVAL_S:
            self.flush()

    def flush(self) -> None:
        self._last_flush = time.monotonic()
        if not self._unwritten:
            return
        if self._storage.is_local:  # one append, as bytes: no text layer (this runs before each commit)
            fd = os.open(self._storage.path(METRICS_FILE), os.O_WRONLY | os.O_APPEND | os.O_CREAT, data_modes().file)
            try:
                data = ("\n".join(self._unwritten) + "\n").encode()
                while data:
                    data = data[os.write(fd, data):]
            finally:
                os.close(fd)
        else:  # object stores cannot append: rewrite the whole file
            self._storage.write_text(METRICS_FILE, "".join(dumps(r) + "\n" for r in self.rows))
        self._unwritten = []

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` rows (a restart continues the history from its checkpoint)."""
        if n >= len(self.rows):
            return
        self.flush()
        self.rows = self.rows[:n]
        self._storage.write_text(METRICS_FILE, "".join(dumps(r) + "\n" for r in self.rows))
