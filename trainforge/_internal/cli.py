"""The ``trainforge`` command (also ``python -m trainforge``). Each part adds its commands; the
parts' modules are imported only for the command that runs, so the CLI starts fast."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    from trainforge.registry._cli import add_commands as models_commands
    from trainforge.serve._cli import add_commands as serve_commands
    from trainforge.server._cli import add_commands as server_commands

    parser = argparse.ArgumentParser(prog="trainforge", description="trainforge: data-parallel training, a train server")
    sub = parser.add_subparsers(dest="command", required=True)
    server_commands(sub)
    models_commands(sub)
    serve_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # errors a user can cause: one line, no traceback
        from trainforge.server._client import ServerError, ServerNotFoundError
        from trainforge.server._main import ServerRunningError

        if isinstance(exc, (ServerError, ServerNotFoundError, ServerRunningError, ValueError, OSError)):
            print(f"trainforge: {exc}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
