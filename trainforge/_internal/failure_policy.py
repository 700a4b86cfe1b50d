"""Decide what to do after a worker failure: restart the group or give up."""

from __future__ import annotations

import enum
import logging

from trainforge._internal.config import FailureConfig

logger = logging.getLogger("trainforge")


class FailureDecision(enum.Enum):
    RESTART = "restart"
    RAISE = "raise"


class FailurePolicy:
    def __init__(self, config: FailureConfig):
        self.config = config

    def allows(self, failures: int) -> bool:
        """Would a restart be allowed after ``failures`` failures?"""
        limit = self.config.max_failures
        return limit == -1 or failures <= limit

    def decide(self, failures_so_far: int) -> FailureDecision:
        """``failures_so_far`` counts the failure being decided on."""
        limit = self.config.max_failures
        if limit == -1 or failures_so_far <= limit:
            logger.info("failure %d of %s allowed: restarting the worker group", failures_so_far,
                        "unlimited" if limit == -1 else limit)
            return FailureDecision.RESTART
        return FailureDecision.RAISE
