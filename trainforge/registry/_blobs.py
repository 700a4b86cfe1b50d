"""The blob store: a registry's file contents, stored once each by sha256 over a :class:`Backend`.

    blobs/sha256/<hh>/<sha256>     file contents, stored once, never modified
    uploads/<id>.json              the blobs a register (or push) in flight is writing: gc keeps them

A blob is put in place whole (a rename on local disk, a complete upload on S3) and read out verified:
a copy whose bytes do not hash to its name raises ``IntegrityError`` and is not kept. ``add`` stores
the new files of a version and calls back to commit it while an upload marker protects its blobs;
``collect`` removes the blobs nothing refers to (gc).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from trainforge._internal.state_files import create, data_modes, make_dirs
from trainforge.registry._backend import Backend, LocalBackend
from trainforge.registry._cache import FileHashes
from trainforge.registry._source import CHUNK, place
from trainforge.registry._types import IntegrityError

STALE_UPLOAD_S = 24 * 3600.0
"""An upload marker older than this is a register that died: gc drops it (and may remove its blobs)."""

Progress = Callable[[int, int, str], None]
"""``progress(bytes_done, bytes_total, what)``, called as files are copied."""

T = TypeVar("T")


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def blob_path(sha: str) -> str:
    """Where the blob ``sha`` is, relative to the registry's root."""
    return f"blobs/sha256/{sha[:2]}/{sha}"


@contextlib.contextmanager
def pool(n: int) -> Iterator[ThreadPoolExecutor]:
    """Threads for ``n`` file operations (at most 8, and twice the CPUs)."""
    with ThreadPoolExecutor(max_workers=max(1, min(8, n, 2 * (os.cpu_count() or 1)))) as executor:
        yield executor


class BlobStore:
    """The content-addressed files of the registry at ``url`` (its ``backend``), for the registry's
    other parts: :meth:`add` (register), :meth:`fetch` and :meth:`link_into` (pull, the local
    cache), :meth:`upload` and :meth:`upload_marker` (push), :meth:`collect` (gc)."""

    def __init__(self, backend: Backend, url: str):
        self._b = backend
        self.url = url

    @property
    def is_local(self) -> bool:
        """Whether the blobs are files on this machine's disk (hard links and renames work on them)."""
        return isinstance(self._b, LocalBackend)

    def local_path(self, sha: str) -> str | None:
        """The blob as a local file, when the store is on local disk."""
        return self._b.local_path(blob_path(sha))

    def exists(self, sha: str) -> bool:
        return self._b.exists(blob_path(sha))

    def present(self, shas: Iterable[str]) -> set[str]:
        """Those of ``shas`` that are stored (checked in parallel)."""
        shas = list(shas)
        with pool(len(shas)) as executor:
            return {s for s, ok in zip(shas, executor.map(self.exists, shas), strict=True) if ok}

    # -- storing --------------------------------------------------------------------------------
    def add(self, files: dict[str, str], *, link: bool, progress: Progress | None,
            commit: Callable[[dict[str, dict[str, Any]], dict[str, int]], T]) -> T:  # fmt: skip
        """Store the local files ``{path in the version: local path}`` that are not stored yet, then
        return ``commit(entries, counts)``: ``entries`` ``{path: {"sha256", "size"}}`` (by path),
        ``counts`` ``{"files_copied", "files_skipped", "bytes_copied"}``. An upload marker keeps gc
        off the blobs until ``commit`` returns; a blob it reuses that a concurrent gc removed meanwhile
        is stored again after. Files this machine hashed before are not read again (:class:`FileHashes`);
        ``link``: the files may be hard-linked into a local store (see :func:`~._source.place`)."""
        sizes = {rel: os.path.getsize(p) for rel, p in files.items()}
        known = FileHashes.load()
        hashes = {rel: h for rel, p in files.items() if (h := known.get(p)) is not None}
        staged: dict[str, str] = {}  # sha -> a copy (or link) of the file beside the blobs, not yet in place
        try:
            unknown = {rel: p for rel, p in files.items() if rel not in hashes}
            if self.is_local:
                # Hash and copy each new file at once (on separate threads): the copy is put in place, or
                # dropped when the blob exists, once the hash is known.
                hashes.update(self._hash_and_stage(unknown, staged, link))
            else:
                with pool(len(unknown)) as executor:
                    hashes.update(zip(unknown, executor.map(sha256_file, unknown.values()), strict=True))
            known.update({files[rel]: h for rel, h in hashes.items()})
            known.save()
            entries = {rel: {"sha256": hashes[rel], "size": sizes[rel]} for rel in sorted(files)}
            by_sha = {hashes[rel]: files[rel] for rel in files}
            with self.upload_marker(by_sha):
                present = self.present(by_sha)
                missing = {s: p for s, p in by_sha.items() if s not in present}
                self._put(missing, progress, staged, link)
                counts = {"files_copied": len(missing), "files_skipped": len(by_sha) - len(missing),
                          "bytes_copied": sum(os.path.getsize(p) for p in missing.values())}  # fmt: skip
                out = commit(entries, counts)
                # A blob this version reuses may have been removed by a gc that ran meanwhile: store it again.
                gone = {s: p for s, p in by_sha.items() if s in present and not self.exists(s)}
                self._put(gone, None, {}, link)
        finally:
            for tmp in staged.values():
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        return out

    def _hash_and_stage(self, files: dict[str, str], staged: dict[str, str], link: bool) -> dict[str, str]:
        """The sha256 of each file, each hashed while it is placed beside the blobs (``staged``: sha ->
        that copy, or link: see :func:`~trainforge.registry._source.place`)."""
        if not files:
            return {}
        tmp_dir = self._b.local_path("blobs/sha256")
        assert tmp_dir is not None
        make_dirs(tmp_dir, data_modes().dir)
        tmps = {rel: os.path.join(tmp_dir, f".tmp-{uuid.uuid4().hex[:12]}") for rel in files}

        def stage(rel: str) -> None:
            place(files[rel], tmps[rel], link=link)

        with pool(2 * len(files)) as executor:
            copies = {rel: executor.submit(stage, rel) for rel in files}
            digests = {rel: executor.submit(sha256_file, p) for rel, p in files.items()}
            out = {rel: f.result() for rel, f in digests.items()}
            for rel, c in copies.items():
                c.result()
                staged.setdefault(out[rel], tmps[rel])
        for rel, tmp in tmps.items():  # duplicates of one content: one copy is enough
            if staged.get(out[rel]) != tmp:
                os.unlink(tmp)
        return out

    def _put(self, blobs: dict[str, str], progress: Progress | None, staged: dict[str, str], link: bool) -> None:
        """Store each ``{sha: local file}``: a staged copy is renamed into place; others are placed
        (:func:`~trainforge.registry._source.place`) or uploaded."""
        if not blobs:
            return
        total = sum(os.path.getsize(p) for p in blobs.values())
        done = 0

        def put(item: tuple[str, str]) -> int:
            sha, path = item
            size = os.path.getsize(path)
            target = self.local_path(sha)
            if target is None:
                self.upload(path, sha)
                return size
            make_dirs(os.path.dirname(target), data_modes().dir)
            tmp = staged.pop(sha, None)
            if tmp is None:
                tmp = os.path.join(os.path.dirname(target), f".tmp-{uuid.uuid4().hex[:12]}")
                place(path, tmp, link=link)
            os.replace(tmp, target)
            return size

        with pool(len(blobs)) as executor:
            for n in executor.map(put, blobs.items()):
                done += n
                if progress is not None:
                    progress(done, total, "files")

    def upload(self, local: str, sha: str) -> None:
        """Put the local file ``local`` (whose content is ``sha``, checked by the caller) in place."""
        self._b.put_local(local, blob_path(sha))

    @contextlib.contextmanager
    def upload_marker(self, shas: Iterable[str]) -> Iterator[None]:
        """Record that these blobs are being written (so gc keeps them) until the block ends."""
        marker = f"uploads/{uuid.uuid4().hex}.json"
        self._b.replace(marker, json.dumps({"blobs": sorted(shas), "at": time.time()}).encode())
        try:
            yield
        finally:
            self._b.rm(marker)

    # -- reading --------------------------------------------------------------------------------
    def fetch(self, sha: str, dest: str) -> int:
        """Copy the blob to ``dest`` (a local path) whole and verified: IntegrityError when its bytes do
        not hash to ``sha`` (``dest`` is then not created). Returns its size. A new ``dest``, and its
        missing directories, are the owner's alone (or the umask's: ``data_modes``)."""
        modes = data_modes()
        make_dirs(os.path.dirname(dest) or ".", modes.dir)
        part = f"{dest}.part-{uuid.uuid4().hex[:8]}"
        try:
            create(part, "wb", modes.file).close()  # the copy below writes into it, keeping its mode
            src = self.local_path(sha)
            if src is not None:
                shutil.copyfile(src, part)  # in the kernel; then what was written is verified
            else:
                self._b.get_local(blob_path(sha), part)
            got = sha256_file(part)
            if got != sha:
                raise IntegrityError(
                    f"blob {sha} in registry {self.url} is corrupted (its bytes hash to {got}): restore it from "
                    "another registry (pull_from) or delete the versions that use it"
                )
            os.replace(part, dest)
            return os.path.getsize(dest)
        finally:
            if os.path.exists(part):
                os.unlink(part)

    def link_into(self, files: dict[str, dict[str, Any]], directory: str, what: str) -> None:
        """Hard-link a local store's blobs into ``directory`` as ``files`` (``{path: {"sha256", ...}}``
        of version ``what``), each verified; copied where links do not work (another filesystem)."""

        def link(item: tuple[str, dict[str, Any]]) -> None:
            rel, f = item
            target = os.path.join(directory, *rel.split("/"))
            make_dirs(os.path.dirname(target), data_modes().dir)
            blob = self.local_path(f["sha256"])
            assert blob is not None
            try:
                os.link(blob, target)
            except FileNotFoundError:
                raise IntegrityError(f"{what}: its file {rel} (blob {f['sha256']}) is missing from registry "
                                     f"{self.url}; restore it with pull_from another registry") from None  # fmt: skip
            except OSError:
                self.fetch(f["sha256"], target)
                return
            got = sha256_file(target)
            if got != f["sha256"]:
                raise IntegrityError(
                    f"{what}: its file {rel} (blob {f['sha256']}) in registry {self.url} is corrupted (it hashes "
                    f"to {got}): restore it from another registry (pull_from) or delete the version"
                )

        with pool(len(files)) as executor:
            list(executor.map(link, files.items()))

    # -- gc -------------------------------------------------------------------------------------
    def collect(self, candidates: set[str] | None, referenced: Callable[[], set[str]]) -> dict[str, int]:
        """Remove the blobs (of ``candidates``, or all) that neither a register in flight nor
        ``referenced()`` (the versions' blobs) names. Returns ``{"blobs_removed", "bytes_freed"}``."""
        # Blobs are listed before the references: a register that starts later writes its upload
        # marker before it stores (or reuses) a blob, so its blobs are either unlisted or referenced.
        stored = {rel.rsplit("/", 1)[-1]: (rel, size) for rel, size in self._b.find("blobs/sha256").items()}
        if candidates is not None:
            stored = {s: v for s, v in stored.items() if s in candidates}
        if not stored:
            return {"blobs_removed": 0, "bytes_freed": 0}
        refs = self._uploading()  # before the versions: a register commits before it drops its marker
        refs |= referenced()
        removed = freed = 0
        for sha, (rel, size) in sorted(stored.items()):
            if sha not in refs:
                self._b.rm(f"blobs/sha256/{rel}")
                removed += 1
                freed += size
        return {"blobs_removed": removed, "bytes_freed": freed}

    def _uploading(self) -> set[str]:
        """The blobs of registers in flight (dropping the markers of those that died long ago)."""
        refs: set[str] = set()
        now = time.time()
        for entry in self._b.ls("uploads"):
            try:
                marker = json.loads(self._b.read(f"uploads/{entry}"))
            except (FileNotFoundError, ValueError):
                continue
            if now - float(marker.get("at") or 0) > STALE_UPLOAD_S:
                self._b.rm(f"uploads/{entry}")  # a register that died long ago
                continue
            refs.update(marker.get("blobs") or [])
        return refs
