"""Where a run's files live, and the checkpoint commit protocol.

Layout of a run directory ``{storage_path}/{name}/``::

    run_state.json              trainer/config summary, status, error (rewritten as the run progresses)
    metrics.jsonl               every report of rank 0, one JSON object per line, in order
    checkpoint_000000/          a committed checkpoint: files of every rank that reported one, merged
        .trainforge_checkpoint.json   the commit marker, written last (index, metrics, time, ranks)
    .staging/a{attempt}_r{report}/rank_{rank}/   files a rank staged, waiting for the other ranks
    logs/rank_{rank}.log        each worker's stdout and stderr

Commit protocol: each rank copies its checkpoint files into its own staging directory (inside
``report()``, so the user may delete their directory as soon as ``report`` returns) and tells the
driver. When every rank has made that report, the driver merges the rank directories into
``checkpoint_NNNNNN`` (for a file that several ranks wrote, the lowest rank's copy wins) and then
writes the commit marker. A directory without the marker is never treated as a checkpoint and is
removed by the next run on that directory.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from typing import Any

from trainforge._internal.checkpoint import Checkpoint, _is_local_fs

COMMIT_MARKER = ".trainforge_checkpoint.json"
STAGING_DIR = ".staging"
METRICS_FILE = "metrics.jsonl"
RUN_STATE_FILE = "run_state.json"
LOGS_DIR = "logs"
CHECKPOINT_PREFIX = "checkpoint_"


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


def resolve_filesystem(storage_path: str, filesystem: Any = None) -> tuple[Any, str]:
    """Return (fsspec filesystem or None for the local disk, path inside it)."""
    if filesystem is not None:
        return filesystem, storage_path
    if "://" not in storage_path or storage_path.startswith("file://"):
        local = storage_path[len("file://"):] if storage_path.startswith("file://") else storage_path
        return None, os.path.abspath(os.path.expanduser(local))
    try:
        import fsspec
    except ImportError as exc:  # pragma: no cover - fsspec is a dependency
        raise ImportError("fsspec is required for remote storage: pip install fsspec") from exc
    try:
        fs, path = fsspec.core.url_to_fs(storage_path)
    except (ImportError, ValueError) as exc:
        protocol = storage_path.split("://", 1)[0]
        extra = {"s3": "s3fs (pip install 'trainforge[s3]')", "gs": "gcsfs", "gcs": "gcsfs"}.get(protocol)
        hint = f"install {extra}" if extra else f"install the fsspec implementation for '{protocol}://'"
        raise ValueError(f"RunConfig.storage_path={storage_path!r} cannot be opened: {exc}. To fix: {hint}.") from exc
    if _is_local_fs(fs):
        return None, os.path.abspath(path)
    return fs, path


class StorageContext:
    """A run's directory and the operations the driver and the workers do on it. Picklable."""

    def __init__(self, storage_path: str, name: str, filesystem: Any = None):
        self.storage_path = storage_path
        self.name = name
        self.fs, root = resolve_filesystem(storage_path, filesystem)
        self.run_path = self._join(root, name)

    # -- small helpers ----------------------------------------------------------------------------
    @property
    def is_local(self) -> bool:
        return self.fs is None

    def _join(self, *parts: str) -> str:
        if self.fs is None:
            return os.path.join(*parts)
        return "/".join(p.rstrip("/") for p in parts)

    def path(self, *parts: str) -> str:
        return self._join(self.run_path, *parts)

    def _makedirs(self, path: str) -> None:
        if self.fs is None:
            os.makedirs(path, exist_ok=True)
        else:
            self.fs.makedirs(path, exist_ok=True)

    def _exists(self, path: str) -> bool:
        return os.path.exists(path) if self.fs is None else self.fs.exists(path)

    def _rm(self, path: str) -> None:
        if self.fs is None:
            shutil.rmtree(path, ignore_errors=True)
        elif self.fs.exists(path):
            self.fs.rm(path, recursive=True)

    def write_text(self, relpath: str, text: str) -> None:
        """Write a small file atomically (write to a temporary name, then rename)."""
        target = self.path(relpath)
        if self.fs is None:
            tmp = target + ".tmp"
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, target)
        else:
            with self.fs.open(target, "w") as f:
                f.write(text)

    def read_text(self, relpath: str) -> str | None:
        target = self.path(relpath)
        try:
            if self.fs is None:
                with open(target) as f:
                    return f.read()
            with self.fs.open(target, "r") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def checkpoint(self, path: str) -> Checkpoint:
        return Checkpoint(path, self.fs)

    # -- driver side ------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Create the run directory and prove it is writable; raise ValueError naming the path if not."""
        try:
            self._makedirs(self.run_path)
            self._makedirs(self.path(STAGING_DIR))
            self.write_text(".write_test", "ok")
            if self.fs is None:
                os.remove(self.path(".write_test"))
            else:
                self.fs.rm(self.path(".write_test"))
        except (OSError, PermissionError) as exc:
            raise ValueError(
                f"RunConfig.storage_path={self.storage_path!r} cannot be written ({exc}). "
                "Use a directory you can write to, or set storage_path to a writable location."
            ) from exc
        self.remove_uncommitted()

    def local_log_dir(self) -> str:
        """A local directory for per-rank log files (the run directory itself on local storage)."""
        if self.fs is None:
            path = self.path(LOGS_DIR)
        else:
            import tempfile

            path = os.path.join(tempfile.gettempdir(), "trainforge_logs", self.name)
        os.makedirs(path, exist_ok=True)
        return path

    def upload_logs(self, local_dir: str) -> None:
        if self.fs is not None and os.path.isdir(local_dir):
            self.fs.put(local_dir.rstrip("/") + "/", self.path(LOGS_DIR) + "/", recursive=True)

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
        """Merge the staged files of ``ranks`` into ``checkpoint_{seq:06d}`` and write the marker last."""
        final = self.path(f"{CHECKPOINT_PREFIX}{seq:06d}")
        self._rm(final)  # leftovers of an interrupted commit of the same number
        self._makedirs(final)
        for rank in sorted(ranks):
            src = self.staging_path(attempt, report_index, rank)
            self._merge_into(src, final)
        marker = {
            "index": seq,
            "report_index": report_index,
            "attempt": attempt,
            "ranks": sorted(ranks),
            "metrics": metrics,
            "time": time.time(),
            **(extra or {}),
        }
        self.write_text(f"{CHECKPOINT_PREFIX}{seq:06d}/{COMMIT_MARKER}", dumps(marker))
        self._rm(self.staging_path(attempt, report_index))
        return self.checkpoint(final)

    def _merge_into(self, src: str, dest: str) -> None:
        if self.fs is None:
            if not os.path.isdir(src):
                return
            for dirpath, _dirnames, filenames in os.walk(src):
                rel = os.path.relpath(dirpath, src)
                target_dir = dest if rel == "." else os.path.join(dest, rel)
                os.makedirs(target_dir, exist_ok=True)
                for fn in filenames:
                    target = os.path.join(target_dir, fn)
                    if not os.path.exists(target):  # a lower rank already wrote this file
                        os.replace(os.path.join(dirpath, fn), target)
            return
        if not self.fs.exists(src):
            return
        for file in self.fs.find(src):
            rel = file[len(src.rstrip("/")) + 1:]
            target = self._join(dest, rel)
            if not self.fs.exists(target):
                self.fs.mv(file, target)

    def discard_staged(self, attempt: int, report_index: int) -> None:
        self._rm(self.staging_path(attempt, report_index))

    def delete_checkpoint(self, checkpoint: Checkpoint) -> None:
        # Remove the marker first so a half-deleted directory is never mistaken for a checkpoint.
        marker = checkpoint.path.rstrip("/") + "/" + COMMIT_MARKER
        try:
            if self.fs is None:
                os.remove(marker)
            else:
                self.fs.rm(marker)
        except FileNotFoundError:
            pass
        self._rm(checkpoint.path)

    def list_checkpoints(self) -> list[tuple[Checkpoint, dict[str, Any]]]:
        """Committed checkpoints (those with a marker), oldest first, with their marker contents."""
        out = []
        for name in self._listdir(self.run_path):
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
        for name in self._listdir(self.run_path):
            if name.startswith(CHECKPOINT_PREFIX) and self.read_text(f"{name}/{COMMIT_MARKER}") is None:
                self._rm(self.path(name))
        for name in self._listdir(self.path(STAGING_DIR)):
            self._rm(self.path(STAGING_DIR, name))

    def _listdir(self, path: str) -> list[str]:
        try:
            if self.fs is None:
                return sorted(os.listdir(path))
            return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(path, detail=False))
        except FileNotFoundError:
            return []

    # -- worker side ------------------------------------------------------------------------------
    def stage_checkpoint(self, local_dir: str, attempt: int, report_index: int, rank: int) -> None:
        """Copy a rank's checkpoint files into its staging directory."""
        dest = self.staging_path(attempt, report_index, rank)
        if self.fs is None:
            shutil.copytree(local_dir, dest, dirs_exist_ok=True)
        else:
            self.fs.put(local_dir.rstrip("/") + "/", dest + "/", recursive=True)

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)
