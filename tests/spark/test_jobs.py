"""The historical job as a user runs it (`python -m riverbed_spark.jobs.key_counts`, its own
Spark in local mode) over a topic mostly in the cold tier: its Parquet outputs hold the right
counts, and it reports its plan and progress."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq

from tests.spark.test_batch_read import RECORDS, record_of, tiered_topic
from tests.support.broker import BrokerProcess

JOB_TIMEOUT_S = 300


def test_key_counts_over_a_topics_whole_history(
    tiered_broker: tuple[BrokerProcess, Path], tmp_path: Path
) -> None:
    broker, store = tiered_broker
    topic = tiered_topic(broker)
    out = tmp_path / "out"
    job = subprocess.run(
        [
            sys.executable,
            "-m",
            "riverbed_spark.jobs.key_counts",
            "--bootstrap-servers",
            broker.bootstrap,
            "--object-store",
            f"file://{store}",
            "--topic",
            topic,
            "--out",
            str(out),
            "--master",
            "local[2]",
            "--window",
            "1 second",
        ],
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},  # loopback only
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
    )
    assert job.returncode == 0, job.stderr[-3000:]
    plan = next(line for line in job.stderr.splitlines() if "splits from the cold tier" in line)
    cold_splits = int(plan.split(": ")[-1].split()[0])
    assert cold_splits > 0
    assert "wrote per-key counts" in job.stderr
    assert "wrote windowed counts" in job.stderr

    expected = Counter(record_of(i)["key"] for i in range(RECORDS))
    keys = pq.read_table(out / "keys").to_pylist()
    assert {row["key"]: row["records"] for row in keys} == dict(expected)
    windows = pq.read_table(out / "windows").to_pylist()
    assert sum(row["records"] for row in windows) == RECORDS
    per_key: Counter[bytes] = Counter()
    for row in windows:
        per_key[row["key"]] += row["records"]
    assert per_key == expected
