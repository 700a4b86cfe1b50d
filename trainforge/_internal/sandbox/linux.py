"""The Linux calls a sandbox is built with, through ``ctypes`` (Python 3.11 has none of them but
``setresuid`` and friends): ``unshare``, ``mount``, ``umount2``, ``pivot_root``, ``mount_setattr``
and ``prctl``. Each raises ``OSError`` naming the call and its arguments; nothing here decides
anything.
"""

from __future__ import annotations

import ctypes
import os
import platform
from typing import Any

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MNT_DETACH = 0x2

MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
AT_FDCWD = -100
AT_RECURSIVE = 0x8000

PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38

# Syscalls glibc 2.36 has no wrapper for, by machine (the generic table's numbers on arm64).
_SYSCALLS = {
    "x86_64": {"pivot_root": 155, "mount_setattr": 442},
    "aarch64": {"pivot_root": 41, "mount_setattr": 442},
}

_libc: Any = None


def _lib() -> Any:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _c(path: str | None) -> bytes | None:
    return None if path is None else os.fsencode(path)


def unshare(flags: int) -> None:
    _check(_lib().unshare(ctypes.c_int(flags)), f"unshare({flags:#x})")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_lib().mount(_c(source), _c(target), _c(fstype), ctypes.c_ulong(flags), _c(data)),
           f"mount({source!r}, {target!r}, {fstype!r}, {flags:#x}, {data!r})")  # fmt: skip


def umount_detached(target: str) -> None:
    _check(_lib().umount2(_c(target), ctypes.c_int(MNT_DETACH)), f"umount2({target!r}, MNT_DETACH)")


def _syscall_number(name: str) -> int | None:
    return _SYSCALLS.get(platform.machine(), {}).get(name)


def pivot_root(new_root: str, put_old: str) -> None:
    number = _syscall_number("pivot_root")
    if number is None:
        raise OSError(38, f"pivot_root: no syscall number known for {platform.machine()}")
    _check(_lib().syscall(ctypes.c_long(number), _c(new_root), _c(put_old)), f"pivot_root({new_root!r}, {put_old!r})")


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]  # fmt: skip


def set_attributes_recursively(target: str, attributes: int) -> bool:
    """``mount_setattr(AT_RECURSIVE)``: set ``attributes`` on the mount at ``target`` and every mount
    below it (Linux 5.12+). False where the kernel lacks the call (the caller falls back to a remount
    of the top mount only)."""
    number = _syscall_number("mount_setattr")
    if number is None:
        return False
    attr = _MountAttr(attributes, 0, 0, 0)
    result = _lib().syscall(ctypes.c_long(number), ctypes.c_int(AT_FDCWD), _c(target), ctypes.c_uint(AT_RECURSIVE),
                            ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)))  # fmt: skip
    if result != 0:
        errno = ctypes.get_errno()
        if errno in (38, 22):  # ENOSYS, EINVAL: an older kernel
            return False
        raise OSError(errno, f"mount_setattr({target!r}, {attributes:#x}): {os.strerror(errno)}")
    return True


def prctl(option: int, value: int) -> None:
    _check(_lib().prctl(ctypes.c_int(option), ctypes.c_ulong(value), ctypes.c_ulong(0), ctypes.c_ulong(0),
                        ctypes.c_ulong(0)), f"prctl({option}, {value})")  # fmt: skip
