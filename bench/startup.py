"""Broker startup time against log size: startup must not grow with the data a broker holds.

For each size (an empty log, then ~1 GB and ~10 GB; --quick: 100 MB and 1 GB) a fresh data dir
gets one partition holding that many bytes of valid record batches, written straight through
Riverbed's log API (much faster than producing them) and closed cleanly. The broker then starts
once unmeasured (the first open after the direct write), and the clock runs from spawning
`riverbed broker` to its port accepting a TCP connection, for

- clean: a start after a SIGTERM shutdown (clean-shutdown marker present);
- unclean: a start after a crash: ~1 MB is produced (acks=all) and the broker SIGKILLed, so the
  log holds data above its recovery point and no marker. The clock starts once ZooKeeper has
  expired the dead broker's session: before that a restarted broker waits for its stale
  registration, a wait set by zookeeper.session.timeout.ms, not by the log. That wait is
  measured too, once per size (`restart_right_after_sigkill_s`), as context;

median of `REPEATS` each. After every measured start the broker must report the whole log
(high watermark = every record written), so a broker that lost data cannot look fast.

The log files were just written and the machine's RAM holds them, so they are in the page cache:
the numbers are what startup costs in CPU and reads of cached files, not cold-disk seeks.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from riverbed.hot.storage.log import LogConfig
from riverbed.hot.storage.log_manager import LogManager
from riverbed.protocol.records import encode_batch, validate_records

from bench.kafka_clients import create_topic, end_offset, produce_acknowledged
from bench.machine import package_version
from bench.options import BenchOptions, BenchResult, Headline, Ratio
from bench.procs import Broker, ProcessFailed, zookeeper

NAME = "startup"
TOPIC = "bench-startup"
SIZES_BYTES_FULL = (10**9, 10 * 10**9)
SIZES_BYTES_QUICK = (100 * 10**6, 10**9)
REPEATS = 3
# Free space needed, as a multiple of the largest log: room for it, its indexes and everything
# else on the disk (25 GB for the full run's 10 GB).
DISK_FREE_FACTOR = 2.5
VALUE_BYTES = 100
# ~1 MB batches, as a batching producer would write them, under the default max.message.bytes.
RECORDS_PER_BATCH = 9_000
# The epoch a new topic's first leader gets; batches carry it as a leader would write them.
LEADER_EPOCH = 0
# Written through the broker before each crash: ~1 MB above the recovery point.
TAIL_RECORDS = 10_000
TAIL_VALUE = b"t" * VALUE_BYTES
# A crashed broker's registration lasts one ZooKeeper session (zookeeper.session.timeout.ms).
REGISTRATION_TIMEOUT_S = 120.0
# A broker that re-reads 10 GB may take minutes: that is a result to report, not a hang.
BROKER_START_TIMEOUT_S = 900.0
# "≈ 1": a larger log may cost some noise, not a multiple.
STARTUP_RATIO_MAX = 1.5


def run(options: BenchOptions) -> BenchResult:
    sizes = SIZES_BYTES_QUICK if options.quick else SIZES_BYTES_FULL
    disk = check_free_disk(options.work_dir, max(sizes))
    by_size: dict[str, dict[str, Any]] = {}
    with (
        tempfile.TemporaryDirectory(prefix=f"{NAME}-", dir=options.work_dir) as scratch,
        zookeeper(Path(scratch) / "zookeeper") as zk_connect,
    ):
        for size_bytes in (0, *sizes):
            by_size[_label(size_bytes)] = measure_size(
                size_bytes,
                Path(scratch),
                zk_connect,
                options.work_dir / "logs",
                options.broker_settings,
            )
    return summarize(sizes, by_size, disk, options)


def check_free_disk(work_dir: Path, largest_bytes: int) -> dict[str, int]:
    usage = shutil.disk_usage(work_dir)
    needed = int(DISK_FREE_FACTOR * largest_bytes)
    if usage.free < needed:
        raise ProcessFailed(
            f"{work_dir} has {usage.free / 1e9:.1f} GB free; the startup benchmark needs "
            f"{needed / 1e9:.1f} GB ({DISK_FREE_FACTOR} x its largest log). "
            "Free some space or pass --work-dir on a bigger disk."
        )
    return {"free_bytes_before": usage.free, "needed_bytes": needed}


def measure_size(
    size_bytes: int,
    scratch_dir: Path,
    zk_connect: str,
    log_dir: Path,
    settings: dict[str, str],
) -> dict[str, Any]:
    data_dir = scratch_dir / f"data-{size_bytes}"
    data_dir.mkdir()
    broker_log = log_dir / f"{NAME}-broker-{_label(size_bytes)}.log"
    broker = Broker(data_dir, zk_connect, settings, broker_log)
    try:
        # The topic lives in ZooKeeper across sizes; each fresh data dir gets an empty log for it.
        broker.start(BROKER_START_TIMEOUT_S)
        if size_bytes == 0:
            create_topic(broker.bootstrap, TOPIC, partitions=1)
        broker.terminate()
        written = fill_log(data_dir, size_bytes)
        records = int(written["records"])
        first_open_s = _timed_start(broker, records)
        broker.terminate()
        clean = []
        for _ in range(REPEATS):
            clean.append(_timed_start(broker, records))
            broker.terminate()
        broker.start(BROKER_START_TIMEOUT_S)
        unclean, registration_waits = [], []
        for _ in range(REPEATS):
            records = _crash_after_writes(broker, records)
            registration_waits.append(broker.wait_until_deregistered(REGISTRATION_TIMEOUT_S))
            unclean.append(_timed_start(broker, records))
        records = _crash_after_writes(broker, records)
        immediate_restart_s = _timed_start(broker, records)
        broker.terminate()
        segment_bytes = sorted(path.stat().st_size for path in data_dir.rglob("*.log"))
    finally:
        broker.close()
        shutil.rmtree(data_dir, ignore_errors=True)
    return {
        "written": written,
        "segment_file_bytes": segment_bytes,
        "first_open_after_write_s": first_open_s,
        "clean_s": clean,
        "clean_s_median": statistics.median(clean),
        "unclean_s": unclean,
        "unclean_s_median": statistics.median(unclean),
        "registration_expiry_waits_s": registration_waits,
        "restart_right_after_sigkill_s": immediate_restart_s,
    }


def _crash_after_writes(broker: Broker, records: int) -> int:
    """Append an acknowledged, unflushed tail, then SIGKILL; returns the records now in the log.

    A crash of an idle broker right after a clean start would leave nothing to recover; a broker
    that was taking writes leaves data above its recovery point, which the next start re-scans.
    """
    produce_acknowledged(broker.bootstrap, TOPIC, 0, [TAIL_VALUE] * TAIL_RECORDS)
    broker.kill()
    return records + TAIL_RECORDS


def _timed_start(broker: Broker, records: int) -> float:
    startup_s = broker.start(BROKER_START_TIMEOUT_S)
    reported = end_offset(broker.bootstrap, TOPIC, 0)
    if reported != records:
        raise ProcessFailed(f"broker reports {reported} records after startup, {records} written")
    return startup_s


def fill_log(data_dir: Path, size_bytes: int) -> dict[str, float]:
    """Append ~1 MB batches to the topic's log in `data_dir` until it holds `size_bytes`, then
    close it as the broker would (flush, checkpoint, clean-shutdown marker)."""
    config = LogConfig()
    value = b"v" * VALUE_BYTES
    now_ms = time.time_ns() // 1_000_000
    batch = bytearray(encode_batch([(None, value, (), now_ms)] * RECORDS_PER_BATCH))
    view = memoryview(batch)
    # Checked once like a produce request; append() rewrites only the base offset and epoch.
    headers = validate_records(view, config.max_message_bytes)
    started = time.perf_counter()
    manager = LogManager(data_dir, config)
    try:
        partition_log = manager.get(TOPIC, 0)
        if partition_log is None:
            raise ProcessFailed(f"the broker created no log for {TOPIC}-0 in {data_dir}")
        appended_bytes = 0
        while appended_bytes < size_bytes:
            partition_log.append(view, headers, LEADER_EPOCH)
            appended_bytes += len(batch)
        records = partition_log.log_end_offset
    finally:
        manager.close()
    elapsed_s = time.perf_counter() - started
    return {
        "bytes": appended_bytes,
        "records": records,
        "batch_bytes": len(batch),
        "segment_bytes": config.segment_bytes,
        "seconds": elapsed_s,
        "mb_per_s": appended_bytes / elapsed_s / 1e6,
    }


def _label(size_bytes: int) -> str:
    if size_bytes == 0:
        return "empty"
    if size_bytes >= 10**9:
        return f"{size_bytes / 10**9:g}GB"
    return f"{size_bytes / 10**6:g}MB"


def summarize(
    sizes: tuple[int, int],
    by_size: dict[str, dict[str, Any]],
    disk: dict[str, int],
    options: BenchOptions,
) -> BenchResult:
    small, large = (_label(size) for size in sizes)
    headlines: list[Headline] = []
    for label, measured in by_size.items():
        headlines += [
            _headline(f"clean start, {label} log", measured["clean_s_median"]),
            _headline(
                f"unclean start (crash after writes), {label} log", measured["unclean_s_median"]
            ),
        ]
    headlines.append(
        _headline(
            f"restart right after SIGKILL (waits for the ZooKeeper session), {large} log",
            by_size[large]["restart_right_after_sigkill_s"],
        )
    )
    ratios: list[Ratio] = []
    for mode in ("clean", "unclean"):
        ratio = by_size[large][f"{mode}_s_median"] / by_size[small][f"{mode}_s_median"]
        ratios.append(
            {
                "label": f"{mode} start {large} / {small}",
                "value": ratio,
                "goal": f"≈ 1 (met if <= {STARTUP_RATIO_MAX})",
                "met": ratio <= STARTUP_RATIO_MAX,
            }
        )
    return {
        "parameters": {
            "sizes_bytes": [0, *sizes],
            "repeats": REPEATS,
            "value_bytes": VALUE_BYTES,
            "records_per_batch": RECORDS_PER_BATCH,
            "tail_records_before_each_crash": TAIL_RECORDS,
            "broker_settings": options.broker_settings,
            "readiness": "TCP connect to the broker's listener succeeds",
        },
        "tools": {"confluent-kafka": package_version("confluent-kafka")},
        "measurements": {"disk": disk, "by_size": by_size},
        "headlines": headlines,
        "ratios": ratios,
    }


def _headline(label: str, seconds: float) -> Headline:
    return {"label": label, "value": float(seconds), "unit": "s"}
