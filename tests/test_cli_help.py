"""The ``trainforge`` CLI as a whole: every command's help ends with the docs page about it, and a
reader that goes away (``trainforge ... | head``) ends a command quietly, as ``ps`` does. (That the
pages and anchors named exist: tests/test_docs.py.)"""

from __future__ import annotations

import os
import subprocess
import sys

from trainforge._cli import DOCS, build_parser, commands, docs_epilog, docs_page


def test_every_commands_help_ends_with_its_docs_page():
    parser = build_parser()
    found = dict(commands(parser))
    # Each command (each top-level one, and `server users` whose page differs from its parent's) is
    # named in the map: a new command needs its page, not its parent's by accident.
    for path in found:
        if len(path) == 1 or path == ("server", "users"):
            assert path in DOCS, f"`trainforge {' '.join(path)}` has no docs page in trainforge/_cli.py DOCS"
    expected = {
        (): "docs/index.md",
        ("server", "start"): "docs/server.md#start-it",
        ("server", "stop"): "docs/server.md#start-it",
        ("server", "users", "add"): "docs/team-server.md#users-and-roles",
        ("jobs",): "docs/server.md#submit-and-manage-jobs",
        ("logs",): "docs/server.md#submit-and-manage-jobs",
        ("dashboard",): "docs/dashboard.md",
        ("models", "alias", "set"): "docs/registry.md",
        ("serve",): "docs/serving.md",
        ("experiments", "import"): "docs/experiments.md",
        ("train",): "docs/model-lifecycle.md",
    }
    for path, page in expected.items():
        assert docs_page(path) == page, path
    for path, p in found.items():  # one epilog, from one helper, in every command's help
        assert p.epilog == docs_epilog(docs_page(path)), path
        assert " ".join(p.format_help().split()).endswith(docs_epilog(docs_page(path))), path


def test_help_in_a_shell_names_the_page():
    out = subprocess.run([sys.executable, "-m", "trainforge", "jobs", "--help"], capture_output=True, text=True,
                         timeout=60, check=True).stdout  # fmt: skip
    assert out.rstrip().endswith("docs: docs/server.md#submit-and-manage-jobs (or `mkdocs serve`)")


def test_a_closed_pipe_ends_a_command_quietly(tmp_path):
    """``trainforge ... | head`` once head has gone: no traceback, no ``[Errno 32] Broken pipe``; the exit
    status of a process ended by SIGPIPE (as ``ps`` gives). A server-side listing: tests/test_server_cli.py."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line: every write fails
    try:
        for args in (["--help"], ["models", "list", "--registry", str(tmp_path / "registry")]):
            r = subprocess.run([sys.executable, "-m", "trainforge", *args], stdout=write, stderr=subprocess.PIPE,
                               stdin=subprocess.DEVNULL, text=True, timeout=60)  # fmt: skip
            assert r.stderr == "", (args, r.stderr)
            assert r.returncode in (0, 141), (args, r.returncode)
    finally:
        os.close(write)


def _trainforge(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainforge", *args], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=60)  # fmt: skip


def test_a_bad_resources_value_says_the_format_and_the_value():
    # Every resources option reads its value one way, and says the format when it is wrong (not
    # argparse's "invalid parse_resources value", an internal name).
    from trainforge._internal.key_values import resources_arg

    options = {(path, a.option_strings[0]) for path, p in commands(build_parser()) for a in p._actions
               if a.type is resources_arg}  # fmt: skip
    assert {(("submit",), "--resources"), (("server", "start"), "--capacity"), (("server", "start"), "--reserve"),
            (("server", "start"), "--default-quota")} <= options, options  # fmt: skip
    for args, option, word in ((("submit", "--resources", "GPU=x", "x.py"), "--resources", "'GPU=x': 'x'"),
                               (("server", "start", "--capacity", "CPU=two"), "--capacity", "'CPU=two': 'two'"),
                               (("server", "start", "--reserve", "CPU"), "--reserve", "'CPU' is not KIND=AMOUNT")):
        r = _trainforge(*args)
        last = r.stderr.splitlines()[-1]
        assert r.returncode == 2 and f"argument {option}: {word}" in last, r.stderr
        assert "KIND=AMOUNT[,KIND=AMOUNT...], e.g. CPU=4,GPU=1" in last and "parse_resources" not in last, last
    r = _trainforge("server", "start", "--half-life", "soon")
    assert "argument --half-life: 'soon': give a duration such as 90" in r.stderr, r.stderr


def test_a_mistyped_command_or_choice_says_the_nearest_one():
    r = _trainforge("sumbit", "x.py")
    last = r.stderr.splitlines()[-1]
    assert r.returncode == 2 and last.startswith("trainforge: error: argument command: invalid choice: 'sumbit': "
                                                 "did you mean 'submit'? (choose from 'server', "), last  # fmt: skip
    r = _trainforge("server", "strat")
    assert "trainforge server: error: argument server_command: invalid choice: 'strat': did you mean 'start'?" in r.stderr
    r = _trainforge("server", "start", "--job-isolation", "usrns")
    assert "invalid choice: 'usrns': did you mean 'userns'? (choose from 'auto', 'uid', 'userns', 'off')" in r.stderr
    r = _trainforge("frobnicate")  # nothing close: no guess
    assert "invalid choice: 'frobnicate' (choose from " in r.stderr and "did you mean" not in r.stderr, r.stderr


def test_an_unknown_option_of_a_subcommand_shows_that_subcommands_usage():
    r = _trainforge("submit", "--wokers", "2", "x.py")
    assert r.returncode == 2 and r.stderr.startswith("usage: trainforge submit "), r.stderr
    assert r.stderr.splitlines()[-1] == "trainforge submit: error: unrecognized arguments: --wokers: did you mean '--workers'?"
    r = _trainforge("server", "start", "--detatch")
    assert r.stderr.startswith("usage: trainforge server start "), r.stderr
    assert r.stderr.splitlines()[-1] == ("trainforge server start: error: unrecognized arguments: --detatch: "
                                         "did you mean '--detach'?")  # fmt: skip
    # The script's own options are its arguments, not the CLI's.
    args = build_parser().parse_args(["submit", "--workers", "2", "train.py", "--epochs", "3"])
    assert args.target == "train.py" and args.args == ["--epochs", "3"]
