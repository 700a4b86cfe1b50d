"""The command channel of a driven run: the driver tells the workers what to do next.

The driver listens (``WorkerListener``: one authenticated TCP listener, a random auth key) on
127.0.0.1, or on its Ray node IP when the workers are Ray actors; the address, key and a
connection key reach the workers in ``train_loop_config[DRIVER_KEY]``. Each worker of each attempt
connects and says hello with its attempt and rank, then receives :class:`Command` s in order:

    train      run one training epoch (after catching up to ``epochs``, see loop.py)
    validate   run the validation loader once
    checkpoint rank 0 reports a checkpoint of the current state
    apply      run a function on the model (or the worker) and report its result
    stop       end the loop (with a last checkpoint if ``checkpoint``)

Each answer is a ``trainforge.report(... | {SEQ_KEY: seq})`` of every rank, so metrics and checkpoints
take the normal path. The driver keeps the command it waits for as pending: a worker of a newer
attempt (a restart after a failure) that connects gets it again; older attempts' connections are
dropped.
"""

from __future__ import annotations

import pickle
import threading
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection
from typing import Any

from trainforge._internal.worker_group.listener import WorkerListener, no_delay

DRIVER_KEY = "_trainforge_driver"  # train_loop_config key of a driven run (removed before setup sees it)
SEQ_KEY = "_seq"  # the report answering command number SEQ_KEY
LOCAL_KEY = "_local"  # a rank's own metrics (reduce_results=False)
RESULT_KEY = "_result"  # an "apply" command's return value on that rank
INTERNAL_KEYS = (SEQ_KEY, LOCAL_KEY, RESULT_KEY)


@dataclass
class Command:
    kind: str  # "train" | "validate" | "checkpoint" | "apply" | "stop"
    seq: int
    epochs: int | None = None  # epochs the driver saw completed before this command (None: unknown)
    num_steps: int | None = None
    info: dict[str, Any] | None = None
    profile: bool = False
    reduce: bool = True
    fn: bytes | None = None  # apply: a cloudpickled function
    target: str = "model"  # apply: fn(model) or fn()
    checkpoint: bool = False  # stop: report a last checkpoint first


class CommandServer:
    """The driver's end."""

    def __init__(self, host: str = "127.0.0.1"):
        self._listener = WorkerListener(host)
        self._key = self._listener.new_key()
        self._lock = threading.Lock()
        self._attempt = -1
        self._conns: dict[int, Connection] = {}
        self._pending: Command | None = None
        self._listener.expect(self._key, self._on_hello)

    def worker_info(self) -> dict[str, str]:
        """What workers need to connect (goes into ``train_loop_config[DRIVER_KEY]``)."""
        return {"address": self._listener.address, "authkey": self._listener.authkey.hex(), "key": self._key}

    def _on_hello(self, conn: Connection, info: dict[str, Any]) -> None:  # on the accept thread
        attempt, rank = int(info.get("attempt", 0)), int(info.get("rank", 0))
        with self._lock:
            if attempt < self._attempt:
                conn.close()  # a worker of an attempt already replaced
                return
            if attempt > self._attempt:
                for old in self._conns.values():
                    old.close()
                self._attempt, self._conns = attempt, {}
            if rank in self._conns:
                self._conns.pop(rank).close()
            self._conns[rank] = conn
            if self._pending is not None:
                _send(conn, self._pending)

    def send(self, command: Command) -> None:
        """Send ``command`` to every connected worker of the newest attempt, and to every worker that
        connects until :meth:`done` (a restarted group gets it too)."""
        with self._lock:
            self._pending = command
            for conn in self._conns.values():
                _send(conn, command)

    def done(self, seq: int) -> None:
        with self._lock:
            if self._pending is not None and self._pending.seq == seq:
                self._pending = None

    def close(self) -> None:
        self._listener.forget(self._key)
        self._listener.close()
        with self._lock:
            for conn in self._conns.values():
                conn.close()
            self._conns = {}


def _send(conn: Connection, command: Command) -> None:
    try:
        conn.send(command)
    except OSError:  # that worker is gone: the controller sees its failure and restarts the group
        pass


class CommandClient:
    """A worker's end."""

    def __init__(self, conn: Connection):
        self._conn = conn

    @classmethod
    def connect(cls, info: dict[str, str], attempt: int, rank: int) -> CommandClient:
        import os

        host, port = info["address"].rsplit(":", 1)
        conn = Client((host, int(port)), authkey=bytes.fromhex(info["authkey"]))
        no_delay(conn)
        hello = ("hello", info["key"], {"attempt": attempt, "rank": rank, "pid": os.getpid()})
        conn.send_bytes(pickle.dumps(hello, protocol=pickle.HIGHEST_PROTOCOL))
        return cls(conn)

    def recv(self) -> Command | None:
        """The next command; None once the driver is gone (its listener closed)."""
        try:
            command: Command = self._conn.recv()
        except (EOFError, OSError):
            return None
        return command

    def close(self) -> None:
        self._conn.close()


def driver_host(scaling: Any) -> str:
    """Where workers reach the driver: 127.0.0.1, or the driver's Ray node IP for Ray actors."""
    from trainforge._internal.worker_group.executor import executor_kind

    if executor_kind(scaling) != "ray":
        return "127.0.0.1"
    from trainforge._internal.ray_utils import ensure_connected

    ray = ensure_connected()
    return str(ray.util.get_node_ip_address())
