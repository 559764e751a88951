"""Run the benchmarks and save each result as JSON: `python -m bench.run [--only NAME] [--quick]`.

Every benchmark writes `bench/results/<name>-<UTC timestamp>.json` and `<name>-latest.json`
(`<name>-quick-…` for a --quick run, so a smoke run never replaces a full one). Each file holds
the machine, the parameters, the raw measurements, the headline numbers and the ratios.
`python -m bench.report` turns the latest files into a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import (
    authorizer,
    client_throughput,
    compaction,
    groups,
    partition_scale,
    produce_consume,
    replication,
    spark,
    startup,
    tiering,
    tls,
    transactions,
)
from bench.machine import machine_info
from bench.options import BenchOptions, BenchResult

BENCHMARKS: dict[str, Callable[[BenchOptions], BenchResult]] = {
    produce_consume.NAME: produce_consume.run,
    client_throughput.NAME: client_throughput.run,
    startup.NAME: startup.run,
    replication.NAME: replication.run,
    groups.NAME: groups.run,
    tiering.NAME: tiering.run,
    spark.NAME: spark.run,
    compaction.NAME: compaction.run,
    tls.NAME: tls.run,
    authorizer.NAME: authorizer.run,
    partition_scale.NAME: partition_scale.run,
    transactions.NAME: transactions.run,
}
RESULTS_DIR = Path(__file__).resolve().parent / "results"
# Scratch data dirs live here (git-ignored): on the repository's disk, deleted after each run.
DEFAULT_WORK_DIR = RESULTS_DIR / "tmp"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    options = BenchOptions(
        quick=args.quick,
        work_dir=args.work_dir.resolve(),
        broker_settings=dict(_setting(item) for item in args.set),
    )
    options.work_dir.mkdir(parents=True, exist_ok=True)
    names = [args.only] if args.only else list(BENCHMARKS)
    failed = []
    for name in names:
        print(f"== {name}{' (quick)' if options.quick else ''}", flush=True)
        try:
            path = run_one(name, options, args.results_dir)
        except Exception:
            traceback.print_exc()
            print(f"   process logs: {options.work_dir / 'logs'}", file=sys.stderr)
            failed.append(name)
            continue
        print(f"   saved {path}", flush=True)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def run_one(
    name: str,
    options: BenchOptions,
    results_dir: Path,
    benchmark: Callable[[BenchOptions], BenchResult] | None = None,
    variant: str | None = None,
) -> Path:
    """Run benchmark `name` (or `benchmark` in its place, e.g. at other sizes, saved as
    `<name>-<variant>-<timestamp>.json` and never as the latest) and save its result."""
    started_at = datetime.now(UTC)
    # The machine may be shared: a busy start explains a slow result.
    loadavg_at_start = os.getloadavg()
    started = time.perf_counter()
    result = (benchmark or BENCHMARKS[name])(options)
    document: dict[str, Any] = {
        "benchmark": name,
        "quick": options.quick,
        **({"variant": variant} if variant else {}),
        "started_at": started_at.isoformat(timespec="seconds"),
        "duration_s": round(time.perf_counter() - started, 3),
        "loadavg_at_start": loadavg_at_start,
        "machine": machine_info(options.work_dir),
        **result,
    }
    for headline in result["headlines"]:
        print(f"   {headline['label']}: {headline['value']:,.3f} {headline['unit']}")
    for ratio in result["ratios"]:
        verdict = {True: "met", False: "NOT met", None: "no goal"}[ratio["met"]]
        print(f"   {ratio['label']}: {ratio['value']:.3f} (goal {ratio['goal']}: {verdict})")
    return save(document, results_dir, started_at)


def save(document: dict[str, Any], results_dir: Path, started_at: datetime) -> Path:
    results_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{document['benchmark']}{'-quick' if document['quick'] else ''}"
    if "variant" in document:
        stem += f"-{document['variant']}"
    text = json.dumps(document, indent=2, sort_keys=False) + "\n"
    path = results_dir / f"{stem}-{started_at.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(text)
    if "variant" not in document:  # a variant (other sizes) never stands for the benchmark
        (results_dir / f"{stem}-latest.json").write_text(text)
    return path


def _setting(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise SystemExit(f"--set wants key=value, got {item!r}")
    return key, value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    parser.add_argument("--only", choices=sorted(BENCHMARKS), help="run one benchmark")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=DEFAULT_WORK_DIR,
        help="where scratch data dirs go (default: %(default)s)",
    )
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra broker setting, passed as `--set KEY=VALUE` (repeatable)",
    )
    return parser


if __name__ == "__main__":
    sys.exit(main())
