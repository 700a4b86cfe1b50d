"""The run directory and the checkpoint commit protocol, on local disk and on fsspec's memory://."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from trainforge._internal.checkpoint import METADATA_FILE, Checkpoint
from trainforge._internal.exceptions import StorageError
from trainforge._internal.storage import (
    COMMIT_MARKER,
    STAGING_DIR,
    StorageContext,
    dumps,
    resolve_filesystem,
)


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def read_tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def storage(tmp_path) -> StorageContext:
    s = StorageContext(str(tmp_path / "results"), "run")
    s.prepare()
    return s


# -- layout -------------------------------------------------------------------------------------------


def test_prepare_creates_run_dir_and_leaves_no_probe(tmp_path):
    s = StorageContext(str(tmp_path / "a" / "b"), "exp")
    s.prepare()
    run = tmp_path / "a" / "b" / "exp"
    assert s.run_path == str(run)
    assert sorted(p.name for p in run.iterdir()) == [STAGING_DIR]


def test_staging_path_layout(storage):
    assert storage.staging_path(2, 5) == storage.path(STAGING_DIR, "a2_r5")
    assert storage.staging_path(2, 5, 3) == storage.path(STAGING_DIR, "a2_r5", "rank_3")


def test_file_url_is_local(tmp_path):
    fs, path = resolve_filesystem(f"file://{tmp_path}")
    assert fs is None and path == str(tmp_path)


def test_prepare_under_a_regular_file_names_the_path(tmp_path):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("x")
    storage_path = str(blocker / "results")
    s = StorageContext(storage_path, "run")
    with pytest.raises(ValueError) as info:
        s.prepare()
    msg = str(info.value)
    assert repr(storage_path) in msg
    assert "cannot be written" in msg
    assert isinstance(info.value.__cause__, OSError)


def test_resolve_filesystem_unknown_protocol_has_hint():
    with pytest.raises(ValueError) as info:
        resolve_filesystem("nosuchproto://bucket/x")
    msg = str(info.value)
    assert "'nosuchproto://bucket/x'" in msg
    assert "To fix" in msg and "nosuchproto://" in msg


def test_write_and_read_text(storage):
    storage.write_text("note.txt", "hello")
    assert storage.read_text("note.txt") == "hello"
    assert storage.read_text("missing.txt") is None
    assert not Path(storage.path("note.txt.tmp")).exists()


def test_dumps_handles_numpy_like_scalars():
    class Scalar:
        def item(self):
            return 1.5

    class Opaque:
        def __repr__(self):
            return "<opaque>"

    assert json.loads(dumps({"a": Scalar(), "b": Opaque()})) == {"a": 1.5, "b": "<opaque>"}


# -- commit protocol (local) --------------------------------------------------------------------------


def stage(
    storage: StorageContext, tmp_path: Path, attempt: int, index: int, rank: int, files: dict[str, str]
):
    src = write_tree(tmp_path / f"src_{attempt}_{index}_{rank}", files)
    storage.stage_checkpoint(str(src), attempt, index, rank)


def test_commit_merges_ranks_lowest_rank_wins(storage, tmp_path):
    stage(storage, tmp_path, 0, 3, 2, {"shared.bin": "rank2", "r2.txt": "2"})
    stage(storage, tmp_path, 0, 3, 0, {"shared.bin": "rank0", "sub/r0.txt": "0"})
    stage(storage, tmp_path, 0, 3, 1, {"shared.bin": "rank1", "sub/r1.txt": "1"})
    ckpt = storage.commit_checkpoint(0, 3, [2, 1, 0], seq=7, metrics={"loss": 0.25})
    assert ckpt.path == storage.path("checkpoint_000007")
    assert ckpt.filesystem is None
    tree = read_tree(Path(ckpt.path))
    marker = json.loads(tree.pop(COMMIT_MARKER))
    assert tree == {"shared.bin": "rank0", "sub/r0.txt": "0", "sub/r1.txt": "1", "r2.txt": "2"}
    assert marker["index"] == 7 and marker["report_index"] == 3 and marker["attempt"] == 0
    assert marker["ranks"] == [0, 1, 2] and marker["metrics"] == {"loss": 0.25}
    assert Path(storage.staging_path(0, 3)).exists()  # cleanup, left for once the report is handed on
    storage.remove_committed_staging()
    assert not Path(storage.staging_path(0, 3)).exists()


def test_commit_only_merges_the_given_ranks(storage, tmp_path):
    stage(storage, tmp_path, 1, 0, 0, {"a": "0"})
    stage(storage, tmp_path, 1, 0, 1, {"b": "1"})
    ckpt = storage.commit_checkpoint(1, 0, [1], seq=0, metrics={})
    assert set(read_tree(Path(ckpt.path))) == {"b", COMMIT_MARKER}


def test_commit_replaces_leftovers_of_an_interrupted_commit(storage, tmp_path):
    write_tree(Path(storage.path("checkpoint_000000")), {"stale.txt": "old"})
    stage(storage, tmp_path, 0, 0, 0, {"fresh.txt": "new"})
    ckpt = storage.commit_checkpoint(0, 0, [0], seq=0, metrics={})
    assert set(read_tree(Path(ckpt.path))) == {"fresh.txt", COMMIT_MARKER}


def test_a_one_rank_commit_renames_a_complete_directory_into_place(storage, tmp_path, monkeypatch):
    """The checkpoint directory appears in one rename, its marker already inside: no moment where
    the checkpoint's name holds files without a marker."""
    stage(storage, tmp_path, 0, 0, 0, {"model.pt": "w"})
    real_replace = os.replace
    seen: list[set[str]] = []

    def replace(src, dst):
        if str(dst) == storage.path("checkpoint_000000"):
            assert not os.path.exists(dst)
            seen.append(set(os.listdir(src)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    ckpt = storage.commit_checkpoint(0, 0, [0], seq=0, metrics={"loss": 1})
    assert seen == [{"model.pt", COMMIT_MARKER}]
    assert json.loads(Path(ckpt.path, COMMIT_MARKER).read_text())["metrics"] == {"loss": 1}
    assert [c.path for c, _ in storage.list_checkpoints()] == [ckpt.path]


@pytest.mark.parametrize("ranks", [[0], [0, 1]], ids=["one_rank", "two_ranks"])
def test_commit_merges_the_trainer_metadata_worker_keys_win(tmp_path, ranks):
    s = StorageContext(str(tmp_path / "results"), "run", trainer_metadata={"owner": "me", "epoch": -1})
    s.prepare()
    # report 0: the worker set no metadata; report 1: rank 0 set "epoch", rank 1 a conflicting copy
    for r in ranks:
        stage(s, tmp_path, 0, 0, r, {"f": "x"})
        stage(s, tmp_path, 0, 1, r, {"f": "x", METADATA_FILE: json.dumps({"epoch": 3 + r, "rank": r})})
    plain = s.commit_checkpoint(0, 0, ranks, 0, {})
    own = s.commit_checkpoint(0, 1, ranks, 1, {})
    assert plain.get_metadata() == {"owner": "me", "epoch": -1}
    assert own.get_metadata() == {"owner": "me", "epoch": 3, "rank": 0}  # rank 0's file, then its keys win


def test_trainer_metadata_is_written_before_the_marker(tmp_path, monkeypatch):
    """A commit that fails while writing the metadata leaves no marker: nothing is picked up."""
    s = StorageContext(str(tmp_path / "results"), "run", trainer_metadata={"owner": "me"})
    s.prepare()
    stage(s, tmp_path, 0, 0, 0, {"f": "x"})
    real_write = s._write

    def write(path: str, data: bytes) -> None:
        if path.endswith(METADATA_FILE):
            raise PermissionError(13, "Permission denied", path)
        real_write(path, data)

    monkeypatch.setattr(s, "_write", write)
    with pytest.raises(StorageError, match="commit_checkpoint"):
        s.commit_checkpoint(0, 0, [0], 0, {})
    assert not Path(s.path("checkpoint_000000", COMMIT_MARKER)).exists()
    assert s.list_checkpoints() == []


@pytest.mark.parametrize("ranks", [[0], [0, 1]], ids=["one_rank", "two_ranks"])
@pytest.mark.parametrize(("setting", "file", "directory"), [(None, 0o600, 0o700), ("umask", 0o640, 0o750)])
def test_committed_checkpoint_is_the_owners_alone_unless_configured(storage, tmp_path, monkeypatch, ranks, setting,
                                                                    file, directory):  # fmt: skip
    """Not the modes of the directory the checkpoint was written in (0755 and 0644 here): the run
    directory's, 0600 / 0700 by default, or the umask's (027 here) with ``$TRAINFORGE_FILE_MODE=umask``."""
    import stat
    import tempfile

    if setting is not None:
        monkeypatch.setenv("TRAINFORGE_FILE_MODE", setting)
    for r in ranks:
        src = Path(tempfile.mkdtemp(dir=tmp_path))
        (src / "sub").mkdir(mode=0o755)
        (src / "sub" / f"r{r}.bin").write_text("x")
        (src / "sub" / f"r{r}.bin").chmod(0o644)
        umask = os.umask(0o027)
        try:
            storage.stage_checkpoint(str(src), 0, 0, r)
        finally:
            os.umask(umask)
    umask = os.umask(0o027)
    try:
        ckpt = storage.commit_checkpoint(0, 0, ranks, 0, {})
    finally:
        os.umask(umask)
    paths = [Path(ckpt.path), *Path(ckpt.path).rglob("*")]
    assert len(paths) == 3 + len(ranks)  # the directory, sub/, the marker and each rank's file
    for path in paths:
        assert stat.S_IMODE(path.stat().st_mode) == (directory if path.is_dir() else file), path


def test_remove_staging_if_empty(storage, tmp_path):
    stage(storage, tmp_path, 0, 0, 0, {"f": "0"})
    storage.remove_staging_if_empty()
    assert Path(storage.staging_path(0, 0, 0), "f").exists()  # something staged: kept
    storage.discard_staged(0, 0)
    storage.remove_staging_if_empty()
    assert not Path(storage.path(STAGING_DIR)).exists()
    storage.remove_staging_if_empty()  # already gone: no error
    stage(storage, tmp_path, 0, 1, 0, {"g": "1"})
    storage.commit_checkpoint(0, 1, [0], 0, {})
    storage.remove_staging_if_empty()  # a committed report's staging directory is not "something left"
    assert not Path(storage.path(STAGING_DIR)).exists()


def test_stage_copies_so_source_can_be_deleted(storage, tmp_path):
    src = write_tree(tmp_path / "user_dir", {"model.pt": "weights"})
    storage.stage_checkpoint(str(src), 0, 0, 0)
    (src / "model.pt").unlink()
    ckpt = storage.commit_checkpoint(0, 0, [0], 0, {})
    assert (Path(ckpt.path) / "model.pt").read_text() == "weights"


def test_staging_copies_every_kind_of_file_byte_for_byte(storage, tmp_path):
    """Staged by copy_file_range where it works; an empty file, a nested one and a large one arrive whole."""
    src = tmp_path / "user_dir"
    (src / "sub" / "deeper").mkdir(parents=True)
    big = os.urandom(3 * 2**20 + 7)
    (src / "big.bin").write_bytes(big)
    (src / "empty").write_bytes(b"")
    (src / "sub" / "deeper" / "x.json").write_text("{}")
    storage.stage_checkpoint(str(src), 0, 0, 0)
    ckpt = Path(storage.commit_checkpoint(0, 0, [0], 0, {}).path)
    assert (ckpt / "big.bin").read_bytes() == big and (ckpt / "empty").read_bytes() == b""
    assert (ckpt / "sub" / "deeper" / "x.json").read_text() == "{}"


@pytest.mark.parametrize("how", ["exdev", "zero"])
def test_staging_falls_back_to_a_plain_copy_where_copy_file_range_cannot(storage, tmp_path, monkeypatch, how):
    """Another filesystem on an old kernel (EXDEV) or a file that copies nothing (a special file whose
    size is not its content): the file is copied by shutil.copyfile instead, whole."""
    import errno

    from trainforge._internal import local_files

    def refuse(*args, **kwargs):
        if how == "exdev":
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        return 0

    monkeypatch.setattr(local_files.os, "copy_file_range", refuse, raising=False)
    data = os.urandom(100_000)
    src = tmp_path / "user_dir"
    src.mkdir()
    (src / "model.pt").write_bytes(data)
    storage.stage_checkpoint(str(src), 0, 0, 0)
    assert (Path(storage.commit_checkpoint(0, 0, [0], 0, {}).path) / "model.pt").read_bytes() == data


def test_a_staging_copy_that_fails_midway_is_an_error_not_a_short_file(storage, tmp_path, monkeypatch):
    import errno

    from trainforge._internal import local_files
    from trainforge._internal import storage as storage_mod

    real = os.copy_file_range
    calls = []

    def full_disk(src, dst, count, *args):
        calls.append(count)
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(src, dst, min(count, 1000), *args)

    monkeypatch.setattr(local_files.os, "copy_file_range", full_disk)
    monkeypatch.setattr(storage_mod, "retry_call", lambda op, url, fn: fn(), raising=False)
    src = tmp_path / "user_dir"
    src.mkdir()
    (src / "model.pt").write_bytes(os.urandom(10_000))
    with pytest.raises(OSError, match="No space left"):
        storage.stage_checkpoint(str(src), 0, 0, 0)


def test_big_files_are_staged_side_by_side_each_whole(storage, tmp_path, monkeypatch):
    """Files of BIG_FILE_BYTES or more are copied on the copy threads and the calling thread
    together; every file arrives whole, small ones and nested ones included."""
    import threading

    from trainforge._internal import local_files

    monkeypatch.setattr(local_files, "_usable_cpus", lambda: 4)
    in_flight, most, lock = [0], [0], threading.Lock()
    second = threading.Event()
    real = local_files.copy_file

    def copy_file(src, dest, mode):
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
            if in_flight[0] > 1:
                second.set()
        second.wait(10)  # the first copy holds on until another starts beside it
        real(src, dest, mode)
        with lock:
            in_flight[0] -= 1

    monkeypatch.setattr(local_files, "copy_file", copy_file)
    src = tmp_path / "user_dir"
    (src / "sub").mkdir(parents=True)
    files = {f"shard_{i}.bin": os.urandom(local_files.BIG_FILE_BYTES + i * 4099) for i in range(5)}
    files["sub/opt.bin"] = os.urandom(2 * local_files.BIG_FILE_BYTES)
    files["meta.json"] = b"{}"
    for name, data in files.items():
        (src / name).write_bytes(data)
    storage.stage_checkpoint(str(src), 0, 0, 0)
    ckpt = Path(storage.commit_checkpoint(0, 0, [0], 0, {}).path)
    for name, data in files.items():
        assert (ckpt / name).read_bytes() == data, name
    assert second.is_set() and most[0] >= 2


def test_one_failed_copy_among_parallel_ones_fails_the_staging(storage, tmp_path, monkeypatch):
    import errno

    from trainforge._internal import local_files
    from trainforge._internal import storage as storage_mod

    monkeypatch.setattr(local_files, "_usable_cpus", lambda: 2)
    monkeypatch.setattr(storage_mod, "retry_call", lambda op, url, fn: fn(), raising=False)
    real = local_files.copy_file

    def copy_file(src, dest, mode):
        if src.endswith("b.bin"):
            raise OSError(errno.ENOSPC, "No space left on device")
        real(src, dest, mode)

    monkeypatch.setattr(local_files, "copy_file", copy_file)
    src = tmp_path / "user_dir"
    src.mkdir()
    for name in ("a.bin", "b.bin", "c.bin"):
        (src / name).write_bytes(os.urandom(local_files.BIG_FILE_BYTES))
    with pytest.raises(OSError, match="No space left"):
        storage.stage_checkpoint(str(src), 0, 0, 0)


def test_a_big_file_copies_whole_where_blocks_cannot_be_reserved(storage, tmp_path, monkeypatch):
    """fallocate refused (a filesystem without it) or missing (no such C function): the copy still
    arrives whole, at its own size."""
    from trainforge._internal import local_files

    data = os.urandom(local_files.BIG_FILE_BYTES + 12345)
    src = tmp_path / "user_dir"
    src.mkdir()
    (src / "model.pt").write_bytes(data)
    for fallocate in (lambda fd, mode, off, size: -1, False):
        monkeypatch.setattr(local_files, "_fallocate", fallocate)
        storage.stage_checkpoint(str(src), 0, 0, 0)
        staged = Path(storage.staging_path(0, 0, 0)) / "model.pt"
        assert staged.stat().st_size == len(data) and staged.read_bytes() == data


def test_list_checkpoints_only_committed_in_index_order(storage, tmp_path):
    for seq in (2, 0, 1):
        stage(storage, tmp_path, 0, seq, 0, {"f": str(seq)})
        storage.commit_checkpoint(0, seq, [0], seq, {"seq": seq})
    write_tree(Path(storage.path("checkpoint_000003")), {"partial.bin": "no marker"})
    write_tree(Path(storage.path("checkpoint_000004")), {COMMIT_MARKER: "{not json"})
    listed = storage.list_checkpoints()
    assert [c.path for c, _ in listed] == [storage.path(f"checkpoint_{i:06d}") for i in range(3)]
    assert [m["metrics"] for _, m in listed] == [{"seq": 0}, {"seq": 1}, {"seq": 2}]
    assert all(isinstance(c, Checkpoint) for c, _ in listed)


def test_list_checkpoints_of_a_missing_dir_is_empty(tmp_path):
    assert StorageContext(str(tmp_path), "never_prepared").list_checkpoints() == []


def test_remove_uncommitted(storage, tmp_path):
    stage(storage, tmp_path, 0, 0, 0, {"f": "0"})
    committed = storage.commit_checkpoint(0, 0, [0], 0, {})
    write_tree(Path(storage.path("checkpoint_000001")), {"half.bin": "x"})
    stage(storage, tmp_path, 0, 1, 0, {"g": "1"})
    stage(storage, tmp_path, 3, 9, 2, {"h": "2"})
    storage.remove_uncommitted()
    assert Path(committed.path, "f").exists()
    assert not Path(storage.path("checkpoint_000001")).exists()
    assert list(Path(storage.path(STAGING_DIR)).iterdir()) == []


def test_prepare_removes_an_interrupted_runs_leftovers(tmp_path):
    s = StorageContext(str(tmp_path), "run")
    s.prepare()
    write_tree(Path(s.path("checkpoint_000000")), {"x": "no marker"})
    write_tree(Path(s.staging_path(0, 0, 0)), {"y": "staged"})
    StorageContext(str(tmp_path), "run").prepare()
    assert not Path(s.path("checkpoint_000000")).exists()
    assert not Path(s.staging_path(0, 0)).exists()


def test_discard_staged(storage, tmp_path):
    stage(storage, tmp_path, 0, 4, 0, {"f": "0"})
    stage(storage, tmp_path, 0, 5, 0, {"f": "0"})
    storage.discard_staged(0, 4)
    assert not Path(storage.staging_path(0, 4)).exists()
    assert Path(storage.staging_path(0, 5, 0), "f").exists()
    storage.discard_staged(0, 99)  # nothing staged: no error


def test_delete_checkpoint(storage, tmp_path):
    stage(storage, tmp_path, 0, 0, 0, {"f": "0"})
    stage(storage, tmp_path, 0, 1, 0, {"f": "1"})
    first = storage.commit_checkpoint(0, 0, [0], 0, {})
    second = storage.commit_checkpoint(0, 1, [0], 1, {})
    storage.delete_checkpoint(first)
    assert not Path(first.path).exists()
    assert [c.path for c, _ in storage.list_checkpoints()] == [second.path]
    storage.delete_checkpoint(first)  # already gone: no error


# -- memory:// ----------------------------------------------------------------------------------------


@pytest.fixture
def memory_storage():
    from fsspec.implementations.memory import MemoryFileSystem

    MemoryFileSystem.store.clear()
    MemoryFileSystem.pseudo_dirs[:] = [""]
    s = StorageContext("memory://bucket/results", "run")
    s.prepare()
    yield s
    MemoryFileSystem.store.clear()
    MemoryFileSystem.pseudo_dirs[:] = [""]


def test_memory_storage_is_remote(memory_storage):
    from fsspec.implementations.memory import MemoryFileSystem

    assert isinstance(memory_storage.fs, MemoryFileSystem)
    assert not memory_storage.is_local
    assert memory_storage.run_path == "/bucket/results/run"


def test_memory_commit_list_delete(memory_storage, tmp_path):
    s = memory_storage
    fs = s.fs
    stage(s, tmp_path, 0, 0, 1, {"shared.txt": "rank1", "r1/opt.pt": "o"})
    stage(s, tmp_path, 0, 0, 0, {"shared.txt": "rank0", "model.pt": "m"})
    ckpt = s.commit_checkpoint(0, 0, [0, 1], 0, {"acc": 0.9})
    assert ckpt.filesystem is fs and not ckpt.is_local
    root = s.path("checkpoint_000000")
    assert ckpt.path == root
    assert fs.cat(root + "/shared.txt") == b"rank0"
    assert fs.cat(root + "/model.pt") == b"m"
    assert fs.cat(root + "/r1/opt.pt") == b"o"
    assert json.loads(fs.cat(root + "/" + COMMIT_MARKER))["metrics"] == {"acc": 0.9}
    s.remove_committed_staging()
    assert not fs.exists(s.staging_path(0, 0))

    # an uncommitted dir is not listed
    fs.pipe(s.path("checkpoint_000001", "partial.bin"), b"x")
    assert [c.path for c, _ in s.list_checkpoints()] == [root]

    # a remote checkpoint is downloaded for use
    with ckpt.as_directory() as local:
        assert Path(local, "model.pt").read_text() == "m"
        downloaded = local
    assert not Path(downloaded).exists()

    s.remove_uncommitted()
    assert not fs.exists(s.path("checkpoint_000001"))
    s.delete_checkpoint(ckpt)
    assert not fs.exists(root)
    assert s.list_checkpoints() == []


def test_memory_write_and_read_text(memory_storage):
    memory_storage.write_text("run_state.json", '{"a": 1}')
    assert memory_storage.read_text("run_state.json") == '{"a": 1}'
    assert memory_storage.read_text("nope") is None


def test_memory_remove_staging_if_empty(memory_storage, tmp_path):
    s = memory_storage
    stage(s, tmp_path, 0, 0, 0, {"f": "0"})
    s.remove_staging_if_empty()
    assert s.fs.exists(s.staging_path(0, 0, 0) + "/f")
    s.commit_checkpoint(0, 0, [0], 0, {})
    s.remove_staging_if_empty()
    assert not s.fs.exists(s.path(STAGING_DIR))
    assert s.fs.exists(s.path("checkpoint_000000", COMMIT_MARKER))
