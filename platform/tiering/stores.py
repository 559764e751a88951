"""Open the object store a URL names."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from riverbed.tiering.file_store import FileStore
from riverbed.tiering.store import ObjectStore


def open_store(url: str, settings: Mapping[str, str]) -> ObjectStore:
    """`file:///abs/path` (a local directory). `s3://` is not built yet (see docs/tiering.md):
    it is refused with a message rather than half working."""
    parts = urlsplit(url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"{url}: a file:// URL names a local path (file:///abs/path)")
        return FileStore(Path(parts.path))
    if parts.scheme == "s3":
        raise ValueError(f"{url}: the S3 object store is not built yet; use file:///path")
    raise ValueError(f"{url}: unknown object store scheme {parts.scheme!r} (file:// or s3://)")
