"""Where a path lives: the local disk or an fsspec filesystem (the named internal interface storage,
checkpoints and the model registry share)."""

from __future__ import annotations

import os
from typing import Any


def is_local_fs(fs: Any) -> bool:
    """True for fsspec's local filesystem (``file://`` is the local disk)."""
    protocol = getattr(fs, "protocol", None)
    if isinstance(protocol, (tuple, list)):
        return "file" in protocol or "local" in protocol
    return protocol in ("file", "local")


def resolve_filesystem(storage_path: str, filesystem: Any = None) -> tuple[Any, str]:
    """Return (fsspec filesystem or None for the local disk, path inside it).

    A ``filesystem`` given explicitly is used as it is (``storage_path`` is a path inside it; a
    ``protocol://`` prefix is stripped). A URL without one is opened with fsspec; a protocol whose
    implementation is not installed raises ValueError naming the package (and trainforge extra).
    """
    if filesystem is not None:
        return filesystem, filesystem._strip_protocol(storage_path)
    if "://" not in storage_path or storage_path.startswith("file://"):
        local = storage_path[len("file://"):] if storage_path.startswith("file://") else storage_path
        return None, os.path.abspath(os.path.expanduser(local))
    import fsspec

    try:
        fs, path = fsspec.core.url_to_fs(storage_path)
    except (ImportError, ValueError) as exc:
        protocol = storage_path.split("://", 1)[0]
        extra = {
            "s3": "s3fs: pip install 'trainforge[s3]'",
            "s3a": "s3fs: pip install 'trainforge[s3]'",
            "gs": "gcsfs: pip install gcsfs",
            "gcs": "gcsfs: pip install gcsfs",
        }.get(protocol)
        hint = f"install {extra}" if extra else f"install the fsspec implementation for '{protocol}://'"
        raise ValueError(
            f"RunConfig.storage_path={storage_path!r} cannot be opened: {exc}. To fix: {hint}, or pass "
            "RunConfig(storage_filesystem=...) with a ready fsspec filesystem."
        ) from exc
    if is_local_fs(fs):
        return None, os.path.abspath(path)
    return fs, path
