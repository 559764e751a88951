"""What every benchmark receives from the runner, and the shape of what it returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict


@dataclass(frozen=True, slots=True)
class BenchOptions:
    # Smaller sizes for a smoke run; results are labelled quick and never replace a full run's.
    quick: bool
    # Scratch space for data dirs; on the repository's disk so the disk is the one users get.
    work_dir: Path
    # Extra `--set k=v` broker settings, recorded in the results next to the numbers.
    broker_settings: dict[str, str] = field(default_factory=dict)


class Headline(TypedDict):
    label: str
    value: float
    unit: str


class Ratio(TypedDict):
    label: str
    value: float
    goal: str
    met: bool | None  # None: reported for context, no goal


class BenchResult(TypedDict):
    parameters: dict[str, Any]
    # Versions of the clients and baseline programs this benchmark drove.
    tools: dict[str, str]
    measurements: dict[str, Any]
    headlines: list[Headline]
    ratios: list[Ratio]
