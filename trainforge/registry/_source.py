"""What a register reads, and how its files get beside the blobs.

A source (a ``Result``, a ``Checkpoint``, a directory, or a URL of any fsspec filesystem) is read as a
local directory of regular files (:func:`local_source`, :func:`walk`). Two rules hold for every way in:

- **Symbolic links are refused**, whether they point to a file or a directory, inside the source or
  out, or nowhere: :class:`~trainforge.registry.SymlinkError` names the link and where it points. A
  link is never followed (registering a directory with ``passwd -> /etc/passwd`` in it used to store
  ``/etc/passwd``), so what is stored is exactly the source's own files.
- **A source file is never modified**, its mode included. Blobs are read-only, so a file is
  hard-linked into the blobs only when it is a committed checkpoint's (never rewritten), already
  read-only (no write permission for anyone) and no more readable than a blob of the registry
  (0400 by default: a 0444 file is copied): the blob is then that very file, with nothing to change.
  Any other file is copied, and the copy (the registry's own file) is made read-only (:func:`place`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import shutil
import stat
from collections.abc import Iterator
from typing import Any

from trainforge._internal.state_files import data_modes, read_only
from trainforge.registry._types import SymlinkError
from trainforge.registry._uri import is_model_uri

CHUNK = 1 << 20  # the buffer of file reads and copies
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)


def symlink_error(rel: str, target: str | None, root: str) -> SymlinkError:
    """The refusal of the link ``rel`` (``/``-separated, relative to ``root``) pointing at ``target``."""
    where = f"to {target!r}" if target is not None else "(its target is not known)"
    return SymlinkError(
        f"{rel} in {root} is a symbolic link {where}: the registry stores regular files only and never follows "
        f"a link. Copy what it points to into {root} in its place, or remove the link, then register again"
    )


def walk(directory: str) -> dict[str, str]:
    """``{relative path (/-separated): absolute path}`` of every file under ``directory``, all regular
    files: a symbolic link (to a file or a directory) is ``SymlinkError``; a FIFO, socket or device,
    or a subdirectory that cannot be read, ``ValueError`` / ``OSError`` (never silently left out)."""

    def fail(exc: OSError) -> None:
        raise exc

    out: dict[str, str] = {}
    for dirpath, dirnames, names in os.walk(directory, onerror=fail):
        for n in sorted(dirnames) + sorted(names):
            full = os.path.join(dirpath, n)
            rel = os.path.relpath(full, directory).replace(os.sep, "/")
            mode = os.lstat(full).st_mode
            if stat.S_ISLNK(mode):
                raise symlink_error(rel, os.readlink(full), directory)
            if stat.S_ISDIR(mode):
                continue
            if not stat.S_ISREG(mode):
                raise ValueError(f"{rel} in {directory} is not a regular file (a FIFO, socket or device): the "
                                 "registry stores regular files only; move it out of the directory")  # fmt: skip
            out[rel] = full
    if not out:
        raise ValueError(f"{directory} holds no files: nothing to register")
    return out


def refuse_remote_links(fs: Any, path: str, where: str) -> None:
    """``SymlinkError`` when the directory ``path`` of the fsspec filesystem ``fs`` holds a link
    (checked before a download, which would follow it; ``where``: ``path`` as the user wrote it)."""
    fs.invalidate_cache(path)
    found = fs.find(path, withdirs=True, detail=True)
    prefix = fs._strip_protocol(path).rstrip("/") + "/"
    for p, info in sorted(found.items()):
        if info.get("islink") or info.get("type") == "link":
            target = info.get("destination")
            raise symlink_error(p[len(prefix):] if p.startswith(prefix) else p, target and str(target), where)


def place(src: str, dst: str, *, link: bool) -> None:
    """Put the regular file ``src`` at ``dst`` (a new name beside the blobs) without changing ``src``:
    a hard link when ``link`` and ``src`` is read-only already and no more readable than a blob
    (the blob is then that file as it is), else a copy of its own made read-only (0400, or the
    umask's 0444 with ``$TRAINFORGE_FILE_MODE=umask``). ``SymlinkError`` when ``src`` is a link (not followed)."""
    try:
        fd = os.open(src, os.O_RDONLY | _NOFOLLOW)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise symlink_error(os.path.basename(src), os.readlink(src), os.path.dirname(src)) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{src} is not a regular file: the registry stores regular files only")
        mode = data_modes().file
        if link and st.st_mode & 0o777 & ~(mode & 0o444) == 0:  # read-only, and readable by no more than a blob
            try:
                os.link(src, dst, follow_symlinks=False)
            except OSError:
                pass  # another filesystem, or no hard links there: copy
            else:
                got = os.lstat(dst)
                if (got.st_dev, got.st_ino) == (st.st_dev, st.st_ino):
                    return
                os.unlink(dst)  # src was replaced meanwhile: copy the file that was opened
        out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), mode)
        try:
            _copy_fd(fd, out, st.st_size)
            read_only(out)  # blobs are immutable: an in-place write fails instead of corrupting them
        except BaseException:
            os.close(out)
            os.unlink(dst)
            raise
        os.close(out)
    finally:
        os.close(fd)


def _copy_fd(src: int, dst: int, size: int) -> None:
    """Copy in the kernel where it can (``sendfile``, as ``shutil.copyfile`` does), else by reads."""
    offset = 0
    if hasattr(os, "sendfile"):
        try:
            while sent := os.sendfile(dst, src, offset, max(size, CHUNK)):
                offset += sent
            return
        except OSError:
            if offset:
                raise
    with open(src, "rb", closefd=False) as fin, open(dst, "wb", closefd=False) as fout:
        shutil.copyfileobj(fin, fout, CHUNK)


def _scalar_metrics(metrics: dict[str, Any] | None) -> dict[str, Any]:
    """The finite numbers and strings of a run's last metrics (what a version records by default)."""
    out: dict[str, Any] = {}
    for k, v in (metrics or {}).items():
        if isinstance(v, bool) or k == "config":
            continue
        if isinstance(v, (int, float)) and math.isfinite(v):
            out[str(k)] = v
        elif hasattr(v, "item") and getattr(v, "size", 2) == 1:  # numpy / torch scalars
            item = v.item()
            if isinstance(item, (int, float)) and math.isfinite(item):
                out[str(k)] = item
    return out


def _definition_of(checkpoint: Any) -> str | None:
    """The definition a checkpoint's run trained (its metadata's ``model_definition``), if any."""
    from trainforge.model import DEFINITION_KEY

    try:
        value = checkpoint.get_metadata().get(DEFINITION_KEY)
    except Exception:  # no metadata, or unreadable: nothing to record
        return None
    return value if isinstance(value, str) and is_model_uri(value) else None


@contextlib.contextmanager
def local_source(source: Any) -> Iterator[tuple[str, dict[str, Any], dict[str, Any], bool]]:
    """(a local directory with the files, lineage, metrics, whether its files may be hard-linked) of a
    Result, Checkpoint or directory. A local checkpoint's files are never modified once it is
    committed, so a local registry may link them (see :func:`place`); a directory's files are copied
    (its owner may rewrite them), and so are a remote checkpoint's (a temporary download)."""
    from trainforge import Checkpoint, Result
    from trainforge._internal.retry import display_url

    lineage: dict[str, Any] = {}
    metrics: dict[str, Any] = {}
    if isinstance(source, Result):
        if source.checkpoint is None:
            raise ValueError(
                f"the Result of {source.path} has no checkpoint: report one with trainforge.report(metrics, "
                "checkpoint=...) in the train loop, or register a directory"
            )
        lineage["run_path"] = display_url(source.filesystem, source.path)
        config = getattr(source, "config", None)
        if isinstance(config, dict) and config:
            with contextlib.suppress(TypeError, ValueError):
                lineage["trial_config"] = json.loads(json.dumps(config, default=str))
        metrics = _scalar_metrics(source.metrics)
        source = source.checkpoint
    if isinstance(source, Checkpoint):
        definition = _definition_of(source)
        if definition is not None:
            lineage["definition"] = definition  # trained from a registered definition (ModelTrainer("models:/..."))
        if source.is_local:
            lineage["checkpoint_path"] = source.path
        else:
            lineage["checkpoint_path"] = display_url(source.filesystem, source.path)
            refuse_remote_links(source.filesystem, source.path, lineage["checkpoint_path"])
        with source.as_directory() as d:
            yield d, lineage, metrics, source.is_local
        return
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if is_model_uri(path):
            raise ValueError(f"source={path!r} is a registered model: copy versions between registries with "
                             "Registry.push / pull_from")  # fmt: skip
        if "://" in path and not path.startswith("file://"):
            from trainforge._internal.filesystem import resolve_filesystem

            fs, inner = resolve_filesystem(path)
            with local_source(Checkpoint(inner, fs)) as out:
                yield out
            return
        path = path.removeprefix("file://")
        if not os.path.isdir(path):
            raise ValueError(f"source={path!r}: no such directory; give a Result, a Checkpoint or a directory of files")
        lineage["checkpoint_path"] = os.path.abspath(path)
        yield os.path.abspath(path), lineage, metrics, False
        return
    raise TypeError(f"source={source!r}: give a trainforge Result, a Checkpoint or a directory")
