"""Riverbed against kcat (Debian's build, librdkafka 2.0.2): the tool operators reach for first."""

from __future__ import annotations

import json
import random
import re
import subprocess
from typing import Any

from tests.interop.drivers import ConfluentKafka
from tests.support.broker import BrokerProcess

KCAT = "/usr/bin/kcat"
KCAT_TIMEOUT_S = 120.0  # 100k lines each way take a few seconds; this only catches a hang
LINE_COUNT = 100_000
# Printable ASCII, tabs, multi-byte UTF-8 and control bytes; never the delimiter "\n".
ALPHABET = [chr(c) for c in range(32, 127)] + ["\t", "\r", "\u00e9", "\u4e2d", "\U0001f30a", "\x01"]


def kcat(broker: BrokerProcess, *args: str, stdin: bytes | None = None) -> bytes:
    result = subprocess.run(
        [KCAT, "-b", broker.bootstrap, *args],
        input=stdin,
        capture_output=True,
        timeout=KCAT_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, f"kcat {' '.join(args)}: {result.stderr.decode()[-2000:]}"
    return result.stdout


def varied_lines(count: int) -> list[bytes]:
    rng = random.Random(count)
    # No empty lines: `kcat -P` skips them rather than producing empty records.
    lengths = [1, 2, 100, 1_000, 10_000]
    lines = []
    for i in range(count):
        length = lengths[i % len(lengths)] if i % 7 == 0 else rng.randrange(1, 200)
        lines.append("".join(rng.choices(ALPHABET, k=length)).encode())
    return lines


def test_100k_lines_round_trip_byte_exact(broker: BrokerProcess, topic: str) -> None:
    lines = varied_lines(LINE_COUNT)
    payload = b"\n".join(lines) + b"\n"
    assert ConfluentKafka(broker.bootstrap).create_topic(topic, 1) == 0

    kcat(broker, "-P", "-t", topic, "-p", "0", "-X", "acks=all", stdin=payload)
    consumed = kcat(broker, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e", "-q")

    assert consumed.count(b"\n") == LINE_COUNT
    assert consumed == payload


def test_metadata_listing_shows_broker_and_partitions(broker: BrokerProcess, topic: str) -> None:
    assert ConfluentKafka(broker.bootstrap).create_topic(topic, 3) == 0

    listing = kcat(broker, "-L", "-t", topic).decode()

    assert re.search(r"^ 1 brokers:$", listing, re.MULTILINE), listing
    assert f"broker 1 at {broker.bootstrap}" in listing, listing
    assert f'topic "{topic}" with 3 partitions:' in listing, listing
    for partition in range(3):
        assert re.search(rf"partition {partition}, leader 1, replicas: 1, isrs: 1", listing)


def test_metadata_json_parses(broker: BrokerProcess, topic: str) -> None:
    assert ConfluentKafka(broker.bootstrap).create_topic(topic, 2) == 0

    metadata: dict[str, Any] = json.loads(kcat(broker, "-L", "-J"))

    assert metadata["brokers"] == [{"id": 1, "name": broker.bootstrap}]
    (found,) = [entry for entry in metadata["topics"] if entry["topic"] == topic]
    assert "error" not in found, found
    assert sorted(p["partition"] for p in found["partitions"]) == [0, 1]
    for partition in found["partitions"]:
        assert partition["leader"] == 1
        assert partition["replicas"] == [{"id": 1}]
        assert partition["isrs"] == [{"id": 1}]
