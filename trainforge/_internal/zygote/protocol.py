"""The zygote's wire protocol: what a client asks for (:class:`SpawnRequest`) and how it is framed.

One Unix-socket connection per child. The client sends the pickled request's length (8 bytes) with
the file descriptors the child gets attached (``SCM_RIGHTS``), then the pickled request; the zygote
replies the child's pid (8 bytes), then, when the child ends, its exit status as
:class:`subprocess.Popen` reports it (8 bytes, negative for a signal) and closes the connection. A
pid of 0 is a refusal followed by its reason (8 bytes of length, then UTF-8 text); a negative pid
is ``-errno`` of a failed fork.
"""

from __future__ import annotations

import dataclasses
import socket
import struct
from typing import Any

ENV_ZYGOTE = "TRAINFORGE_ZYGOTE"  # a job's zygote socket: its local workers are forked from it
PID = struct.Struct("!q")  # every number on the wire: a length, a pid, an exit status
MAX_REQUEST = 1 << 20


@dataclasses.dataclass
class SpawnRequest:
    """What to run in the forked child: ``module:function`` called with ``args``; its return value
    (or SystemExit's code) is the exit code. ``fds`` maps each child fd number to the index of an
    attached descriptor. ``mark``: variable names (present in ``env``) that ``/proc/PID/environ``
    must show. ``watch_pid``: the child kills its process group when that process ends (the
    parent-death signal a worker gets from its real parent)."""

    target: str
    args: list[Any]
    env: dict[str, str]
    cwd: str
    fds: dict[int, int]
    new_session: bool = True
    mark: tuple[str, ...] = ()
    watch_pid: int | None = None
    preload: tuple[str, ...] = ()


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """``n`` bytes from ``sock``, or fewer if the peer closed the connection first."""
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data
