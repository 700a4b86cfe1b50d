"""Files that are their owner's alone.

**The train server's state directory and its jobs' files**: files 0600, directories 0700 whatever
the umask (they hold the token, the jobs' specs and environments, their output and results)::

    write_atomic(path, data)     # readers see the old file or the new one whole, never a part
    with open_append(path) as f: # a log or an events file (created 0600)
        ...
    make_dir(path)               # 0700

**Run directories and registries** (checkpoints, metrics, logs, registry blobs and records, the
registry cache) on local disk: :func:`data_modes`, ``private`` by default (files 0600, read-only
blobs 0400, directories 0700) or, with ``$TRAINFORGE_FILE_MODE=umask``, as the process umask says
(:func:`~trainforge._internal.constants.file_mode_setting`). They are given at creation (``os.open``,
``os.mkdir``: the umask can only take bits away), so writing a file costs no extra call::

    modes = data_modes()
    make_dirs(path, modes.dir)                  # missing parents too, each with that mode
    with create(path, "wb", modes.file) as f:   # or "ab", "a", "w"
        ...
    read_only(fd)                               # a blob: its write bits off
"""

from __future__ import annotations

import dataclasses
import os
import stat
from typing import IO, Any

from trainforge._internal import constants

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


# -- run directories and registries ---------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Modes:
    """The modes new files (``file``) and directories (``dir``) are created with; the umask takes
    its bits away, as it does for every file."""

    file: int
    dir: int


PRIVATE = Modes(FILE_MODE, DIR_MODE)
UMASK = Modes(0o666, 0o777)  # what open() and mkdir() ask for by default: the umask decides


def data_modes() -> Modes:
    """The modes of run directories and registries: :data:`PRIVATE` unless
    ``$TRAINFORGE_FILE_MODE=umask`` (ValueError, naming it, for any other value)."""
    return UMASK if constants.file_mode_setting() == "umask" else PRIVATE


def make_dirs(path: str, mode: int) -> None:
    """``path`` as a directory, it and each missing parent created with ``mode`` (``os.makedirs``
    gives the parents the umask's default); existing ones are left as they are."""
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        if not os.path.isdir(path):
            raise
    except FileNotFoundError:
        parent = os.path.dirname(os.path.abspath(path))
        if parent == os.path.abspath(path):
            raise
        make_dirs(parent, mode)
        try:
            os.mkdir(path, mode)
        except FileExistsError:  # made meanwhile by another process
            if not os.path.isdir(path):
                raise


_FLAGS = {"w": os.O_TRUNC, "a": os.O_APPEND}


def create(path: str, how: str, mode: int, encoding: str | None = None) -> IO[Any]:
    """``open(path, how)`` for writing (``"wb"``, ``"ab"``, ``"w"``, ``"a"``) with a new file created
    with ``mode``; an existing file keeps its own."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | _FLAGS[how[0]], mode)
    try:
        return os.fdopen(fd, how, encoding=encoding)
    except BaseException:
        os.close(fd)
        raise


def read_only(file: int | str) -> None:
    """Take every write bit off ``file`` (an open file descriptor, or a path; a registry blob: an
    in-place write then fails instead of corrupting it): 0600 becomes 0400, 0644 becomes 0444."""
    os.chmod(file, stat.S_IMODE(os.stat(file).st_mode) & ~0o222)
