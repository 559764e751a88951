"""Offset checkpoint files: one offset per partition, in Kafka's text format.

Used for `recovery-point-offset-checkpoint` and `replication-offset-checkpoint`:

    0                      <- format version
    2                      <- number of entries
    orders 0 1500          <- topic, partition, offset (topic names hold no spaces)
    orders 1 1420

Files are replaced atomically (see `write_atomically`), so a reader sees a whole old or a whole
new file; anything else is damage and is reported, never guessed around.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from riverbed.common.fileio import write_atomically

CHECKPOINT_VERSION = 0

TopicPartition = tuple[str, int]


class CheckpointError(ValueError):
    """A checkpoint file that is not in the format this module writes."""


def write_offset_checkpoint(path: Path, offsets: Mapping[TopicPartition, int]) -> None:
    lines = [str(CHECKPOINT_VERSION), str(len(offsets))]
    lines += [
        f"{topic} {partition} {offset}" for (topic, partition), offset in sorted(offsets.items())
    ]
    write_atomically(path, ("\n".join(lines) + "\n").encode())


def read_offset_checkpoint(path: Path) -> dict[TopicPartition, int]:
    """The offsets in `path`; empty if the file does not exist (a new data dir)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    lines = text.splitlines()
    if len(lines) < 2 or lines[0] != str(CHECKPOINT_VERSION):
        raise CheckpointError(f"{path}: expected version line {CHECKPOINT_VERSION}")
    if not lines[1].isdigit() or int(lines[1]) != len(lines) - 2:
        raise CheckpointError(f"{path}: entry count {lines[1]!r} does not match the file")
    offsets: dict[TopicPartition, int] = {}
    for number, line in enumerate(lines[2:], start=3):
        fields = line.split(" ")
        if len(fields) != 3 or not fields[1].isdigit():
            raise CheckpointError(f"{path}:{number}: expected 'topic partition offset'")
        try:
            offset = int(fields[2])
        except ValueError:
            raise CheckpointError(
                f"{path}:{number}: offset {fields[2]!r} is not a number"
            ) from None
        offsets[(fields[0], int(fields[1]))] = offset
    return offsets
