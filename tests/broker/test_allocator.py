"""The broker pins glibc's malloc thresholds: a tiering conversion's freed blocks are reused,
not returned to the kernel and faulted in again (measured here in page faults, in a process of
its own, since the thresholds are process-wide)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from riverbed.common.allocator import keep_freed_blocks

# Four conversions of an 8 MB segment on a worker thread; the page faults of the last three.
CONVERSIONS = r"""
import resource, sys, threading
from riverbed.common.allocator import keep_freed_blocks
from riverbed.protocol.records_codec import encode_batch
from riverbed.tiering.parquet_codec import segment_to_parquet

pinned = keep_freed_blocks() if sys.argv[2] == "pin" else False
values = [b'{"event":"%08d","kind":"view","user":"user-%d"}' % (i, i % 977) for i in range(60_000)]
segment = b"".join(
    encode_batch([(None, v, (), 1_700_000_000_000) for v in values[i : i + 3000]], base_offset=i)
    for i in range(0, len(values), 3000)
)
faults = []

def convert():
    for run in range(4):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        segment_to_parquet(segment, "t", 0, sys.argv[1])
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)

worker = threading.Thread(target=convert)
worker.start()
worker.join()
print(pinned, sum(faults[1:]))
"""


def faults_of_conversions(tmp_path: Path, mode: str, **environ: str) -> tuple[bool, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | environ
    out = subprocess.run(
        [sys.executable, "-c", CONVERSIONS, str(tmp_path / "out.parquet"), mode],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        timeout=120,
    ).stdout.split()
    return out[0] == "True", int(out[1])


@pytest.mark.processes
def test_pinned_thresholds_spare_the_page_faults_of_freed_blocks(tmp_path: Path) -> None:
    pinned, faults = faults_of_conversions(tmp_path, "pin")
    unpinned, default_faults = faults_of_conversions(tmp_path, "default")
    assert pinned
    assert not unpinned
    assert faults * 3 < default_faults, (faults, default_faults)


@pytest.mark.processes
def test_an_operators_own_malloc_settings_win(tmp_path: Path) -> None:
    assert keep_freed_blocks({"MALLOC_TRIM_THRESHOLD_": "1048576"}) is False
    assert keep_freed_blocks({"MALLOC_MMAP_THRESHOLD_": "1048576"}) is False
    pinned, _ = faults_of_conversions(tmp_path, "pin", MALLOC_TRIM_THRESHOLD_="1048576")
    assert not pinned
