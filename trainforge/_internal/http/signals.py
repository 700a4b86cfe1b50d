"""Signals of a trainforge HTTP server run in the foreground."""

from __future__ import annotations

from typing import Any


def exit_on_signal(signum: int, frame: Any) -> None:
    """A SIGTERM handler (``signal.signal(signal.SIGTERM, exit_on_signal)``): uvicorn re-raises the
    signal once it has shut down; this turns it into ``SystemExit(0)``, so the caller's ``finally``
    runs (files removed, "stopped" printed) instead of the process being killed outright."""
    raise SystemExit(0)
