"""The broker's data directory: the partition logs in it, its lock, marker and checkpoints.

Layout of a data directory:

    .lock                              flock()ed while a broker uses the directory
    .clean_shutdown                    written last by a clean close, removed at startup
    recovery-point-offset-checkpoint   per partition: offsets below it are on disk
    replication-offset-checkpoint      per partition: the high watermark
    orders-0/                          one directory per partition: <topic>-<partition>
    orders-1.3f2a...-delete/           a deleted partition whose removal a crash interrupted

At startup the recovery-point checkpoint says where each log's unflushed tail begins, so only
that tail is re-scanned. After a clean shutdown (marker present) every log was flushed before
the checkpoint was written, so nothing is scanned; after a crash the checkpoint is still a safe
lower bound, since a recovery point is only checkpointed once the data below it is fsynced.

A log that goes offline (a failed fsync, an append it could not undo: see log.py) means the
data directory failed, as Kafka's LogDirFailureChannel has it: the manager tells its owner once
(`on_dir_failure`, from whichever thread saw the failure), and a later `close` writes no
clean-shutdown marker, so the next start recovers as after a crash.
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from riverbed.common.fileio import fsync_dir, syncfs, write_atomically
from riverbed.hot.storage.checkpoint import (
    TopicPartition,
    read_offset_checkpoint,
    write_offset_checkpoint,
)
from riverbed.hot.storage.log import DELETED_DIR_SUFFIX, LogConfig, PartitionLog
from riverbed.hot.storage.partition_metadata import (
    PartitionMetadataError,
    read_partition_metadata,
    write_partition_metadata,
)
from riverbed.protocol import record_types

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"
CLEAN_SHUTDOWN_FILE = ".clean_shutdown"
RECOVERY_POINT_CHECKPOINT_FILE = "recovery-point-offset-checkpoint"
HIGH_WATERMARK_CHECKPOINT_FILE = "replication-offset-checkpoint"
# One thread fsyncs sealed segments for every log: syncs finish in roll order, and appends on
# the owner thread never wait for a whole segment to reach the disk.
FLUSH_THREADS = 1
# Kafka's topic name rule; the name becomes a directory name, so it is enforced here too.
TOPIC_NAME_LENGTH_MAX = 249
_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]+")


class DataDirLockedError(Exception):
    """Another process (a second broker) holds the data directory's lock."""


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def partition_dir_name(topic: str, partition: int) -> str:
    if (
        not _TOPIC_NAME.fullmatch(topic)
        or topic in (".", "..")
        or len(topic) > TOPIC_NAME_LENGTH_MAX
        or partition < 0
    ):
        raise ValueError(f"invalid topic partition {topic!r} {partition}")
    return f"{topic}-{partition}"


def parse_partition_dir(name: str) -> TopicPartition | None:
    """(topic, partition) from `<topic>-<partition>`, split on the LAST '-' (topic names may
    hold '-'); None for anything else."""
    topic, _, partition = name.rpartition("-")
    if not topic or not partition.isdigit():
        return None
    return topic, int(partition)


class LogManager:
    """Owns every partition log of one data directory.

    Methods run on the owner thread, except `checkpoint*` which may run on a worker thread
    while the owner appends (they only read offsets). `on_dir_failure(data_dir, reason)` is
    called once, from any thread, when the first log goes offline (None: nobody is told).
    """

    def __init__(
        self,
        data_dir: Path,
        default_config: LogConfig,
        *,
        now_ms: Callable[[], int] = wall_clock_ms,
        on_dir_failure: Callable[[Path, str], None] | None = None,
    ) -> None:
        self._data_dir = data_dir
        self._default_config = default_config
        self._now_ms = now_ms
        self._on_dir_failure = on_dir_failure
        # Why the directory failed (the first log that went offline); the lock makes the report
        # once when the owner thread and the flush thread see failures together.
        self._failure: str | None = None
        self._failure_lock = threading.Lock()
        self._logs: dict[TopicPartition, PartitionLog] = {}
        # Each log's topic id from its partition.metadata: None for a log made before the file
        # existed, the error for a file that cannot be read (raised again to whoever asks).
        self._topic_ids: dict[TopicPartition, uuid.UUID | PartitionMetadataError | None] = {}
        self._closed = False
        # Checkpoints may be written from a worker thread and from close(): one at a time.
        self._checkpoint_lock = threading.Lock()
        data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = _lock(data_dir)
        self._flush_executor = ThreadPoolExecutor(FLUSH_THREADS, thread_name_prefix="log-flush")
        try:
            self.had_clean_shutdown = self._load_logs()
        except BaseException:
            self._flush_executor.shutdown()
            os.close(self._lock_fd)
            raise

    def _load_logs(self) -> bool:
        marker = self._data_dir / CLEAN_SHUTDOWN_FILE
        clean = marker.exists()
        if clean:
            # From now on a crash must not look like a clean shutdown.
            marker.unlink()
            fsync_dir(self._data_dir)
        recovery_points = read_offset_checkpoint(self._data_dir / RECOVERY_POINT_CHECKPOINT_FILE)
        high_watermarks = read_offset_checkpoint(self._data_dir / HIGH_WATERMARK_CHECKPOINT_FILE)
        if clean:
            how = "after a clean shutdown"
        elif not recovery_points and not any(p.is_dir() for p in self._data_dir.iterdir()):
            how = "(a new data dir)"
        else:
            how = "after an unclean shutdown: recovering from the recovery points"
        log.info("loading logs in %s %s", self._data_dir, how)
        for child in sorted(self._data_dir.iterdir()):
            if not child.is_dir():
                continue
            if child.name.endswith(DELETED_DIR_SUFFIX):
                shutil.rmtree(child)
                continue
            topic_partition = parse_partition_dir(child.name)
            if topic_partition is None:
                log.warning("ignoring %s: not a <topic>-<partition> directory", child)
                continue
            partition_log = self._open(
                child,
                record_types.TopicPartition(*topic_partition),
                self._default_config,
                recovery_points.get(topic_partition),
            )
            try:
                self._topic_ids[topic_partition] = read_partition_metadata(child)
            except PartitionMetadataError as error:
                self._topic_ids[topic_partition] = error
            high_watermark = high_watermarks.get(topic_partition)
            if high_watermark is not None:
                partition_log.update_high_watermark(
                    max(
                        partition_log.high_watermark,
                        min(high_watermark, partition_log.log_end_offset),
                    )
                )
            self._logs[topic_partition] = partition_log
        return clean

    def _open(
        self,
        directory: Path,
        tp: record_types.TopicPartition,
        config: LogConfig,
        recovery_point: int | None,
    ) -> PartitionLog:
        return PartitionLog.open(
            directory,
            tp,
            config,
            recovery_point=recovery_point,
            now_ms=self._now_ms,
            flush_executor=self._flush_executor,
            on_offline=functools.partial(self._log_went_offline, tp),
        )

    def _log_went_offline(self, tp: record_types.TopicPartition, reason: str) -> None:
        failure = f"the log of {tp.topic}-{tp.partition} went offline: {reason}"
        with self._failure_lock:
            if self._failure is not None:
                return
            self._failure = failure
        if self._on_dir_failure is not None:
            self._on_dir_failure(self._data_dir, failure)

    @property
    def data_dir(self) -> Path:
        return self._data_dir

    def get_or_create(
        self, topic: str, partition: int, config: LogConfig, topic_id: uuid.UUID
    ) -> PartitionLog:
        """The log of a partition, created empty if new (its partition.metadata naming
        `topic_id`); an existing log takes `config`. Whether an existing log is that topic's is
        the caller's to check first (`topic_id`)."""
        partition_log = self._logs.get((topic, partition))
        if partition_log is not None:
            if partition_log.config != config:
                partition_log.update_config(config)
            return partition_log
        directory = self._data_dir / partition_dir_name(topic, partition)
        directory.mkdir()
        # Before the directory is synced into the data dir: a log that is found after a crash
        # has its id, or is empty (one without the file is adopted by the topic it is hosted for).
        write_partition_metadata(directory, topic_id)
        fsync_dir(self._data_dir)
        partition_log = self._open(
            directory, record_types.TopicPartition(topic, partition), config, 0
        )
        self._logs[(topic, partition)] = partition_log
        self._topic_ids[(topic, partition)] = topic_id
        return partition_log

    def get(self, topic: str, partition: int) -> PartitionLog | None:
        return self._logs.get((topic, partition))

    def topic_id(self, topic: str, partition: int) -> uuid.UUID | None:
        """The id of the topic whose log this is; None for no log, or a log from before
        partition.metadata. Raises PartitionMetadataError if its file cannot be read."""
        topic_id = self._topic_ids.get((topic, partition))
        if isinstance(topic_id, PartitionMetadataError):
            raise topic_id
        return topic_id

    def adopt(self, topic: str, partition: int, topic_id: uuid.UUID) -> None:
        """Write partition.metadata for a log from before the file (Kafka does the same when it
        first sees such a log with a topic id)."""
        if (topic, partition) not in self._logs or self.topic_id(topic, partition) is not None:
            raise ValueError(f"{topic}-{partition} has no log without a topic id")
        write_partition_metadata(self._logs[(topic, partition)].directory, topic_id)
        self._topic_ids[(topic, partition)] = topic_id

    def delete(self, topic: str, partition: int) -> None:
        partition_log = self._logs.pop((topic, partition), None)
        self._topic_ids.pop((topic, partition), None)
        if partition_log is not None:
            partition_log.delete()

    def partitions(self) -> list[TopicPartition]:
        return sorted(self._logs)

    def flush_all(self) -> None:
        for partition_log in list(self._logs.values()):
            partition_log.flush()
        self.checkpoint_recovery_points()

    def checkpoint(self) -> None:
        """Persist recovery points and high watermarks (the broker does this periodically)."""
        self.checkpoint_recovery_points()
        self.checkpoint_high_watermarks()

    def checkpoint_recovery_points(self) -> None:
        logs = dict(self._logs)  # a snapshot: the owner thread may add logs meanwhile
        offsets = {tp: partition_log.recovery_point for tp, partition_log in logs.items()}
        with self._checkpoint_lock:
            write_offset_checkpoint(self._data_dir / RECOVERY_POINT_CHECKPOINT_FILE, offsets)

    def checkpoint_high_watermarks(self) -> None:
        logs = dict(self._logs)
        offsets = {tp: partition_log.high_watermark for tp, partition_log in logs.items()}
        with self._checkpoint_lock:
            write_offset_checkpoint(self._data_dir / HIGH_WATERMARK_CHECKPOINT_FILE, offsets)

    def close(self) -> None:
        """Clean shutdown: close every log, make everything durable, checkpoint, then write the
        marker. If a log cannot be closed, the sync fails or the directory failed (a log went
        offline) the marker is not written, so the next start recovers.

        One syncfs of the data directory's file system replaces the per-log fsyncs (data,
        indexes, directory, leader epochs; the producer-state snapshots the broker wrote just
        before): two or more fsyncs per partition made a broker with thousands of partitions
        spend seconds of its shutdown waiting on the disk, one log after the other."""
        if self._closed:
            return
        self._closed = True
        try:
            failures = []
            closed = []
            for topic_partition, partition_log in self._logs.items():
                try:
                    partition_log.close(sync=False)
                except Exception as error:
                    log.error("closing the log of %s failed: %s", topic_partition, error)
                    failures.append(error)
                else:
                    closed.append(partition_log)
            try:
                syncfs(self._data_dir)
            except OSError as error:
                log.error("making the logs durable failed: %s", error)
                raise
            for partition_log in closed:
                partition_log.synced_after_close()
            self.checkpoint()
            if failures:
                raise failures[0]
            if self._failure is not None:
                # Offline logs were not flushed: their unflushed tails must be recovered.
                log.error("%s failed, no clean shutdown: %s", self._data_dir, self._failure)
                return
            write_atomically(self._data_dir / CLEAN_SHUTDOWN_FILE, b"")
        finally:
            self._flush_executor.shutdown()
            os.close(self._lock_fd)


def _lock(data_dir: Path) -> int:
    path = data_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        # flock, not lockf: flock locks conflict between two opens in the same process too.
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DataDirLockedError(
            f"data directory {data_dir} is in use by another broker ({path} is locked)"
        ) from None
    return fd
