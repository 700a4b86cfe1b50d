"""The environment mark: how a forked child makes ``/proc/PID/environ`` name its job.

A fork cannot change the environment block ``/proc/PID/environ`` shows (the one the process was
``exec``'d with), which is how the server finds every process of a job. So the zygote is started
with a placeholder variable (:data:`MARK_VAR`, :data:`MARK_LEN` bytes long) whose bytes the child
overwrites in place with the job's identifying variables; :func:`check_marking` tells at start
whether that works here.
"""

from __future__ import annotations

import ctypes

MARK_VAR = "TRAINFORGE_ZYGOTE_MARK"
MARK_LEN = 240  # room for the identifying variables of a job (job id, server id)
_PAD_VAR = "TRAINFORGE_PAD"


def mark_address() -> tuple[int, int] | None:
    """Where the placeholder's bytes are in our exec-time environment block: (address, length)."""
    libc = ctypes.CDLL(None)
    environ = ctypes.POINTER(ctypes.c_void_p).in_dll(libc, "environ")
    prefix = f"{MARK_VAR}=".encode()
    i = 0
    while environ[i]:
        addr = environ[i]
        if ctypes.string_at(addr, len(prefix)) == prefix:
            length = len(ctypes.string_at(addr))
            return (addr, length) if length >= len(prefix) + MARK_LEN else None
        i += 1
    return None


def _mark_bytes(pairs: list[tuple[str, str]], length: int) -> bytes | None:
    body = b"".join(f"{k}={v}".encode() + b"\0" for k, v in pairs)
    pad = length - len(body) - len(_PAD_VAR) - 1
    return None if pad < 0 else body + f"{_PAD_VAR}=".encode() + b"#" * pad


def write_mark(where: tuple[int, int], pairs: list[tuple[str, str]]) -> bool:
    """Write ``pairs`` over the placeholder at ``where``; False if they do not fit."""
    data = _mark_bytes(pairs, where[1])
    if data is None:
        return False
    ctypes.memmove(where[0], data, len(data))
    return True


def _proc_environ() -> dict[str, str]:
    with open("/proc/self/environ", "rb") as f:
        entries = f.read().split(b"\0")
    return dict(e.decode(errors="replace").split("=", 1) for e in entries if b"=" in e)


def check_marking(where: tuple[int, int] | None) -> str | None:
    """None if writing the placeholder in place shows in /proc/self/environ; else why not."""
    if where is None:
        return f"${MARK_VAR} is missing or shorter than {MARK_LEN} characters"
    original = ctypes.string_at(where[0], where[1])
    try:
        if not write_mark(where, [("TRAINFORGE_MARK_CHECK", "1")]):
            return "the placeholder is too short"
        if _proc_environ().get("TRAINFORGE_MARK_CHECK") != "1":
            return "/proc/self/environ does not show the rewritten environment"
    except OSError as exc:
        return f"cannot read /proc/self/environ: {exc}"
    finally:
        ctypes.memmove(where[0], original, len(original))
    return None
