"""How the admin CLI shows things: rich tables on stdout, progress bars on stderr, JSON.

Tables use no borders and never wrap or truncate a cell: a value that does not fit widens the
line instead, so output piped to a file or to `grep`/`awk` has one row per line and every value
whole (without a terminal the width is TABLE_WIDTH_NO_TTY and colors are off). Progress bars go
to stderr and vanish when done, so stdout carries only the result.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Final

from rich import box
from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

# Wide enough for the widest table (topics describe) without wrapping.
TABLE_WIDTH_NO_TTY: Final = 240
NONE_CELL: Final = "-"


def stdout_console() -> Console:
    tty = sys.stdout.isatty()
    return Console(
        file=sys.stdout,
        width=None if tty else TABLE_WIDTH_NO_TTY,
        highlight=False,
        no_color=not tty,
        soft_wrap=True,
    )


def print_table(
    console: Console, title: str, columns: Sequence[str], rows: Iterable[Sequence[object]]
) -> None:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for column in columns:
        table.add_column(column, overflow="fold", no_wrap=True)
    for row in rows:
        table.add_row(*(cell_text(cell) for cell in row))
    console.print(table)


def plain_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A borderless table as text, Kafka's tools' way (a header line, then one line per row,
    columns left-aligned two spaces apart), for commands whose output scripts parse."""
    table = Table(box=None, pad_edge=False, show_edge=False, padding=(0, 2, 0, 0))
    for header in headers:
        table.add_column(header, overflow="fold", no_wrap=True)
    for row in rows:
        table.add_row(*(cell_text(cell) for cell in row))
    console = Console(width=TABLE_WIDTH_NO_TTY, no_color=True, highlight=False)
    with console.capture() as captured:
        console.print(table)
    return "\n".join(line.rstrip() for line in captured.get().splitlines())


def cell_text(value: object) -> str:
    if value is None:
        return NONE_CELL
    if value == "":
        return '""'  # an empty value, not a missing cell
    if isinstance(value, list | tuple):
        return ",".join(str(item) for item in value) or NONE_CELL
    return str(value)


def print_json(document: object) -> None:
    print(json.dumps(document, indent=2, sort_keys=False))


def progress_bar(what: str, *counts: ProgressColumn, quiet: bool = False) -> Progress:
    """A transient progress bar on stderr: "<what> [bar] <counts> <elapsed>" (off if quiet)."""
    return Progress(
        TextColumn(what),
        BarColumn(),
        *counts,
        TimeElapsedColumn(),
        console=Console(file=sys.stderr),
        transient=True,
        disable=quiet,
    )
