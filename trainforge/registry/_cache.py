"""This machine's registry cache (``$TRAINFORGE_REGISTRY_CACHE``, else ``~/.cache/trainforge/registry``):

    <cache>/<registry key>/<name>/<version>/    a version's files, materialised once for loading
    <cache>/file-hashes.json                    the sha256 of local files registered before

Both are caches: deleting them costs a copy (or a read) again, never data.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Callable

from trainforge._internal.state_files import create, data_modes, make_dirs

ENV_CACHE = "TRAINFORGE_REGISTRY_CACHE"


def cache_dir() -> str:
    """Where versions are pulled for loading: ``$TRAINFORGE_REGISTRY_CACHE``, else
    ``~/.cache/trainforge/registry``."""
    return os.environ.get(ENV_CACHE) or os.path.join(os.path.expanduser("~"), ".cache", "trainforge", "registry")


def local_copy(registry_url: str, name: str, version: int, fill: Callable[[str], object]) -> str:
    """The cache's directory of version ``version`` of ``name`` in the registry at ``registry_url``;
    the first call fills it (``fill(directory)`` writes the files into a temporary directory, renamed
    into place when complete, so a concurrent caller never sees it half written)."""
    key = hashlib.sha256(registry_url.encode()).hexdigest()[:16]
    final = os.path.join(cache_dir(), key, name, str(version))
    if os.path.isdir(final):
        return final
    tmp = f"{final}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        fill(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not os.path.isdir(final):  # not a concurrent materialization of the same version
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


class FileHashes:
    """This machine's sha256 of local files by ``(device, inode, size, mtime, ctime)``, so registering
    files that did not change does not read them again (``<cache_dir>/file-hashes.json``; a cache:
    concurrent writers may drop each other's entries, never corrupt them)."""

    MAX_ENTRIES = 100_000

    def __init__(self, path: str, entries: dict[str, str]):
        self.path, self.entries, self.changed = path, entries, False

    @classmethod
    def load(cls) -> FileHashes:
        path = os.path.join(cache_dir(), "file-hashes.json")
        try:
            with open(path) as f:
                entries = json.load(f)
        except (OSError, ValueError):
            entries = {}
        return cls(path, entries if isinstance(entries, dict) else {})

    @staticmethod
    def key(path: str) -> str:
        st = os.stat(path)
        return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"

    def get(self, path: str) -> str | None:
        return self.entries.get(self.key(path))

    def update(self, hashes: dict[str, str]) -> None:
        for path, sha in hashes.items():
            with contextlib.suppress(OSError):
                key = self.key(path)
                if self.entries.get(key) != sha:
                    self.entries[key] = sha
                    self.changed = True

    def save(self) -> None:
        if not self.changed:
            return
        entries = dict(list(self.entries.items())[-self.MAX_ENTRIES :])
        with contextlib.suppress(OSError):
            modes = data_modes()
            make_dirs(os.path.dirname(self.path), modes.dir)
            tmp = f"{self.path}.tmp-{uuid.uuid4().hex[:8]}"
            with create(tmp, "w", modes.file) as f:
                json.dump(entries, f)
            os.replace(tmp, self.path)
