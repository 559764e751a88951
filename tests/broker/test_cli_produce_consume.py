"""`riverbed produce` / `riverbed consume`: the CLI on top of Riverbed's own client."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.broker import BrokerProcess

TIMEOUT_S = 60


def riverbed(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "riverbed.cli", *args],
        input=stdin, capture_output=True, timeout=TIMEOUT_S,
    )  # fmt: skip


def test_produce_lines_with_keys_then_consume_as_json(broker: BrokerProcess) -> None:
    server = ("--bootstrap-server", broker.bootstrap)
    assert riverbed("topics", "create", "cli", "--partitions", "3", *server).returncode == 0
    lines = [f"key-{i % 10}:value {i} é".encode() for i in range(1000)]
    produced = riverbed(
        "produce", "cli", "--key-separator", ":", *server, stdin=b"\n".join(lines) + b"\n"
    )
    assert produced.returncode == 0, produced.stderr
    assert b"produced 1000 records" in produced.stderr

    consumed = riverbed(
        "consume", "cli", "--from-beginning", "--max", "1000", "--format", "json", *server
    )
    assert consumed.returncode == 0, consumed.stderr
    records = [json.loads(line) for line in consumed.stdout.splitlines()]
    assert len(records) == 1000
    assert sorted((r["key"], r["value"]) for r in records) == sorted(
        tuple(line.decode().split(":", 1)) for line in lines
    )
    # Same key, same partition (murmur2), and per-partition order kept.
    by_key: dict[str, set[int]] = {}
    for r in records:
        by_key.setdefault(r["key"], set()).add(r["partition"])
    assert all(len(parts) == 1 for parts in by_key.values())
    for partition in range(3):
        offsets = [r["offset"] for r in records if r["partition"] == partition]
        assert offsets == sorted(offsets)

    # A client written by others reads the keys the CLI wrote.
    kcat = subprocess.run(
        ["kcat", "-C", "-b", broker.bootstrap, "-t", "cli", "-e", "-q", "-f", "%k=%s\n"],
        capture_output=True, timeout=TIMEOUT_S, check=True,
    )  # fmt: skip
    assert len(kcat.stdout.splitlines()) == 1000
    assert b"key-3=value 3 \xc3\xa9" in kcat.stdout.splitlines()


def test_consume_text_stops_when_idle(broker: BrokerProcess) -> None:
    server = ("--bootstrap-server", broker.bootstrap)
    subprocess.run(
        ["kcat", "-P", "-b", broker.bootstrap, "-t", "plain"],
        input=b"one\ntwo\nthree\n", check=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    consumed = riverbed(
        "consume", "plain", "--from-beginning", "--idle-timeout-ms", "1500", *server
    )
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout.splitlines() == [b"one", b"two", b"three"]
