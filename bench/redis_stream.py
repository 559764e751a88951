"""The baseline: redis-server's XADD throughput, measured with redis-benchmark.

redis-server runs with persistence off (`--save "" --appendonly no`): the fastest Redis there is,
so the ratios against it are the hardest ones. One run with the append-only file on
(`appendfsync everysec`, Redis's usual durable setting) is measured too, for context only.
"""

from __future__ import annotations

import csv
import io
import shutil
import signal
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.procs import HOST, ProcessFailed, free_port, stop, wait_until_accepting

STREAM_KEY = "bench-stream"
FIELD_NAME = "field"
REDIS_START_TIMEOUT_S = 30.0
# A million pipelined XADDs take about a second; anything near this limit is a hang.
REDIS_BENCHMARK_TIMEOUT_S = 600.0


@dataclass(frozen=True, slots=True)
class XaddParameters:
    records: int
    value: bytes
    pipeline: int
    clients: int
    repeats: int


def required_programs() -> list[str]:
    return ["redis-server", "redis-benchmark", "redis-cli"]


def check_programs() -> None:
    missing = [name for name in required_programs() if shutil.which(name) is None]
    if missing:
        raise ProcessFailed(
            f"missing {', '.join(missing)}: install Debian's redis-server and redis-tools "
            "(`make bench` does)"
        )


def tool_versions() -> dict[str, str]:
    return {name: _first_line([name, "--version"]) for name in required_programs()}


def measure_xadd(params: XaddParameters, work_dir: Path, aof: bool) -> dict[str, Any]:
    """Start a private redis-server, run XADD `repeats` times, verify what was stored."""
    check_programs()
    if not params.value.isascii() or b" " in params.value:
        raise ValueError("the value goes on a command line: printable ASCII without spaces")
    work_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log_path = work_dir / "redis.log"
    if aof:
        persistence = ["--appendonly", "yes", "--appendfsync", "everysec"]
    else:
        persistence = ["--appendonly", "no"]
    server_args = [
        "redis-server", "--port", str(port), "--bind", HOST, "--save", "",
        *persistence, "--dir", str(work_dir), "--logfile", str(log_path),
    ]  # fmt: skip
    server = subprocess.Popen(server_args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_until_accepting(server, port, REDIS_START_TIMEOUT_S, log_path)
        runs = [_one_run(params, port) for _ in range(params.repeats)]
    finally:
        stop(server, signal.SIGTERM)
    rates = [run["requests_per_s"] for run in runs]
    return {
        "server_args": server_args,
        "runs": runs,
        "requests_per_s_median": statistics.median(rates),
        "payload_mb_per_s_median": statistics.median(rates) * len(params.value) / 1e6,
    }


def _one_run(params: XaddParameters, port: int) -> dict[str, Any]:
    _cli(port, "DEL", STREAM_KEY)
    command = [
        "redis-benchmark", "-h", HOST, "-p", str(port),
        "-n", str(params.records), "-P", str(params.pipeline), "-c", str(params.clients), "--csv",
        "XADD", STREAM_KEY, "*", FIELD_NAME, params.value.decode(),
    ]  # fmt: skip
    started = time.perf_counter()
    completed = subprocess.run(
        command, capture_output=True, text=True, timeout=REDIS_BENCHMARK_TIMEOUT_S, check=True
    )
    wall_s = time.perf_counter() - started
    row = _parse_csv(completed.stdout)
    stored = int(_cli(port, "XLEN", STREAM_KEY))
    if stored != params.records:
        raise ProcessFailed(f"XLEN is {stored} after {params.records} XADDs")
    first_entry = _cli(port, "XRANGE", STREAM_KEY, "-", "+", "COUNT", "1").splitlines()
    # --raw prints the entry id, then field and value on their own lines.
    if first_entry[1:] != [FIELD_NAME, params.value.decode()]:
        raise ProcessFailed(f"stored entry is not the benchmark's value: {first_entry!r}")
    return {
        "command": [*command[:-1], f"<{len(params.value)}-byte value>"],
        "requests_per_s": float(row["rps"]),
        "latency_ms": {
            name.removesuffix("_latency_ms"): float(value)
            for name, value in row.items()
            if name.endswith("_latency_ms")
        },
        "wall_s_including_connect": wall_s,
        "xlen": stored,
        "stored_value_bytes": len(first_entry[2]),
        "stream_memory_bytes": int(_cli(port, "MEMORY", "USAGE", STREAM_KEY)),
    }


def _parse_csv(output: str) -> dict[str, str]:
    rows = list(csv.DictReader(io.StringIO(output)))
    if len(rows) != 1 or "rps" not in rows[0]:
        raise ProcessFailed(f"unexpected redis-benchmark output:\n{output}")
    return rows[0]


def _cli(port: int, *args: str) -> str:
    completed = subprocess.run(
        ["redis-cli", "-h", HOST, "-p", str(port), "--raw", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return completed.stdout.strip()


def _first_line(command: list[str]) -> str:
    try:
        completed = subprocess.run(command, capture_output=True, text=True, timeout=10)
    except OSError:
        return "not installed"
    return completed.stdout.strip().splitlines()[0] if completed.stdout.strip() else "unknown"
