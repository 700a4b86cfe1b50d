"""The zygote's wire protocol: what a client asks for (:class:`SpawnRequest`) and how it is framed.

One Unix-socket connection per child. The client sends the pickled request's length (8 bytes) with
the file descriptors the child gets attached (``SCM_RIGHTS``), then the pickled request; the zygote
replies the child's pid (8 bytes), then, when the child ends, its exit status as
:class:`subprocess.Popen` reports it (8 bytes, negative for a signal) and closes the connection. A
pid of 0 is a refusal followed by its reason (8 bytes of length, then UTF-8 text); a negative pid
is ``-errno`` of a failed fork.

**Job channels.** Only the server (the zygote's own uid) connects to the socket. A sandboxed job's
runner, forked with ``channel=True``, gets instead one end of a ``SOCK_SEQPACKET`` pair whose other
end the zygote keeps, bound to the runner's sandbox plan (``$TRAINFORGE_ZYGOTE=fd:N``). A process
of the job asks for a child by sending one message there: the request as JSON (never a pickle: the
job is not trusted), with the connection to use for that child as the first attached descriptor
(then the child's). Every child forked through a channel enters the channel's plan first, whatever
the request says.
"""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import struct
from typing import Any

ENV_ZYGOTE = "TRAINFORGE_ZYGOTE"  # a job's zygote socket: its local workers are forked from it
PID = struct.Struct("!q")  # every number on the wire: a length, a pid, an exit status
MAX_REQUEST = 1 << 20
MAX_CHANNEL_REQUEST = 1 << 17  # one SOCK_SEQPACKET message
CHANNEL_PREFIX = "fd:"  # $TRAINFORGE_ZYGOTE of a sandboxed job: its channel's descriptor
_TARGET = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


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
    sandbox: str | None = None  # a sandbox plan (JSON) the child enters before anything else
    channel: bool = False  # the child gets a job channel bound to ``sandbox`` (see the module docstring)

    def to_json(self) -> bytes:
        """The request as a job channel carries it (no ``sandbox``, no ``channel``: the channel's own apply)."""
        fields = {k: v for k, v in dataclasses.asdict(self).items() if k not in ("sandbox", "channel")}
        fields["fds"] = {str(k): v for k, v in self.fds.items()}
        return json.dumps(fields).encode()

    @classmethod
    def from_json(cls, data: bytes, sandbox: str) -> SpawnRequest:
        """A request that came over a job channel, checked field by field (ValueError naming the
        first that is wrong), with the channel's ``sandbox``."""
        raw = json.loads(data)
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")

        def field(name: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
            value = raw.get(name, default)
            if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
                raise ValueError(f"{name}={value!r}")
            return value

        target = field("target", str)
        if not _TARGET.match(target):
            raise ValueError(f"target={target!r}")
        args = field("args", list, [])
        env = field("env", dict, {})
        fds = field("fds", dict, {})
        mark = field("mark", list, [])
        preload = field("preload", list, [])
        watch = raw.get("watch_pid")
        if not all(isinstance(a, (str, int)) and not isinstance(a, bool) for a in args):
            raise ValueError("args: strings and integers only")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise ValueError("env: strings only")
        if not all(isinstance(k, str) and k.isdigit() and isinstance(v, int) for k, v in fds.items()):
            raise ValueError("fds: {\"target fd\": index}")
        if not all(isinstance(m, str) for m in (*mark, *preload)) or not (watch is None or type(watch) is int):
            raise ValueError("mark, preload, watch_pid")
        return cls(target=target, args=args, env=env, cwd=field("cwd", str), fds={int(k): v for k, v in fds.items()},
                   new_session=bool(raw.get("new_session", True)), mark=tuple(mark), watch_pid=watch,
                   preload=tuple(preload), sandbox=sandbox)  # fmt: skip


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """``n`` bytes from ``sock``, or fewer if the peer closed the connection first."""
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data
