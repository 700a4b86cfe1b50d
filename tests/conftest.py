"""Shared fixtures. Every test runs with its own storage path and fails if it leaks child processes."""

from __future__ import annotations

import os

import psutil
import pytest


@pytest.fixture(autouse=True)
def _isolated_storage(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFORGE_STORAGE_PATH", str(tmp_path / "results"))
    monkeypatch.setenv("TRAINFORGE_SHUTDOWN_GRACE_S", "3")
    yield


@pytest.fixture(autouse=True)
def _no_leftover_processes():
    """Fail any test that leaves a child process (a worker, or a worker's child) behind."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    leftover = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    if not leftover:
        return
    gone, alive = psutil.wait_procs(leftover, timeout=5)
    for p in alive:
        p.kill()
    assert not alive, f"test left processes behind: {[(p.pid, p.cmdline()) for p in alive]}"


os.environ.setdefault("PYTHONFAULTHANDLER", "1")
