"""``Alarm``: the scheduler's one timer. The scheduler decides on events (a submission, a job's end,
...); a rule that depends on time alone (a preemptible job passing its exemption while an urgent job
waits) would otherwise wait for an unrelated event. After each decision the service arms the alarm
at the next moment a policy's answer could change (:meth:`PolicySet.next_change
<trainforge.server.scheduling.policy.PolicySet.next_change>`), and it decides again then.

One daemon thread, started the first time the alarm is armed, waits on a condition: with nothing
armed it sleeps until armed (no wake-ups on an idle server); re-arming moves the moment. Firing
disarms it: the callback (a decision) arms it again if something still waits for a moment.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)


_SLACK_S = 0.01  # fire this long after the moment: the rule reads "at least exempt_s", never just under


class Alarm:
    """Calls ``callback()`` at the moment last given to :meth:`arm` (seconds since the epoch, as
    ``clock`` tells them)."""

    def __init__(self, callback: Callable[[], None], *, name: str = "tf-scheduler-alarm",
                 clock: Callable[[], float] = time.time):  # fmt: skip
        self._callback = callback
        self._name = name
        self._clock = clock
        self._cond = threading.Condition()
        self._at: float | None = None
        self._closed = False
        self._thread: threading.Thread | None = None
        self.fired = 0  # how many times it called back (for tests and /metrics)

    @property
    def at(self) -> float | None:
        """The moment it is armed for (None: disarmed)."""
        with self._cond:
            return self._at

    def arm(self, at: float | None) -> None:
        """Call back at ``at`` (None: disarm)."""
        with self._cond:
            if self._closed or at == self._at:
                return
            self._at = at
            if at is not None and self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name=self._name)
                self._thread.start()
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (self._at is None or self._clock() < self._at + _SLACK_S):
                    self._cond.wait(None if self._at is None else self._at + _SLACK_S - self._clock())
                if self._closed:
                    return
                self._at = None
            self.fired += 1
            try:
                self._callback()
            except Exception:  # noqa: BLE001 - a thread of its own: say what failed, keep the alarm
                logger.exception("the scheduler's alarm")
