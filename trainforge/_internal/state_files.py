"""Files that are their owner's alone.

**The train server's state directory and its jobs' files**: files 0600, directories 0700 whatever
the umask (they hold the token, the jobs' specs and environments, their output and results)::

    write_atomic(path, data)     # readers see the old file or the new one whole, never a part
    with open_append(path) as f: # a log or an events file (created 0600)
        ...
    with open_regular(path) as f:  # read a file a job may have put there: never through a link
        ...
    make_dir(path)               # 0700

A job's directory is the job's to fill (in a sandbox, its own user owns it), and the server reads
and writes there as itself: so none of these follows a symbolic link at the file's name (a link
planted there could point at the server's token), none blocks on a FIFO, and ``write_atomic``'s
temporary file is created anew (``O_EXCL``), never opened where the job put something.

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
import errno
import os
import secrets
import stat
from typing import IO, Any

from trainforge._internal import constants

FILE_MODE = 0o600
DIR_MODE = 0o700


class NotRegularFileError(FileNotFoundError):
    """The path names a symbolic link, a FIFO, a device or a directory, not a regular file: for a
    reader, as good as no file."""


def write_atomic(path: str, data: bytes | str, *, mode: int = FILE_MODE, fsync: bool = False,
                 owner: tuple[int, int] | None = None) -> None:  # fmt: skip
    """Write ``path`` so that readers see the old or the new file whole, never a part: a temporary
    name, then a rename. ``mode`` applies before anything is written, whatever the umask; ``owner``
    (uid, gid) gives the file to them (a sandboxed job's files in its directory)."""
    tmp = f"{path}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)  # the umask may have taken bits off; what was asked for is what we get
            if owner is not None:
                os.fchown(f.fileno(), *owner)
            f.write(data.encode() if isinstance(data, str) else data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def open_append(path: str, encoding: str | None = None) -> IO[Any]:
    """``path`` opened to append to (binary, or text in ``encoding``), created if need be; 0600
    whatever the umask (and an existing file is made so). Never through a symbolic link (OSError),
    never waiting for a FIFO's reader (ENXIO); a device (``/dev/null``) is taken as it is."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK,
                 FILE_MODE)  # fmt: skip
    try:
        os.set_blocking(fd, True)
        if stat.S_ISREG(os.fstat(fd).st_mode):
            os.fchmod(fd, FILE_MODE)
        return os.fdopen(fd, "a" if encoding else "ab", encoding=encoding)
    except BaseException:
        os.close(fd)
        raise


def open_regular(path: str) -> IO[bytes]:
    """``path`` opened to read (binary), if it is a regular file. A symbolic link at that name, a
    FIFO or anything else raises :class:`NotRegularFileError` (a ``FileNotFoundError``: readers
    treat it as no file); a missing file raises ``FileNotFoundError``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotRegularFileError(errno.ELOOP, f"{path} is a symbolic link: not read") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFileError(errno.EINVAL, f"{path} is not a regular file: not read")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
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


def read_text(path: str) -> str | None:
    """The stripped text of a small file (an address, a token), or None if it is missing or empty."""
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        return None
