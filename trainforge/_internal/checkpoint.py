"""``Checkpoint``: a directory of files, on local disk or any fsspec filesystem."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

from trainforge._internal.filesystem import is_local_fs
from trainforge._internal.state_files import create, data_modes

METADATA_FILE = ".metadata.json"


class Checkpoint:
    """A reference to a directory of checkpoint files.

    Example::

        with tempfile.TemporaryDirectory() as d:
            torch.save(model.state_dict(), os.path.join(d, "model.pt"))
            trainforge.report({"loss": loss}, checkpoint=Checkpoint.from_directory(d))

        with result.checkpoint.as_directory() as d:
            model.load_state_dict(torch.load(os.path.join(d, "model.pt")))

    ``path`` is a local path or a path inside ``filesystem`` (an fsspec filesystem; ``None`` means
    the local disk). Metadata is a small JSON dict stored beside the files in ``.metadata.json``.
    Reads and writes on a remote filesystem retry transient errors and raise ``StorageError`` when
    they fail for good.
    """

    def __init__(self, path: str | os.PathLike, filesystem: Any = None):
        self.path = os.fspath(path) if filesystem is None else str(path)
        self.filesystem = filesystem

    @classmethod
    def from_directory(cls, path: str | os.PathLike) -> Checkpoint:
        path = os.fspath(path)
        if not os.path.isdir(path):
            raise ValueError(
                f"Checkpoint.from_directory({path!r}): no such directory. Write the checkpoint files "
                "into a directory first, then pass that directory."
            )
        return cls(os.path.abspath(path))

    @classmethod
    def from_uri(cls, uri: str | os.PathLike) -> Checkpoint:
        """A checkpoint by URI: a registered model version (``models:/name/3``,
        ``models:/name@production``, ``models:/name``; its local copy, pulled and verified on first
        use, from ``Registry()`` or the registry named by ``?registry=<url>``), a URL of any fsspec
        filesystem (``s3://bucket/run/checkpoint_000002``) or a local directory."""
        uri = os.fspath(uri)
        scheme, sep, _ = uri.partition(":/")
        if sep and scheme.isidentifier() and not uri.startswith(f"{scheme}://"):  # models:/..., not s3://
            from trainforge._internal.extensions import CHECKPOINT_SCHEMES, lookup

            resolve = lookup(CHECKPOINT_SCHEMES, scheme)
            if resolve is None:
                raise ValueError(
                    f"Checkpoint.from_uri({uri!r}): nothing handles {scheme}:/ URIs here. models:/ URIs need the "
                    "model registry (trainforge.registry, part of trainforge: reinstall it, or import "
                    "trainforge.registry first when running from a checkout)."
                )
            return resolve(uri)  # type: ignore[no-any-return]
        if "://" in uri and not uri.startswith("file://"):
            from trainforge._internal.filesystem import resolve_filesystem

            fs, path = resolve_filesystem(uri)
            return cls(path, fs)
        return cls.from_directory(uri.removeprefix("file://"))

    @property
    def is_local(self) -> bool:
        return self.filesystem is None or is_local_fs(self.filesystem)

    def to_directory(self, path: str | os.PathLike | None = None) -> str:
        """Copy the checkpoint files into ``path`` (a new temporary directory by default); return it."""
        dest = os.fspath(path) if path is not None else tempfile.mkdtemp(prefix="trainforge_ckpt_")
        os.makedirs(dest, exist_ok=True)
        if self.is_local:
            shutil.copytree(self.path, dest, dirs_exist_ok=True)
        else:
            src = self.path.rstrip("/") + "/"
            self._remote("download", lambda: self.filesystem.get(src, dest.rstrip("/") + "/", recursive=True))
        return dest

    def _remote(self, operation: str, fn: Any) -> Any:
        from trainforge._internal.retry import display_url, retry_call

        return retry_call(f"checkpoint {operation}", display_url(self.filesystem, self.path), fn)

    @contextlib.contextmanager
    def as_directory(self) -> Iterator[str]:
        """Yield a local directory with the files: the checkpoint itself when local (do not modify it),
        otherwise a temporary download that is removed afterwards."""
        if self.is_local:
            yield self.path
            return
        tmp = self.to_directory()
        try:
            yield tmp
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    # -- metadata ---------------------------------------------------------------------------------
    def _metadata_path(self) -> str:
        return self.path.rstrip("/") + "/" + METADATA_FILE

    def get_metadata(self) -> dict[str, Any]:
        try:
            if self.is_local:
                with open(self._metadata_path()) as f:
                    return json.load(f)
            return self._remote("get_metadata", self._read_remote_metadata)
        except FileNotFoundError:
            return {}

    def _read_remote_metadata(self) -> dict[str, Any]:
        try:
            return json.loads(self.filesystem.cat_file(self._metadata_path()))
        except FileNotFoundError:
            return {}

    def set_metadata(self, metadata: dict[str, Any]) -> None:
        if not isinstance(metadata, dict):
            raise TypeError(f"Checkpoint metadata must be a dict, got {type(metadata).__name__}.")
        text = json.dumps(metadata)
        if self.is_local:
            tmp = self._metadata_path() + ".tmp"
            with create(tmp, "w", data_modes().file) as f:
                f.write(text)
            os.replace(tmp, self._metadata_path())
        else:
            self._remote("set_metadata", lambda: self.filesystem.pipe_file(self._metadata_path(), text.encode()))

    def update_metadata(self, metadata: dict[str, Any]) -> None:
        merged = self.get_metadata()
        merged.update(metadata)
        self.set_metadata(merged)

    def __repr__(self) -> str:
        return f"Checkpoint(path={self.path!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Checkpoint) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    def __fspath__(self) -> str:
        if not self.is_local:
            raise TypeError("a remote checkpoint has no local path; use as_directory() or to_directory()")
        return self.path
