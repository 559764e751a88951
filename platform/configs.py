"""Typed broker and topic configuration, with Kafka's names, defaults and validation.

Topic configs are stored and sent on the wire as strings; this module is the one place they are
parsed. Most topic configs have a broker-level synonym (as in Kafka: `segment.bytes` defaults to
the broker's `log.segment.bytes`), so a topic's effective value comes from, in order: the topic's
override, the broker's config if set explicitly, the built-in default. `effective_topic_config`
reports which of the three each value came from, for DescribeConfigs.

Every topic config Kafka documents is accepted, validated by Kafka's rules, stored and described,
because Kafka's tooling (Connect, operators, Terraform providers) sets them freely. Those
Riverbed does not act on say why in `ConfigDef.without_effect` (docs/status.md lists them), and
only the others reach the log layer (`TopicConfig`). Unknown keys are refused: a typo in a topic
config is an INVALID_CONFIG error, not a silently ignored setting.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, Self, TypeVar

from riverbed.common.scheduling import BATCH
from riverbed.common.scheduling import POLICIES as SCHEDULING_POLICIES
from riverbed.coordination.leader_balance import (
    IMBALANCE_PERCENTAGE_MAX,
    IMBALANCE_PERCENTAGE_MIN,
    RebalancePolicy,
)
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.security.acl import InvalidAclError, parse_super_users
from riverbed.security.authorizer import AuthorizerSettings
from riverbed.security.jaas import Credentials, JaasError, parse_credentials
from riverbed.security.limits import ConnectionLimits
from riverbed.security.listeners import ListenerError, ListenerSet, listener_set
from riverbed.security.sasl_server import SUPPORTED_MECHANISMS, mechanisms_error
from riverbed.security.tls import TlsFiles

if TYPE_CHECKING:
    from riverbed.coordination.zk import ZkDigest

log = logging.getLogger(__name__)

INT_MAX: Final = 2**31 - 1
LONG_MAX: Final = 2**63 - 1
LONG_MIN: Final = -(2**63)
# Kafka: a segment must hold at least one legacy record header (LegacyRecord.RECORD_OVERHEAD_V0).
SEGMENT_BYTES_MIN: Final = 14
# How `log.cleaner.dedupe.buffer.size` is spent, on either tier: one key of the compaction map
# costs its own bytes plus this, rounded up. On CPython 3.11, tracemalloc measured ~84 bytes per
# entry for the dict and the int offset (100k entries), and a bytes object's header is 33 bytes.
MAP_ENTRY_OVERHEAD_BYTES: Final = 128
# local.retention.*: -2 means "same as retention.*" (Kafka's tiered storage convention).
LOCAL_RETENTION_FROM_RETENTION: Final = -2

ConfigPrimitive = bool | int | float | str | tuple[str, ...] | None
_C = TypeVar("_C")


class ConfigError(KafkaError):
    """An unknown key or an invalid value; `key` names the config. Reported as INVALID_CONFIG."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(ErrorCode.INVALID_CONFIG, message)
        self.key = key


class ConfigType(enum.Enum):
    """Value types; the values are DescribeConfigs' config_type ids."""

    BOOLEAN = 1
    STRING = 2
    INT = 3
    LONG = 5
    DOUBLE = 6
    LIST = 7


class ConfigSource(enum.IntEnum):
    """Where an effective value came from; the values are DescribeConfigs' ConfigSource ids."""

    TOPIC = 1  # DYNAMIC_TOPIC_CONFIG
    DYNAMIC_DEFAULT_BROKER = 3  # DYNAMIC_DEFAULT_BROKER_CONFIG
    BROKER = 4  # STATIC_BROKER_CONFIG
    DEFAULT = 5  # DEFAULT_CONFIG


@dataclass(frozen=True, slots=True)
class Validator:
    """`check(value)` is True for a valid value; `allowed` describes the valid ones in errors."""

    check: Callable[[ConfigPrimitive], bool]
    allowed: str


def at_least(minimum: int) -> Validator:
    return Validator(lambda v: isinstance(v, int) and v >= minimum, f"integers >= {minimum}")


def between(low: float, high: float) -> Validator:
    return Validator(
        lambda v: isinstance(v, int | float) and low <= v <= high, f"numbers in [{low}, {high}]"
    )


def one_of(*choices: str) -> Validator:
    return Validator(lambda v: v in choices, ", ".join(choices))


def subset_of(*choices: str) -> Validator:
    """A list whose items are all `choices`; empty is valid (Kafka's ValidList accepts it)."""
    return Validator(
        lambda v: isinstance(v, tuple) and all(item in choices for item in v),
        f"a comma-separated list of {', '.join(choices)} (or empty)",
    )


def level(low: int, high: int, *also: int) -> Validator:
    """A compression level: an integer in [low, high], or one of `also` (a codec's 'default')."""
    extra = "".join(f" or {value}" for value in also)
    return Validator(
        lambda v: isinstance(v, int) and (low <= v <= high or v in also),
        f"integers in [{low}, {high}]{extra}",
    )


# Kafka's message.format.version values: an ApiVersion such as 0.10.2, 2.8 or 3.0-IV1.
_API_VERSION = re.compile(r"\d+\.\d+(\.\d+){0,2}(-IV\d+)?")
API_VERSION: Final = Validator(
    lambda v: isinstance(v, str) and _API_VERSION.fullmatch(v) is not None,
    "a Kafka version such as 2.8 or 3.0-IV1",
)


_THROTTLED_REPLICA = re.compile(r"\d+:\d+")


def _throttled_replicas_ok(value: ConfigPrimitive) -> bool:
    if not isinstance(value, tuple):
        return False
    return value == ("*",) or all(_THROTTLED_REPLICA.fullmatch(item) for item in value)


# Kafka's format of *.replication.throttled.replicas: "*" or partition:broker pairs.
THROTTLED_REPLICAS: Final = Validator(
    _throttled_replicas_ok, "'*' or a comma-separated list of partition:broker"
)

_LISTENER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)://([^:/\s]*):(\d{1,5})")


def _listeners_ok(value: ConfigPrimitive) -> bool:
    if not isinstance(value, tuple) or not value:
        return False
    for item in value:
        match = _LISTENER.fullmatch(item)
        if match is None or not 0 < int(match.group(3)) < 65536:
            return False
    return True


LISTENERS: Final = Validator(_listeners_ok, "a comma-separated list of NAME://host:port")

# Kafka's default is GSSAPI, which Riverbed does not implement. SCRAM only by default: PLAIN sends
# the password itself (in the clear on a SASL_PLAINTEXT listener) and costs the broker a PBKDF2
# per login, so it is enabled only on purpose.
SASL_MECHANISMS_DEFAULT: Final = ("SCRAM-SHA-512", "SCRAM-SHA-256")
SASL_MECHANISMS: Final = Validator(
    lambda v: isinstance(v, tuple) and mechanisms_error(v) is None,
    f"a non-empty comma-separated list of distinct {', '.join(SUPPORTED_MECHANISMS)}",
)

# authorizer.class.name values that turn on Riverbed's ACL authorizer: Kafka's names for its
# ZooKeeper-backed AclAuthorizer (current and pre-2.4), whose ACL layout and rules Riverbed
# follows, so a Kafka server.properties keeps working, and Riverbed's own.
ACL_AUTHORIZER_CLASS_NAMES: Final = (
    "kafka.security.authorizer.AclAuthorizer",
    "kafka.security.auth.SimpleAclAuthorizer",
    "riverbed.security.authorizer.AclAuthorizer",
)

AUTHORIZER_CLASS_NAME: Final = Validator(
    lambda v: v == "" or v in ACL_AUTHORIZER_CLASS_NAMES,
    "empty (no authorizer) or one of " + ", ".join(ACL_AUTHORIZER_CLASS_NAMES),
)


def _super_users_ok(value: ConfigPrimitive) -> bool:
    if not isinstance(value, str):
        return False
    try:
        parse_super_users(value)
    except InvalidAclError:
        return False
    return True


SUPER_USERS: Final = Validator(
    _super_users_ok, "principals written Type:name, separated by ';' (User:alice;User:bob)"
)


@dataclass(frozen=True, slots=True)
class ConfigDef:
    name: str
    type: ConfigType
    default: ConfigPrimitive
    doc: str
    validator: Validator | None = None
    broker_synonym: str | None = None  # topic configs: the broker config providing the default
    sensitive: bool = False
    # Topic configs Kafka documents that Riverbed accepts, validates, stores and describes but
    # does not act on: why not (docs/status.md lists them). Kafka's tooling sets them freely.
    without_effect: str | None = None

    @property
    def attribute(self) -> str:
        return self.name.replace(".", "_")

    def parse(self, text: str | None) -> ConfigPrimitive:
        """The typed value of `text`, or ConfigError naming this key and the allowed values."""
        if text is None:
            raise ConfigError(self.name, f"config {self.name!r} cannot be null")
        try:
            value = _PARSERS[self.type](text.strip())
        except ValueError:
            raise self._invalid(text) from None
        if self.validator is not None and not self.validator.check(value):
            raise self._invalid(text)
        return value

    def render(self, value: ConfigPrimitive) -> str | None:
        """The wire/storage string of a typed value."""
        if value is None:
            return None
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, tuple):
            return ",".join(value)
        return str(value)

    def _invalid(self, text: str) -> ConfigError:
        allowed = self.validator.allowed if self.validator else f"a {self.type.name.lower()}"
        return ConfigError(
            self.name, f"invalid value {text!r} for config {self.name!r}; allowed: {allowed}"
        )


def _parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered not in ("true", "false"):
        raise ValueError(text)
    return lowered == "true"


def _parse_ranged_int(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise ValueError(text)
        return value

    return parse


def _parse_list(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


_PARSERS: Final[dict[ConfigType, Callable[[str], ConfigPrimitive]]] = {
    ConfigType.BOOLEAN: _parse_bool,
    ConfigType.INT: _parse_ranged_int(-INT_MAX - 1, INT_MAX),
    ConfigType.LONG: _parse_ranged_int(LONG_MIN, LONG_MAX),
    ConfigType.DOUBLE: float,
    ConfigType.STRING: str,
    ConfigType.LIST: _parse_list,
}

_MS_7_DAYS: Final = 7 * 24 * 60 * 60 * 1000
_MS_1_DAY: Final = 24 * 60 * 60 * 1000
_COMPRESSION_TYPES: Final = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer", "none")

_T = ConfigType
# Why the topic configs Riverbed accepts without acting on them have no effect (several share one).
_NO_RECOMPRESSION: Final = (
    "the broker stores batches as the producer compressed them: it does "
    "not touch records on the produce path"
)
_MAGIC_V2_ONLY: Final = "the broker stores and serves record batches of magic v2 only"
_TIMESTAMPS_UNCHECKED: Final = (
    "record timestamps are not checked against the broker's clock "
    "(the broker reads batch headers, not records)"
)
_KIP_950: Final = "disabling tiered storage on a topic (KIP-950) is not built"
# Object store settings for an s3:// remote.storage.url (see riverbed.tiering.stores).
REMOTE_STORAGE_S3 = "remote.storage.s3."
# The follower replication throttle's two configs, named apart because the replica fetcher reads
# them from the metadata cache and `riverbed partitions reassign --throttle` writes them.
FOLLOWER_RATE_CONFIG: Final = "follower.replication.throttled.rate"
FOLLOWER_REPLICAS_CONFIG: Final = "follower.replication.throttled.replicas"
TOPIC_CONFIG_DEFS: Final[tuple[ConfigDef, ...]] = (
    ConfigDef("cleanup.policy", _T.LIST, ("delete",), "delete old segments, compact, or both",
              subset_of("compact", "delete"), "log.cleanup.policy"),
    ConfigDef("compression.gzip.level", _T.INT, -1, "gzip level when the broker recompresses",
              level(1, 9, -1), without_effect=_NO_RECOMPRESSION),
    ConfigDef("compression.lz4.level", _T.INT, 9, "lz4 level when the broker recompresses",
              level(1, 17), without_effect=_NO_RECOMPRESSION),
    ConfigDef("compression.type", _T.STRING, "producer", "codec of stored batches; producer keeps "
              "the producer's", one_of(*_COMPRESSION_TYPES), "compression.type",
              without_effect=_NO_RECOMPRESSION),
    ConfigDef("compression.zstd.level", _T.INT, 3, "zstd level when the broker recompresses",
              level(-131072, 22), without_effect=_NO_RECOMPRESSION),
    ConfigDef("delete.retention.ms", _T.LONG, _MS_1_DAY, "how long compaction keeps tombstones",
              at_least(0), "log.cleaner.delete.retention.ms"),
    ConfigDef("file.delete.delay.ms", _T.LONG, 60000, "how long a deleted segment's files are "
              "kept before removal", at_least(0), without_effect="a deleted segment's files are "
              "renamed *.deleted and unlinked at once, on a background thread"),
    ConfigDef("flush.messages", _T.LONG, LONG_MAX, "fsync after this many messages",
              at_least(1), "log.flush.interval.messages"),
    ConfigDef("flush.ms", _T.LONG, LONG_MAX, "fsync after this long", at_least(0),
              "log.flush.interval.ms"),
    ConfigDef("index.interval.bytes", _T.INT, 4096, "bytes between offset index entries",
              at_least(0), "log.index.interval.bytes"),
    ConfigDef("follower.replication.throttled.replicas", _T.LIST, (), "replicas (partition:"
              "follower broker, or *) whose copying is capped by follower.replication."
              "throttled.rate", THROTTLED_REPLICAS),
    ConfigDef("leader.replication.throttled.replicas", _T.LIST, (), "replicas (partition:"
              "broker, or *) that Kafka's leader-side throttle would cap", THROTTLED_REPLICAS,
              without_effect="Riverbed throttles replication on the follower only "
              "(follower.replication.throttled.replicas)"),
    ConfigDef("local.retention.bytes", _T.LONG, LOCAL_RETENTION_FROM_RETENTION, "bytes kept on "
              "local disk when tiered (-2: retention.bytes)", at_least(-2),
              "log.local.retention.bytes"),
    ConfigDef("local.retention.ms", _T.LONG, LOCAL_RETENTION_FROM_RETENTION, "time kept on local "
              "disk when tiered (-2: retention.ms)", at_least(-2), "log.local.retention.ms"),
    ConfigDef("max.compaction.lag.ms", _T.LONG, LONG_MAX, "longest a message stays uncompacted",
              at_least(1), "log.cleaner.max.compaction.lag.ms"),
    ConfigDef("max.message.bytes", _T.INT, 1048588, "largest record batch accepted",
              at_least(0), "message.max.bytes"),
    ConfigDef("message.downconversion.enable", _T.BOOLEAN, True, "down-convert batches for "
              "consumers of old message formats (Kafka 3.x; removed in 4.0)",
              without_effect=_MAGIC_V2_ONLY),
    ConfigDef("message.format.version", _T.STRING, "3.0-IV1", "message format of appended "
              "batches (Kafka 3.x; removed in 4.0)", API_VERSION, without_effect=_MAGIC_V2_ONLY),
    ConfigDef("message.timestamp.after.max.ms", _T.LONG, LONG_MAX, "how far in the future a "
              "CreateTime timestamp may be", at_least(0), without_effect=_TIMESTAMPS_UNCHECKED),
    ConfigDef("message.timestamp.before.max.ms", _T.LONG, LONG_MAX, "how far in the past a "
              "CreateTime timestamp may be", at_least(0), without_effect=_TIMESTAMPS_UNCHECKED),
    ConfigDef("message.timestamp.difference.max.ms", _T.LONG, LONG_MAX, "how far from the "
              "broker's clock a CreateTime timestamp may be (Kafka 3.x; removed in 4.0)",
              at_least(0), without_effect=_TIMESTAMPS_UNCHECKED),
    ConfigDef("message.timestamp.type", _T.STRING, "CreateTime", "which timestamp batches carry",
              one_of("CreateTime", "LogAppendTime"), "log.message.timestamp.type"),
    ConfigDef("min.cleanable.dirty.ratio", _T.DOUBLE, 0.5, "dirty share that triggers compaction",
              between(0, 1), "log.cleaner.min.cleanable.ratio"),
    ConfigDef("min.compaction.lag.ms", _T.LONG, 0, "shortest a message stays uncompacted",
              at_least(0), "log.cleaner.min.compaction.lag.ms"),
    ConfigDef("min.insync.replicas", _T.INT, 1, "in-sync replicas needed for acks=all",
              at_least(1), "min.insync.replicas"),
    ConfigDef("preallocate", _T.BOOLEAN, False, "allocate a new segment file's full size at "
              "once", without_effect="segment files grow as they are written"),
    ConfigDef("remote.log.copy.disable", _T.BOOLEAN, False, "stop uploading a tiered topic's "
              "segments, keeping what is uploaded", without_effect=_KIP_950),
    ConfigDef("remote.log.delete.on.disable", _T.BOOLEAN, False, "delete the cold tier when "
              "remote.storage.enable is turned off", without_effect=_KIP_950),
    ConfigDef("remote.storage.enable", _T.BOOLEAN, False, "tier closed segments to object "
              "storage (no broker-level default)"),
    ConfigDef("retention.bytes", _T.LONG, -1, "partition size before old segments are deleted "
              "(-1: unlimited)", at_least(-1), "log.retention.bytes"),
    ConfigDef("retention.ms", _T.LONG, _MS_7_DAYS, "age before segments are deleted (-1: "
              "forever)", at_least(-1), "log.retention.ms"),
    ConfigDef("segment.bytes", _T.INT, 1073741824, "segment file size before rolling",
              at_least(SEGMENT_BYTES_MIN), "log.segment.bytes"),
    ConfigDef("segment.index.bytes", _T.INT, 10485760, "largest offset or time index of a "
              "segment", at_least(4), without_effect="a segment's indexes grow with it; only "
              "segment.bytes and segment.ms roll it"),
    ConfigDef("segment.jitter.ms", _T.LONG, 0, "random time taken off segment.ms per segment",
              at_least(0), without_effect="segments roll at segment.ms exactly"),
    ConfigDef("segment.ms", _T.LONG, _MS_7_DAYS, "segment age before rolling", at_least(1),
              "log.roll.ms"),
    ConfigDef("unclean.leader.election.enable", _T.BOOLEAN, False, "allow an out-of-sync replica "
              "to lead (loses data)", None, "unclean.leader.election.enable"),
)  # fmt: skip

BROKER_ONLY_CONFIG_DEFS: Final[tuple[ConfigDef, ...]] = (
    ConfigDef("broker.id", _T.INT, 0, "this broker's id in the cluster", at_least(0)),
    ConfigDef("broker.rack", _T.STRING, None, "rack for rack-aware replica placement"),
    ConfigDef("listeners", _T.LIST, ("PLAINTEXT://127.0.0.1:9092",), "addresses to listen on",
              LISTENERS),
    ConfigDef("advertised.listeners", _T.LIST, None, "addresses given to clients (default: "
              "listeners)", LISTENERS),
    ConfigDef("listener.security.protocol.map", _T.LIST, tuple(
                  f"{p}:{p}" for p in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")),
              "NAME:PROTOCOL pairs: the security protocol of each listener name",
              Validator(lambda v: isinstance(v, tuple) and all(":" in i for i in v),
                        "a comma-separated list of NAME:PROTOCOL")),
    ConfigDef("inter.broker.listener.name", _T.STRING, None, "the listener brokers use to reach "
              "each other (default: the first listener)"),
    ConfigDef("ssl.keystore.type", _T.STRING, "PEM", "format of ssl.keystore.location",
              one_of("PEM")),
    ConfigDef("ssl.keystore.location", _T.STRING, None, "PEM file with this broker's "
              "certificate chain and private key (SSL and SASL_SSL listeners)"),
    ConfigDef("ssl.key.password", _T.STRING, None, "password of the private key in "
              "ssl.keystore.location, if it is encrypted", sensitive=True),
    ConfigDef("ssl.truststore.type", _T.STRING, "PEM", "format of ssl.truststore.location",
              one_of("PEM")),
    ConfigDef("ssl.truststore.location", _T.STRING, None, "PEM file with the CA certificates "
              "that sign client certificates and the other brokers' certificates"),
    ConfigDef("ssl.client.auth", _T.STRING, "none", "whether TLS listeners ask clients for a "
              "certificate", one_of("none", "requested", "required")),
    ConfigDef("ssl.endpoint.identification.algorithm", _T.STRING, "https", "https: check that "
              "another broker's certificate names its host; empty: do not",
              Validator(lambda v: v in ("https", ""), "https or an empty string")),
    ConfigDef("sasl.mechanism.inter.broker.protocol", _T.STRING, "SCRAM-SHA-512", "SASL "
              "mechanism brokers use with each other on a SASL inter-broker listener",
              one_of("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")),
    ConfigDef("sasl.jaas.config", _T.STRING, None, "the broker's own SASL credentials for "
              "inter-broker connections, as a JAAS line: ... required username=\"u\" "
              "password=\"p\";", sensitive=True),
    ConfigDef("max.connections", _T.INT, INT_MAX, "connections the broker accepts at once over "
              "all listeners; more are closed at once", at_least(1)),
    ConfigDef("max.connections.per.ip", _T.INT, INT_MAX, "connections one IP address may hold "
              "at once", at_least(1)),
    ConfigDef("max.connections.per.ip.overrides", _T.LIST, (), "ip:count pairs overriding "
              "max.connections.per.ip", Validator(
                  lambda v: isinstance(v, tuple) and all(
                      re.fullmatch(r"[^:,\s]+:\d+", i) for i in v), "a list of ip:count")),
    ConfigDef("connections.max.idle.ms", _T.LONG, 600000, "a connection with no complete request "
              "and nothing to answer for this long is closed", at_least(1)),
    ConfigDef("log.dirs", _T.LIST, ("/tmp/riverbed-logs",), "directories holding partition logs",
              Validator(lambda v: isinstance(v, tuple) and bool(v), "a list of directories")),
    ConfigDef("zookeeper.connect", _T.STRING, None, "host:port[,host:port][/chroot] of ZooKeeper",
              Validator(lambda v: isinstance(v, str) and bool(v), "host:port[/chroot]")),
    ConfigDef("zookeeper.set.acl", _T.BOOLEAN, False, "znodes the broker creates are readable "
              "and writable only with zookeeper.auth.digest's credentials"),
    ConfigDef("zookeeper.auth.digest", _T.STRING, None, "user:password of ZooKeeper's digest "
              "scheme, sent when the broker connects", Validator(
                  lambda v: isinstance(v, str) and ":" in v and v.index(":") > 0
                  and not v.endswith(":"), "user:password"), sensitive=True),
    ConfigDef("zookeeper.session.timeout.ms", _T.INT, 18000, "ZooKeeper session timeout",
              at_least(1)),
    ConfigDef("zookeeper.connection.timeout.ms", _T.INT, None, "how long to wait for ZooKeeper "
              "at startup (default: the session timeout)", at_least(1)),
    ConfigDef("auto.create.topics.enable", _T.BOOLEAN, True, "create unknown topics on metadata "
              "requests"),
    ConfigDef("delete.topic.enable", _T.BOOLEAN, True, "allow DeleteTopics"),
    ConfigDef("num.partitions", _T.INT, 1, "partitions of auto-created topics", at_least(1)),
    ConfigDef("default.replication.factor", _T.INT, 1, "replication factor of auto-created "
              "topics", at_least(1)),
    ConfigDef("socket.request.max.bytes", _T.INT, 104857600, "largest request accepted",
              at_least(1)),
    ConfigDef("replica.lag.time.max.ms", _T.LONG, 30000, "a follower this far behind leaves the "
              "ISR", at_least(1)),
    ConfigDef("auto.leader.rebalance.enable", _T.BOOLEAN, True, "the controller moves "
              "leaderships back to their preferred replicas when a broker leads too few of its "
              "own (leader.imbalance.*)"),
    ConfigDef("leader.imbalance.check.interval.seconds", _T.LONG, 300, "how often the "
              "controller checks the leader balance", at_least(1)),
    ConfigDef("leader.imbalance.per.broker.percentage", _T.INT, 10, "share of the partitions "
              "a broker is the preferred replica of that it may not lead before the controller "
              "hands them back to it", between(IMBALANCE_PERCENTAGE_MIN, IMBALANCE_PERCENTAGE_MAX)),
    ConfigDef("max.incremental.fetch.session.cache.slots", _T.INT, 1000, "fetch sessions "
              "(KIP-227) the broker keeps at once; 0 turns them off", at_least(0)),
    ConfigDef("min.incremental.fetch.session.eviction.ms", _T.INT, 120000, "a fetch session "
              "unused this long may be evicted for a new one, and one older than this may be "
              "evicted by a larger one", at_least(0)),
    ConfigDef("log.retention.check.interval.ms", _T.LONG, 300000, "how often retention runs",
              at_least(1)),
    ConfigDef("log.cleaner.enable", _T.BOOLEAN, True, "run the log cleaner (compaction of "
              "cleanup.policy=compact topics, __consumer_offsets among them)"),
    ConfigDef("log.cleaner.backoff.ms", _T.LONG, 15000, "how long the cleaner sleeps when no "
              "log needs cleaning", at_least(1)),
    ConfigDef("log.cleaner.dedupe.buffer.size", _T.LONG, 134217728, "memory for the cleaner's "
              "key -> latest offset map; a pass cleans as far as the map reaches",
              at_least(1024 * 1024)),
    ConfigDef("log.cleaner.io.max.bytes.per.second", _T.DOUBLE, 1.7976931348623157e308,
              "cap on the cleaner's reads plus writes", Validator(
                  lambda v: isinstance(v, float) and v > 0, "a number above 0")),
    ConfigDef("offsets.topic.num.partitions", _T.INT, 50, "partitions of __consumer_offsets "
              "(fixed once the topic exists)", at_least(1)),
    ConfigDef("offsets.topic.replication.factor", _T.INT, 3, "replication factor of "
              "__consumer_offsets; it is not created until this many brokers are up",
              at_least(1)),
    ConfigDef("offsets.topic.segment.bytes", _T.INT, 104857600, "segment size of "
              "__consumer_offsets", at_least(SEGMENT_BYTES_MIN)),
    ConfigDef("offsets.commit.timeout.ms", _T.INT, 5000, "how long an offset commit waits for "
              "the replicas of __consumer_offsets", at_least(1)),
    ConfigDef("offsets.retention.minutes", _T.INT, 10080, "committed offsets of a group empty "
              "this long expire", at_least(1)),
    ConfigDef("offsets.retention.check.interval.ms", _T.LONG, 600000, "how often expired "
              "offsets are removed", at_least(1)),
    ConfigDef("offset.metadata.max.bytes", _T.INT, 4096, "longest metadata string of a commit",
              at_least(0)),
    ConfigDef("transaction.state.log.num.partitions", _T.INT, 50, "partitions of "
              "__transaction_state (fixed once the topic exists)", at_least(1)),
    ConfigDef("transaction.state.log.replication.factor", _T.INT, 3, "replication factor of "
              "__transaction_state; it is not created until this many brokers are up",
              at_least(1)),
    ConfigDef("transaction.state.log.min.isr", _T.INT, 2, "min.insync.replicas of "
              "__transaction_state", at_least(1)),
    ConfigDef("transaction.state.log.segment.bytes", _T.INT, 104857600, "segment size of "
              "__transaction_state", at_least(SEGMENT_BYTES_MIN)),
    ConfigDef("transaction.max.timeout.ms", _T.INT, 900000, "longest transaction.timeout.ms a "
              "transactional producer may ask for (INVALID_TRANSACTION_TIMEOUT above it)",
              at_least(1)),
    ConfigDef("transactional.id.expiration.ms", _T.INT, 604800000, "a transactional id without "
              "a transaction for this long is forgotten", at_least(1)),
    ConfigDef("transaction.abort.timed.out.transaction.cleanup.interval.ms", _T.INT, 10000,
              "how often transactions open beyond their timeout are aborted", at_least(1)),
    ConfigDef("transaction.remove.expired.transaction.cleanup.interval.ms", _T.INT, 3600000,
              "how often expired transactional ids are removed", at_least(1)),
    ConfigDef("group.min.session.timeout.ms", _T.INT, 6000, "shortest session.timeout.ms a "
              "member may ask for", at_least(1)),
    ConfigDef("group.max.session.timeout.ms", _T.INT, 1800000, "longest session.timeout.ms a "
              "member may ask for", at_least(1)),
    ConfigDef("group.initial.rebalance.delay.ms", _T.INT, 3000, "how long a new group waits for "
              "more members before its first rebalance", at_least(0)),
    ConfigDef("group.max.size", _T.INT, INT_MAX, "most members a group may have", at_least(1)),
    ConfigDef("remote.storage.url", _T.STRING, None, "object store of the cold tier: "
              "file:///path or s3://bucket/prefix (tiering is off when unset)",
              Validator(lambda v: v is None or (isinstance(v, str) and "://" in v),
                        "file:///path or s3://bucket[/prefix]")),
    ConfigDef("remote.log.manager.task.interval.ms", _T.LONG, 30000, "how often each partition "
              "led here is tiered (uploads, local retention)", at_least(1)),
    ConfigDef("remote.fetch.cache.bytes", _T.LONG, 1073741824, "on-disk cache of object chunks "
              "read for cold fetches", at_least(8 * 1024 * 1024)),
    ConfigDef("remote.log.orphan.grace.ms", _T.LONG, 600000, "age past which a data object no "
              "manifest points at (a deposed leader's late upload) is deleted; longer than any "
              "upload takes", at_least(0)),
    ConfigDef("remote.log.compaction.broker.max.bytes", _T.LONG, 1073741824, "largest cold "
              "range (bytes of its batches in the log) of a compacted tiered partition that the "
              "broker compacts itself; larger ones are left to the Spark job (0: always)",
              at_least(0)),
    ConfigDef("remote.log.compaction.grace.ms", _T.LONG, 3600000, "how long objects replaced "
              "by a cold compaction stay readable (readers holding an older manifest) before "
              "they are deleted", at_least(0)),
    ConfigDef("metrics.port", _T.INT, -1, "port of the Prometheus /metrics endpoint (-1: none; "
              "0: any free port, logged)", between(-1, 65535)),
    ConfigDef("metrics.host", _T.STRING, None, "interface the metrics endpoint binds (default: "
              "the first listener's)"),
    ConfigDef("process.scheduling.policy", _T.STRING, BATCH, "the broker process's Linux "
              "scheduling policy: batch (SCHED_BATCH: no wakeup preemption between brokers and "
              "clients sharing cores) or inherit (what the broker was started with)",
              one_of(*SCHEDULING_POLICIES)),
    ConfigDef("sasl.enabled.mechanisms", _T.LIST, SASL_MECHANISMS_DEFAULT, "SASL mechanisms "
              "SASL listeners offer, in this order", SASL_MECHANISMS),
    ConfigDef("authorizer.class.name", _T.STRING, "", "the authorizer: empty for none (every "
              "request allowed), or one of " + ", ".join(ACL_AUTHORIZER_CLASS_NAMES) + " for "
              "Riverbed's ACL authorizer (ACLs in ZooKeeper, Kafka's layout)",
              AUTHORIZER_CLASS_NAME),
    ConfigDef("super.users", _T.STRING, "", "principals the authorizer always allows, "
              "';'-separated (User:admin;User:broker)", SUPER_USERS),
    ConfigDef("allow.everyone.if.no.acl.found", _T.BOOLEAN, False, "with the authorizer on, allow "
              "every principal on a resource no ACL names"),
)  # fmt: skip

# Broker configs that can change while brokers run (Kafka's dynamic broker configs), set
# cluster-wide with IncrementalAlterConfigs on the default broker entity (empty name) and kept in
# ZooKeeper at /config/brokers/<default>.
DYNAMIC_BROKER_CONFIG_DEFS: Final[tuple[ConfigDef, ...]] = (
    ConfigDef("follower.replication.throttled.rate", _T.LONG, LONG_MAX, "bytes/s each broker "
              "copies for the replicas in a topic's follower.replication.throttled.replicas",
              at_least(1)),
    ConfigDef("leader.replication.throttled.rate", _T.LONG, LONG_MAX, "Kafka's leader-side cap; "
              "accepted, not enforced (Riverbed throttles on the follower)", at_least(1)),
)  # fmt: skip
DYNAMIC_BROKER_CONFIGS: Final = {d.name: d for d in DYNAMIC_BROKER_CONFIG_DEFS}

_BROKER_SYNONYMS: Final = {d.broker_synonym: d for d in TOPIC_CONFIG_DEFS if d.broker_synonym}
BROKER_CONFIG_DEFS: Final[tuple[ConfigDef, ...]] = (
    *BROKER_ONLY_CONFIG_DEFS,
    *(
        dataclasses.replace(d, name=synonym, broker_synonym=None)
        for synonym, d in _BROKER_SYNONYMS.items()
    ),
)
TOPIC_CONFIGS: Final = {d.name: d for d in TOPIC_CONFIG_DEFS}
# The topic configs the log layer reads (TopicConfig's fields).
ACTED_ON_TOPIC_CONFIG_DEFS: Final = tuple(d for d in TOPIC_CONFIG_DEFS if d.without_effect is None)
BROKER_CONFIGS: Final = {d.name: d for d in BROKER_CONFIG_DEFS}


def _parse_all(
    defs: Mapping[str, ConfigDef], values: Mapping[str, str | None], kind: str
) -> dict[str, ConfigPrimitive]:
    parsed: dict[str, ConfigPrimitive] = {}
    for key, text in values.items():
        definition = defs.get(key)
        if definition is None:
            raise ConfigError(
                key,
                f"unknown {kind} config {key!r}; known {kind} configs: {', '.join(sorted(defs))}",
            )
        parsed[key] = definition.parse(text)
    return parsed


def validate_topic_configs(configs: Mapping[str, str | None]) -> dict[str, str]:
    """Check topic config overrides; return them in canonical string form, ready to store.
    Raises ConfigError (a KafkaError with INVALID_CONFIG) naming the first bad key."""
    return _canonical(TOPIC_CONFIGS, configs, "topic")


def validate_dynamic_broker_configs(configs: Mapping[str, str | None]) -> dict[str, str]:
    """Check dynamic broker config overrides, as validate_topic_configs does topic ones."""
    return _canonical(DYNAMIC_BROKER_CONFIGS, configs, "dynamic broker")


class _KafkaConfigRules:
    """The checks the metadata store applies to every config write (coordination.metadata's
    ConfigRules): Kafka's topic configs and the cluster-wide dynamic broker configs."""

    def topic(self, configs: Mapping[str, str | None]) -> dict[str, str]:
        return validate_topic_configs(configs)

    def dynamic_broker(self, configs: Mapping[str, str | None]) -> dict[str, str]:
        return validate_dynamic_broker_configs(configs)


CONFIG_RULES: Final = _KafkaConfigRules()


def dynamic_broker_config(overrides: Mapping[str, str]) -> dict[str, int]:
    """The effective dynamic broker configs (all LONG) for the stored `overrides`."""
    values = _parse_all(DYNAMIC_BROKER_CONFIGS, overrides, "dynamic broker")
    effective = {d.name: d.default for d in DYNAMIC_BROKER_CONFIG_DEFS} | values
    return {name: int(value) for name, value in effective.items() if isinstance(value, int)}


def _canonical(
    defs: Mapping[str, ConfigDef], configs: Mapping[str, str | None], kind: str
) -> dict[str, str]:
    parsed = _parse_all(defs, configs, kind)
    canonical: dict[str, str] = {}
    for key, value in parsed.items():
        text = defs[key].render(value)
        if text is None:  # parse never yields None for these configs; keep the type honest
            raise ConfigError(key, f"config {key!r} cannot be null")
        canonical[key] = text
    return canonical


def _build(
    cls: Callable[..., _C],
    defs: Iterable[ConfigDef],
    values: Mapping[str, ConfigPrimitive],
    **extra: object,
) -> _C:
    return cls(**extra, **{d.attribute: values[d.name] for d in defs})


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """A topic's effective configuration, typed; attribute = Kafka name with '.' -> '_'."""

    cleanup_policy: tuple[str, ...]
    delete_retention_ms: int
    flush_messages: int
    flush_ms: int
    follower_replication_throttled_replicas: tuple[str, ...]
    index_interval_bytes: int
    local_retention_bytes: int
    local_retention_ms: int
    max_compaction_lag_ms: int
    max_message_bytes: int
    message_timestamp_type: str
    min_cleanable_dirty_ratio: float
    min_compaction_lag_ms: int
    min_insync_replicas: int
    remote_storage_enable: bool
    retention_bytes: int
    retention_ms: int
    segment_bytes: int
    segment_ms: int
    unclean_leader_election_enable: bool

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        return "delete" in self.cleanup_policy


@dataclass(frozen=True, slots=True)
class ConfigSynonym:
    name: str
    value: str | None
    source: ConfigSource


@dataclass(frozen=True, slots=True)
class ConfigValue:
    """One row of DescribeConfigs; `source` and `type` values are its wire ids."""

    name: str
    value: str | None
    source: ConfigSource
    read_only: bool = False
    sensitive: bool = False
    type: ConfigType = ConfigType.STRING
    documentation: str = ""
    synonyms: tuple[ConfigSynonym, ...] = ()  # every source that sets it, highest first


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """A broker's configuration, typed; attribute = Kafka name with '.' -> '_'.
    `explicit` holds the keys that were set rather than defaulted."""

    explicit: frozenset[str]
    # `remote.storage.s3.*` settings, passed as they are to the object store, which checks them
    # when the broker starts (riverbed.tiering.stores); never described or logged (secrets).
    remote_storage_s3: Mapping[str, str]
    broker_id: int
    broker_rack: str | None
    listeners: tuple[str, ...]
    advertised_listeners: tuple[str, ...] | None
    listener_security_protocol_map: tuple[str, ...]
    inter_broker_listener_name: str | None
    ssl_keystore_type: str
    ssl_keystore_location: str | None
    ssl_key_password: str | None
    ssl_truststore_type: str
    ssl_truststore_location: str | None
    ssl_client_auth: str
    ssl_endpoint_identification_algorithm: str
    sasl_mechanism_inter_broker_protocol: str
    sasl_jaas_config: str | None
    max_connections: int
    max_connections_per_ip: int
    max_connections_per_ip_overrides: tuple[str, ...]
    connections_max_idle_ms: int
    log_dirs: tuple[str, ...]
    zookeeper_connect: str
    zookeeper_set_acl: bool
    zookeeper_auth_digest: str | None
    zookeeper_session_timeout_ms: int
    zookeeper_connection_timeout_ms: int | None
    auto_create_topics_enable: bool
    delete_topic_enable: bool
    num_partitions: int
    default_replication_factor: int
    socket_request_max_bytes: int
    replica_lag_time_max_ms: int
    auto_leader_rebalance_enable: bool
    leader_imbalance_check_interval_seconds: int
    leader_imbalance_per_broker_percentage: int
    max_incremental_fetch_session_cache_slots: int
    min_incremental_fetch_session_eviction_ms: int
    log_retention_check_interval_ms: int
    log_cleaner_enable: bool
    log_cleaner_backoff_ms: int
    log_cleaner_dedupe_buffer_size: int
    log_cleaner_io_max_bytes_per_second: float
    offsets_topic_num_partitions: int
    offsets_topic_replication_factor: int
    offsets_topic_segment_bytes: int
    offsets_commit_timeout_ms: int
    offsets_retention_minutes: int
    offsets_retention_check_interval_ms: int
    offset_metadata_max_bytes: int
    transaction_state_log_num_partitions: int
    transaction_state_log_replication_factor: int
    transaction_state_log_min_isr: int
    transaction_state_log_segment_bytes: int
    transaction_max_timeout_ms: int
    transactional_id_expiration_ms: int
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int
    transaction_remove_expired_transaction_cleanup_interval_ms: int
    group_min_session_timeout_ms: int
    group_max_session_timeout_ms: int
    group_initial_rebalance_delay_ms: int
    group_max_size: int
    remote_storage_url: str | None
    remote_log_manager_task_interval_ms: int
    remote_fetch_cache_bytes: int
    remote_log_orphan_grace_ms: int
    remote_log_compaction_broker_max_bytes: int
    remote_log_compaction_grace_ms: int
    metrics_port: int
    metrics_host: str | None
    process_scheduling_policy: str
    sasl_enabled_mechanisms: tuple[str, ...]
    authorizer_class_name: str
    super_users: str
    allow_everyone_if_no_acl_found: bool
    # Broker-level defaults of topic configs (see TOPIC_CONFIG_DEFS' broker_synonym).
    log_cleanup_policy: tuple[str, ...]
    compression_type: str
    log_cleaner_delete_retention_ms: int
    log_flush_interval_messages: int
    log_flush_interval_ms: int
    log_index_interval_bytes: int
    log_local_retention_bytes: int
    log_local_retention_ms: int
    log_cleaner_max_compaction_lag_ms: int
    message_max_bytes: int
    log_message_timestamp_type: str
    log_cleaner_min_cleanable_ratio: float
    log_cleaner_min_compaction_lag_ms: int
    min_insync_replicas: int
    log_retention_bytes: int
    log_retention_ms: int
    log_segment_bytes: int
    log_roll_ms: int
    unclean_leader_election_enable: bool

    @classmethod
    def from_mapping(cls, values: Mapping[str, str], *, allow_unknown: bool = False) -> Self:
        """Parse broker configs. `zookeeper.connect` is required. Unknown keys are errors unless
        `allow_unknown` (for a real Kafka server.properties), when they are logged and skipped."""
        known = {key: text for key, text in values.items() if key in BROKER_CONFIGS}
        s3 = {key: text for key, text in values.items() if key.startswith(REMOTE_STORAGE_S3)}
        for key in sorted(set(values) - set(known) - set(s3)):
            if not allow_unknown:
                _parse_all(BROKER_CONFIGS, {key: values[key]}, "broker")  # raises, naming it
            log.warning("ignoring unsupported broker config %r", key)
        parsed = {d.name: d.default for d in BROKER_CONFIG_DEFS}
        parsed.update(_parse_all(BROKER_CONFIGS, known, "broker"))
        if parsed["zookeeper.connect"] is None:
            raise ConfigError("zookeeper.connect", "broker config 'zookeeper.connect' is required")
        config = _build(
            cls, BROKER_CONFIG_DEFS, parsed, explicit=frozenset(known), remote_storage_s3=s3
        )
        config.check_security()
        return config

    @classmethod
    def load_properties(cls, path: Path, *, allow_unknown: bool = False) -> Self:
        """Read a Kafka-style .properties file (key=value or key: value, # and ! comments)."""
        return cls.from_mapping(parse_properties(path.read_text()), allow_unknown=allow_unknown)

    def value(self, name: str) -> ConfigPrimitive:
        value: ConfigPrimitive = getattr(self, BROKER_CONFIGS[name].attribute)
        return value

    def check_security(self) -> None:
        """The listener, SASL and ZooKeeper settings taken together; a ConfigError names the
        key."""
        if self.zookeeper_set_acl and self.zookeeper_auth_digest is None:
            raise ConfigError(
                "zookeeper.set.acl",
                "zookeeper.set.acl=true needs zookeeper.auth.digest (user:password): the "
                "broker could not read back what it creates",
            )
        listeners = self.listener_set
        inter_broker = next(b for b in listeners.bound if b.name == listeners.inter_broker)
        if inter_broker.protocol.uses_sasl:
            self.inter_broker_credentials  # noqa: B018 - raises if it does not parse
            if self.sasl_mechanism_inter_broker_protocol not in self.sasl_enabled_mechanisms:
                raise ConfigError(
                    "sasl.mechanism.inter.broker.protocol",
                    f"sasl.mechanism.inter.broker.protocol "
                    f"{self.sasl_mechanism_inter_broker_protocol} is not in "
                    f"sasl.enabled.mechanisms ({', '.join(self.sasl_enabled_mechanisms)})",
                )

    @property
    def zookeeper_digest(self) -> ZkDigest | None:
        """The broker's ZooKeeper credentials, if any (zookeeper.auth.digest)."""
        from riverbed.coordination.zk import ZkDigest  # kazoo: only for what talks to ZooKeeper

        if self.zookeeper_auth_digest is None:
            return None
        return ZkDigest.parse(self.zookeeper_auth_digest, set_acl=self.zookeeper_set_acl)

    @property
    def listener_set(self) -> ListenerSet:
        """`listeners`, `advertised.listeners` and the inter-broker listener, checked together."""
        try:
            return listener_set(
                self.listeners,
                self.advertised_listeners,
                self.listener_security_protocol_map,
                self.inter_broker_listener_name,
            )
        except ListenerError as error:
            raise ConfigError(error.key, str(error)) from None

    @property
    def leader_rebalance(self) -> RebalancePolicy:
        """The controller's automatic preferred-leader rebalance (checked when parsed)."""
        return RebalancePolicy(
            enabled=self.auto_leader_rebalance_enable,
            check_interval_s=self.leader_imbalance_check_interval_seconds,
            imbalance_percentage=self.leader_imbalance_per_broker_percentage,
        )

    @property
    def tls_files(self) -> TlsFiles:
        return TlsFiles(self.ssl_keystore_location, self.ssl_key_password,
                        self.ssl_truststore_location)  # fmt: skip

    @property
    def inter_broker_credentials(self) -> Credentials:
        """The broker's own SASL username and password, from `sasl.jaas.config`."""
        if self.sasl_jaas_config is None:
            raise ConfigError(
                "sasl.jaas.config",
                "a SASL inter-broker listener needs sasl.jaas.config with the broker's username "
                "and password",
            )
        try:
            return parse_credentials(self.sasl_jaas_config)
        except JaasError as error:
            raise ConfigError("sasl.jaas.config", str(error)) from None

    @property
    def authorizer_settings(self) -> AuthorizerSettings:
        """`super.users` and `allow.everyone.if.no.acl.found` (validated when parsed)."""
        return AuthorizerSettings(
            parse_super_users(self.super_users), self.allow_everyone_if_no_acl_found
        )

    @property
    def connection_limits(self) -> ConnectionLimits:
        overrides: dict[str, int] = {}
        for entry in self.max_connections_per_ip_overrides:
            host, _, count = entry.rpartition(":")
            overrides[host] = int(count)
        return ConnectionLimits(
            max_connections=self.max_connections,
            max_connections_per_ip=self.max_connections_per_ip,
            per_ip_overrides=overrides,
            idle_ms_max=self.connections_max_idle_ms,
        )

    @property
    def advertised(self) -> tuple[str, ...]:
        return self.advertised_listeners or self.listeners

    @property
    def advertised_host_port(self) -> tuple[str, int]:
        """Host and port of the first advertised listener (what clients are told to dial)."""
        return _host_port(self.advertised[0])

    @property
    def host(self) -> str:
        """Interface of the first listener (the one the broker binds)."""
        return _host_port(self.listeners[0])[0]

    @property
    def port(self) -> int:
        return _host_port(self.listeners[0])[1]

    @property
    def advertised_host(self) -> str:
        return self.advertised_host_port[0]

    @property
    def log_dir(self) -> str:
        """The data directory; one per broker for now (Kafka's JBOD is not supported)."""
        return self.log_dirs[0]

    @property
    def authorizer_enabled(self) -> bool:
        """Whether requests are checked against ACLs (authorizer.class.name is set)."""
        return bool(self.authorizer_class_name)

    @property
    def zookeeper_connect_timeout_ms(self) -> int:
        return self.zookeeper_connection_timeout_ms or self.zookeeper_session_timeout_ms


def _host_port(listener: str) -> tuple[str, int]:
    match = _LISTENER.fullmatch(listener)
    if match is None:  # validated when parsed
        raise ValueError(f"malformed listener {listener!r}")
    return match.group(2) or "127.0.0.1", int(match.group(3))


def parse_properties(text: str) -> dict[str, str]:
    """The subset of java.util.Properties syntax Kafka config files use (no line continuations)."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped[0] in "#!":
            continue
        match = re.match(r"([^=:\s]+)\s*[=:\s]\s*(.*)", stripped)
        if match is None:
            values[stripped] = ""
        else:
            values[match.group(1)] = match.group(2).strip()
    return values


def effective_topic_config(
    broker: BrokerConfig, overrides: Mapping[str, str]
) -> dict[str, ConfigValue]:
    """Every topic config with its value and source: topic override, explicit broker config, or
    the default. `overrides` are stored (already validated) strings."""
    result: dict[str, ConfigValue] = {}
    for definition in TOPIC_CONFIG_DEFS:
        synonyms: list[ConfigSynonym] = []
        if definition.name in overrides:
            synonyms.append(
                ConfigSynonym(definition.name, overrides[definition.name], ConfigSource.TOPIC)
            )
        synonym = definition.broker_synonym
        if synonym is not None and synonym in broker.explicit:
            text = definition.render(broker.value(synonym))
            synonyms.append(ConfigSynonym(synonym, text, ConfigSource.BROKER))
        default = definition.render(definition.default)
        synonyms.append(ConfigSynonym(synonym or definition.name, default, ConfigSource.DEFAULT))
        result[definition.name] = _config_value(definition, synonyms, read_only=False)
    return result


def effective_broker_config(
    broker: BrokerConfig, dynamic: Mapping[str, str] | None = None
) -> dict[str, ConfigValue]:
    """Every broker config with its value: set in the config file/flags, or the default, all
    read-only; then the dynamic ones, set cluster-wide (`dynamic`, the stored overrides) or
    their defaults."""
    result: dict[str, ConfigValue] = {}
    for definition in BROKER_CONFIG_DEFS:
        synonyms: list[ConfigSynonym] = []
        if definition.name in broker.explicit:
            text = definition.render(broker.value(definition.name))
            synonyms.append(ConfigSynonym(definition.name, text, ConfigSource.BROKER))
        default = definition.render(definition.default)
        synonyms.append(ConfigSynonym(definition.name, default, ConfigSource.DEFAULT))
        result[definition.name] = _config_value(definition, synonyms, read_only=True)
    for definition in DYNAMIC_BROKER_CONFIG_DEFS:
        synonyms = []
        if dynamic and definition.name in dynamic:
            value = dynamic[definition.name]
            synonyms.append(
                ConfigSynonym(definition.name, value, ConfigSource.DYNAMIC_DEFAULT_BROKER)
            )
        default = definition.render(definition.default)
        synonyms.append(ConfigSynonym(definition.name, default, ConfigSource.DEFAULT))
        result[definition.name] = _config_value(definition, synonyms, read_only=False)
    return result


def _config_value(
    definition: ConfigDef, synonyms: list[ConfigSynonym], *, read_only: bool
) -> ConfigValue:
    winner = synonyms[0]
    return ConfigValue(
        name=definition.name,
        value=winner.value,
        source=winner.source,
        read_only=read_only,
        sensitive=definition.sensitive,
        type=definition.type,
        documentation=definition.doc,
        synonyms=tuple(synonyms),
    )


def topic_config(broker: BrokerConfig, overrides: Mapping[str, str]) -> TopicConfig:
    """A topic's effective configuration, typed, for the log layer: the configs Riverbed acts on
    (an override of one it does not act on is stored and described, nothing more)."""
    values: dict[str, ConfigPrimitive] = {}
    for definition in ACTED_ON_TOPIC_CONFIG_DEFS:
        if definition.name in overrides:
            values[definition.name] = definition.parse(overrides[definition.name])
        elif definition.broker_synonym is not None:
            values[definition.name] = broker.value(definition.broker_synonym)
        else:
            values[definition.name] = definition.default
    return _build(TopicConfig, ACTED_ON_TOPIC_CONFIG_DEFS, values)


def _check_fields(cls: type, defs: Iterable[ConfigDef], extra: frozenset[str]) -> None:
    # The dataclasses above spell out each config for the type checker; this keeps them in step
    # with the definition tables.
    fields = {f.name for f in dataclasses.fields(cls)} - extra
    attributes = {d.attribute for d in defs}
    if fields != attributes:
        raise RuntimeError(f"{cls.__name__} fields differ from its config definitions: "
                           f"{sorted(fields ^ attributes)}")  # fmt: skip


_check_fields(TopicConfig, ACTED_ON_TOPIC_CONFIG_DEFS, frozenset())
_check_fields(BrokerConfig, BROKER_CONFIG_DEFS, frozenset({"explicit", "remote_storage_s3"}))
