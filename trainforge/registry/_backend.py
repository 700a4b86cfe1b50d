"""The registry's storage: a local directory or any fsspec filesystem, with the four operations the
registry's consistency rests on.

- ``create(path, data)``: an exclusive create of a small file, complete or absent, never half
  written; False when the path exists. Local disk: a temporary file hard-linked into place (``link``
  fails when the name exists). S3: a conditional put (``If-None-Match: *``). Any other fsspec
  filesystem: a check then a write, which is not safe against a concurrent writer (documented).
- ``replace(path, data)``: an atomic overwrite (a temporary file renamed into place; one PUT on S3).
- ``put_local(local, path)``: a file into place whole (copied beside it, then renamed; an upload,
  which S3 makes visible only when complete).
- listings and reads; remote calls retry transient errors (``trainforge._internal.retry``) and a
  missing path is always ``FileNotFoundError``.

On local disk every file and directory is created the owner's alone (0600, blobs 0400, directories
0700), or as the umask says with ``$TRAINFORGE_FILE_MODE=umask``
(:func:`~trainforge._internal.state_files.data_modes`).
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from trainforge._internal.state_files import create, data_modes, make_dirs, read_only

T = TypeVar("T")


def _tmp_name(path: str) -> str:
    head, _, tail = path.rpartition("/")
    return f"{head}/.tmp-{uuid.uuid4().hex[:12]}-{tail}"


class Backend:
    """Where a registry's files are; paths are ``/``-separated and relative to its root."""

    url: str

    def read(self, rel: str) -> bytes:
        raise NotImplementedError

    def create(self, rel: str, data: bytes) -> bool:
        raise NotImplementedError

    def replace(self, rel: str, data: bytes) -> None:
        raise NotImplementedError

    def ls(self, rel: str) -> list[str]:
        """The names directly under ``rel`` (files and directories); [] when it does not exist."""
        raise NotImplementedError

    def find(self, rel: str) -> dict[str, int]:
        """Every file under ``rel``, recursively: ``{path relative to rel: size}``."""
        raise NotImplementedError

    def exists(self, rel: str) -> bool:
        raise NotImplementedError

    def size(self, rel: str) -> int:
        raise NotImplementedError

    def rm(self, rel: str) -> None:
        """Remove a file; nothing when it is already gone."""
        raise NotImplementedError

    def put_local(self, local: str, rel: str) -> None:
        raise NotImplementedError

    def get_local(self, rel: str, local: str) -> None:
        raise NotImplementedError

    def local_path(self, rel: str) -> str | None:
        """The file's path on this machine's disk (local registries), else None."""
        return None

    @property
    def exclusive_create_is_atomic(self) -> bool:
        return True


class LocalBackend(Backend):
    def __init__(self, root: str):
        self.root = os.path.abspath(os.path.expanduser(root))
        self.url = self.root

    def _p(self, rel: str) -> str:
        return os.path.join(self.root, *rel.split("/")) if rel else self.root

    def local_path(self, rel: str) -> str:
        return self._p(rel)

    def read(self, rel: str) -> bytes:
        with open(self._p(rel), "rb") as f:
            return f.read()

    def _write_tmp(self, path: str, data: bytes) -> str:
        modes = data_modes()
        make_dirs(os.path.dirname(path), modes.dir)
        tmp = _tmp_name(path)
        with create(tmp, "wb", modes.file) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return tmp

    def create(self, rel: str, data: bytes) -> bool:
        path = self._p(rel)
        tmp = self._write_tmp(path, data)
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)

    def replace(self, rel: str, data: bytes) -> None:
        path = self._p(rel)
        os.replace(self._write_tmp(path, data), path)

    def ls(self, rel: str) -> list[str]:
        try:
            return [n for n in os.listdir(self._p(rel)) if not n.startswith(".tmp-")]
        except (FileNotFoundError, NotADirectoryError):
            return []

    def find(self, rel: str) -> dict[str, int]:
        base = self._p(rel)
        out: dict[str, int] = {}
        for dirpath, _, names in os.walk(base):
            for n in names:
                if n.startswith(".tmp-"):
                    continue
                full = os.path.join(dirpath, n)
                try:
                    out[os.path.relpath(full, base).replace(os.sep, "/")] = os.stat(full).st_size
                except FileNotFoundError:  # removed meanwhile
                    pass
        return out

    def exists(self, rel: str) -> bool:
        return os.path.exists(self._p(rel))

    def size(self, rel: str) -> int:
        return os.stat(self._p(rel)).st_size

    def rm(self, rel: str) -> None:
        try:
            os.unlink(self._p(rel))
        except FileNotFoundError:
            pass

    def put_local(self, local: str, rel: str) -> None:
        path = self._p(rel)
        modes = data_modes()
        make_dirs(os.path.dirname(path), modes.dir)
        tmp = _tmp_name(path)
        try:
            create(tmp, "wb", modes.file).close()
            shutil.copyfile(local, tmp)  # into the file just made: its mode kept
            read_only(tmp)  # blobs are immutable: an in-place write fails instead of corrupting them
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def get_local(self, rel: str, local: str) -> None:
        shutil.copyfile(self._p(rel), local)


class FsspecBackend(Backend):
    """A registry on an fsspec filesystem (``s3://bucket/registry``, ``gs://...``, ``memory://...``)."""

    def __init__(self, fs: Any, root: str):
        from trainforge._internal.retry import display_url

        self.fs = fs
        self.root = root.rstrip("/")
        self.url = display_url(fs, self.root)
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        self.is_s3 = protocol in ("s3", "s3a")

    def _p(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def _call(self, operation: str, rel: str, fn: Callable[[], T]) -> T:
        from trainforge import StorageError
        from trainforge._internal.retry import retry_call

        try:
            return retry_call(f"registry {operation}", f"{self.url}/{rel}", fn)
        except StorageError as exc:
            if isinstance(exc.__cause__, FileNotFoundError):  # a missing path is an answer, not a failure
                raise exc.__cause__ from None
            raise

    def read(self, rel: str) -> bytes:
        return self._call("read", rel, lambda: bytes(self.fs.cat_file(self._p(rel))))

    @property
    def exclusive_create_is_atomic(self) -> bool:
        return self.is_s3

    def create(self, rel: str, data: bytes) -> bool:
        path = self._p(rel)
        if self.is_s3:
            bucket, _, key = path.partition("/")

            def put() -> bool:
                try:
                    self.fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
                    return True
                except Exception as exc:  # s3fs maps 412 Precondition Failed to an OSError subclass
                    if _is_precondition_failed(exc):
                        return False
                    raise

            return self._call("create", rel, put)
        if self._call("exists", rel, lambda: self.fs.exists(path)):
            return False
        self._call("create", rel, lambda: self.fs.pipe_file(path, data))
        return True

    def replace(self, rel: str, data: bytes) -> None:
        self._call("write", rel, lambda: self.fs.pipe_file(self._p(rel), data))

    def ls(self, rel: str) -> list[str]:
        def listing() -> list[str]:
            try:
                entries = self.fs.ls(self._p(rel), detail=False, refresh=True)
            except FileNotFoundError:
                return []
            return [e.rstrip("/").rsplit("/", 1)[-1] for e in entries]

        return self._call("list", rel, listing)

    def find(self, rel: str) -> dict[str, int]:
        base = self._p(rel)

        def listing() -> dict[str, int]:
            self.fs.invalidate_cache(base)
            try:
                found = self.fs.find(base, detail=True)
            except FileNotFoundError:
                return {}
            prefix = self.fs._strip_protocol(base).rstrip("/") + "/"
            return {p[len(prefix):]: int(info.get("size") or 0) for p, info in found.items()
                    if p.startswith(prefix) and info.get("type") != "directory"}  # fmt: skip

        return self._call("list", rel, listing)

    def exists(self, rel: str) -> bool:
        path = self._p(rel)

        def check() -> bool:
            self.fs.invalidate_cache(path)
            return bool(self.fs.exists(path))

        return self._call("exists", rel, check)

    def size(self, rel: str) -> int:
        path = self._p(rel)

        def info() -> int:
            self.fs.invalidate_cache(path)
            return int(self.fs.info(path)["size"])

        return self._call("stat", rel, info)

    def rm(self, rel: str) -> None:
        def remove() -> None:
            try:
                self.fs.rm_file(self._p(rel))
            except FileNotFoundError:
                pass

        self._call("remove", rel, remove)

    def put_local(self, local: str, rel: str) -> None:
        self._call("upload", rel, lambda: self.fs.put_file(local, self._p(rel)))

    def get_local(self, rel: str, local: str) -> None:
        self._call("download", rel, lambda: self.fs.get_file(self._p(rel), local))


def _is_precondition_failed(exc: BaseException) -> bool:
    cur: BaseException | None = exc
    while cur is not None:
        response = getattr(cur, "response", None)
        if isinstance(response, dict):
            err = response.get("Error") or {}
            status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            if err.get("Code") in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
                return True
        if "PreconditionFailed" in str(cur) or "412" in str(cur) and "Precondition" in str(cur):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def open_backend(url: str) -> Backend:
    """The backend of a registry URL or directory."""
    from trainforge._internal.filesystem import resolve_filesystem

    try:
        fs, path = resolve_filesystem(url)
    except ValueError as exc:
        raise ValueError(str(exc).replace("RunConfig.storage_path", "the registry URL")) from None
    if fs is None:
        return LocalBackend(path)
    return FsspecBackend(fs, path)
