"""Leader epochs across restarts, on real files: opening a log drops the epochs that wrote
nothing in memory and rewrites no file, after a clean shutdown and after a crash alike."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

from riverbed.hot.storage.leader_epoch import EpochEntry, leader_epoch_checkpoint_path
from riverbed.hot.storage.log import LogConfig, PartitionLog
from riverbed.hot.storage.log_manager import LogManager
from riverbed.protocol.records import encode_batch, validate_records

from tests.hot.test_recovery import all_values

CONFIG = LogConfig(segment_bytes=4096, index_interval_bytes=200)
TOPIC = "orders"
TOPIC_ID = uuid.uuid4()


def append_at(log: PartitionLog, values: list[bytes], leader_epoch: int) -> None:
    buf = memoryview(
        bytearray(encode_batch([(None, v, (), 1_000 + i) for i, v in enumerate(values)]))
    )
    log.append(buf, validate_records(buf, 1 << 20), leader_epoch=leader_epoch)


def checkpoint_text(log: PartitionLog) -> str:
    return leader_epoch_checkpoint_path(log.directory).read_text()


def open_log(manager: LogManager) -> PartitionLog:
    log = manager.get(TOPIC, 0)
    assert log is not None
    return log


def test_an_epoch_that_wrote_nothing_is_gone_after_a_restart(tmp_path: Path) -> None:
    manager = LogManager(tmp_path, CONFIG)
    log = manager.get_or_create(TOPIC, 0, CONFIG, TOPIC_ID)
    append_at(log, [b"a", b"b"], 0)
    log.leader_epochs.assign(3, log.log_end_offset)  # led, wrote nothing
    manager.close()

    log = open_log(manager := LogManager(tmp_path, CONFIG))
    assert log.leader_epochs.entries() == (EpochEntry(0, 0),)
    # The next leadership starts where epoch 3 would have: the answer for epoch 0 holds.
    log.leader_epochs.assign(4, log.log_end_offset)
    assert log.leader_epochs.end_offset_for(0, log.log_end_offset) == (0, 2)
    append_at(log, [b"c"], 4)
    log.flush()  # the file follows once the recovery point passes the batches
    assert checkpoint_text(log) == "0\n2\n0 0\n4 2\n"
    manager.close()


def test_opening_a_log_rewrites_no_epoch_file(tmp_path: Path) -> None:
    """A file running ahead of the log (an entry at its end, written before a batch that a
    crash or a failed write lost) is cut back in memory; the file stays as it was."""
    manager = LogManager(tmp_path, CONFIG)
    log = manager.get_or_create(TOPIC, 0, CONFIG, TOPIC_ID)
    append_at(log, [b"a", b"b"], 0)
    log.leader_epochs.assign(5, log.log_end_offset)  # written, but no batch followed
    path = leader_epoch_checkpoint_path(log.directory)
    manager.close()
    before = (path.read_text(), path.stat().st_ino, path.stat().st_mtime_ns)
    assert before[0] == "0\n2\n0 0\n5 2\n"

    log = open_log(manager := LogManager(tmp_path, CONFIG))
    assert log.leader_epochs.entries() == (EpochEntry(0, 0),)
    assert (path.read_text(), path.stat().st_ino, path.stat().st_mtime_ns) == before
    append_at(log, [b"c"], 6)
    log.flush()  # the next write of the file writes what memory holds
    assert checkpoint_text(log) == "0\n2\n0 0\n6 2\n"
    manager.close()


def test_after_a_crash_an_epoch_file_ahead_of_the_log_is_cut_back(tmp_path: Path) -> None:
    """A crash between an epoch's entry and its first batch leaves the file ahead of the log:
    the re-scanned log decides, and the answers are those of the log without that epoch."""
    live = tmp_path / "live"
    manager = LogManager(live, CONFIG)
    log = manager.get_or_create(TOPIC, 0, CONFIG, TOPIC_ID)
    for i in range(20):
        append_at(log, [b"old %d" % i * 30], 0)
    manager.flush_all()
    append_at(log, [b"unflushed"], 2)
    log.leader_epochs.assign(9, log.log_end_offset)  # the crash comes before its batch
    values = all_values(log)
    crashed = tmp_path / "crashed"
    shutil.copytree(live, crashed)  # no clean marker: what a crash leaves
    manager.close()
    (crashed / ".lock").unlink()

    manager = LogManager(crashed, CONFIG)
    assert not manager.had_clean_shutdown
    recovered = open_log(manager)
    assert recovered.recovered_segments >= 1
    assert all_values(recovered) == values
    end = recovered.log_end_offset
    assert recovered.leader_epochs.entries() == (EpochEntry(0, 0), EpochEntry(2, end - 1))
    assert recovered.leader_epochs.end_offset_for(9, end) == (-1, -1)
    manager.close()


def test_a_clean_restart_rescans_nothing_and_keeps_every_epoch(tmp_path: Path) -> None:
    manager = LogManager(tmp_path, CONFIG)
    log = manager.get_or_create(TOPIC, 0, CONFIG, TOPIC_ID)
    append_at(log, [b"a"], 1)
    log.leader_epochs.assign(2, log.log_end_offset)
    append_at(log, [b"b"], 2)
    manager.close()

    reopened = open_log(manager := LogManager(tmp_path, CONFIG))
    assert manager.had_clean_shutdown
    assert reopened.recovered_segments == 0
    assert reopened.leader_epochs.entries() == (EpochEntry(1, 0), EpochEntry(2, 1))
    manager.close()


def test_recovery_takes_epochs_from_the_batches_not_from_a_file_ahead_of_the_log(
    tmp_path: Path,
) -> None:
    """The file may keep an entry of a leadership that wrote nothing across clean restarts
    (opening does not rewrite it). Batches of an older epoch can follow at that offset (this
    replica then follows a leader elected uncleanly); if a crash takes their unwritten entry,
    recovery must derive it from their headers, not keep the stale one."""
    live = tmp_path / "live"
    manager = LogManager(live, CONFIG)
    log = manager.get_or_create(TOPIC, 0, CONFIG, TOPIC_ID)
    for i in range(20):
        append_at(log, [b"old %d" % i * 30], 0)
    start = log.log_end_offset
    log.leader_epochs.assign(5, start)  # led at epoch 5, wrote nothing
    manager.close()
    assert checkpoint_text(log) == f"0\n2\n0 0\n5 {start}\n"

    log = open_log(manager := LogManager(live, CONFIG))
    assert log.leader_epochs.entries() == (EpochEntry(0, 0),)
    manager.flush_all()
    append_at(log, [b"from the new leader"], 3)
    append_at(log, [b"and more"], 3)
    values = all_values(log)
    crashed = tmp_path / "crashed"
    shutil.copytree(live, crashed)  # a crash before epoch 3's entry reached the file
    manager.close()
    (crashed / ".lock").unlink()
    assert checkpoint_text(log) == f"0\n2\n0 0\n3 {start}\n"  # closing wrote it

    recovered = open_log(manager := LogManager(crashed, CONFIG))
    assert not manager.had_clean_shutdown
    assert all_values(recovered) == values
    assert recovered.leader_epochs.entries() == (EpochEntry(0, 0), EpochEntry(3, start))
    assert leader_epoch_checkpoint_path(recovered.directory).read_text() == (
        f"0\n2\n0 0\n3 {start}\n"
    )
    manager.close()
