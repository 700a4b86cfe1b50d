"""The files of the train server's state directory and of its jobs, the owner's alone whatever the
umask: files 0600, directories 0700 (they hold the token, the jobs' specs and environments, their
output and results).

    write_atomic(path, data)     # readers see the old file or the new one whole, never a part
    with open_append(path) as f: # a log or an events file (created 0600)
        ...
    make_dir(path)               # 0700
"""

from __future__ import annotations

import os
from typing import IO, Any

FILE_MODE = 0o600
DIR_MODE = 0o700


def write_atomic(path: str, data: bytes | str, *, mode: int = FILE_MODE, fsync: bool = False) -> None:
    """Write ``path`` so that readers see the old or the new file whole, never a part: a temporary
    name, then a rename. ``mode`` applies before anything is written, whatever the umask."""
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), mode)  # the umask may have taken bits off; what was asked for is what we get
        f.write(data.encode() if isinstance(data, str) else data)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


def open_append(path: str, encoding: str | None = None) -> IO[Any]:
    """``path`` opened to append to (binary, or text in ``encoding``), created if need be; 0600
    whatever the umask (and an existing file is made so)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
        return os.fdopen(fd, "a" if encoding else "ab", encoding=encoding)
    except BaseException:
        os.close(fd)
        raise


def make_dir(path: str) -> None:
    """``path`` (and its missing parents) as a directory, 0700 whatever the umask; an existing one is
    made 0700 too."""
    os.makedirs(path, mode=DIR_MODE, exist_ok=True)
    os.chmod(path, DIR_MODE)
