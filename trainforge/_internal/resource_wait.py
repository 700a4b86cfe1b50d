"""``ResourceWait``: how long the controller's SCHEDULING state waits for the scaling policy to find
room for at least the minimum number of workers (``$TRAINFORGE_RESOURCE_WAIT_S``) before the run
fails with :class:`ResourcesUnavailable`."""

from __future__ import annotations

import logging
import time

from trainforge._internal import constants
from trainforge._internal.scaling_policy import ScalingPolicy

logger = logging.getLogger("trainforge")


class ResourcesUnavailable(Exception):
    """Waited longer than ``$TRAINFORGE_RESOURCE_WAIT_S`` and the minimum group still does not fit."""


class ResourceWait:
    """One wait at a time: :meth:`size` is the group size to start now, or None (after a short
    sleep, to poll the resource view) while waiting; the first None logs what is missing."""

    def __init__(self) -> None:
        self._waiting_since: float | None = None

    def size(self, scaling: ScalingPolicy) -> int | None:
        n = scaling.size_now()
        if n is not None:
            self._waiting_since = None
            return n
        now = time.monotonic()
        if self._waiting_since is None:
            self._waiting_since = now
            logger.warning("waiting for resources: %s", scaling.shortage())
        if now - self._waiting_since > constants.resource_wait_s():
            raise ResourcesUnavailable(
                f"gave up waiting {constants.resource_wait_s():.0f}s for resources: {scaling.shortage()}. "
                f"Lower the minimum of ScalingConfig.num_workers, free resources, or raise "
                f"${constants.ENV_RESOURCE_WAIT_S}."
            )
        time.sleep(min(1.0, constants.resource_wait_s()))  # poll the resource view
        return None
