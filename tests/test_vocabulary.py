"""One vocabulary per concept (issue 35): each of these has one definition that every part takes, and
no module keeps a copy. The trial state, the run outcome and the worker count have tests of their own
(test_trial_state.py, test_run_outcome.py, test_server_jobs.py)."""

from __future__ import annotations

import os
import re
import socket

import pytest

import trainforge
from trainforge._internal import amounts, http
from trainforge._internal.constants import API_PREFIX

ROOT = os.path.dirname(trainforge.__file__)


def _sources(*exts: str) -> dict[str, str]:
    out = {}
    for directory, _, files in os.walk(ROOT):
        for name in files:
            if name.endswith(exts) and "vendor" not in directory:
                path = os.path.join(directory, name)
                with open(path, encoding="utf-8") as f:
                    out[os.path.relpath(path, ROOT)] = f.read()
    return out


def test_the_api_prefix_is_written_once():
    """The client, the server's app, routes, audit and pages take API_PREFIX; the pages' scripts get it
    from the page (data-api)."""
    quoted = re.compile(r"""(?<!`)["']/api/v1""")  # a string literal (not ``/api/v1`` in a docstring)
    holders = sorted(path for path, text in _sources(".py", ".js").items() if quoted.search(text))
    assert holders == [os.path.join("_internal", "constants.py")], holders
    assert API_PREFIX == "/api/v1"


def test_safe_methods_are_the_guards():
    pytest.importorskip("fastapi")
    from trainforge.server.routes import access
    from trainforge.server.team import audit

    assert access.SAFE_METHODS is audit.SAFE_METHODS is http.SAFE_METHODS == {"GET", "HEAD", "OPTIONS"}
    defined = [path for path, text in _sources(".py").items() if re.search(r"^SAFE_METHODS\s*=", text, re.M)]
    assert defined == [os.path.join("_internal", "http", "guard.py")]


def test_both_servers_take_one_allowed_host_rule():
    from trainforge.serve import ServeConfig
    from trainforge.serve._server import allowed_hosts

    assert http.allowed_hosts("127.0.0.1") == {"127.0.0.1", "localhost", "::1"}
    assert http.allowed_hosts("10.1.2.3", ["Models.Example"]) == {"127.0.0.1", "localhost", "::1", "10.1.2.3",
                                                                   "models.example"}  # fmt: skip
    wild = http.allowed_hosts("0.0.0.0")
    assert socket.gethostname().lower() in wild and "0.0.0.0" in wild
    config = ServeConfig(host="10.1.2.3", token="t" * 32, allowed_hosts=("a.example",))
    assert allowed_hosts(config) == http.allowed_hosts("10.1.2.3", ["a.example"])
    with open(os.path.join(ROOT, "server", "_main.py"), encoding="utf-8") as f:
        assert "http.allowed_hosts(config.host)" in f.read()  # the train server's guard: the same rule
    loopback_sets = [path for path, text in _sources(".py").items() if re.search(r"""\{"127\.0\.0\.1", "localhost", "::1\"""", text)]
    assert loopback_sets == [os.path.join("_internal", "http", "guard.py")], loopback_sets  # nobody keeps a copy


def test_one_number_formatter():
    assert amounts.fmt_number(2.0) == "2" and amounts.fmt_number(0.5) == "0.5" and amounts.fmt_number(1e6) == "1e+06"
    assert amounts.fmt_amount("memory", 2.3129e10) == "21.5 GiB" and amounts.fmt_amount("CPU", 2.0) == "2"
    assert amounts.size_text(64 * 2**20) == "64 MiB (67108864 bytes)" and http.size_text is amounts.size_text
    copies = [path for path, text in _sources(".py").items()
              if re.search(r"^def (_num|_fmt_number|fmt_bytes|fmt_amount|fmt_resources|size_text)\(", text, re.M)]
    assert copies == [os.path.join("_internal", "amounts.py")], copies


def test_metrics_are_shown_by_one_rule():
    assert amounts.fmt_metric(0.123456) == "0.1235" and amounts.fmt_metric(12345.6) == "1.235e+04"
    copies = [path for path, text in _sources(".py").items() if ":.4g}" in text]
    assert copies == [os.path.join("_internal", "amounts.py")], copies


def test_no_private_name_of_these_is_imported_across_modules():
    """``from x import _num`` was how the scheduler reached the decision's formatter."""
    private = re.compile(r"^from trainforge\S* import .*\b(_num|_display|_fmt_resources)\b", re.M)
    assert [path for path, text in _sources(".py").items() if private.search(text)] == []
