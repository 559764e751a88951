"""Structured logs: one line per event, as `key=value` text or as JSON.

An *event* is a log record with a stable name and typed fields, logged with `event()`:

    event(log, logging.INFO, "partition.leader_changed", topic="orders", partition=0, leader=2)

renders as

    ts=2026-11-24T19:00:00.123Z level=INFO logger=riverbed.coordination.controller
    event=partition.leader_changed topic=orders partition=0 leader=2

(on one line), or with `--log-format json` as one JSON object per line whose fields keep their
JSON types. Records that are not events (third-party libraries, the client's prose messages)
render the same way with their text in `msg`; a traceback goes into `exc`, so every record is
exactly one line whatever it holds. docs/logging.md lists the events.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Final

LOG_FORMATS: Final = ("text", "json")
# Characters that make a text value need quotes (so `key=value` pairs split unambiguously).
_NEEDS_QUOTES: Final = frozenset(' "=\\\n\r\t')
# Attributes the `extra` of an event sets on its LogRecord.
_EVENT: Final = "riverbed_event"
_FIELDS: Final = "riverbed_fields"

FieldValue = str | int | float | bool | None | list[object] | tuple[object, ...]


def event(log: logging.Logger, level: int, name: str, /, **fields: FieldValue) -> None:
    """Log the event `name` with `fields` (cheap when `level` is disabled)."""
    if log.isEnabledFor(level):
        log.log(level, name, extra={_EVENT: name, _FIELDS: fields})


def configure(level: str, log_format: str) -> None:
    """Send every record to stderr, one line each, in `log_format` (text or json)."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Neither format shows the caller, thread or process: not collecting them (the logging
    # HOWTO's "Optimization") takes a record from ~41 to ~27 us, and a leadership move of
    # thousands of partitions logs thousands of events at once.
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    # kazoo logs every reconnect attempt at INFO; the broker logs what matters itself.
    logging.getLogger("kazoo").setLevel(logging.WARNING)


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{key}={_text(value)}" for key, value in _pairs(self, record).items())


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_pairs(self, record), default=str, separators=(",", ":"))


def _pairs(formatter: logging.Formatter, record: logging.LogRecord) -> dict[str, object]:
    pairs: dict[str, object] = {
        "ts": _timestamp(record.created),
        "level": record.levelname,
        "logger": record.name,
    }
    name = getattr(record, _EVENT, None)
    if name is None:
        pairs["msg"] = record.getMessage()
    else:
        pairs["event"] = name
        fields: Mapping[str, object] = getattr(record, _FIELDS, {})
        # A field named like a fixed key is kept under a prefix rather than dropped.
        pairs.update({(f"field.{k}" if k in pairs else k): v for k, v in fields.items()})
    if record.exc_info:
        pairs["exc"] = formatter.formatException(record.exc_info)
    elif record.exc_text:
        pairs["exc"] = record.exc_text
    return pairs


def _timestamp(created_s: float) -> str:
    whole_s = int(created_s)
    # Rounded to the microsecond first, as datetime.fromtimestamp does.
    micros = round((created_s - whole_s) * 1_000_000)
    if micros >= 1_000_000:
        whole_s, micros = whole_s + 1, micros - 1_000_000
    prefix = _second_prefixes.get(whole_s)
    if prefix is None:
        # strftime once per second: records come in bursts within the same second.
        prefix = datetime.fromtimestamp(whole_s, UTC).strftime("%Y-%m-%dT%H:%M:%S.")
        _second_prefixes.clear()
        _second_prefixes[whole_s] = prefix
    return f"{prefix}{micros // 1000:03d}Z"


# The formatted date and time of the last second a record was logged in.
_second_prefixes: dict[int, str] = {}


def _text(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        text = ",".join(_text(item) for item in value)
        return text if text else '""'
    text = str(value)
    if text and not _NEEDS_QUOTES.intersection(text):
        return text
    escaped = (
        text.replace("\\", "\\\\")
        .replace('"', '\\"')
        .replace("\n", "\\n")
        .replace("\r", "\\r")
        .replace("\t", "\\t")
    )
    return f'"{escaped}"'
