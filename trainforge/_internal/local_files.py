"""Local-disk file operations of the checkpoint protocol (:mod:`trainforge._internal.storage` on a
local run directory): a tree copied into staging, a file written in a directory nobody reads yet, a
directory renamed into place. Files and directories are created with the run directory's
:class:`~trainforge._internal.state_files.Modes` (the owner's alone by default), given at creation."""

from __future__ import annotations

import errno
import os
import shutil
import threading
from typing import TYPE_CHECKING, Any

from trainforge._internal.state_files import PRIVATE, Modes, create, make_dirs

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor


def copy_tree(src: str, dest: str, modes: Modes = PRIVATE) -> None:
    """Copy the files under ``src`` into ``dest`` (merging with what is there), the new directories
    and files created with ``modes`` (the run directory's, not the source's: ``shutil.copytree``
    would copy the modes of the directory the user wrote the checkpoint in). Files of at least
    ``BIG_FILE_BYTES`` are copied side by side (:func:`copy_files`)."""

    def fail(exc: OSError) -> None:
        raise exc

    pairs: list[tuple[str, str]] = []
    for dirpath, _dirnames, filenames in os.walk(src, onerror=fail, followlinks=True):
        rel = os.path.relpath(dirpath, src)
        target = dest if rel == "." else os.path.join(dest, rel)
        make_dirs(target, modes.dir)
        pairs.extend((os.path.join(dirpath, name), os.path.join(target, name)) for name in filenames)
    copy_files(pairs, modes.file)


# A file this big is worth a copy on another thread: on a 2-core machine two 5 MB files copy in
# 1.0 ms side by side against 1.6 ms one after the other (each copy is a kernel loop over one file's
# pages, and ext4 lets writes to different files run at once; halves of one file contend for its
# inode and are slower than one thread), and its blocks worth reserving first (_reserve). Below it,
# handing a file to a thread costs more than it saves.
BIG_FILE_BYTES = 1 << 20
COPY_THREADS = 4  # at most, the calling thread included (more only compete for memory bandwidth)
_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def copy_files(pairs: list[tuple[str, str]], mode: int = PRIVATE.file) -> None:
    """Copy each ``(src, dest)`` file (a new ``dest`` created with ``mode``); the big ones
    (``BIG_FILE_BYTES``) on up to as many threads as this process may use CPUs (``COPY_THREADS`` at
    most), largest first, the calling thread taking its share. Every copy is finished or failed when
    this returns; the first failure is raised."""
    sizes: dict[tuple[str, str], int] = {}
    for pair in pairs:
        try:
            sizes[pair] = os.stat(pair[0]).st_size
        except OSError:
            sizes[pair] = 0  # copy_file says what is wrong with it
    big = sorted((p for p in pairs if sizes[p] >= BIG_FILE_BYTES), key=lambda p: -sizes[p])
    threads = min(len(big), _usable_cpus(), COPY_THREADS)
    if threads < 2:
        for src, dest in pairs:
            copy_file(src, dest, mode)
        return
    small = [p for p in pairs if sizes[p] < BIG_FILE_BYTES]
    queue = iter(big + small)
    take = threading.Lock()
    errors: list[BaseException] = []

    def work() -> None:
        while not errors:
            with take:
                pair = next(queue, None)
            if pair is None:
                return
            try:
                copy_file(*pair, mode)
            except BaseException as exc:  # noqa: BLE001 - raised by the caller below
                errors.append(exc)

    helpers = [_thread_pool().submit(work) for _ in range(threads - 1)]
    work()
    for helper in helpers:
        helper.result()
    if errors:
        raise errors[0]


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def _thread_pool() -> ThreadPoolExecutor:
    """The process's copy threads, started by its first parallel copy (a fork gets a new pool)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            from concurrent.futures import ThreadPoolExecutor

            _pool = ThreadPoolExecutor(max_workers=COPY_THREADS - 1, thread_name_prefix="trainforge-copy")
        return _pool


def _forget_pool() -> None:
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()  # the parent's threads do not exist in a forked child


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


# copy_file_range's errors that mean "not here" (another filesystem before Linux 5.3, a filesystem or
# kernel without it, a file it cannot take): shutil.copyfile copies the file instead.
_NO_COPY_RANGE = {errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM, errno.EBADF}


def copy_file(src: str, dest: str, mode: int = PRIVATE.file) -> None:
    """``shutil.copyfile`` (the data, not the mode: a new ``dest`` is created with ``mode``), by
    ``copy_file_range`` where the kernel has it: the copy stays in the kernel with one call per file
    (about 10% faster than the ``sendfile`` loop that ``shutil`` uses on Linux for a file of a few MB,
    measured by bench_recovery's persist part)."""
    if not hasattr(os, "copy_file_range"):
        create(dest, "wb", mode).close()  # then shutil writes into it, its mode kept
        shutil.copyfile(src, dest)
        return
    with open(src, "rb") as fin, create(dest, "wb", mode) as fout:
        size = os.fstat(fin.fileno()).st_size
        if size >= BIG_FILE_BYTES:
            _reserve(fout.fileno(), size)
        done = 0
        try:
            while done < size:
                n = os.copy_file_range(fin.fileno(), fout.fileno(), min(size - done, 2**30))
                if n == 0:  # the file is shorter than it said (it changed, or a special file)
                    break
                done += n
        except OSError as exc:
            if exc.errno not in _NO_COPY_RANGE or done:
                raise
        if done == size and size:
            return
    shutil.copyfile(src, dest)  # nothing copied (an empty or special file, or no copy_file_range here): dest exists


_fallocate: Any = None


def _reserve(fd: int, size: int) -> None:
    """Allocate a big file's blocks before its copy (``fallocate(2)`` with ``FALLOC_FL_KEEP_SIZE``:
    the size grows with the copy): ext4 then writes into extents it has, about 10% faster for 10 MB.
    Best effort: where the call or the filesystem is missing, the copy allocates as it goes (the C
    library's ``posix_fallocate`` is not used: where a filesystem lacks it, it writes zeros first)."""
    global _fallocate
    if _fallocate is None:
        try:
            import ctypes

            _fallocate = ctypes.CDLL(None, use_errno=True).fallocate
            _fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
            _fallocate.restype = ctypes.c_int
        except (ImportError, OSError, AttributeError):  # not Linux, or no such function in its C library
            _fallocate = False
    if _fallocate:
        _fallocate(fd, 1, 0, size)  # 1: FALLOC_FL_KEEP_SIZE; an error (-1) leaves the copy to allocate


def write_new(path: str, data: bytes, mode: int = PRIVATE.file) -> None:
    """Write a file in a directory nobody reads yet (a staging directory): no temporary name; a new
    file is created with ``mode``."""
    with create(path, "wb", mode) as f:
        f.write(data)


def move_dir(src: str, dest: str) -> None:
    """Rename directory ``src`` to ``dest``, replacing what an interrupted commit left at ``dest``."""
    try:
        os.replace(src, dest)
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
            raise
        if os.path.isdir(dest) and not os.path.islink(dest):
            shutil.rmtree(dest)
        else:
            os.remove(dest)
        os.replace(src, dest)
