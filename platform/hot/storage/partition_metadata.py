"""`partition.metadata`: which topic a local log belongs to, kept in the log's own directory.

Kafka's file and format (KIP-516), two lines:

    version: 0
    topic_id: <22-char base64url UUID>

A directory is named `<topic>-<partition>`, and a topic deleted and created again under the same
name gets a new id: without the id on disk a broker that was down meanwhile could not tell the
old log from the new topic's, and would serve old records as the new topic's (a follower keeps
them below the leader's first epoch). With it, a log whose id is not the topic's in ZooKeeper is
kept and not served until a DeleteTopics of its own id says it may go.

Written once, durably, when the log is created (or adopted, for a log from before the file
existed); never rewritten, since a log's topic cannot change.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from riverbed.common.fileio import write_atomically
from riverbed.common.uuids import decode_uuid, encode_uuid

PARTITION_METADATA_FILE = "partition.metadata"
PARTITION_METADATA_VERSION = 0


class PartitionMetadataError(ValueError):
    """A `partition.metadata` file that is not in the format this module writes."""


class ForeignLogError(Exception):
    """The local log of a partition is another topic's than the one it is asked for (or its
    file cannot be read): kept, and not served."""


def write_partition_metadata(directory: Path, topic_id: uuid.UUID) -> None:
    text = f"version: {PARTITION_METADATA_VERSION}\ntopic_id: {encode_uuid(topic_id)}\n"
    write_atomically(directory / PARTITION_METADATA_FILE, text.encode("ascii"))


def read_partition_metadata(directory: Path) -> uuid.UUID | None:
    """The topic id in `directory`'s file; None if the log has none (made before the file
    existed, or its creation was interrupted before the file was written)."""
    path = directory / PARTITION_METADATA_FILE
    try:
        text = path.read_text(encoding="ascii")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        raise PartitionMetadataError(f"{path}: not ASCII text") from None
    fields: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        key, sep, value = line.partition(":")
        if not sep:
            raise PartitionMetadataError(f"{path}:{number}: expected 'key: value'")
        fields[key.strip()] = value.strip()
    if fields.get("version") != str(PARTITION_METADATA_VERSION):
        raise PartitionMetadataError(
            f"{path}: version {fields.get('version')!r}, expected {PARTITION_METADATA_VERSION}"
        )
    try:
        return decode_uuid(fields.get("topic_id", ""))
    except ValueError as error:
        raise PartitionMetadataError(f"{path}: topic_id: {error}") from None
