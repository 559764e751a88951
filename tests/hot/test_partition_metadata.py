"""partition.metadata: a local log knows its topic's id, across restarts, and a log of another
topic of the same name is refused rather than served."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from riverbed.common.uuids import encode_uuid
from riverbed.hot.replication.partitions import PartitionManager
from riverbed.hot.storage.log import LogConfig
from riverbed.hot.storage.log_manager import LogManager
from riverbed.hot.storage.partition_metadata import (
    PARTITION_METADATA_FILE,
    ForeignLogError,
    PartitionMetadataError,
    read_partition_metadata,
    write_partition_metadata,
)

CONFIG = LogConfig()
TOPIC = "orders"


def test_the_file_is_kafkas_two_lines_and_reads_back(tmp_path: Path) -> None:
    topic_id = uuid.uuid4()
    write_partition_metadata(tmp_path, topic_id)
    text = (tmp_path / PARTITION_METADATA_FILE).read_text()
    assert text == f"version: 0\ntopic_id: {encode_uuid(topic_id)}\n"
    assert read_partition_metadata(tmp_path) == topic_id
    assert read_partition_metadata(tmp_path / "absent") is None


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("version: 1\ntopic_id: AAAAAAAAAAAAAAAAAAAAAA\n", "version '1'"),
        ("version: 0\n", "topic_id"),
        ("version: 0\ntopic_id: not-an-id\n", "topic_id"),
        ("garbage\n", "expected 'key: value'"),
        ("version: 0\ntopic_id: \xe9\n", "not ASCII"),
    ],
)
def test_a_damaged_file_is_named_in_the_error(tmp_path: Path, text: str, complaint: str) -> None:
    (tmp_path / PARTITION_METADATA_FILE).write_text(text, encoding="latin-1")
    with pytest.raises(PartitionMetadataError, match=complaint) as caught:
        read_partition_metadata(tmp_path)
    assert PARTITION_METADATA_FILE in str(caught.value)


def test_a_log_keeps_its_topic_id_across_a_restart(tmp_path: Path) -> None:
    topic_id = uuid.uuid4()
    manager = LogManager(tmp_path, CONFIG)
    manager.get_or_create(TOPIC, 0, CONFIG, topic_id)
    assert manager.topic_id(TOPIC, 0) == topic_id
    manager.close()
    reopened = LogManager(tmp_path, CONFIG)
    assert reopened.topic_id(TOPIC, 0) == topic_id
    assert reopened.topic_id(TOPIC, 1) is None  # no log at all
    reopened.close()


def test_a_log_from_before_the_file_is_adopted_by_the_topic_that_hosts_it(tmp_path: Path) -> None:
    manager = LogManager(tmp_path, CONFIG)
    log = manager.get_or_create(TOPIC, 0, CONFIG, uuid.uuid4())
    directory = log.directory
    manager.close()
    (directory / PARTITION_METADATA_FILE).unlink()  # as written by an older Riverbed

    reopened = LogManager(tmp_path, CONFIG)
    assert reopened.topic_id(TOPIC, 0) is None
    topic_id = uuid.uuid4()
    partitions = PartitionManager(reopened, broker_id=1)
    partitions.ensure(TOPIC, 0, CONFIG, topic_id)
    assert read_partition_metadata(directory) == topic_id
    assert reopened.topic_id(TOPIC, 0) == topic_id
    reopened.close()


def test_the_log_of_an_earlier_topic_of_the_name_is_refused_and_kept(tmp_path: Path) -> None:
    old_id = uuid.uuid4()
    manager = LogManager(tmp_path, CONFIG)
    manager.get_or_create(TOPIC, 0, CONFIG, old_id)
    manager.close()

    reopened = LogManager(tmp_path, CONFIG)
    partitions = PartitionManager(reopened, broker_id=1)
    with pytest.raises(ForeignLogError, match=str(old_id)):
        partitions.ensure(TOPIC, 0, CONFIG, uuid.uuid4())
    assert partitions.get(TOPIC, 0) is None
    assert reopened.topic_id(TOPIC, 0) == old_id  # untouched
    # The topic it belongs to is still served.
    assert partitions.ensure(TOPIC, 0, CONFIG, old_id).topic_id == old_id
    with pytest.raises(ForeignLogError):
        partitions.ensure(TOPIC, 0, CONFIG, uuid.uuid4())
    reopened.close()


def test_an_unreadable_file_refuses_the_log_without_stopping_the_others(tmp_path: Path) -> None:
    manager = LogManager(tmp_path, CONFIG)
    damaged = manager.get_or_create(TOPIC, 0, CONFIG, uuid.uuid4()).directory
    manager.get_or_create(TOPIC, 1, CONFIG, uuid.uuid4())
    manager.close()
    (damaged / PARTITION_METADATA_FILE).write_text("version: 0\ntopic_id: ?\n")

    reopened = LogManager(tmp_path, CONFIG)  # loads: one bad file is not a failed data dir
    with pytest.raises(PartitionMetadataError):
        reopened.topic_id(TOPIC, 0)
    partitions = PartitionManager(reopened, broker_id=1)
    with pytest.raises(ForeignLogError, match=PARTITION_METADATA_FILE):
        partitions.ensure(TOPIC, 0, CONFIG, uuid.uuid4())
    assert reopened.topic_id(TOPIC, 1) is not None
    reopened.close()
