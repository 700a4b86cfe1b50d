"""Building a plan's view of the file system in this process (run as root, in a mount namespace
of its own): a new root on a tmpfs, the plan's mounts made in it (:meth:`Plan.ops`), then
``pivot_root`` into it and the old root detached, so nothing outside the view is reachable by any
path, ``..`` or ``/proc/self/root`` included. What bubblewrap does, done in-process so that a
process forked from the warm pool can enter it without an ``exec``.
"""

from __future__ import annotations

import contextlib
import glob
import os
import stat

from trainforge._internal.sandbox import linux
from trainforge._internal.sandbox.plan import DEV, PROC, TMPFS, Plan

_TMPFS_FLAGS = linux.MS_NOSUID | linux.MS_NODEV


def build(plan: Plan) -> None:
    """Make ``plan``'s view this process's root. The caller has unshared its mount namespace."""
    linux.mount(None, "/", None, linux.MS_REC | linux.MS_PRIVATE)  # nothing we mount leaks out, nothing comes in
    root = plan.root
    linux.mount("tmpfs", root, "tmpfs", _TMPFS_FLAGS, "mode=0755")
    for kind, path, writable in plan.ops():
        inside = root + path
        if kind == "bind":
            _bind(path, inside, writable)
        elif kind == "mask":
            _mask(path, inside)
        elif kind == PROC:
            _mkdirs(inside)
            _mount_proc(inside)
        elif kind == DEV:
            _make_dev(inside)
        elif kind == TMPFS:
            _mkdirs(inside)
            linux.mount("tmpfs", inside, "tmpfs", _TMPFS_FLAGS, "mode=1777")
    os.chdir(root)
    linux.pivot_root(".", ".")  # the old root is stacked under the new one at "/" ...
    linux.umount_detached(".")  # ... and detached: gone from this namespace
    os.chdir("/")


def _bind(path: str, inside: str, writable: bool) -> None:
    """``path`` at ``inside``: a symbolic link is copied as a link (``/bin -> usr/bin``), anything
    else bind-mounted (with what is mounted below it), then made read-only (unless ``writable``) and
    nosuid, recursively. A path that vanished since the plan was made is skipped."""
    if os.path.islink(path):
        _mkdirs(os.path.dirname(inside))
        with contextlib.suppress(FileExistsError):
            os.symlink(os.readlink(path), inside)
        return
    if not os.path.exists(path):
        return
    if os.path.isdir(path):
        _mkdirs(inside)
    else:
        _touch(inside)
    linux.mount(path, inside, None, linux.MS_BIND | linux.MS_REC)
    attributes = linux.MOUNT_ATTR_NOSUID | (0 if writable else linux.MOUNT_ATTR_RDONLY)
    if not linux.set_attributes_recursively(inside, attributes):
        flags = linux.MS_REMOUNT | linux.MS_BIND | linux.MS_NOSUID | (0 if writable else linux.MS_RDONLY)
        linux.mount(None, inside, None, flags)


def _mask(path: str, inside: str) -> None:
    """Nothing at ``inside``: an empty tmpfs over a directory (where binds inside it come next), an
    empty read-only file over a file."""
    if os.path.isdir(inside):
        linux.mount("tmpfs", inside, "tmpfs", _TMPFS_FLAGS, "mode=0755")
    elif os.path.lexists(inside):
        linux.mount("/dev/null", inside, None, linux.MS_BIND)
        linux.mount(None, inside, None, linux.MS_REMOUNT | linux.MS_BIND | linux.MS_RDONLY)


# The devices a process may expect (major, minor), made anew with mode 0666 (the host's may be
# root's alone); GPU device files are the host's, bound in (GPU_DEVICES).
_DEVICES = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8), "urandom": (1, 9), "tty": (5, 0)}
_DEV_LINKS = {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
              "stderr": "/proc/self/fd/2", "ptmx": "pts/ptmx"}  # fmt: skip


def gpu_devices() -> list[str]:
    """The host's GPU device files (NVIDIA's, and DRI's): what a job's ``/dev`` gets of the host's."""
    out = []
    for pattern in ("nvidia*", "nvidia-caps/*", "dri/*"):
        out += glob.glob(os.path.join("/dev", pattern))
    return sorted(p for p in out if not os.path.isdir(p))


def _make_dev(inside: str) -> None:
    """A ``/dev`` of its own: a tmpfs with the usual character devices (0666), the usual links, a
    new ``devpts`` (where the kernel allows one) and the host's GPU devices bound in. Nothing else of
    the host's devices (its disks) is there."""
    _mkdirs(inside)
    linux.mount("tmpfs", inside, "tmpfs", linux.MS_NOSUID, "mode=0755")
    for name, (major, minor) in _DEVICES.items():
        path = os.path.join(inside, name)
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
        os.chmod(path, 0o666)  # whatever the umask
    for name, target in _DEV_LINKS.items():
        os.symlink(target, os.path.join(inside, name))
    os.mkdir(os.path.join(inside, "pts"), 0o755)
    with contextlib.suppress(OSError):
        linux.mount("devpts", os.path.join(inside, "pts"), "devpts", linux.MS_NOSUID | linux.MS_NOEXEC,
                    "newinstance,ptmxmode=0666,mode=620")  # fmt: skip
    for device in gpu_devices():
        target = inside + device
        _touch(target)
        linux.mount(device, target, None, linux.MS_BIND)


def _mount_proc(inside: str) -> None:
    """A new proc that shows a process only the processes of its own uid (``hidepid``)."""
    flags = linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC
    try:
        linux.mount("proc", inside, "proc", flags, "hidepid=invisible")
    except OSError:  # a kernel before 5.8 knows only the number
        linux.mount("proc", inside, "proc", flags, "hidepid=2")


def _mkdirs(path: str) -> None:
    os.makedirs(path, mode=0o755, exist_ok=True)


def _touch(path: str) -> None:
    _mkdirs(os.path.dirname(path))
    if not os.path.lexists(path):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))
