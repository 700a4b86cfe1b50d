"""A rank's background checkpoint uploader (``CheckpointUploadMode.ASYNC``).

``report(..., checkpoint_upload_mode=ASYNC)`` copies the checkpoint files to a local temporary
directory and hands the upload to this thread; the thread stages them in storage and only then
sends the report message (with ``wait=True``: once sent, it reaches the driver even if the worker
dies right after). Jobs run one at a time, in submission order.

While any job is queued or running the uploader is *busy*, and every other message of the rank
(metrics-only reports, synchronous checkpoint reports) must go through it too, so the driver
receives the rank's reports in report order: that keeps checkpoint order, top-k retention and the
final Result correct. A failed upload stops the uploader: the jobs behind it are dropped, and the
error is raised in the train loop at its next ``report()`` and when the loop ends.
"""

from __future__ import annotations

import queue
import shutil
import threading
from collections.abc import Callable


class Uploader:
    """One background thread running (work, message) jobs in order. ``send(msg, wait=...)`` is the
    worker channel's send."""

    def __init__(self, send: Callable[..., None]):
        self._send = send
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._cond = threading.Condition()
        self._pending = 0
        self.error: BaseException | None = None
        self._dropping = False
        self._thread: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        """True while a job is queued or running (then all of the rank's messages must come here)."""
        return self._pending > 0

    def submit(
        self, msg: tuple, work: Callable[[], None] | None = None, local_dir: str | None = None
    ) -> None:
        """Queue ``work()`` (may be None) followed by ``send(msg)``; ``local_dir`` is removed after."""
        self.raise_if_failed()
        with self._cond:
            self._pending += 1
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="trainforge-uploader", daemon=True)
            self._thread.start()
        self._jobs.put((msg, work, local_dir))

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            msg, work, local_dir = job
            try:
                if self.error is None and not self._dropping:
                    if work is not None:
                        work()
                    # A checkpoint report must be in the socket before the job counts as done.
                    self._send(msg, wait=work is not None)
            except BaseException as exc:  # noqa: BLE001 - raised in the train loop
                self.error = exc
            finally:
                if local_dir is not None:
                    shutil.rmtree(local_dir, ignore_errors=True)
                with self._cond:
                    self._pending -= 1
                    self._cond.notify_all()

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error

    def drain(self) -> None:
        """Wait until every queued job is done; raise the error of a failed upload."""
        with self._cond:
            self._cond.wait_for(lambda: self._pending == 0)
        self.raise_if_failed()

    def close(self, wait: bool) -> None:
        """Stop the thread: after the queued jobs (``wait``, raising a failed upload's error), or
        dropping them (the train loop failed: its reports no longer matter)."""
        if self._thread is None:
            return
        try:
            if wait:
                self.drain()
        finally:
            self._dropping = True
            self._jobs.put(None)
