"""The moto server of the tests and benchmarks keeps objects of a tiered segment's size in memory
(tests/support/moto_server.py, KEY_BUFFER_BYTES): it would otherwise spill each one to a
temporary file and read it back for its ETag, on the cores the broker under test shares."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from tests.support.moto_server import KEY_BUFFER_BYTES, MotoServer
from tests.tiering.conftest import MotoServerFactory

# Past moto's own spill size (S3's smallest multipart part, 5 MiB, less 1 KiB), like the
# 7 MB objects of bench/tiering.py.
OBJECT_BYTES = 7 * 1024 * 1024


def _temporary_files(pid: int) -> list[str]:
    """The regular files the process holds open that were deleted or made unnamed: where a
    SpooledTemporaryFile's spill goes."""
    held = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except FileNotFoundError:  # closed meanwhile
            continue
        if target.startswith("/") and target.endswith("(deleted)"):
            held.append(target)
    return held


def test_a_segment_sized_object_stays_in_memory(moto_server: MotoServer, s3_bucket: str) -> None:
    assert OBJECT_BYTES < KEY_BUFFER_BYTES
    body = os.urandom(OBJECT_BYTES)
    before = _temporary_files(moto_server.pid)

    moto_server.put_object(s3_bucket, "segment.parquet", body)

    assert _temporary_files(moto_server.pid) == before
    assert moto_server.get_object(s3_bucket, "segment.parquet") == body
    etag = moto_server.etag(s3_bucket, "segment.parquet")
    assert etag.strip('"') == hashlib.md5(body).hexdigest()


def test_without_the_setting_moto_spills_it(moto_server_factory: MotoServerFactory) -> None:
    """The check above can see a spill: with moto's own default it finds one."""
    server = moto_server_factory({"MOTO_S3_DEFAULT_KEY_BUFFER_SIZE": str(5 * 1024 * 1024 - 1024)})
    bucket = server.create_bucket("riverbed-spill")
    before = _temporary_files(server.pid)

    server.put_object(bucket, "segment.parquet", os.urandom(OBJECT_BYTES))

    assert len(_temporary_files(server.pid)) > len(before)
