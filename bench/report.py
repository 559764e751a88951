"""Print the latest benchmark results as Markdown: `python -m bench.report`.

Reads `bench/results/<name>-latest.json` for every benchmark; a benchmark that only has a
--quick result is shown with that one, labelled as such.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench.run import RESULTS_DIR

GIB = 1024**3


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__)
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    print(render(latest_documents(args.results_dir)))


def latest_documents(results_dir: Path) -> list[dict[str, Any]]:
    by_name: dict[str, dict[str, Any]] = {}
    for path in sorted(results_dir.glob("*-latest.json")):
        document = json.loads(path.read_text())
        current = by_name.get(document["benchmark"])
        if current is None or (current["quick"] and not document["quick"]):
            by_name[document["benchmark"]] = document
    return [by_name[name] for name in sorted(by_name)]


def render(documents: list[dict[str, Any]]) -> str:
    if not documents:
        return "No results yet: run `python -m bench.run` first."
    lines = [*_machines(documents), "", "| Benchmark | Measurement | Result |", "|---|---|---|"]
    for document in documents:
        for headline in document["headlines"]:
            lines.append(
                f"| {_title(document)} | {headline['label']} | "
                f"{_number(headline['value'], headline['unit'])} |"
            )
    lines += ["", "| Benchmark | Ratio | Measured | Goal | Met |", "|---|---|---|---|---|"]
    for document in documents:
        for ratio in document["ratios"]:
            lines.append(
                f"| {_title(document)} | {ratio['label']} | {ratio['value']:.2f} | "
                f"{ratio['goal']} | {_met(ratio['met'])} |"
            )
    return "\n".join(lines)


def _machines(documents: list[dict[str, Any]]) -> list[str]:
    described = {(_machine(document["machine"])) for document in documents}
    if len(described) == 1:
        return [f"Measured on {described.pop()}."]
    return [f"- {_title(d)}: measured on {_machine(d['machine'])}." for d in documents]


def _machine(machine: dict[str, Any]) -> str:
    commit = machine["git"]["commit"]
    code = f"commit {commit[:12]}" if commit else "an uncommitted tree"
    if commit and machine["git"]["dirty"]:
        code += " (with local changes)"
    ram = f"{machine['ram_bytes'] / GIB:.0f} GiB RAM" if machine["ram_bytes"] else "RAM unknown"
    return (
        f"{machine['cpu_model']} ({machine['cpu_cores_usable']} cores usable), {ram}, "
        f"{machine['kernel']}, Python {machine['python']}, "
        f"{machine['work_dir_filesystem']['type']} data disk, {code}"
    )


def _title(document: dict[str, Any]) -> str:
    return f"{document['benchmark']}{' (quick)' if document['quick'] else ''}"


def _number(value: float, unit: str) -> str:
    if unit == "records/s":
        return f"{value:,.0f} {unit}"
    if unit == "s":
        return f"{value:.3f} {unit}"
    if unit == "x":  # a ratio: below 0.1 one decimal would read as zero
        return f"{value:.3f} {unit}"
    return f"{value:,.1f} {unit}"


def _met(met: bool | None) -> str:
    if met is None:
        return "n/a"
    return "yes" if met else "**no**"


if __name__ == "__main__":
    main()
