"""The data source's options, named as Spark's Kafka source names them, checked up front.

Spark hands a data source its options as a case-insensitive mapping of strings. Every mistake is
reported here, before any planning, as one ValueError naming the option and what it accepts.

Offsets follow Spark's Kafka source: "earliest", "latest", or JSON per partition such as
`{"orders": {"0": 23, "1": -2}}` where -2 means earliest and -1 latest.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from riverbed.configs import REMOTE_STORAGE_S3
from riverbed.tiering.stores import s3_settings

EARLIEST: Final = -2
LATEST: Final = -1
# Hot ranges are read through the broker in splits of at most this many offsets.
HOT_SPLIT_OFFSETS_DEFAULT: Final = 1_000_000
# Cold splits group consecutive objects up to this many object bytes.
COLD_SPLIT_BYTES_DEFAULT: Final = 32 * 1024 * 1024
READ_UNCOMMITTED: Final = "read_uncommitted"
READ_COMMITTED: Final = "read_committed"
# One offset spec: a single value for every partition, or values per (topic, partition).
OffsetSpec = int | dict[tuple[str, int], int]


@dataclass(frozen=True)
class Subscription:
    """Which topics: exactly one of Spark's three ways to name them."""

    topics: tuple[str, ...] = ()  # subscribe
    pattern: str | None = None  # subscribePattern
    assigned: tuple[tuple[str, int], ...] = ()  # assign: (topic, partition) pairs

    def matches(self, topic: str) -> bool:
        if self.pattern is not None:
            return re.fullmatch(self.pattern, topic) is not None
        if self.assigned:
            return any(t == topic for t, _ in self.assigned)
        return topic in self.topics


@dataclass(frozen=True)
class StoreOptions:
    """Where the cold tier is and how to reach it, with the broker's setting names."""

    url: str  # file:///path or s3://bucket[/prefix]
    # remote.storage.s3.* as given; resolved with the environment where the store is opened
    # (on each executor, whose environment is the one that counts there).
    settings: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ReadOptions:
    bootstrap_servers: str | None  # None: the object store alone (the cluster may be down)
    subscription: Subscription
    starting: OffsetSpec
    ending: OffsetSpec
    starting_timestamp_ms: int | None
    ending_timestamp_ms: int | None
    include_headers: bool
    fail_on_data_loss: bool
    store: StoreOptions | None
    hot_split_offsets: int
    cold_split_bytes: int
    max_offsets_per_trigger: int | None
    # kafka.isolation.level, as Spark's Kafka source passes it to its consumers (Kafka's
    # default, read_uncommitted). read_committed leaves out aborted transactions and stops at
    # each partition's last stable offset.
    isolation_level: str = READ_UNCOMMITTED

    @property
    def read_committed(self) -> bool:
        return self.isolation_level == READ_COMMITTED


def parse_read_options(options: Mapping[str, str], *, streaming: bool = False) -> ReadOptions:
    get = _Getter(options)
    bootstrap = get.text("kafka.bootstrap.servers") or get.text("bootstrap.servers")
    store = _store_options(get)
    if bootstrap is None and store is None:
        raise ValueError(
            "set bootstrap.servers (the cluster), remote.storage.url (the object store), or both"
        )
    starting = _offsets(get, "startingOffsets", EARLIEST if not streaming else LATEST)
    ending = _offsets(get, "endingOffsets", LATEST)
    for name in ("endingOffsets", "endingTimestamp"):
        if streaming and get.text(name) is not None:
            raise ValueError(f"{name} is for batch queries; a stream has no end")
    if starting == LATEST and not streaming:
        raise ValueError("startingOffsets=latest is for streams; a batch query would read nothing")
    if ending == EARLIEST:
        raise ValueError("endingOffsets=earliest would read nothing; use latest or offsets")
    for name in ("startingTimestamp", "endingTimestamp"):
        if bootstrap is None and get.text(name) is not None:
            raise ValueError(f"{name} needs bootstrap.servers: the cluster finds offsets by time")
    return ReadOptions(
        bootstrap_servers=bootstrap,
        subscription=_subscription(get),
        starting=starting,
        ending=ending,
        starting_timestamp_ms=get.integer("startingTimestamp", minimum=0),
        ending_timestamp_ms=get.integer("endingTimestamp", minimum=0),
        include_headers=get.boolean("includeHeaders", False),
        fail_on_data_loss=get.boolean("failOnDataLoss", True),
        store=store,
        hot_split_offsets=get.integer("hotSplitOffsets", minimum=1) or HOT_SPLIT_OFFSETS_DEFAULT,
        cold_split_bytes=get.integer("coldSplitBytes", minimum=1) or COLD_SPLIT_BYTES_DEFAULT,
        max_offsets_per_trigger=get.integer("maxOffsetsPerTrigger", minimum=1),
        isolation_level=_isolation_level(get),
    )


def _isolation_level(get: _Getter) -> str:
    text = get.text("kafka.isolation.level") or get.text("isolation.level") or READ_UNCOMMITTED
    if text not in (READ_UNCOMMITTED, READ_COMMITTED):
        raise ValueError(
            f"kafka.isolation.level must be {READ_UNCOMMITTED} or {READ_COMMITTED}, got {text!r}"
        )
    return text


def _store_options(get: _Getter) -> StoreOptions | None:
    """`remote.storage.url` and `remote.storage.s3.*`, checked as the broker checks its own
    settings of those names (riverbed.tiering.stores), environment fallbacks included."""
    url = get.text("remote.storage.url")
    settings = {
        name.lower(): value
        for name, value in get.options.items()
        if name.lower().startswith(REMOTE_STORAGE_S3)
    }
    if url is None:
        if settings:
            raise ValueError(f"{REMOTE_STORAGE_S3}* options given without remote.storage.url")
        return None
    if url.startswith("s3://"):
        s3_settings(settings, os.environ)  # raises ValueError naming a bad or unknown option
    elif not url.startswith("file:///"):
        raise ValueError(f"remote.storage.url must be file:///abs/path or s3://bucket, got {url!r}")
    return StoreOptions(url, settings)


def _subscription(get: _Getter) -> Subscription:
    given = [name for name in ("subscribe", "subscribePattern", "assign") if get.text(name)]
    if len(given) != 1:
        raise ValueError(
            "set exactly one of subscribe, subscribePattern, assign"
            + (f" (got {', '.join(given)})" if given else "")
        )
    name = given[0]
    text = get.text(name) or ""
    if name == "subscribe":
        topics = tuple(t.strip() for t in text.split(",") if t.strip())
        if not topics:
            raise ValueError("subscribe names no topic")
        return Subscription(topics=topics)
    if name == "subscribePattern":
        try:
            re.compile(text)
        except re.error as error:
            raise ValueError(
                f"subscribePattern {text!r} is not a regular expression: {error}"
            ) from None
        return Subscription(pattern=text)
    try:
        document = json.loads(text)
        pairs = tuple(
            (str(topic), int(partition))
            for topic, partitions in document.items()
            for partition in partitions
        )
    except (ValueError, AttributeError, TypeError) as error:
        raise ValueError(f'assign must be JSON like {{"orders": [0, 1]}}, got {text!r}') from error
    if not pairs:
        raise ValueError("assign names no partition")
    return Subscription(assigned=pairs)


def _offsets(get: _Getter, name: str, default: int) -> OffsetSpec:
    text = get.text(name)
    if text is None:
        return default
    if text.strip().lower() == "earliest":
        return EARLIEST
    if text.strip().lower() == "latest":
        return LATEST
    try:
        document = json.loads(text)
        per_partition = {
            (str(topic), int(partition)): int(offset)
            for topic, partitions in document.items()
            for partition, offset in partitions.items()
        }
    except (ValueError, AttributeError, TypeError) as error:
        raise ValueError(
            f'{name} must be earliest, latest or JSON like {{"orders": {{"0": 23}}}}, got {text!r}'
        ) from error
    bad = [offset for offset in per_partition.values() if offset < EARLIEST]
    if bad:
        raise ValueError(f"{name}: offset {bad[0]} is neither -2 (earliest), -1 (latest) nor >= 0")
    return per_partition


class _Getter:
    def __init__(self, options: Mapping[str, str]) -> None:
        # Spark's mapping is case-insensitive; a plain dict (tests, jobs) is made so here.
        self.options = {str(k): str(v) for k, v in options.items()}
        self._lower = {k.lower(): v for k, v in self.options.items()}

    def text(self, name: str) -> str | None:
        value = self._lower.get(name.lower())
        return value if value not in (None, "") else None

    def integer(self, name: str, *, minimum: int) -> int | None:
        text = self.text(name)
        if text is None:
            return None
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"{name} must be an integer, got {text!r}") from None
        if value < minimum:
            raise ValueError(f"{name} must be at least {minimum}, got {value}")
        return value

    def boolean(self, name: str, default: bool) -> bool:
        text = self.text(name)
        if text is None:
            return default
        if text.lower() not in ("true", "false"):
            raise ValueError(f"{name} must be true or false, got {text!r}")
        return text.lower() == "true"
