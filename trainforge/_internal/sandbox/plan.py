"""What a sandboxed process may see and who it is: a :class:`Plan`, decided by the train server for
each job and carried (as JSON) to the process that enters it, whichever way that process starts (a
fresh interpreter, a fork of the warm pool, bubblewrap).

A plan is an allowlist. The process sees a new root holding only:

- each :class:`Bind`, at its own path (read-only unless ``writable``): the system's directories,
  Python and trainforge, the job's code and working directory, its own directory and storage;
- a new ``/proc`` (showing only the processes it may see), the host's ``/dev`` and private ``/tmp``
  and ``/dev/shm`` (in memory, gone with the job);
- nothing at each of ``masks`` (an empty directory, or an empty file), applied after the binds
  that contain them and before those inside them: the server's state directory is masked, and the
  job's own directory inside it bound again.

Then it becomes ``uid``/``gid`` (with ``groups``; None: stays who it is, as in a user namespace),
after joining ``cgroups`` (directories whose ``cgroup.procs`` takes its pid), and only then takes
``env``, the job's environment: nothing the job chose (``LD_PRELOAD``, ``PYTHONPATH``, ...) touches
the process while it is still root.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

# What every sandbox has besides its binds (the kinds of View.ops), where the plan does not say otherwise.
PROC, DEV, TMPFS = "proc", "dev", "tmpfs"
PRIVATE_TMPFS = ("/tmp", "/dev/shm")


@dataclasses.dataclass(frozen=True)
class Bind:
    """``path`` (absolute), seen at the same path inside; ``writable`` or read-only."""

    path: str
    writable: bool = False


@dataclasses.dataclass(frozen=True)
class Plan:
    """How one job's processes are confined (see the module docstring).

    ``root``: an empty directory, private to the server, on which the new root is built (the
    in-process way; bubblewrap builds its own).
    """

    binds: tuple[Bind, ...] = ()
    masks: tuple[str, ...] = ()
    uid: int | None = None
    gid: int | None = None
    groups: tuple[int, ...] = ()
    cgroups: tuple[str, ...] = ()
    root: str = ""
    env: dict[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for bind in self.binds:
            if not os.path.isabs(bind.path):
                raise ValueError(f"Plan.binds: {bind.path!r} is not an absolute path")
        for mask in self.masks:
            if not os.path.isabs(mask):
                raise ValueError(f"Plan.masks: {mask!r} is not an absolute path")
        if (self.uid is None) != (self.gid is None):
            raise ValueError(f"Plan.uid={self.uid!r}, gid={self.gid!r}: give both or neither")
        if self.uid == 0:
            raise ValueError("Plan.uid=0: a sandboxed job never runs as root")

    def ops(self) -> list[tuple[str, str, bool]]:
        """What the view is built from, in the order to build it: ``(kind, path, writable)`` with
        kind ``bind``, ``mask``, ``proc``, ``dev`` or ``tmpfs``. Shallower paths first, so a mount
        comes before those inside it; at one depth binds before masks, so a mask hides a bind of the
        same path."""
        order = {"bind": 0, DEV: 0, PROC: 0, TMPFS: 1, "mask": 2}
        ops: list[tuple[str, str, bool]] = [("bind", b.path, b.writable) for b in self.binds]
        ops += [("mask", m, False) for m in self.masks]
        ops += [(PROC, "/proc", False), (DEV, "/dev", True)]
        ops += [(TMPFS, path, True) for path in PRIVATE_TMPFS]
        return sorted(ops, key=lambda op: (_depth(op[1]), order[op[0]], op[1]))

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Plan:
        data: dict[str, Any] = json.loads(text)
        data["binds"] = tuple(Bind(**b) for b in data["binds"])
        for key in ("masks", "groups", "cgroups"):
            data[key] = tuple(data.get(key) or ())
        return cls(**data)


def _depth(path: str) -> int:
    return len([part for part in os.path.normpath(path).split("/") if part])
