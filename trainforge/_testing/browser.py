"""Real-browser helpers: Debian's Chromium driven by Playwright's sync API.

tests/conftest.py builds the ``chromium`` (session) and ``page`` fixtures from these, and
bench/bench_dashboard.py drives its pages with them. Playwright's own browser
download is never used (it cannot be fetched on CI): tests launch ``/usr/bin/chromium``, which
``bash scripts/setup.sh dev`` installs. Playwright is imported lazily, so a checkout without it still
collects; a test that needs the browser then errors with the fix (never a skip).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

import psutil

if TYPE_CHECKING:
    from playwright.sync_api import Browser, ConsoleMessage, Error, Page, Playwright

CHROMIUM = "/usr/bin/chromium"


class BrowserUnavailable(RuntimeError):
    """Playwright or Chromium is missing; the message says how to install it."""


class BrowserSession:
    """A Playwright driver and one headless Chromium launched through it.

    ``driver_pid`` is the root of every process the session starts: the Playwright driver (node), whose
    child is Chromium, whose children are its zygotes, renderers and GPU process. Renderers come and go
    with pages, so the process-leak check excludes the whole tree under this pid, not a snapshot of it.
    """

    def __init__(self, playwright: Playwright, browser: Browser, driver_pid: int) -> None:
        self.playwright = playwright
        self.browser = browser
        self.driver_pid = driver_pid

    @classmethod
    def start(cls, executable: str = CHROMIUM) -> BrowserSession:
        try:
            from playwright.sync_api import sync_playwright
        except ImportError as exc:
            raise BrowserUnavailable(
                "Playwright is not installed in this environment: run `bash scripts/setup.sh dev` "
                "(requirements-dev.txt pins it)"
            ) from exc
        if not os.access(executable, os.X_OK):
            raise BrowserUnavailable(
                f"{executable} is missing (the browser tests use Debian's Chromium, not Playwright's "
                "download): run `bash scripts/setup.sh dev` as root (it runs `apt-get install -y chromium`), "
                "or `sudo apt-get update && sudo apt-get install -y chromium`"
            )
        me = psutil.Process()
        before = {p.pid for p in me.children()}
        playwright = sync_playwright().start()
        (driver_pid,) = [p.pid for p in me.children() if p.pid not in before and _is_driver(p)]
        # As root Chromium refuses to start with its sandbox; CI runs as root.
        args = ["--no-sandbox"] if os.geteuid() == 0 else []
        try:
            browser = playwright.chromium.launch(executable_path=executable, headless=True, args=args)
        except BaseException:
            playwright.stop()
            raise
        return cls(playwright, browser, driver_pid)

    def processes(self) -> list[psutil.Process]:
        """The driver and all its descendants that are still there."""
        try:
            driver = psutil.Process(self.driver_pid)
            return [driver, *driver.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def stop(self) -> None:
        """Close the browser and the driver; raise if any of their processes is still there 5 s later
        (those are killed first)."""
        processes = self.processes()
        try:
            self.browser.close()
        finally:
            self.playwright.stop()
        _, alive = psutil.wait_procs(processes, timeout=5)
        for p in alive:
            p.kill()
        assert not alive, f"browser processes outlived the browser session: {[p.pid for p in alive]}"


class PageErrors:
    """What went wrong in a page, as text: ``console.error`` messages (Chromium logs a failed load, a
    4xx or 5xx included, as one), uncaught exceptions, a crash. A test that expects one says so with
    ``allow(regex)``, e.g. ``allow("status of 401")`` before opening a page without its token."""

    def __init__(self) -> None:
        self.messages: list[str] = []
        self._allowed: list[re.Pattern[str]] = []

    def attach(self, page: Page) -> None:
        page.on("console", self._on_console)
        page.on("pageerror", self._on_pageerror)
        page.on("crash", lambda _: self.messages.append("the page crashed"))

    def allow(self, pattern: str) -> None:
        """Messages that ``re.search(pattern, message)`` matches are expected: ``check`` ignores them."""
        self._allowed.append(re.compile(pattern))

    def _on_console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            where = message.location  # no url for an inline script of a data: page
            at = f" at {_short(where['url'])}:{where.get('lineNumber')}" if where.get("url") else ""
            self.messages.append(f"console error{at}: {message.text}")

    def _on_pageerror(self, error: Error) -> None:
        self.messages.append(f"uncaught exception: {error.stack or f'{error.name}: {error.message}'}")

    def unexpected(self) -> list[str]:
        return [m for m in self.messages if not any(a.search(m) for a in self._allowed)]

    def check(self) -> None:
        """Raise AssertionError listing the errors not allowed, if there were any."""
        if errors := self.unexpected():
            listed = "\n".join(f"  {m}" for m in errors)
            raise AssertionError(f"the page reported {len(errors)} error(s):\n{listed}")


@contextlib.contextmanager
def open_page(browser: Browser, errors: PageErrors | None = None) -> Iterator[Page]:
    """A page in a fresh context (its own cookies and storage), closed on exit. On a normal exit it
    raises AssertionError if the page logged a console error, threw an uncaught exception or crashed
    (recorded in ``errors``, where a caller may allow some)."""
    from playwright.sync_api import Error as PlaywrightError

    errors = PageErrors() if errors is None else errors
    context = browser.new_context()
    try:
        page = context.new_page()
        errors.attach(page)
        yield page
        if not page.is_closed():
            with contextlib.suppress(PlaywrightError):
                page.evaluate("0")  # a round trip: events the page sent before it have been delivered
    finally:
        context.close()
    errors.check()


def _short(url: str, limit: int = 80) -> str:
    """A URL for a message: a data: URL holds the whole page."""
    return url if len(url) <= limit else url[: limit - 3] + "..."


def _is_driver(p: psutil.Process) -> bool:
    """Playwright's driver: ``.../playwright/driver/node .../cli.js run-driver``."""
    try:
        return "run-driver" in p.cmdline()
    except psutil.Error:
        return False
