"""The listening socket of a trainforge HTTP server (the train server, ``trainforge serve``)."""

from __future__ import annotations

import socket


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` and listening (``port`` 0 picks a free one; read it back with
    ``getsockname()``), for ``uvicorn.Server.run(sockets=[...])``. OSError naming ``host:port`` and
    saying what to do when the port is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on such sockets' connections (without it every
    # response waited ~40 ms for the client's delayed ACK).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(
            f"cannot listen on {host}:{port} ({exc.strerror}): another program uses the port; pass --port "
            "(0 picks a free one)"
        ) from None
    sock.listen(2048)  # connections queue here until uvicorn accepts them
    return sock
