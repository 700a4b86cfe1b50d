"""A job's cgroup, on whatever the host mounts: cgroup v2, v1, or both (a "hybrid" host, where v2
tracks processes and v1 holds the controllers).

    host = Hierarchies.discover()              # once: what is mounted, and where this process sits
    group = host.group("trainforge-abc/job-7") # one directory per hierarchy used, below ours
    group.create(memory_max=8 << 30, pids_max=4096)
    join_cgroups(group.directories)            # in the job's first process (sandbox.enter does)
    group.kill()                               # every process in it, setsid or double-forked alike
    group.usage()                              # {"cpu_s": ..., "memory": ...}
    group.remove()

Each role goes to the first hierarchy that can play it (v2 first):

- **tracking and kill**: v2 (``cgroup.kill``, Linux 5.14+: one write kills everything in it, no
  race with a fork), else v1's freezer (freeze, SIGKILL what is in it, thaw), else any v1
  hierarchy (SIGKILL what is in it until it is empty);
- **memory** (a limit and the usage): v2 ``memory.max``/``memory.current`` where the v2 subtree
  has the memory controller, else v1 ``memory.limit_in_bytes``/``memory.usage_in_bytes``;
- **pids** (a limit on tasks: fork bombs end at it): v2 ``pids.max``, else v1 ``pids.max``;
- **CPU time**: v2 ``cpu.stat`` (always there), else v1 ``cpuacct.usage``.

The job's cgroups go below the server's own (so whatever limits the server's service has, its jobs
stay within). On v2, controllers are enabled for the subtree where the server's cgroup lets us; a
role no hierarchy can play is left out and said so (:meth:`Hierarchies.describe`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time

V2 = "cgroup2"


@dataclasses.dataclass(frozen=True)
class Hierarchy:
    """One mounted hierarchy: ``mount`` (where it is mounted), ``controllers`` (v1: its own; v2: the
    ones enabled for our subtree), ``own`` (this process's cgroup in it, a path from its root)."""

    version: int
    mount: str
    controllers: frozenset[str]
    own: str

    def directory(self, relative: str) -> str:
        return os.path.join(self.mount, self.own.lstrip("/"), relative)


@dataclasses.dataclass
class Hierarchies:
    """The hierarchies of this host a job's cgroup can use, by role (None: no hierarchy can)."""

    track: Hierarchy | None = None
    memory: Hierarchy | None = None
    pids: Hierarchy | None = None
    cpu: Hierarchy | None = None
    problems: list[str] = dataclasses.field(default_factory=list)

    @classmethod
    def discover(cls, mountinfo: str = "/proc/self/mountinfo", own: str = "/proc/self/cgroup") -> Hierarchies:
        """What this host mounts and where this process sits, by reading ``mountinfo`` and ``own``."""
        found = cls()
        try:
            mounts = _mounts(mountinfo)
            positions = _positions(own)
        except OSError as exc:
            found.problems.append(f"cannot read the cgroup mounts ({exc})")
            return found
        v2 = next((h for h in _hierarchies(mounts, positions) if h.version == 2), None)
        v1 = [h for h in _hierarchies(mounts, positions) if h.version == 1]
        if v2 is not None:
            v2 = _delegate(v2, found.problems)
        by_controller = {c: h for h in v1 for c in h.controllers}
        if v2 is not None and (_kernel_has_cgroup_kill() or "freezer" not in by_controller):
            found.track = v2
        elif "freezer" in by_controller:
            found.track = by_controller["freezer"]
        elif v1:
            found.track = by_controller.get("pids") or v1[0]
        found.memory = v2 if v2 is not None and "memory" in v2.controllers else by_controller.get("memory")
        found.pids = v2 if v2 is not None and "pids" in v2.controllers else by_controller.get("pids")
        found.cpu = v2 if v2 is not None else by_controller.get("cpuacct")
        for role in ("track", "memory", "pids"):
            if getattr(found, role) is None:
                found.problems.append(f"no cgroup hierarchy offers {role}")
        return found

    def describe(self) -> str:
        """One line: which hierarchy plays each role."""
        def name(h: Hierarchy | None) -> str:
            return "-" if h is None else f"v{h.version}" + ("" if h.version == 2 else f"({','.join(sorted(h.controllers))})")

        return (f"tracking and kill {name(self.track)}"
                f"{' (cgroup.kill)' if self.track is not None and self.track.version == 2 else ''}, "
                f"memory {name(self.memory)}, pids {name(self.pids)}, CPU time {name(self.cpu)}")  # fmt: skip

    @property
    def usable(self) -> bool:
        return self.track is not None

    def group(self, relative: str) -> JobCgroup:
        """The cgroup ``relative`` below ours, in every hierarchy that plays a role."""
        return JobCgroup(self, relative)

    def children(self, relative: str) -> list[str]:
        """The names of the cgroups directly below ``relative`` (in the tracking hierarchy)."""
        if self.track is None:
            return []
        try:
            return sorted(e.name for e in os.scandir(self.track.directory(relative)) if e.is_dir())
        except OSError:
            return []


class JobCgroup:
    """One job's cgroup: a directory in each hierarchy that plays a role (see the module docstring)."""

    def __init__(self, hierarchies: Hierarchies, relative: str):
        self.host = hierarchies
        self.relative = relative.strip("/")
        used = [h for h in (hierarchies.track, hierarchies.memory, hierarchies.pids, hierarchies.cpu) if h is not None]
        unique: dict[str, Hierarchy] = {}
        for h in used:
            unique.setdefault(h.mount, h)
        self._hierarchies = list(unique.values())

    @property
    def directories(self) -> tuple[str, ...]:
        """The directories a process joins (one per hierarchy)."""
        return tuple(h.directory(self.relative) for h in self._hierarchies)

    def _dir(self, h: Hierarchy | None) -> str | None:
        return None if h is None else h.directory(self.relative)

    def create(self, *, memory_max: int | None = None, pids_max: int | None = None) -> None:
        """Make the directories (and their parents, with the v2 controllers enabled down to them)
        and set the limits (None: none)."""
        for h in self._hierarchies:
            path = h.directory(self.relative)
            if h.version == 2:
                _make_v2(h, self.relative)
            else:
                os.makedirs(path, exist_ok=True)
        memory = self._dir(self.host.memory)
        if memory is not None and memory_max is not None:
            name = "memory.max" if self.host.memory is not None and self.host.memory.version == 2 else "memory.limit_in_bytes"
            _write(os.path.join(memory, name), str(int(memory_max)))
        pids = self._dir(self.host.pids)
        if pids is not None and pids_max is not None:
            _write(os.path.join(pids, "pids.max"), str(int(pids_max)))

    def exists(self) -> bool:
        track = self._dir(self.host.track)
        return track is not None and os.path.isdir(track)

    def pids(self) -> set[int]:
        """Every process in the job's cgroup now."""
        track = self._dir(self.host.track)
        if track is None:
            return set()
        try:
            with open(os.path.join(track, "cgroup.procs")) as f:
                return {int(line) for line in f if line.strip()}
        except OSError:
            return set()

    def kill(self, timeout: float = 10.0) -> bool:
        """SIGKILL every process in it, forks under way included, and wait until it is empty
        (True) or ``timeout`` seconds passed (False)."""
        track = self.host.track
        directory = self._dir(track)
        if track is None or directory is None or not os.path.isdir(directory):
            return True
        if track.version == 2 and os.path.exists(os.path.join(directory, "cgroup.kill")):
            _write(os.path.join(directory, "cgroup.kill"), "1")
        elif "freezer" in track.controllers:
            self._freeze_and_kill(directory)
        deadline = time.monotonic() + timeout
        while True:
            left = self.pids()
            if not left:
                return True
            for pid in left:  # v1 without a freezer; or what was not yet gone
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)  # the kernel is tearing them down: a few ms

    def _freeze_and_kill(self, directory: str) -> None:
        state = os.path.join(directory, "freezer.state")
        _write(state, "FROZEN")
        deadline = time.monotonic() + 5.0
        while _read(state) != "FROZEN" and time.monotonic() < deadline:
            time.sleep(0.002)
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        _write(state, "THAWED")  # the killed processes die as they thaw

    def usage(self) -> dict[str, float]:
        """``cpu_s`` (CPU seconds used so far by every process that was in it) and ``memory``
        (bytes charged to it now), where a hierarchy offers them."""
        out: dict[str, float] = {}
        cpu, memory = self.host.cpu, self.host.memory
        if cpu is not None:
            directory = cpu.directory(self.relative)
            if cpu.version == 2:
                for line in (_read(os.path.join(directory, "cpu.stat")) or "").splitlines():
                    key, _, value = line.partition(" ")
                    if key == "usage_usec" and value.strip().isdigit():
                        out["cpu_s"] = int(value) / 1e6
            else:
                nanoseconds = _read(os.path.join(directory, "cpuacct.usage"))
                if nanoseconds and nanoseconds.isdigit():
                    out["cpu_s"] = int(nanoseconds) / 1e9
        if memory is not None:
            name = "memory.current" if memory.version == 2 else "memory.usage_in_bytes"
            charged = _read(os.path.join(memory.directory(self.relative), name))
            if charged and charged.isdigit():
                out["memory"] = float(charged)
        return out

    def remove(self) -> None:
        """Remove the (empty) directories, and their parents below ours once those are empty too."""
        for h in self._hierarchies:
            parts = self.relative.split("/")
            while parts:
                with contextlib.suppress(OSError):
                    os.rmdir(h.directory("/".join(parts)))
                parts.pop()


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _mounts(path: str) -> list[tuple[str, str, str, str]]:
    """``(fstype, mount point, root, super options)`` of each cgroup mount in ``mountinfo``."""
    out = []
    with open(path) as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(tail) >= 3 and tail[0] in ("cgroup", V2) and len(fields) >= 5:
                out.append((tail[0], fields[4].replace("\\040", " "), fields[3], tail[2]))
    return out


def _positions(path: str) -> dict[str, str]:
    """This process's cgroup per hierarchy: ``""`` for v2, else the hierarchy's controllers
    (comma-separated, as /proc/self/cgroup names them, ``name=systemd`` included)."""
    out: dict[str, str] = {}
    with open(path) as f:
        for line in f:
            parts = line.rstrip("\n").split(":", 2)
            if len(parts) == 3:
                out[parts[1]] = parts[2]
    return out


def _hierarchies(mounts: list[tuple[str, str, str, str]], positions: dict[str, str]) -> list[Hierarchy]:
    out = []
    for fstype, point, root, options in mounts:
        if fstype == V2:
            own = positions.get("")
            if own is None or not os.access(point, os.W_OK):
                continue
            controllers = frozenset((_read(os.path.join(point, own.lstrip("/"), "cgroup.controllers")) or "").split())
            out.append(Hierarchy(2, point, controllers, _below_root(own, root)))
        else:  # the line of /proc/self/cgroup whose controllers this mount's options name
            opts = set(options.split(","))
            key = next((k for k in positions if k and set(k.split(",")) <= opts), None)
            if key is None or not os.access(point, os.W_OK):
                continue
            controllers = frozenset(n for n in key.split(",") if not n.startswith("name="))
            out.append(Hierarchy(1, point, controllers, _below_root(positions[key], root)))
    return out


def _below_root(own: str, root: str) -> str:
    """Our cgroup as a path from the mount's root (a container sees its own cgroup as ``/``)."""
    if root not in ("/", "") and own.startswith(root):
        own = own[len(root):] or "/"
    return own


def _kernel_has_cgroup_kill() -> bool:
    """Linux 5.14 or newer: every v2 cgroup but the root has ``cgroup.kill``."""
    try:
        major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (5, 14)


def _delegate(h: Hierarchy, problems: list[str]) -> Hierarchy:
    """Enable the memory and pids controllers for the subtree below our v2 cgroup where the kernel
    offers them. A cgroup with processes of its own cannot hand controllers down (v2's "no internal
    processes" rule) unless it is the root: then this process moves to a leaf of its own
    (``trainforge-server``) first, as a service with ``Delegate=yes`` is expected to."""
    wanted = [c for c in ("memory", "pids", "cpu") if c in h.controllers]
    if not wanted:
        return dataclasses.replace(h, controllers=frozenset())
    own_dir = h.directory("")
    control = os.path.join(own_dir, "cgroup.subtree_control")
    enabled = set((_read(control) or "").split())
    missing = [c for c in wanted if c not in enabled]
    if missing:
        try:
            _write(control, " ".join(f"+{c}" for c in missing))
        except OSError:
            try:
                leaf = os.path.join(own_dir, "trainforge-server")
                os.makedirs(leaf, exist_ok=True)
                _write(os.path.join(leaf, "cgroup.procs"), str(os.getpid()))
                _write(control, " ".join(f"+{c}" for c in missing))
            except OSError as exc:
                problems.append(f"cgroup v2: cannot enable {', '.join(missing)} below {own_dir} ({exc.strerror}): "
                                "run the server in a cgroup delegated to it (systemd: Delegate=yes)")  # fmt: skip
                return dataclasses.replace(h, controllers=frozenset(enabled & set(wanted)))
    return dataclasses.replace(h, controllers=frozenset(set(wanted) | (enabled & set(wanted))))


def _make_v2(h: Hierarchy, relative: str) -> None:
    """``relative`` below our v2 cgroup, each intermediate level handing the controllers down."""
    parts = relative.split("/")
    path = h.directory("")
    for i, part in enumerate(parts):
        path = os.path.join(path, part)
        os.makedirs(path, exist_ok=True)
        if i < len(parts) - 1 and h.controllers:
            control = os.path.join(path, "cgroup.subtree_control")
            enabled = set((_read(control) or "").split())
            missing = [c for c in h.controllers if c not in enabled]
            if missing:
                _write(control, " ".join(f"+{c}" for c in sorted(missing)))
