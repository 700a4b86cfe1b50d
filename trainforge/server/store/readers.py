"""``ReaderPool``: the train server store's reader connections to its SQLite database (at most
``size``, lent one at a time; see :mod:`trainforge.server.store.database`)."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator


class ReaderPool:
    """At most ``size`` connections from ``connect``, opened when first needed, one lent per
    :meth:`lend`; a thread that finds them all lent waits for one. After :meth:`close`, lending
    raises and a connection given back is closed."""

    def __init__(self, connect: Callable[[], sqlite3.Connection], size: int):
        if size < 1:
            raise ValueError(f"a reader pool needs at least 1 connection, not {size}")
        self._connect = connect
        self.size = size
        self.opened = 0  # connections open now, lent or idle
        self.peak = 0  # the most ever open at once
        self._idle: list[sqlite3.Connection] = []
        self._cond = threading.Condition()
        self._closed = False

    @contextlib.contextmanager
    def lend(self) -> Iterator[sqlite3.Connection]:
        conn = self._take()
        try:
            yield conn
        finally:
            self._give_back(conn)

    def _take(self) -> sqlite3.Connection:
        with self._cond:
            while True:
                if self._closed:
                    raise sqlite3.ProgrammingError("Cannot operate on a closed database (the JobStore was closed).")
                if self._idle:
                    return self._idle.pop()
                if self.opened < self.size:
                    self.opened += 1  # this slot is ours: connect outside the lock
                    self.peak = max(self.peak, self.opened)
                    break
                self._cond.wait()
        try:
            return self._connect()
        except BaseException:
            with self._cond:
                self.opened -= 1
                self._cond.notify()
            raise

    def _give_back(self, conn: sqlite3.Connection) -> None:
        with self._cond:
            if not self._closed:
                self._idle.append(conn)
                self._cond.notify()
                return
            self.opened -= 1
        conn.close()

    def close(self) -> None:
        """Close the idle connections now, the lent ones when they come back; wake the waiters."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self.opened -= len(idle)
            self._cond.notify_all()
        for conn in idle:
            conn.close()
