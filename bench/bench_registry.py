#!/usr/bin/env python
"""The model registry (``trainforge.registry``): register and load vs a plain copy of the same files.

    python bench/bench_registry.py [--mb 512] [--repeats 3] [--markdown] [--quick]

Checkpoints of ``--mb`` MB of random bytes (incompressible, written once, in the page cache for
every run) in three shapes: one file; 16 files; 1000 small files (``--mb``/8 in all). For each:

- **register** into a fresh local registry (same filesystem) vs ``shutil.copytree`` of the same
  directory (what a user would do instead: copy the checkpoint somewhere safe). Register hashes every
  file (sha256) and copies each one it has not stored before; goal: >= 0.8x the copy's speed.
- **register again** (the same files, a new version): nothing is copied (asserted: ``bytes_copied``
  is 0); it still reads every file to hash it.
- **load** (``Registry.local_dir``: the version's files materialized in the local cache, verified by
  checksum; what ``load`` and ``.checkpoint`` use) vs ``copytree`` of the stored files; then a
  cached **load again**.
- **pull** into a new directory (copied and verified) vs ``copytree``.
- for the single file, its **sha256 alone** (one read, one core): what no register can beat, since a
  blob's id is the sha256 of its whole content (one sequential hash) and the copy runs beside it.
- **S3** (moto's server in a thread on 127.0.0.1, ``--s3-mb`` MB in 4 files): register vs s3fs's
  ``put(recursive=True)``, pull vs ``get(recursive=True)``.

Speeds are MB/s of checkpoint size; ratios are the copy's time over the registry's (>= 1: faster than
the copy). Medians of ``--repeats``. Prints a table (``--markdown``) and writes
``bench/results/registry.json``. ``--quick``: 64 MB, 1 repeat.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH_DIR)
sys.path.insert(0, os.path.dirname(BENCH_DIR))

from _common import finish, fmt, git_commit, machine_info, median, render_markdown, render_text, status  # noqa: E402

RESULTS = os.path.join(BENCH_DIR, "results", "registry.json")


def _make(root: str, shape: str, mb: int) -> str:
    d = os.path.join(root, shape)
    os.makedirs(d, exist_ok=True)
    total = mb << 20
    if shape == "1 file":
        sizes = [total]
    elif shape == "16 files":
        sizes = [total // 16] * 16
    else:
        sizes = [total // 1000] * 1000
    for i, size in enumerate(sizes):
        sub = os.path.join(d, f"part{i // 100}") if len(sizes) > 100 else d
        os.makedirs(sub, exist_ok=True)
        with open(os.path.join(sub, f"f{i}.bin"), "wb") as f:
            f.write(os.urandom(size))
    return d


def _size(d: str) -> int:
    return sum(os.path.getsize(os.path.join(p, n)) for p, _, ns in os.walk(d) for n in ns)


def _timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _local_once(src: str, base: str) -> dict[str, float]:
    from trainforge import Checkpoint
    from trainforge.registry import Registry

    out: dict[str, float] = {}
    os.environ["TRAINFORGE_REGISTRY_CACHE"] = os.path.join(base, "cache")
    out["copy"] = _timed(lambda: shutil.copytree(src, os.path.join(base, "copy")))
    reg = Registry(os.path.join(base, "reg"))
    out["register"] = _timed(lambda: reg.register("bench", src))
    assert reg.last_transfer["bytes_copied"] == _size(src)
    out["register_again"] = _timed(lambda: reg.register("bench", src))
    assert reg.last_transfer["bytes_copied"] == 0, reg.last_transfer
    reg2 = Registry(os.path.join(base, "reg2"))
    os.environ["TRAINFORGE_REGISTRY_CACHE"] = os.path.join(base, "cache2")  # no hash known
    out["register_ckpt"] = _timed(lambda: reg2.register("bench", Checkpoint.from_directory(src)))
    os.environ["TRAINFORGE_REGISTRY_CACHE"] = os.path.join(base, "cache")
    out["load_copy"] = _timed(lambda: shutil.copytree(os.path.join(base, "reg", "blobs"), os.path.join(base, "blobcopy")))
    out["load"] = _timed(lambda: reg.local_dir("bench/1"))
    out["load_again"] = _timed(lambda: reg.local_dir("bench/1"))
    out["pull"] = _timed(lambda: reg.pull("bench/1", os.path.join(base, "pulled")))
    files = [os.path.join(p, n) for p, _, ns in os.walk(src) for n in ns]
    if len(files) == 1:  # what no register of it can beat: one core's sha256 of the file, read once
        from trainforge.registry._blobs import sha256_file

        out["sha256_alone"] = _timed(lambda: sha256_file(files[0]))
    shutil.rmtree(base)
    return out


def _local(shape: str, src: str, work: str, repeats: int) -> dict[str, list[float]]:
    runs = [_local_once(src, os.path.join(work, f"{shape.replace(' ', '_')}-{i}")) for i in range(repeats)]
    return {k: [r[k] for r in runs] for k in runs[0]}


def _s3_once(fs: Any, bucket: str, src: str, dest: str) -> dict[str, float]:
    from trainforge.registry import Registry

    out: dict[str, float] = {}
    out["put"] = _timed(lambda: fs.put(src + "/", f"{bucket}/copy/", recursive=True))
    reg = Registry(f"s3://{bucket}/registry")
    out["register"] = _timed(lambda: reg.register("bench", src))
    out["get"] = _timed(lambda: fs.get(f"{bucket}/copy/", os.path.join(dest, "got") + "/", recursive=True))
    out["pull"] = _timed(lambda: reg.pull("bench/1", os.path.join(dest, "pulled")))
    return out


def _s3(mb: int, work: str, repeats: int) -> dict[str, Any]:
    import logging

    import boto3
    import s3fs
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1",
                      AWS_ENDPOINT_URL=f"http://{host}:{port}")  # fmt: skip
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        os.environ.pop(var, None)
    s3fs.S3FileSystem.clear_instance_cache()
    src = os.path.join(work, "s3src")
    os.makedirs(src)
    for i in range(4):
        with open(os.path.join(src, f"f{i}.bin"), "wb") as f:
            f.write(os.urandom((mb << 20) // 4))
    out = []
    try:
        for i in range(repeats):
            bucket = f"bench-{i}-{os.getpid()}"
            boto3.client("s3").create_bucket(Bucket=bucket)
            out.append(_s3_once(s3fs.S3FileSystem(), bucket, src, os.path.join(work, f"s3-{i}")))
    finally:
        server.stop()
    return {k: [r[k] for r in out] for k in out[0]}


def _row(label: str, size_mb: float, op: str, t: float | None, c: float | None, goal: float | None) -> list[str]:
    ratio = c / t if c and t else None
    return [label, op, fmt(size_mb / t if t else None, ".0f"), fmt(size_mb / c if c else None, ".0f"),
            f"{fmt(ratio, '.2f')}x" if ratio else "-", f">= {goal}x" if goal else "-",
            status(None if goal is None or ratio is None else ratio >= goal)]  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    p.add_argument("--mb", type=int, default=512)
    p.add_argument("--s3-mb", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json-out", default=RESULTS)
    args = p.parse_args()
    if args.quick:
        args.mb, args.s3_mb, args.repeats = 64, 16, 1
    header = ["checkpoint", "operation", "registry MB/s", "plain copy MB/s", "registry vs copy", "goal", "ok"]
    rows: list[list[str]] = []
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench_registry_") as work:
        for shape in ("1 file", "16 files", "1000 files"):
            mb = args.mb if shape != "1000 files" else args.mb // 8
            src = _make(os.path.join(work, "src"), shape, mb)
            size_mb = _size(src) / 2**20
            r = runs[shape] = _local(shape, src, os.path.join(work, "runs"), args.repeats)
            label = f"{shape}, {size_mb:.0f} MB"

            for op, mine, ref, goal in (
                ("register a directory (copied)", "register", "copy", 0.8),
                ("register again (0 bytes copied)", "register_again", "copy", None),
                ("register a Checkpoint (linked)", "register_ckpt", "copy", 0.8),
                ("load (materialize, verified)", "load", "load_copy", 0.8),
                ("load again (cached)", "load_again", "load_copy", None),
                ("pull to a directory (verified)", "pull", "load_copy", None),
            ):
                rows.append(_row(label, size_mb, op, median(r[mine]), median(r[ref]), goal))
            if "sha256_alone" in r:
                rows.append(_row(label, size_mb, "sha256 of the file alone (register's floor)", median(r["sha256_alone"]),
                                 median(r["copy"]), None))  # fmt: skip
            shutil.rmtree(os.path.join(work, "src"))
        s3 = runs["s3"] = _s3(args.s3_mb, work, args.repeats)
        for op, mine, ref in (("S3: register vs put", "register", "put"), ("S3: pull vs get", "pull", "get")):
            rows.append(_row(f"4 files, {args.s3_mb} MB", args.s3_mb, op, median(s3[mine]), median(s3[ref]), 0.8))
    table = (render_markdown if args.markdown else render_text)(header, rows)
    print(table)
    print(f"\n(medians of {args.repeats} run(s); local disk: the registry and the copies on the same filesystem; "
          "S3: moto's server in this process's threads)")  # fmt: skip
    data = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "commit": git_commit(),
        "machine": machine_info(),
        "args": vars(args),
        "table": {"header": header, "rows": rows},
        "runs": runs,
    }
    return finish(args.json_out, data, {})


if __name__ == "__main__":
    sys.exit(main())
