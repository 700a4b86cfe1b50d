"""The ``trainforge`` command (also ``python -m trainforge``). Each part adds its commands; the
parts' modules are imported only for the command that runs, so the CLI starts fast.

Every command's help ends with the docs page about it (:data:`DOCS`, :func:`docs_epilog`). A reader
that goes away (``trainforge jobs | head -2``) ends the command quietly, as ``ps`` does."""

from __future__ import annotations

import argparse
import difflib
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from typing import Any

# The docs page of each command (a command not named here has its parent's): paths in the checkout,
# which tests/test_docs.py checks (page and anchor exist).
DOCS: dict[tuple[str, ...], str] = {
    (): "docs/index.md",
    ("server",): "docs/server.md#start-it",
    ("server", "users"): "docs/team-server.md#users-and-roles",
    **{(c,): "docs/server.md#submit-and-manage-jobs" for c in (
        "submit", "jobs", "queue", "status", "logs", "stop", "hold", "release", "priority", "retry", "resources")},
    ("dashboard",): "docs/dashboard.md",
    ("events",): "docs/team-server.md#the-audit-log",
    ("whoami",): "docs/team-server.md#quotas-and-fair-share",
    ("models",): "docs/registry.md",
    ("serve",): "docs/serving.md",
    ("experiments",): "docs/experiments.md",
    ("train",): "docs/model-lifecycle.md",
}  # fmt: skip


def docs_page(path: tuple[str, ...]) -> str:
    """The docs page of the command ``path`` (``("server", "users", "add")``): its own, else its nearest parent's."""
    while path not in DOCS:
        path = path[:-1]
    return DOCS[path]


def docs_epilog(page: str) -> str:
    """The line every command's help ends with: its docs page, as a reader of a clone opens it (the
    file, or the site ``mkdocs serve`` makes of them)."""
    return f"docs: {page} (or `mkdocs serve`)"


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """``parser`` and every subcommand's parser under it, with its command path."""
    yield path, parser
    for action in parser._actions:  # argparse keeps its subcommands only there
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, (*path, name))


class Parser(argparse.ArgumentParser):
    """The parser of ``trainforge`` and, through ``add_subparsers`` (which makes its parsers of its
    own class), of every subcommand. Two differences from argparse's:

    - a mistyped choice says the nearest one (``invalid choice: 'sumbit': did you mean 'submit'?``),
      a command's name or an option's value alike;
    - an option a subcommand does not know is reported by that subcommand, with its usage
      (``trainforge submit: error: unrecognized arguments: --wokers``), where argparse hands it up to
      the top-level parser, whose usage lists only the commands. No ``trainforge`` command takes
      unknown options on to something else (a script's own arguments are its ``REMAINDER``)."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}" + _suggestion(extras[0], self._option_names()))
        return parsed, extras

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is not None and value not in action.choices:
            names = [str(c) for c in action.choices]
            raise argparse.ArgumentError(action, f"invalid choice: {value!r}{_suggestion(str(value), names)} "
                                                 f"(choose from {', '.join(map(repr, names))})")  # fmt: skip

    def _option_names(self) -> list[str]:
        return [name for action in self._actions for name in action.option_strings]


def _suggestion(word: str, names: list[str]) -> str:
    """``": did you mean 'submit'?"`` for ``word`` "sumbit" among ``names``; "" when none is close."""
    close = difflib.get_close_matches(word.partition("=")[0], names, n=1)
    return f": did you mean {close[0]!r}?" if close else ""


def build_parser() -> argparse.ArgumentParser:
    from trainforge.registry.cli import add_commands as models_commands
    from trainforge.registry.train_cli import add_commands as train_commands
    from trainforge.serve.cli import add_commands as serve_commands
    from trainforge.server.cli.commands import add_commands as server_commands
    from trainforge.tune.cli import add_commands as tune_commands

    parser = Parser(prog="trainforge", description="trainforge: data-parallel training, a train server")
    sub = parser.add_subparsers(dest="command", required=True)
    server_commands(sub)
    models_commands(sub)
    serve_commands(sub)
    tune_commands(sub)
    train_commands(sub)
    for path, p in commands(parser):
        p.epilog = docs_epilog(docs_page(path))
    return parser


def _reader_gone() -> int:
    """The reader of the output went away: no more output, no error (as ``ps`` ends on SIGPIPE)."""
    try:  # the interpreter's last flush of stdout would fail again, loudly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 128 + signal.SIGPIPE


def main(argv: list[str] | None = None) -> int:
    try:
        return _run(argv)
    except BrokenPipeError:
        return _reader_gone()


def _run(argv: list[str] | None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit:
        sys.stdout.flush()  # --help or a usage error: written here, where a closed pipe is caught
        raise
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()
        return code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        raise
    except Exception as exc:  # errors a user can cause: one line, no traceback
        from trainforge.server.cli.commands import user_errors

        if isinstance(exc, (*user_errors(), ValueError, OSError)):
            print(f"trainforge: {exc}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
