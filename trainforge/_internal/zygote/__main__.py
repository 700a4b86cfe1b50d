"""``python -m trainforge._internal.zygote SOCKET_PATH [--preload a,b] [--learn FILE]``: one zygote
process (what :func:`~trainforge._internal.zygote.launcher.launch` starts)."""

from __future__ import annotations

import contextlib
import os
import sys

from trainforge._internal.zygote.mark import check_marking, mark_address
from trainforge._internal.zygote.server import Zygote


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m trainforge._internal.zygote")
    parser.add_argument("socket_path")
    parser.add_argument("--preload", default="")
    parser.add_argument("--learn", default=None, help="a file of modules to import (one per line), appended to")
    parser.add_argument("--ready-fd", type=int, default=None, help="write the ready line here, then close it")
    parser.add_argument("--room", default="", help="blank room for the children's command lines")
    args = parser.parse_args(argv)
    modules = [m for m in args.preload.split(",") if m]
    if args.learn and os.path.exists(args.learn):
        with open(args.learn) as f:
            modules += [line.strip() for line in f if line.strip()]
    if check_marking(mark_address()) is not None:
        modules = []  # it will not serve (serve() says why): do not make its starter wait for the imports
    for module in dict.fromkeys(modules):
        with contextlib.suppress(Exception):
            __import__(module)
    return Zygote(args.socket_path, args.learn, args.ready_fd).serve()


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip the interpreter's teardown: with torch imported it takes about a second, and a tuner (or a
    # server) waits for the zygote to exit.
    os._exit(code)
