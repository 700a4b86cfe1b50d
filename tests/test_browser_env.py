"""The real-browser test environment: Debian's Chromium under Playwright (the ``page`` fixture and its
error check), and the vendored front-end files the dashboard serves, checked against VENDORED.md."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from urllib.parse import quote

import pytest

import trainforge.server
from trainforge._testing.browser import PageErrors, open_page

UPLOT = Path(trainforge.server.__file__).parent / "pages" / "static" / "vendor" / "uplot"


def data_url(html: str) -> str:
    return "data:text/html," + quote(html)


def test_page_loads_html_and_evaluates_js(page):
    page.goto(data_url("<title>env</title><p id=x>hello</p><script>console.log('not an error')</script>"))
    assert page.title() == "env"
    assert page.evaluate("document.getElementById('x').textContent") == "hello"
    assert page.evaluate("[1, 2, 3].map(x => x * 2)") == [2, 4, 6]


def test_console_errors_and_uncaught_exceptions_fail_the_page(chromium):
    # The ``page`` fixture's teardown is this context manager's exit, so asserting that it raises
    # proves the fixture would fail such a test.
    with pytest.raises(AssertionError) as failed:
        with open_page(chromium) as page:
            page.goto(data_url("<script>console.error('boom', 42); null.x</script>"))
    message = str(failed.value)
    assert "2 error(s)" in message, message
    assert "console error: boom 42" in message, message
    assert "uncaught exception: TypeError" in message, message


def test_errors_after_load_are_caught_at_exit(chromium):
    with pytest.raises(AssertionError, match="late"):
        with open_page(chromium) as page:
            page.goto(data_url("<p>ok</p>"))
            page.evaluate("setTimeout(() => { throw new Error('late') }, 0)")
            page.wait_for_timeout(50)


def test_allowed_errors_pass_and_the_others_still_fail(chromium):
    errors = PageErrors()
    errors.allow(r"status of 401")
    with pytest.raises(AssertionError) as failed:
        with open_page(chromium, errors) as page:
            page.goto(data_url("<script>console.error('the status of 401'); console.error('other')</script>"))
    assert "1 error(s)" in str(failed.value) and "other" in str(failed.value), failed.value
    assert len(errors.messages) == 2


def test_page_fixture_takes_allowed_errors(page, page_errors):
    page_errors.allow(r"^console error: expected$")
    page.goto(data_url("<script>console.error('expected')</script>"))
    assert page_errors.messages == ["console error: expected"]


def test_page_runs_vendored_uplot(page):
    """The vendored uPlot loads in Chromium (no console errors) and draws a chart."""
    js = (UPLOT / "uPlot.iife.min.js").read_text()
    page.set_content("<div id=chart></div>")
    page.add_style_tag(content=(UPLOT / "uPlot.min.css").read_text())
    page.add_script_tag(content=js)
    page.evaluate(
        """() => new uPlot({width: 400, height: 200, series: [{}, {label: "loss", stroke: "red"}]},
                          [[1, 2, 3], [0.9, 0.5, 0.3]], document.getElementById("chart"))"""
    )
    assert page.locator("#chart canvas").count() == 1
    assert page.evaluate("typeof uPlot.paths.spline") == "function"


def _vendored_table() -> dict[str, str]:
    """VENDORED.md's ``| `file` | ... | `sha256` |`` rows: {file: sha256}."""
    rows = re.findall(r"^\| `([^`]+)` \|.*\| `([0-9a-f]{64})` \|$", (UPLOT / "VENDORED.md").read_text(), re.M)
    return dict(rows)


def test_vendored_files_match_vendored_md():
    table = _vendored_table()
    present = {p.name for p in UPLOT.iterdir()} - {"VENDORED.md"}
    assert present == set(table), f"files in {UPLOT} and VENDORED.md's table differ: {present ^ set(table)}"
    for name, expected in table.items():
        actual = hashlib.sha256((UPLOT / name).read_bytes()).hexdigest()
        assert actual == expected, f"{UPLOT / name} changed: sha256 {actual}, VENDORED.md says {expected}"


def test_vendored_md_names_the_shipped_version():
    version = re.search(r"^# uPlot (\S+),", (UPLOT / "VENDORED.md").read_text(), re.M)
    assert version is not None
    banner = (UPLOT / "uPlot.iife.min.js").read_text()[:200]
    assert f"(v{version.group(1)})" in banner, banner
