"""Where a run's files live, and the checkpoint commit protocol.

Layout of a run directory ``{storage_path}/{name}/`` (a local path or any fsspec URL, e.g.
``s3://bucket/prefix``)::

    run_state.json              trainer/config summary, status, error (rewritten as the run progresses)
    metrics.jsonl               every report of rank 0, one JSON object per line, in order
    checkpoint_000000/          a committed checkpoint: files of every rank that reported one, merged
        .metadata.json                the checkpoint's metadata, under it the trainer's ``metadata=``
        .trainforge_checkpoint.json   the commit marker, written last (index, metrics, time, ranks)
    .staging/a{attempt}_r{report}/rank_{rank}/   files a rank staged, waiting for the other ranks
                                (``.staging/`` is removed at the end of a run when empty)
    logs/rank_{rank}.log        each worker's stdout and stderr (uploaded at the end on remote storage)
    logs/rank_{rank}.stack      a local worker's thread stacks, dumped when it was found hung (only then)

Commit protocol: each rank copies its checkpoint files into its own staging directory (inside
``report()``, or from the rank's background uploader with ``CheckpointUploadMode.ASYNC``) and tells
the driver. When every rank has made that report, the driver merges the rank directories into
``checkpoint_NNNNNN`` (for a file that several ranks wrote, the lowest rank's copy wins), adds the
trainer's metadata to the checkpoint's ``.metadata.json`` (keys the workers set win), writes the
commit marker, and only then removes the staging directory. On local disk the merge renames files;
on other filesystems it is one listing of the staging directory and one batch of copies inside the
filesystem (server-side ``CopyObject`` on S3: no data passes through the driver), then one batched
delete. A directory without the marker is never treated as a checkpoint and is removed by the next
run on that directory, so a run killed in the middle of a commit leaves nothing that is picked up.

The common case, one rank's files on local disk, is one rename: the trainer's metadata and the
marker are written into that rank's staging directory, which is then renamed into place, so the
checkpoint directory appears whole, marker included. Removing a committed report's staging directory
is cleanup, not part of the commit (on some disks removing even an empty directory waits for the
journal, milliseconds): :meth:`StorageContext.commit_checkpoint` leaves it to
:meth:`StorageContext.remove_committed_staging`, which the controller calls once the report is handed
on (an interrupted run's leftovers are removed by the next run, as above).

Every operation retries transient errors and raises :class:`StorageError` naming the operation, the
URL and the cause when it fails for good (see ``retry.py``).

On local disk the run directory is its owner's alone: files 0600, directories 0700 (the missing
parents of ``storage_path`` included), or as the umask says with ``$TRAINFORGE_FILE_MODE=umask``
(:func:`~trainforge._internal.state_files.data_modes`). The modes are given when each file and
directory is created: no extra pass over the files.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import time
from collections.abc import Callable
from typing import Any, TypeVar

from trainforge._internal.checkpoint import METADATA_FILE, Checkpoint
from trainforge._internal.exceptions import StorageError
from trainforge._internal.filesystem import resolve_filesystem
from trainforge._internal.local_files import copy_tree, move_dir, write_new
from trainforge._internal.retry import display_url, is_transient, retry_call
from trainforge._internal.state_files import create, data_modes, make_dirs

COMMIT_MARKER = ".trainforge_checkpoint.json"
STAGING_DIR = ".staging"
METRICS_FILE = "metrics.jsonl"
RUN_STATE_FILE = "run_state.json"
LOGS_DIR = "logs"
CHECKPOINT_PREFIX = "checkpoint_"

# Filesystems whose directories are implied by object keys: nothing to create (and creating the
# "parent" of a path would create a missing bucket instead of reporting it).
OBJECT_STORE_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "adl", "oss", "oci"})

T = TypeVar("T")


def _jsonable(value: Any) -> Any:
    """json.dumps default: numpy/torch scalars become Python numbers, anything else its repr."""
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return item()
        except Exception:
            pass
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        try:
            return tolist()
        except Exception:
            pass
    return repr(value)


def dumps(obj: Any) -> str:
    return json.dumps(obj, default=_jsonable)


class StorageContext:
    """A run's directory and the operations the driver and the workers do on it. Picklable (with its
    filesystem: s3fs and the other fsspec filesystems pickle their constructor arguments)."""

    def __init__(
        self,
        storage_path: str,
        name: str,
        filesystem: Any = None,
        trainer_metadata: dict[str, Any] | None = None,
    ):
        self.storage_path = storage_path
        self.name = name
        # DataParallelTrainer(metadata=...): merged into the metadata of every committed checkpoint.
        self.trainer_metadata = dict(trainer_metadata or {})
        self.fs, root = resolve_filesystem(storage_path, filesystem)
        if self.fs is None:
            data_modes()  # a bad $TRAINFORGE_FILE_MODE is said here, before anything runs
        self.run_path = self._join(root, name)
        self._committed_staging: list[str] = []  # staging directories of committed reports, to remove

    # -- small helpers ----------------------------------------------------------------------------
    @property
    def is_local(self) -> bool:
        return self.fs is None

    @property
    def _has_dirs(self) -> bool:
        protocols = getattr(self.fs, "protocol", ())
        protocols = protocols if isinstance(protocols, (tuple, list)) else (protocols,)
        return not OBJECT_STORE_PROTOCOLS.intersection(protocols)

    def _join(self, *parts: str) -> str:
        if self.fs is None:
            return os.path.join(*parts)
        return "/".join(p.rstrip("/") for p in parts)

    def _parent(self, path: str) -> str:
        return os.path.dirname(path) if self.fs is None else path.rstrip("/").rsplit("/", 1)[0]

    def path(self, *parts: str) -> str:
        return self._join(self.run_path, *parts)

    def url(self, path: str | None = None) -> str:
        """``path`` (the run directory by default) as a URL for messages: ``s3://bucket/...``."""
        return display_url(self.fs, self.run_path if path is None else path)

    def _do(self, operation: str, path: str, fn: Callable[..., T], *args: Any) -> T:
        """Run one filesystem step with retries; failures raise StorageError naming ``path``."""
        return retry_call(operation, self.url(path), functools.partial(fn, *args))

    # -- filesystem primitives (no retries: called through _do) ------------------------------------
    def _makedirs(self, path: str) -> None:
        if self.fs is None:
            make_dirs(path, data_modes().dir)
        elif self._has_dirs:
            self.fs.makedirs(path, exist_ok=True)

    def _rm(self, path: str) -> None:
        """Remove a file or directory tree; nothing there is fine."""
        try:
            if self.fs is None:
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                else:
                    os.remove(path)
            else:
                self.fs.invalidate_cache(path)  # another process may have written there
                self.fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass

    def _listdir(self, path: str) -> list[str]:
        try:
            if self.fs is None:
                return sorted(os.listdir(path))
            self.fs.invalidate_cache(path)
            return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(path, detail=False))
        except FileNotFoundError:
            return []

    def _find(self, root: str) -> list[str]:
        """Relative paths (with '/') of every file under ``root``; [] when it does not exist."""
        if self.fs is None:
            out = []
            for dirpath, _dirnames, filenames in os.walk(root):
                rel = os.path.relpath(dirpath, root)
                out += [fn if rel == "." else os.path.join(rel, fn) for fn in filenames]
            return sorted(out)
        prefix = root.rstrip("/") + "/"
        self.fs.invalidate_cache(root)
        try:
            found = self.fs.find(root)
        except FileNotFoundError:
            return []
        return sorted(p[len(prefix):] for p in found if p.startswith(prefix))

    def _write(self, path: str, data: bytes) -> None:
        """Write a small file atomically (local: temporary name + rename; object stores: one PUT)."""
        if self.fs is None:
            tmp = path + ".tmp"
            with create(tmp, "wb", data_modes().file) as f:
                f.write(data)
            os.replace(tmp, path)
        else:
            self.fs.pipe_file(path, data)

    def _read(self, path: str) -> bytes | None:
        try:
            if self.fs is None:
                with open(path, "rb") as f:
                    return f.read()
            return self.fs.cat_file(path)  # a plain GET: no stale directory listing involved
        except FileNotFoundError:
            return None

    # -- small files ------------------------------------------------------------------------------
    def write_bytes(self, relpath: str, data: bytes) -> None:
        target = self.path(relpath)
        self._do("write", target, self._write, target, data)

    def read_bytes(self, relpath: str) -> bytes | None:
        """The file's contents, or None when it does not exist."""
        target = self.path(relpath)
        return self._do("read", target, self._read, target)

    def write_text(self, relpath: str, text: str) -> None:
        self.write_bytes(relpath, text.encode())

    def read_text(self, relpath: str) -> str | None:
        data = self.read_bytes(relpath)
        return None if data is None else data.decode()

    def _exists(self, path: str) -> bool:
        if self.fs is None:
            return os.path.exists(path)
        self.fs.invalidate_cache(path)
        return bool(self._do("exists", path, self.fs.exists, path))

    def checkpoint(self, path: str) -> Checkpoint:
        return Checkpoint(path, self.fs)

    # -- driver side ------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Create the run directory, prove it is writable, and remove an interrupted run's leftovers.

        A storage path that cannot be written is a configuration mistake found before any worker
        starts: it raises ValueError naming ``storage_path``, what failed and why, and what to do."""
        probe = self.path(".write_test")

        def create() -> None:
            self._makedirs(self.run_path)
            self._makedirs(self.path(STAGING_DIR))

        def probe_write() -> None:
            self._write(probe, b"ok")
            self._rm(probe)

        for what, step in (("create", create), ("write a file in", probe_write)):
            try:
                self._do("prepare", self.run_path, step)
            except StorageError as exc:
                cause = exc.__cause__
                if cause is None or is_transient(cause):  # unreachable: its own message says what to do
                    detail = str(exc)
                else:
                    detail = (
                        f"could not {what} the run directory {self.url()}: {type(cause).__name__}: {cause}. "
                        f"To fix: {self._prepare_hint(cause)}."
                    )
                raise ValueError(f"RunConfig.storage_path={self.storage_path!r} cannot be written: {detail}") from cause
        self.remove_uncommitted()

    def _prepare_hint(self, exc: BaseException) -> str:
        """What to do when the run directory cannot be created or written at the start of a run."""
        elsewhere = "choose a location you can write to for RunConfig.storage_path"
        if self.fs is not None:
            if isinstance(exc, FileNotFoundError) and not self._has_dirs:
                return f"the bucket must exist: create it first (trainforge never creates buckets), or {elsewhere}"
            if isinstance(exc, PermissionError) or "Credentials" in type(exc).__name__:
                return (
                    "check the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or those given to "
                    f"RunConfig.storage_filesystem) and that they allow writing there, or {elsewhere}"
                )
            return f"check RunConfig.storage_path and RunConfig.storage_filesystem, or {elsewhere}"
        existing = self.run_path
        while not os.path.exists(existing) and os.path.dirname(existing) != existing:
            existing = os.path.dirname(existing)
        if not os.path.isdir(existing):
            return f"{existing!r} is a file, not a directory: move it away, or {elsewhere}"
        if isinstance(exc, PermissionError):
            return f"you may not create files in {existing!r}: {elsewhere}, or get write access to it"
        if isinstance(exc, FileNotFoundError):
            return f"directories cannot be created in {existing!r}: {elsewhere}"
        return elsewhere

    def local_log_dir(self) -> str:
        """A local directory for per-rank log files (the run directory itself on local storage)."""
        if self.fs is None:
            path = self.path(LOGS_DIR)
        else:
            import tempfile

            path = os.path.join(tempfile.gettempdir(), "trainforge_logs", self.name)
        make_dirs(path, data_modes().dir)
        return path

    def upload_logs(self, local_dir: str) -> None:
        """Copy the per-rank log files to ``{run}/logs/`` (remote storage only)."""
        if self.fs is None or not os.path.isdir(local_dir):
            return
        dest = self.path(LOGS_DIR)
        put = functools.partial(self.fs.put, recursive=True)
        self._do("upload_logs", dest, put, local_dir.rstrip("/") + "/", dest + "/")

    def staging_path(self, attempt: int, report_index: int, rank: int | None = None) -> str:
        parts = [STAGING_DIR, f"a{attempt}_r{report_index}"]
        if rank is not None:
            parts.append(f"rank_{rank}")
        return self.path(*parts)

    def commit_checkpoint(
        self,
        attempt: int,
        report_index: int,
        ranks: list[int],
        seq: int,
        metrics: dict[str, Any],
        extra: dict[str, Any] | None = None,
    ) -> Checkpoint:
        """Merge the staged files of ``ranks`` into ``checkpoint_{seq:06d}`` and write the marker last
        (``extra``: more fields for the marker).

        Each step is retried on its own and may run again without harm. The report's staging
        directory is left for :meth:`remove_committed_staging` (call it once the report is handed on)."""
        name = f"{CHECKPOINT_PREFIX}{seq:06d}"
        final = self.path(name)
        staged = self.staging_path(attempt, report_index)
        op = "commit_checkpoint"
        marker = {
            "index": seq,
            "report_index": report_index,
            "attempt": attempt,
            "ranks": sorted(ranks),
            "metrics": metrics,
            "time": time.time(),
            **(extra or {}),
        }
        single = self._join(staged, f"rank_{ranks[0]}") if len(ranks) == 1 else None
        if self.fs is None and single is not None and os.path.isdir(single):
            # One rank's files on local disk (the common case): complete its directory, marker last,
            # then rename it into place; nothing is visible under the checkpoint's name before that.
            if self.trainer_metadata:
                self._do(op, single, self._merge_trainer_metadata, single)
            marker_path = os.path.join(single, COMMIT_MARKER)
            self._do(op, marker_path, write_new, marker_path, dumps(marker).encode(), data_modes().file)
            self._do(op, final, move_dir, single, final)
        else:
            self._do(op, final, self._rm, final)  # leftovers of an interrupted commit of the same number
            plan = self._do(op, staged, self._merge_plan, staged, ranks)
            self._do(op, final, self._place, plan, final)
            if self.trainer_metadata:
                self._do(op, final, self._merge_trainer_metadata, final)
            marker_path = self._join(final, COMMIT_MARKER)
            self._do(op, marker_path, self._write, marker_path, dumps(marker).encode())
        self._committed_staging.append(staged)
        return self.checkpoint(final)

    def remove_committed_staging(self) -> None:
        """Remove the staging directories of the reports committed since the last call."""
        while self._committed_staging:
            staged = self._committed_staging[0]
            self._do("remove_staging", staged, self._rm, staged)
            self._committed_staging.pop(0)

    def _merge_trainer_metadata(self, final: str) -> None:
        """Write the trainer's metadata under the checkpoint's own (a key a worker set wins)."""
        path = self._join(final, METADATA_FILE)
        data = self._read(path)
        own = json.loads(data) if data else {}
        merged = {**self.trainer_metadata, **own}
        if merged != own:
            self._write(path, dumps(merged).encode())

    def _merge_plan(self, staged: str, ranks: list[int]) -> dict[str, str]:
        """{relative path in the checkpoint: staged source file}; the lowest rank's copy wins."""
        wanted = {f"rank_{r}": r for r in ranks}
        by_rel: dict[str, tuple[int, str]] = {}
        for rel in self._find(staged):
            rank_dir, _, inner = rel.partition("/")
            rank = wanted.get(rank_dir)
            if rank is None or not inner:
                continue
            if inner not in by_rel or rank < by_rel[inner][0]:
                by_rel[inner] = (rank, self._join(staged, rel))
        return {rel: src for rel, (_rank, src) in sorted(by_rel.items())}

    def _place(self, plan: dict[str, str], final: str) -> None:
        """Put the planned files into ``final``: renames on local disk, one batch of copies otherwise."""
        targets = {rel: self._join(final, *rel.split("/")) for rel in plan}
        for parent in sorted({self._parent(t) for t in targets.values()} | {final}):
            self._makedirs(parent)
        if self.fs is None:
            for rel, src in plan.items():
                if os.path.exists(src) or not os.path.exists(targets[rel]):  # else: moved by an earlier try
                    os.replace(src, targets[rel])
        elif plan:
            self.fs.copy(list(plan.values()), [targets[rel] for rel in plan])

    def remove_staging_if_empty(self) -> None:
        """At the end of a run: remove ``.staging/`` unless something is left in it (an interrupted
        commit's files, which the next run on this directory removes)."""
        self.remove_committed_staging()
        staging = self.path(STAGING_DIR)
        if self.fs is None:
            try:
                os.rmdir(staging)
            except OSError:  # not empty, or not there
                pass
        elif self._has_dirs and not self._do("remove_staging", staging, self._listdir, staging):
            self._do("remove_staging", staging, self._rm, staging)

    def discard_staged(self, attempt: int, report_index: int) -> None:
        path = self.staging_path(attempt, report_index)
        self._do("discard_staged", path, self._rm, path)

    def delete_checkpoint(self, checkpoint: Checkpoint) -> None:
        # Remove the marker first so a half-deleted directory is never mistaken for a checkpoint.
        marker = self._join(checkpoint.path, COMMIT_MARKER)
        self._do("delete_checkpoint", marker, self._rm, marker)
        self._do("delete_checkpoint", checkpoint.path, self._rm, checkpoint.path)

    def list_checkpoints(self) -> list[tuple[Checkpoint, dict[str, Any]]]:
        """Committed checkpoints (those with a marker), oldest first, with their marker contents."""
        out = []
        for name in self._do("list_checkpoints", self.run_path, self._listdir, self.run_path):
            if not name.startswith(CHECKPOINT_PREFIX):
                continue
            text = self.read_text(f"{name}/{COMMIT_MARKER}")
            if text is None:
                continue
            try:
                marker = json.loads(text)
            except ValueError:
                continue
            out.append((self.checkpoint(self.path(name)), marker))
        out.sort(key=lambda item: item[1].get("index", 0))
        return out

    def remove_uncommitted(self) -> None:
        """Delete checkpoint directories without a marker and all staged files (an interrupted run's)."""
        op = "remove_uncommitted"
        for name in self._do(op, self.run_path, self._listdir, self.run_path):
            if name.startswith(CHECKPOINT_PREFIX) and self.read_text(f"{name}/{COMMIT_MARKER}") is None:
                self._do(op, self.path(name), self._rm, self.path(name))
        staging = self.path(STAGING_DIR)
        for name in self._do(op, staging, self._listdir, staging):
            self._do(op, self.path(STAGING_DIR, name), self._rm, self.path(STAGING_DIR, name))

    # -- worker side ------------------------------------------------------------------------------
    def stage_checkpoint(self, local_dir: str, attempt: int, report_index: int, rank: int) -> None:
        """Copy a rank's checkpoint files into its staging directory (an upload on remote storage)."""
        dest = self.staging_path(attempt, report_index, rank)
        if self.fs is None:
            self._do("stage_checkpoint", dest, copy_tree, local_dir, dest, data_modes())
        else:
            put = functools.partial(self.fs.put, recursive=True)
            self._do("stage_checkpoint", dest, put, local_dir.rstrip("/") + "/", dest + "/")

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_committed_staging": []}  # the driver's own bookkeeping
