"""A local fsspec filesystem whose uploads (``put``) are slowed to a given bandwidth.

Used by ``bench_recovery.py`` to show what asynchronous checkpoint uploads buy when storage is slower
than a local copy (on a local disk an upload is just a copy). It lives in its own module so that the
worker processes unpickle it by reference (they get the driver's ``sys.path``, which holds ``bench/``).
"""

from __future__ import annotations

import os
import time
from typing import Any

from fsspec.implementations.local import LocalFileSystem


class SlowLocalFileSystem(LocalFileSystem):
    """Local disk, but ``put_file`` takes at least ``bytes / (mbps * 1e6)`` seconds.

    The protocol is not ``file``, so trainforge treats it as remote storage (uploads go through ``put``).
    """

    protocol = ("slowfile",)

    def __init__(self, mbps: float = 200.0, **kwargs: Any):
        super().__init__(**kwargs)
        self.mbps = float(mbps)

    def put_file(self, path1: Any, path2: Any, callback: Any = None, **kwargs: Any) -> None:
        t0 = time.perf_counter()
        size = os.path.getsize(path1) if os.path.isfile(path1) else 0
        out = super().put_file(path1, path2, callback=callback, **kwargs)
        remaining = size / (self.mbps * 1e6) - (time.perf_counter() - t0)
        if remaining > 0:
            time.sleep(remaining)
        return out
