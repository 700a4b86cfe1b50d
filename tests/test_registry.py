"""The model registry (``trainforge.registry``) on local disk and on S3 (moto's server on 127.0.0.1):
references, versions and dedup, aliases and their history, concurrent writers in separate processes,
a register killed half-way, gc and delete freeing exactly the unreferenced bytes, corrupted blobs,
resumable pushes and pulls, loading a ``trainforge.model.Model`` in one call, ``models:/`` URIs as
checkpoints (``resume_from_checkpoint``, ``Checkpoint.from_uri``, a tuner), and the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples

import trainforge
from trainforge import Checkpoint, DataParallelTrainer, RunConfig, ScalingConfig
from trainforge.registry import (
    AliasedVersionError,
    IntegrityError,
    ModelNotFoundError,
    ModelRef,
    Registry,
    RegistryError,
    SymlinkError,
    load_model,
    parse_model_uri,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _dir(root, name: str, files: dict[str, bytes]) -> str:
    d = os.path.join(str(root), name)
    for rel, data in files.items():
        path = os.path.join(d, *rel.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    return d


def _blobs(root: str) -> dict[str, int]:
    out = {}
    for dirpath, _, names in os.walk(os.path.join(root, "blobs")):
        for n in names:
            if not n.startswith(".tmp-"):
                out[n] = os.path.getsize(os.path.join(dirpath, n))
    return out


# -- references -----------------------------------------------------------------------------------
def test_parse_model_uri_forms_and_errors():
    assert parse_model_uri("models:/digits/3") == ModelRef("digits", 3)
    assert parse_model_uri("models:/digits@production") == ModelRef("digits", alias="production")
    assert parse_model_uri("models:/digits") == ModelRef("digits")
    assert parse_model_uri("digits/latest") == ModelRef("digits")
    assert parse_model_uri("digits@staging") == ModelRef("digits", alias="staging")
    assert parse_model_uri("models:/d/2?registry=s3://b/r") == ModelRef("d", 2, registry="s3://b/r")
    for bad, words in [("models:/d/0", "from 1"), ("models:/d/x", "number"), ("models:/d@12", "read as a version"),
                       ("models:/bad name", "letters"), ("", "models:/"), ("models:/d?x=1", "registry")]:  # fmt: skip
        with pytest.raises(ValueError, match=words):
            parse_model_uri(bad)


@settings(max_examples=examples(200), deadline=None)
@given(name=st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,30}\Z"),
       version=st.integers(1, 10**6), alias=st.from_regex(r"\A[a-z][a-z0-9_-]{0,20}\Z"))  # fmt: skip
def test_a_reference_prints_as_it_parses(name, version, alias):
    for ref in (ModelRef(name, version), ModelRef(name, alias=alias if alias != "latest" else "prod"), ModelRef(name)):
        assert parse_model_uri(str(ref)) == ref


# -- one registry ---------------------------------------------------------------------------------
def test_register_versions_dedup_and_lineage(tmp_path):
    reg = Registry(str(tmp_path / "reg"))
    src = _dir(tmp_path, "ckpt", {"weights.bin": b"w" * 4096, "sub/config.json": b"{}"})
    mv1 = reg.register("net", src, metrics={"acc": 0.9}, tags={"team": "vision"}, description="first", by="ann")
    assert (mv1.version, mv1.uri, mv1.size) == (1, "models:/net/1", 4098)
    assert set(mv1.files) == {"weights.bin", "sub/config.json"}
    assert reg.last_transfer == {"files_copied": 2, "bytes_copied": 4098, "files_skipped": 0}
    assert mv1.lineage["checkpoint_path"] == src and mv1.lineage["trainforge_version"] == trainforge.__version__
    assert mv1.created_by == "ann" and mv1.metrics == {"acc": 0.9}
    # The same files again, and under another name: stored once.
    mv2 = reg.register("net", src)
    reg.register("other", src)
    assert mv2.version == 2 and reg.last_transfer["files_copied"] == 0 and reg.last_transfer["files_skipped"] == 2
    assert sum(_blobs(reg.url).values()) == 4098
    assert [v.version for v in reg.versions("net")] == [1, 2]
    assert reg.get("net").version == 2 and reg.get("models:/net/1") == mv1
    m = reg.get_model("net")
    assert (m.latest_version, m.num_versions, m.aliases) == (2, 2, {})
    assert [x.name for x in reg.list_models()] == ["net", "other"]
    # Versions are immutable: the manifest on disk is read-only content, blobs are read-only files.
    blob = next(iter(_blobs(reg.url)))
    assert not os.access(os.path.join(reg.url, "blobs", "sha256", blob[:2], blob), os.W_OK) or os.geteuid() == 0


def test_a_checkpoint_is_linked_a_directory_copied_and_unchanged_files_not_read_again(tmp_path, monkeypatch):
    from trainforge.registry import _blobs

    reg = Registry(str(tmp_path / "reg"))
    src = _dir(tmp_path, "ckpt", {"w": b"w" * 5000, "m": b"m" * 10})
    blob = lambda mv, f: os.path.join(reg.url, "blobs", "sha256", mv.files[f]["sha256"][:2], mv.files[f]["sha256"])  # noqa: E731
    # A directory: copied (its owner may rewrite it), the copy read-only.
    mv = reg.register("dir", src)
    assert os.stat(blob(mv, "w")).st_ino != os.stat(os.path.join(src, "w")).st_ino
    assert os.stat(blob(mv, "w")).st_mode & 0o222 == 0
    # A committed checkpoint is never modified: its read-only files are hard-linked, not copied.
    ck = _dir(tmp_path, "ckpt2", {"x": b"x" * 7000})
    os.chmod(os.path.join(ck, "x"), 0o400)
    mv = reg.register("ckpt", Checkpoint.from_directory(ck))
    assert os.stat(blob(mv, "x")).st_ino == os.stat(os.path.join(ck, "x")).st_ino
    # Files this machine hashed before (same inode, size, mtime, ctime) are not read again.
    reads = []
    real = _blobs.sha256_file
    monkeypatch.setattr(_blobs, "sha256_file", lambda p: reads.append(p) or real(p))
    assert reg.register("dir", src).version == 2 and reads == []
    with open(os.path.join(src, "m"), "wb") as f:
        f.write(b"changed")
    mv3 = reg.register("dir", src)
    assert reads == [os.path.join(src, "m")] and reg.last_transfer["files_copied"] == 1
    assert open(os.path.join(reg.local_dir(mv3), "m"), "rb").read() == b"changed"


def _mode(path) -> int:
    return os.stat(path).st_mode & 0o7777


def test_registering_never_changes_a_source_files_mode_and_blobs_are_read_only(tmp_path):
    from trainforge._internal.result import Result

    reg = Registry(str(tmp_path / "reg"))
    blob = lambda mv, f: os.path.join(reg.url, "blobs", "sha256", mv.files[f]["sha256"][:2], mv.files[f]["sha256"])  # noqa: E731
    # A symlink in a committed checkpoint (or a Result's): refused, and its target keeps its mode (the
    # registry used to link the target into the blobs and chmod it 0444: a 0600 secret became readable).
    secret = tmp_path / "secret"
    secret.write_bytes(b"token")
    os.chmod(secret, 0o600)
    ck = _dir(tmp_path, "linked", {"w": b"w" * 100})
    os.symlink(secret, os.path.join(ck, "secret"))
    for source in (Checkpoint.from_directory(ck), Result(metrics={}, checkpoint=Checkpoint.from_directory(ck),
                                                         error=None, path=str(tmp_path))):  # fmt: skip
        with pytest.raises(SymlinkError):
            reg.register("leak", source)
        assert _mode(secret) == 0o600
    assert reg.model_names() == [] and _blobs(reg.url) == {}
    # A writable file of a checkpoint is copied (linking it would make the blob writable, or need a chmod
    # of the user's file): the source keeps 0640, the blob is a read-only file of its own.
    ck = _dir(tmp_path, "writable", {"w": b"w" * 3000, "ro": b"r" * 10, "shared": b"s" * 20})
    os.chmod(os.path.join(ck, "w"), 0o640)
    os.chmod(os.path.join(ck, "ro"), 0o400)
    os.chmod(os.path.join(ck, "shared"), 0o440)
    mv = reg.register("ck", Checkpoint.from_directory(ck))
    assert [_mode(os.path.join(ck, f)) for f in ("w", "ro", "shared")] == [0o640, 0o400, 0o440]
    assert os.stat(blob(mv, "w")).st_ino != os.stat(os.path.join(ck, "w")).st_ino
    assert _mode(blob(mv, "w")) == 0o400  # the registry's own copy: read-only, the owner's alone
    # A read-only one is hard-linked as it is (nothing to change): the blob is that file, mode and all.
    assert os.stat(blob(mv, "ro")).st_ino == os.stat(os.path.join(ck, "ro")).st_ino
    assert _mode(blob(mv, "ro")) == 0o400
    # A read-only one that others may read is copied: linked, it would be a blob others may read.
    assert os.stat(blob(mv, "shared")).st_ino != os.stat(os.path.join(ck, "shared")).st_ino
    assert _mode(blob(mv, "shared")) == 0o400
    assert open(os.path.join(reg.local_dir(mv), "w"), "rb").read() == b"w" * 3000


@pytest.mark.parametrize(("setting", "file", "blob", "directory"),
                         [(None, 0o600, 0o400, 0o700), ("umask", 0o644, 0o444, 0o755)])  # fmt: skip
def test_the_registrys_files_are_the_owners_alone_unless_configured(tmp_path, monkeypatch, setting, file, blob,
                                                                    directory):  # fmt: skip
    """Under umask 022, from a 0644 source: blobs 0400, records 0600, directories 0700 (the registry's
    root, a pushed-to registry, the cache, a pulled copy); ``$TRAINFORGE_FILE_MODE=umask``: the umask's
    0444 / 0644 / 0755."""
    if setting is not None:
        monkeypatch.setenv("TRAINFORGE_FILE_MODE", setting)
    src = _dir(tmp_path, "src", {"w": b"w" * 3000, "sub/x": b"x" * 10})
    for f in ("w", "sub/x"):
        os.chmod(os.path.join(src, f), 0o644)
    old = os.umask(0o022)
    try:
        reg = Registry(str(tmp_path / "team" / "reg"))  # its parent is made too
        mv = reg.register("net", src, alias="prod")
        cached = reg.local_dir(mv)
        pulled = reg.pull("net/1", str(tmp_path / "out"))
        reg.push("net", str(tmp_path / "other"))
    finally:
        os.umask(old)
    trees = {"reg": tmp_path / "team", "other": tmp_path / "other", "cache": tmp_path / "registry-cache",
             "pulled": tmp_path / "out"}  # fmt: skip
    wrong, blobs = [], 0
    for name, root in trees.items():
        for path in [root, *root.rglob("*")]:
            mode = path.stat().st_mode & 0o777
            # blobs, and the cache's copy of a version (links to them); the pulled copy is the user's to change
            is_blob = path.is_file() and ("sha256" in path.parts or name == "cache" and path.name in ("w", "x"))
            want = directory if path.is_dir() else blob if is_blob else file
            blobs += is_blob
            if mode != want:
                wrong.append((name, str(path.relative_to(root)), oct(mode), oct(want)))
    assert wrong == [], wrong
    assert blobs >= 2 * 2 + 2  # two blobs in each registry, and the cache's links to them
    assert str(pulled) == str(tmp_path / "out") and os.path.dirname(cached).startswith(str(tmp_path / "registry-cache"))
    assert [_mode(os.path.join(src, f)) for f in ("w", "sub/x")] == [0o644, 0o644]  # the source is never changed


def _fsspec_checkpoint(directory: str) -> Checkpoint:
    """The checkpoint at ``directory`` on an fsspec filesystem that is not the local one (``dir://``
    over the local disk: links show as links, and a download would follow them)."""
    import fsspec
    from fsspec.implementations.dirfs import DirFileSystem

    fs = DirFileSystem(os.path.dirname(directory), fsspec.filesystem("file"))
    ck = Checkpoint(os.path.basename(directory), fs)
    assert not ck.is_local
    return ck


@pytest.mark.parametrize("registry", ["local", "memory"])
@pytest.mark.parametrize("how", ["directory", "file-url", "checkpoint", "result", "fsspec"])
@pytest.mark.parametrize(("rel", "target"), [("passwd_link", "/etc/passwd"), ("sub/etc_dir", "/etc"),
                                             ("sub/inside", "../w"), ("dangling", "nowhere")])  # fmt: skip
def test_a_symlink_in_a_source_is_refused_naming_it_by_every_way_in(tmp_path, registry, how, rel, target):
    import uuid

    from trainforge._internal.result import Result

    reg = Registry(str(tmp_path / "reg") if registry == "local" else f"memory://reg-{uuid.uuid4().hex}")
    src = _dir(tmp_path, "ckpt", {"w": b"weights", "sub/x": b"x"})
    os.symlink(target, os.path.join(src, *rel.split("/")))
    source = {
        "directory": lambda: src,
        "file-url": lambda: f"file://{src}",
        "checkpoint": lambda: Checkpoint.from_directory(src),
        "result": lambda: Result(metrics={}, checkpoint=Checkpoint.from_directory(src), error=None, path=str(tmp_path)),
        "fsspec": lambda: _fsspec_checkpoint(src),
    }[how]()
    with pytest.raises(SymlinkError) as info:
        reg.register("net", source)
    text = str(info.value)
    assert f"{rel} " in text and repr(target) in text, text  # the file, and where it points
    assert "copy what it points to" in text.lower() and "remove the link" in text, text  # what to do
    assert isinstance(info.value, RegistryError) and isinstance(info.value, ValueError)
    assert reg.model_names() == []


def test_cli_register_refuses_a_symlink_naming_it(tmp_path):
    src = _dir(tmp_path, "ckpt", {"w": b"w"})
    os.symlink("/etc/passwd", os.path.join(src, "passwd_link"))
    reg = str(tmp_path / "reg")
    out = _cli("register", "net", src, "--registry", reg, ok=False)
    assert "passwd_link" in out.stderr and "/etc/passwd" in out.stderr and "Traceback" not in out.stderr
    assert Registry(reg).model_names() == []


def test_a_fifo_in_a_source_is_refused_instead_of_read_forever(tmp_path):
    src = _dir(tmp_path, "ckpt", {"w": b"w"})
    os.mkfifo(os.path.join(src, "pipe"))
    reg = Registry(str(tmp_path / "reg"))
    with pytest.raises(ValueError, match="pipe in .* is not a regular file"):
        reg.register("net", src)
    assert reg.model_names() == []


def test_a_version_another_process_deleted_is_gone_at_once(tmp_path):
    mine, theirs = Registry(str(tmp_path / "reg")), Registry(str(tmp_path / "reg"))
    for i in (1, 2, 3):
        mine.register("m", _dir(tmp_path, f"v{i}", {"w": bytes([i]) * 100}))
    held = mine.get("models:/m/3")  # its manifest is cached now, and so is its local copy
    assert mine.get("m").version == 3 and os.path.isdir(mine.local_dir(held))
    theirs.delete_version("m", 3)
    with pytest.raises(ModelNotFoundError, match=r"no version 3.*\[1, 2\]"):
        mine.get("models:/m/3")
    with pytest.raises(KeyError):
        mine.load("models:/m/3")
    with pytest.raises(KeyError):
        mine.set_alias("m", "prod", 3)
    with pytest.raises(KeyError):
        held.checkpoint  # noqa: B018 (a version in hand is looked up again)
    assert [v.version for v in mine.versions("m")] == [1, 2] and mine.get("m").version == 2
    assert mine.get_model("m").latest_version == 2
    # Cheaply: a cached version costs one existence check, no read.
    calls = []
    for op in ("exists", "read"):
        real = getattr(mine._b, op)
        setattr(mine._b, op, lambda rel, _op=op, _real=real: calls.append((_op, rel)) or _real(rel))
    assert mine.get("m/2").version == 2
    assert calls == [("exists", "models/m/versions/2.json")]


def test_every_registry_error_is_a_registry_error(tmp_path):
    import trainforge.registry as registry

    errors = [getattr(registry, n) for n in registry.__all__
              if isinstance(getattr(registry, n), type) and issubclass(getattr(registry, n), BaseException)]  # fmt: skip
    assert {e.__name__ for e in errors} >= {"ConflictError", "AliasedVersionError", "IntegrityError",
                                            "ModelNotFoundError", "SymlinkError", "RegistryError"}  # fmt: skip
    for cls in errors:
        assert cls.__module__ == "trainforge.registry._types", cls  # the tree is drawn in one place
        try:
            raise cls("what happened")
        except RegistryError as exc:
            assert type(exc) is cls
    assert issubclass(ModelNotFoundError, KeyError)  # code that catches KeyError goes on working
    try:
        Registry(str(tmp_path / "reg")).get("nope")
    except RegistryError as exc:
        assert isinstance(exc, KeyError) and "no model 'nope'" in str(exc)


def test_errors_name_what_exists(tmp_path):
    reg = Registry(str(tmp_path / "reg"))
    reg.register("net", _dir(tmp_path, "a", {"f": b"1"}))
    with pytest.raises(KeyError, match=r"no model 'nope'.*\['net'\]"):
        reg.get("nope/1")
    with pytest.raises(KeyError, match=r"no version 5.*\[1\]"):
        reg.get("net/5")
    with pytest.raises(KeyError, match="no alias 'prod'"):
        reg.get("net@prod")
    with pytest.raises(ValueError, match="no such directory"):
        reg.register("net", str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="name="):
        reg.register("bad/name", _dir(tmp_path, "b", {"f": b"1"}))
    with pytest.raises(ValueError, match="model.json"):
        from trainforge.model import Model

        reg.register("net", _dir(tmp_path, "c", {"f": b"1"}), model_cls=Model)
    with pytest.raises(ValueError, match="import path"):
        reg.register("net", _dir(tmp_path, "d", {"f": b"1"}), loader=lambda d: d)
    with pytest.raises(ValueError, match="records no way to load it"):
        reg.load("net/1")


def test_aliases_move_with_history_and_delete_needs_force(tmp_path):
    reg = Registry(str(tmp_path / "reg"))
    for i in range(3):
        reg.register("net", _dir(tmp_path, f"v{i}", {"w": bytes([i]) * 100}), alias="staging" if i == 0 else None)
    reg.set_alias("net", "production", 1, by="ann")
    reg.set_alias("net", "production", 3, by="bob")
    reg.delete_alias("net", "staging", by="cy")
    assert reg.get("net@production").version == 3 and reg.get_model("net").aliases == {"production": 3}
    history = [(m.alias, m.from_version, m.to_version, m.by) for m in reg.alias_history("net")]
    assert history == [("staging", None, 1, history[0][3]), ("production", None, 1, "ann"),
                       ("production", 1, 3, "bob"), ("staging", 1, None, "cy")]  # fmt: skip
    assert [m.to_version for m in reg.alias_history("net", "production")] == [1, 3]
    with pytest.raises(AliasedVersionError, match="production"):
        reg.delete_version("net", 3)
    with pytest.raises(KeyError, match="no alias"):
        reg.delete_alias("net", "staging")
    reg.delete_version("net", 3, force=True)
    assert reg.get_model("net").aliases == {} and reg.alias_history("net", "production")[-1].to_version is None
    # A deleted number is never given again.
    assert reg.register("net", _dir(tmp_path, "v9", {"w": b"new"})).version == 4


def test_delete_and_gc_free_exactly_the_unreferenced_bytes(tmp_path):
    reg = Registry(str(tmp_path / "reg"))
    a, b, c = b"a" * 1000, b"b" * 2000, b"c" * 3000
    reg.register("net", _dir(tmp_path, "v1", {"a": a, "b": b}))
    reg.register("net", _dir(tmp_path, "v2", {"b": b, "c": c}))
    assert sum(_blobs(reg.url).values()) == 6000
    assert reg.delete_version("net", 1) == {"blobs_removed": 1, "bytes_freed": 1000}  # "b" is still v2's
    assert reg.gc() == {"blobs_removed": 0, "bytes_freed": 0}
    # An orphan (a blob whose register died long ago) goes with gc, and only it.
    reg.register("tmp", _dir(tmp_path, "t", {"x": b"x" * 777}))
    orphan = [s for s in _blobs(reg.url) if _blobs(reg.url)[s] == 777][0]
    os.unlink(os.path.join(reg.url, "models", "tmp", "versions", "1.json"))
    assert reg.gc() == {"blobs_removed": 1, "bytes_freed": 777} and orphan not in _blobs(reg.url)
    assert reg.pull("net/2", str(tmp_path / "out")) and open(tmp_path / "out" / "c", "rb").read() == c


def test_pull_verifies_resumes_and_moves_nothing_twice(tmp_path):
    reg = Registry(str(tmp_path / "reg"))
    reg.register("net", _dir(tmp_path, "v1", {"a": b"a" * 5000, "d/b": b"b" * 100}))
    out = str(tmp_path / "out")
    reg.pull("net/1", out)
    assert reg.last_transfer == {"files_copied": 2, "bytes_copied": 5100, "files_skipped": 0}
    inode = os.stat(os.path.join(out, "a")).st_ino
    reg.pull("net/1", out)
    assert reg.last_transfer == {"files_copied": 0, "bytes_copied": 0, "files_skipped": 2}
    assert os.stat(os.path.join(out, "a")).st_ino == inode
    # An interrupted pull (one file missing, one truncated) copies just those.
    os.unlink(os.path.join(out, "d", "b"))
    reg.pull("net/1", out)
    assert reg.last_transfer == {"files_copied": 1, "bytes_copied": 100, "files_skipped": 1}
    with open(os.path.join(out, "a"), "r+b") as f:
        f.truncate(10)
    reg.pull("net/1", out)
    assert reg.last_transfer["files_copied"] == 1 and os.path.getsize(os.path.join(out, "a")) == 5000


def test_a_corrupted_blob_is_always_caught(tmp_path):
    reg = Registry(str(tmp_path / "reg"))
    mv = reg.register("net", _dir(tmp_path, "v1", {"a": b"a" * 5000}))
    sha = mv.files["a"]["sha256"]
    path = os.path.join(reg.url, "blobs", "sha256", sha[:2], sha)
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.write(b"X")
    with pytest.raises(IntegrityError, match="corrupted"):
        reg.pull("net/1", str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out" / "a")
    with pytest.raises(IntegrityError, match="corrupted"):
        reg.local_dir("net/1")
    other = Registry(str(tmp_path / "other"))
    with pytest.raises(IntegrityError, match="corrupted"):
        reg.push("net/1", other)
    assert other.model_names() == [] or other.versions("net") == []


def test_push_copies_only_missing_blobs_resumes_and_keeps_aliases(tmp_path, monkeypatch):
    src, dst = Registry(str(tmp_path / "src")), Registry(str(tmp_path / "dst"))
    src.register("net", _dir(tmp_path, "v1", {"a": b"a" * 1000, "b": b"b" * 1000}))
    src.register("net", _dir(tmp_path, "v2", {"a": b"a" * 1000, "c": b"c" * 1000}), alias="production")
    # The first push dies after one file: nothing is visible, and the retry copies only the rest.
    real, calls = type(dst._b).put_local, []

    def flaky(self, local, rel):
        calls.append(rel)
        if len(calls) == 2:
            raise OSError("connection reset")
        real(self, local, rel)

    monkeypatch.setattr(type(dst._b), "put_local", flaky)
    with pytest.raises(OSError, match="reset"):
        src.push("net/1", dst)
    monkeypatch.setattr(type(dst._b), "put_local", real)
    assert dst.model_names() == []
    pushed = src.push("net/1", dst)
    assert [v.version for v in pushed] == [1] and dst.last_transfer["files_copied"] == 1
    assert dst.last_transfer["files_skipped"] == 1
    # The whole model: version 2 (one new file) and its alias; pushing again moves nothing.
    assert [v.version for v in src.push("net", dst)] == [1, 2] and dst.last_transfer["files_copied"] == 1
    assert dst.get("net@production").version == 2 and dst.get("net/2").lineage["origin"]["version"] == 2
    assert [v.version for v in src.push("net", dst)] == [1, 2] and dst.last_transfer["files_copied"] == 0
    assert dst.versions("net")[-1].version == 2
    # pull_from is the same copy the other way; a taken number is not reused: the next free one is.
    back = Registry(str(tmp_path / "back"))
    back.register("net", _dir(tmp_path, "own", {"z": b"z"}))
    assert [v.version for v in back.pull_from(dst, "net@production")] == [2]
    assert open(os.path.join(back.local_dir("net/2"), "c"), "rb").read() == b"c" * 1000


# -- concurrent writers, each its own process -----------------------------------------------------
_WRITER = textwrap.dedent("""
    import sys, json
    from trainforge.registry import Registry
    url, src, mode = sys.argv[1:4]
    reg = Registry(url)
    print("ready", flush=True)
    sys.stdin.readline()  # all start together, once every writer has imported
    if mode == "register":
        print(json.dumps(reg.register("race", src).version))
    else:
        print(json.dumps([reg.set_alias("race", "production", v).seq for v in (1, 2, 3, 1, 2)]))
""")


def _race(url: str, src: str, mode: str, n: int = 8) -> list:
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, url, src, mode], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": REPO})
             for _ in range(n)]  # fmt: skip
    for p in procs:
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        outs.append(json.loads(out))
    return outs


def _concurrent_writers(url: str, tmp_path) -> None:
    reg = Registry(url)
    src = _dir(tmp_path, "race-src", {"w": b"w" * 10000})
    versions = _race(url, src, "register")
    assert sorted(versions) == list(range(1, 9))
    assert [v.version for v in reg.versions("race")] == list(range(1, 9))
    seqs = _race(url, src, "alias", n=6)
    history = reg.alias_history("race", "production")
    assert sorted(s for out in seqs for s in out) == list(range(1, 31)) == [m.seq for m in history]
    for before, after in zip(history, history[1:], strict=False):  # one order: each move starts where the last ended
        assert after.from_version == before.to_version
    assert reg.get("race@production").version == history[-1].to_version


def test_concurrent_registers_and_alias_moves_on_local_disk(tmp_path):
    _concurrent_writers(str(tmp_path / "reg"), tmp_path)


def test_a_register_killed_half_way_is_never_visible(tmp_path):
    """A register SIGKILLed after storing one of its three files: readers see the previous version
    only; its blobs are kept while its upload marker is fresh (it might be running), and go with gc
    once it is stale."""
    url = str(tmp_path / "reg")
    reg = Registry(url)
    reg.register("net", _dir(tmp_path, "v1", {"a": b"a" * 10}))
    src = _dir(tmp_path, "v2", {"x": b"x" * 1000, "y": b"y" * 2000, "z": b"z" * 4000})
    script = textwrap.dedent("""
        import os, signal, sys
        from trainforge.registry import Registry
        def die(done, total, what):
            os.kill(os.getpid(), signal.SIGKILL)
        Registry(sys.argv[1]).register("net", sys.argv[2], progress=die)
    """)
    p = subprocess.run([sys.executable, "-c", script, url, src], env={**os.environ, "PYTHONPATH": REPO}, timeout=120)
    assert p.returncode == -signal.SIGKILL
    assert [v.version for v in reg.versions("net")] == [1] and reg.get("net").version == 1
    stored = sum(_blobs(url).values()) - 10
    assert stored > 0  # it stored something before it died
    assert reg.gc() == {"blobs_removed": 0, "bytes_freed": 0}  # its marker is fresh: it might still be running
    (marker,) = os.listdir(os.path.join(url, "uploads"))
    path = os.path.join(url, "uploads", marker)
    data = json.load(open(path))
    json.dump({**data, "at": data["at"] - 2 * 86400}, open(path, "w"))
    out = reg.gc()
    assert out["bytes_freed"] == stored and sum(_blobs(url).values()) == 10
    assert reg.register("net", src).version == 2  # and the next register works from scratch


# -- the model object, and models:/ as a checkpoint ------------------------------------------------
torch = pytest.importorskip("torch")

from trainforge.model import BATCH_SIZE, LoopConfig, Model, ModelTrainer  # noqa: E402


class Scaler(Model):
    """y = w * x on 1 feature; preprocess scales the input, postprocess rounds."""

    def setup(self, config):
        torch.manual_seed(0)
        net = torch.nn.Linear(1, 1)
        self.register(models=net, optimizers=torch.optim.SGD(net.parameters(), lr=0.1),
                      criterion=torch.nn.MSELoss())  # fmt: skip

    def setup_data(self, config):
        x = torch.linspace(-1, 1, 32).unsqueeze(1)
        data = torch.utils.data.TensorDataset(x, 3 * x)
        self.register_data(train_loader=torch.utils.data.DataLoader(data, batch_size=config[BATCH_SIZE]))

    def preprocess(self, x):
        return torch.as_tensor(x, dtype=torch.float32).reshape(-1, 1) * 2

    def postprocess(self, y):
        return [round(float(v), 3) for v in y.flatten()]


def test_register_a_trained_model_and_load_it_in_one_call(tmp_path):
    result = ModelTrainer(Scaler, config={BATCH_SIZE: 8}, loop_config=LoopConfig(num_epochs=2),
                          run_config=RunConfig(name="scaler")).fit()  # fmt: skip
    reg = Registry()  # $TRAINFORGE_REGISTRY (set per test by conftest)
    mv = reg.register("scaler", result, model_cls=Scaler, alias="production")
    assert mv.model_class == f"{__name__}:Scaler" and mv.lineage["run_path"] == result.path
    assert mv.metrics and all(isinstance(v, (int, float)) for v in mv.metrics.values())
    expected = Scaler.load(result.checkpoint)([0.5, -0.25])
    assert load_model("models:/scaler@production")([0.5, -0.25]) == expected
    assert reg.load("scaler/1")([0.5, -0.25]) == expected
    # As a checkpoint: Checkpoint.from_uri, and a new run resumes from it (epoch 3 of 3 is the only one left).
    ckpt = Checkpoint.from_uri("models:/scaler@production")
    assert os.path.exists(os.path.join(ckpt.path, "model.json"))
    resumed = ModelTrainer(Scaler, config={BATCH_SIZE: 8}, loop_config=LoopConfig(num_epochs=3),
                           resume_from_checkpoint="models:/scaler/1").fit()  # fmt: skip
    assert resumed.error is None and [m["epoch"] for m in resumed.metrics_history] == [3]


def _reads_checkpoint(config):
    with trainforge.get_checkpoint().as_directory() as d:
        trainforge.report({"value": int(open(os.path.join(d, "value.txt")).read())})


def test_models_uri_is_a_checkpoint_for_trainers_and_tuners(tmp_path):
    reg = Registry()
    reg.register("state", _dir(tmp_path, "s", {"value.txt": b"41"}), alias="production")
    trainer = DataParallelTrainer(_reads_checkpoint, scaling_config=ScalingConfig(num_workers=1),
                                  resume_from_checkpoint="models:/state@production")  # fmt: skip
    assert trainer.fit().metrics["value"] == 41
    pytest.importorskip("optuna")
    from trainforge import tune

    grid = tune.Tuner(trainer, tune_config=tune.TuneConfig(num_samples=1)).fit()
    assert grid[0].metrics["value"] == 41
    with pytest.raises(KeyError, match="no alias 'missing'"):
        DataParallelTrainer(_reads_checkpoint, resume_from_checkpoint="models:/state@missing")


# -- the CLI --------------------------------------------------------------------------------------
def _cli(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-m", "trainforge", "models", *args], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PYTHONPATH": REPO})  # fmt: skip
    assert (p.returncode == 0) == ok, p.stderr
    return p


def test_cli_register_list_alias_delete_push_pull(tmp_path):
    src = _dir(tmp_path, "ckpt", {"w": b"w" * 300})
    out = _cli("register", "net", src, "--metric", "acc=0.75", "--tag", "team=vision", "--alias", "staging")
    assert "registered models:/net/1" in out.stdout and "alias staging -> 1" in out.stdout
    _cli("register", "net", src)
    listed = json.loads(_cli("list", "--json").stdout)
    assert [(m["name"], m["latest_version"], m["aliases"]) for m in listed] == [("net", 2, {"staging": 1})]
    shown = json.loads(_cli("show", "models:/net@staging", "--json").stdout)
    assert shown["metrics"] == {"acc": 0.75} and shown["tags"] == {"team": "vision"} and shown["version"] == 1
    _cli("alias", "set", "net", "staging", "2", "--by", "ann")
    history = _cli("alias", "history", "net").stdout.splitlines()
    assert len(history) == 2 and "1 -> 2  by ann" in history[1]
    refused = _cli("delete", "net", "2", ok=False)
    assert "staging" in refused.stderr and "--force" in refused.stderr and "Traceback" not in refused.stderr
    missing = _cli("show", "nope", ok=False)
    assert "no model 'nope'" in missing.stderr and "Traceback" not in missing.stderr
    assert "0 file(s) removed" in _cli("delete", "net", "1").stdout  # its file is version 2's too
    dest = str(tmp_path / "team")
    assert "pushed models:/net/2" in _cli("push", "net", dest).stdout
    assert Registry(dest).get("net@staging").version == 2
    pulled = _cli("pull", "net@staging", str(tmp_path / "here"), "--registry", dest).stdout
    assert "1 file(s) copied" in pulled and open(tmp_path / "here" / "w", "rb").read() == b"w" * 300


# -- S3 -------------------------------------------------------------------------------------------
@pytest.fixture
def atomic_s3_puts(monkeypatch):
    """S3 makes a conditional put (If-None-Match: *) atomic; moto's server checks the condition and
    then writes, unlocked, so two racing puts can both pass its check (seen under CI's load). A lock
    around moto's put_object gives the test server S3's guarantee, which the registry relies on."""
    import threading

    from moto.s3.responses import S3Response

    lock = threading.Lock()
    real = S3Response.put_object

    def put_object(self):
        with lock:
            return real(self)

    monkeypatch.setattr(S3Response, "put_object", put_object)


def test_s3_register_alias_pull_push_and_integrity(bucket, tmp_path, atomic_s3_puts):
    url = f"s3://{bucket}/registry"
    reg = Registry(url)
    mv = reg.register("net", _dir(tmp_path, "v1", {"a": b"a" * 3000, "b": b"b" * 100}), alias="production")
    assert reg.url == url and mv.version == 1
    assert reg.register("net", _dir(tmp_path, "v2", {"a": b"a" * 3000})).version == 2
    assert reg.last_transfer["files_copied"] == 0  # stored once, on S3 too
    reg.set_alias("net", "production", 2)
    assert reg.get("models:/net@production").version == 2
    assert [m.to_version for m in reg.alias_history("net", "production")] == [1, 2]
    # Pull and the local cache, then push S3 -> local -> S3 under another prefix.
    assert open(os.path.join(reg.local_dir("net@production"), "a"), "rb").read() == b"a" * 3000
    local = Registry(str(tmp_path / "local"))
    assert [v.version for v in local.pull_from(reg, "net")] == [1, 2]
    assert local.get("net@production").version == 2
    mirror = Registry(f"s3://{bucket}/mirror")
    local.push("net/1", mirror)
    assert mirror.get("net/1").files == mv.files
    # delete + gc on S3 free exactly what nothing uses.
    reg.set_alias("net", "production", 1)
    assert reg.delete_version("net", 2) == {"blobs_removed": 0, "bytes_freed": 0}
    reg.delete_version("net", 1, force=True)
    assert reg.gc() == {"blobs_removed": 0, "bytes_freed": 0}
    assert mirror.gc() == {"blobs_removed": 0, "bytes_freed": 0}
    # A corrupted blob on S3 is caught on pull.
    import s3fs

    sha = mirror.get("net/1").files["b"]["sha256"]
    s3fs.S3FileSystem().pipe_file(f"{bucket}/mirror/blobs/sha256/{sha[:2]}/{sha}", b"not b")
    with pytest.raises(IntegrityError, match="corrupted"):
        mirror.pull("net/1", str(tmp_path / "bad"))


def test_s3_concurrent_registers_and_alias_moves(bucket, tmp_path, atomic_s3_puts):
    _concurrent_writers(f"s3://{bucket}/registry", tmp_path)


def test_cli_versions_shows_the_validation_metrics_first_and_fits_a_narrow_terminal(tmp_path, monkeypatch):
    src = _dir(tmp_path, "ckpt", {"w": b"w"})
    _cli("register", "net", src, "--metric", "epoch=2", "--metric", "batch_count=40", "--metric", "loss=0.31",
         "--metric", "train_loss=0.3", "--metric", "val_accuracy=0.8333")  # fmt: skip
    monkeypatch.setenv("COLUMNS", "200")
    header, row = _cli("versions", "net").stdout.splitlines()
    assert header.split() == ["VERSION", "CREATED", "SIZE", "ALIASES", "METRICS"]
    assert row[header.index("METRICS"):].startswith("val_accuracy=0.8333 "), row  # no column cut before it
    assert row.endswith("epoch=2 batch_count=40"), row  # bookkeeping last
    monkeypatch.setenv("COLUMNS", "70")
    header, row = _cli("versions", "net").stdout.splitlines()
    assert len(row) <= 70 and "val_accuracy=0.8333" in row and row.endswith("..."), row
    monkeypatch.delenv("COLUMNS")  # a pipe: every value whole
    assert _cli("versions", "net").stdout.splitlines()[1].endswith("epoch=2 batch_count=40")
