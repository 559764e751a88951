"""The log cleaner's files in a log directory: the crash-safe swap of cleaned segments (and
its completion after a crash), and the first dirty offset's checkpoint.

A cleaning pass rewrites groups of old segments; the group covering offsets [base, end) becomes
`cleaned/<base>.log` (+ `.index`, `.timeindex`), fsynced. The swap of the whole pass, run on the
log's owner thread:
1. writes the marker `cleaner-swap` (one "<base> <end>" line per group) atomically: from here
   on the swap happens;
2. deletes every segment file with a base offset in (base, end) of a group;
3. renames each group's cleaned files over `<base>.log`, `.index`, `.timeindex`;
4. fsyncs the directory and removes the marker.
A crash before step 1 leaves the old segments and a `cleaned/` directory that opening the log
removes; a crash after it leaves the marker, and opening the log repeats steps 2-4 (each can be
repeated) before listing segments. Either way the log is opened exactly as before the pass or
exactly as after it: never with both an old segment and its replacement (duplicated offsets),
never with neither (lost ones), never with half a pass.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from riverbed.common.fileio import fsync_dir, write_atomically
from riverbed.hot.storage.segment import SEGMENT_SUFFIXES, segment_file

log = logging.getLogger(__name__)

CLEANED_DIR = "cleaned"
SWAP_MARKER = "cleaner-swap"
CHECKPOINT_FILE = "cleaner-offset-checkpoint"


def cleaned_dir(directory: Path) -> Path:
    """Where the cleaner writes cleaned segments of the log in `directory` before the swap."""
    return directory / CLEANED_DIR


OffsetRange = tuple[int, int]  # [base offset, end offset)


def swap_in(directory: Path, groups: Sequence[OffsetRange]) -> None:
    """Replace the segments of each group's range by its cleaned one (steps 1-4)."""
    marker = "".join(f"{base_offset} {end_offset}\n" for base_offset, end_offset in groups)
    write_atomically(directory / SWAP_MARKER, marker.encode())
    _finish(directory, groups)


def discard_cleaned(directory: Path) -> None:
    """Remove cleaned segments that were not swapped in (a cleaning abandoned or cut short)."""
    shutil.rmtree(cleaned_dir(directory), ignore_errors=True)


def finish_interrupted_swap(directory: Path) -> None:
    """Run when a log is opened: complete a swap that a crash interrupted after its marker was
    written, and remove what an interrupted cleaning left."""
    marker = directory / SWAP_MARKER
    if marker.exists():
        groups = [_offset_range(line) for line in marker.read_text().splitlines()]
        log.warning(
            "%s: finishing the swap of cleaned segments for offsets %s that a crash interrupted",
            directory.name,
            ", ".join(f"[{base}, {end})" for base, end in groups),
        )
        _finish(directory, groups)
    marker.with_name(marker.name + ".tmp").unlink(missing_ok=True)
    discard_cleaned(directory)


def _offset_range(line: str) -> OffsetRange:
    base_text, end_text = line.split()
    return int(base_text), int(end_text)


def _finish(directory: Path, groups: Sequence[OffsetRange]) -> None:
    for path in directory.iterdir():
        if (
            path.suffix in SEGMENT_SUFFIXES
            and path.stem.isdigit()
            and any(base < int(path.stem) < end for base, end in groups)
        ):
            path.unlink()
    cleaned = cleaned_dir(directory)
    for base_offset, _ in groups:
        for suffix in SEGMENT_SUFFIXES:
            source = segment_file(cleaned, base_offset, suffix)
            if source.exists():
                os.replace(source, segment_file(directory, base_offset, suffix))
    fsync_dir(directory)
    (directory / SWAP_MARKER).unlink()
    fsync_dir(directory)


def load_first_dirty_offset(directory: Path) -> int:
    """The checkpointed first dirty offset of the log in `directory`; 0 (all dirty) if none."""
    try:
        return int((directory / CHECKPOINT_FILE).read_text())
    except (OSError, ValueError):
        return 0


def save_first_dirty_offset(directory: Path, offset: int) -> None:
    write_atomically(directory / CHECKPOINT_FILE, f"{offset}\n".encode())


def cap_first_dirty_offset(directory: Path, log_end_offset: int) -> None:
    """After a truncation to `log_end_offset`: the offsets from there on will be written again,
    so they are dirty (else records appended there would count as compacted already)."""
    if load_first_dirty_offset(directory) > log_end_offset:
        save_first_dirty_offset(directory, log_end_offset)
