"""Client settings: Kafka's names with dots as underscores, Kafka's defaults, checked up front.

Every setting is declared once in `SETTINGS` (default, parser/validator, meaning). Each client
declares the settings it accepts as the fields of a frozen dataclass (`ProducerSettings`,
`ConsumerSettings`, `AdminSettings`) and builds it with `from_kwargs(kwargs)`, which:

- refuses an unknown name with a `TypeError` naming it and the closest known name;
- parses each value (`acks="all"` becomes -1, `"127.0.0.1:9092,h:9093"` becomes address pairs)
  and refuses a bad one with a `ValueError` naming the setting and what it accepts;
- fills the rest with Kafka's defaults, and records which names the user set (`explicit`),
  because some defaults give way to explicit settings (idempotence, delivery.timeout.ms).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from riverbed.client.group.assignors import ASSIGNORS, COOPERATIVE_STICKY, RANGE
from riverbed.protocol.compression import CompressionType
from riverbed.security.client import (
    SASL_MECHANISMS,
    ConnectionSecurity,
    SaslCredentials,
    connection_security,
)
from riverbed.security.session import SecurityProtocol
from riverbed.security.tls import TlsConfigError, TlsFiles

INT32_MAX: Final = 2**31 - 1
ACKS_ALL: Final = -1
# Kafka's limit for an idempotent producer: the broker keeps the last five batches per producer
# for de-duplication, so at most five requests per partition may be unanswered.
IDEMPOTENT_IN_FLIGHT_MAX: Final = 5

Parser = Callable[[str, object], Any]


@dataclass(frozen=True, slots=True)
class Setting:
    """One setting: its default (already parsed) and the parser that checks a user's value."""

    default: object
    parse: Parser
    doc: str


def _int_in(low: int, high: int = INT32_MAX) -> Parser:
    def parse(name: str, value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"{name} must be an int in {low}..{high}, got {value!r}")
        return value

    return parse


def _choice(*allowed: str) -> Parser:
    def parse(name: str, value: object) -> str:
        if not isinstance(value, str) or value.lower() not in allowed:
            raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
        return value.lower()

    return parse


def _bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def _str(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a str, got {value!r}")
    return value


def _optional_str(name: str, value: object) -> str | None:
    return None if value is None else _str(name, value)


def _acks(name: str, value: object) -> int:
    """ "all", "-1", -1 -> -1 (the leader waits for the in-sync replicas); "1"/1; "0"/0."""
    normalized = {"all": ACKS_ALL, "-1": ACKS_ALL, "0": 0, "1": 1, -1: ACKS_ALL, 0: 0, 1: 1}
    if isinstance(value, bool) or not isinstance(value, str | int) or value not in normalized:
        raise ValueError(f'{name} must be one of "all" (or -1), 1, 0; got {value!r}')
    return normalized[value]


def _strategies(name: str, value: object) -> tuple[str, ...]:
    """ "range,cooperative-sticky" or a list of assignor names -> a tuple of the names."""
    if isinstance(value, str):
        names = [entry.strip() for entry in value.split(",")]
    elif isinstance(value, list | tuple) and all(isinstance(entry, str) for entry in value):
        names = [entry.strip() for entry in value]
    else:
        raise ValueError(f'{name} must be "name[,name...]" or a list; got {value!r}')
    known = ", ".join(ASSIGNORS)
    if not names or any(entry not in ASSIGNORS for entry in names):
        raise ValueError(f"{name} must name assignors among {known}; got {value!r}")
    if len(set(names)) != len(names):
        raise ValueError(f"{name} names an assignor twice: {value!r}")
    return tuple(names)


def _bootstrap(name: str, value: object) -> tuple[tuple[str, int], ...]:
    """ "host:port[,host:port...]" or a list of "host:port" -> ((host, port), ...)."""
    if isinstance(value, str):
        entries = value.split(",")
    elif isinstance(value, list | tuple) and all(isinstance(entry, str) for entry in value):
        entries = list(value)
    else:
        raise ValueError(f'{name} must be "host:port[,host:port...]" or a list; got {value!r}')
    addresses = []
    for entry in entries:
        host, sep, port = entry.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{name}: {entry!r} is not HOST:PORT")
        addresses.append((host.strip("[]"), int(port)))
    if not addresses:
        raise ValueError(f"{name} names no broker")
    return tuple(addresses)


def _security_protocol(name: str, value: object) -> SecurityProtocol:
    allowed = [protocol.value.lower() for protocol in SecurityProtocol]
    if not isinstance(value, str) or value.lower() not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
    return SecurityProtocol(value.upper())


def _sasl_mechanism(name: str, value: object) -> str:
    if not isinstance(value, str) or value.upper() not in SASL_MECHANISMS:
        raise ValueError(f"{name} must be one of {', '.join(SASL_MECHANISMS)}; got {value!r}")
    return value.upper()


SETTINGS: Final[dict[str, Setting]] = {
    # Every client
    "bootstrap_servers": Setting(None, _bootstrap, "brokers to ask for cluster metadata first"),
    "client_id": Setting("riverbed", _str, "sent with every request, for the brokers' logs"),
    "request_timeout_ms": Setting(30_000, _int_in(1), "how long to wait for one response"),
    "retry_backoff_ms": Setting(100, _int_in(0), "first wait before retrying a failed request"),
    "retry_backoff_max_ms": Setting(
        1_000, _int_in(0), "the wait doubles per failure (with jitter) up to this"
    ),
    "metadata_max_age_ms": Setting(
        300_000, _int_in(0), "cluster metadata older than this is refreshed"
    ),
    "socket_connection_setup_timeout_ms": Setting(
        10_000,
        _int_in(1),
        "how long to wait for a connection, its TLS handshake, ApiVersions and SASL exchange",
    ),
    # Security (librdkafka's names)
    "security_protocol": Setting(
        SecurityProtocol.PLAINTEXT,
        _security_protocol,
        "plaintext, ssl, sasl_plaintext or sasl_ssl: how connections are secured",
    ),
    "ssl_ca_location": Setting(
        None,
        _optional_str,
        "PEM file of the CA certificates that sign the brokers' (default: the system's)",
    ),
    "ssl_certificate_location": Setting(
        None, _optional_str, "PEM file of this client's certificate, for brokers that ask"
    ),
    "ssl_key_location": Setting(
        None, _optional_str, "PEM file of its private key (default: in ssl_certificate_location)"
    ),
    "ssl_key_password": Setting(None, _optional_str, "password of an encrypted private key"),
    "ssl_endpoint_identification_algorithm": Setting(
        "https", _choice("https", "none"), "https: check that a broker's certificate names its host"
    ),
    "sasl_mechanism": Setting(
        "PLAIN", _sasl_mechanism, "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (sasl_* protocols)"
    ),
    "sasl_username": Setting(None, _optional_str, "the SASL user"),
    "sasl_password": Setting(None, _optional_str, "its password"),
    # Producer
    "acks": Setting(ACKS_ALL, _acks, "0: no answer; 1: the leader wrote it; all: the ISR did"),
    "linger_ms": Setting(5, _int_in(0), "how long a batch waits for more records"),
    "batch_size": Setting(16_384, _int_in(1), "bytes per partition batch before it is sent"),
    "compression_type": Setting(
        "none", _choice(*(c.name.lower() for c in CompressionType)), "codec of each batch"
    ),
    "enable_idempotence": Setting(True, _bool, "broker-side de-duplication of retries"),
    "max_in_flight_requests_per_connection": Setting(
        5, _int_in(1), "unanswered produce requests per broker"
    ),
    "retries": Setting(INT32_MAX, _int_in(0), "resends of a batch (bounded by delivery time)"),
    "delivery_timeout_ms": Setting(
        120_000, _int_in(1), "time from send() until the record is acknowledged or failed"
    ),
    "buffer_memory": Setting(33_554_432, _int_in(1, 2**62), "bytes of records not yet sent"),
    "max_block_ms": Setting(60_000, _int_in(0), "how long send() may wait for buffer space"),
    "max_request_size": Setting(1_048_576, _int_in(1), "largest produce request and record"),
    "transactional_id": Setting(
        None,
        _optional_str,
        "makes the producer transactional (KIP-98): init_transactions(), begin_transaction()...",
    ),
    "transaction_timeout_ms": Setting(
        60_000,
        _int_in(1, INT32_MAX),
        "the coordinator aborts a transaction left open this long",
    ),
    # Consumer
    "group_id": Setting(None, _optional_str, "the consumer group: subscribe() and commits"),
    "group_instance_id": Setting(
        None, _optional_str, "static membership (KIP-345): the member keeps its place on restart"
    ),
    "session_timeout_ms": Setting(
        45_000, _int_in(1), "a member without a heartbeat this long is removed from the group"
    ),
    "heartbeat_interval_ms": Setting(3_000, _int_in(1), "time between heartbeats"),
    "max_poll_interval_ms": Setting(
        300_000, _int_in(1), "a member not calling getmany() this long leaves the group"
    ),
    "partition_assignment_strategy": Setting(
        (RANGE, COOPERATIVE_STICKY), _strategies, "assignors, in order of preference"
    ),
    "enable_auto_commit": Setting(True, _bool, "commit positions in the background"),
    "auto_commit_interval_ms": Setting(5_000, _int_in(0), "time between automatic commits"),
    "default_api_timeout_ms": Setting(
        60_000, _int_in(0), "how long commit(), committed() and close() may take"
    ),
    "isolation_level": Setting(
        "read_uncommitted",
        _choice("read_uncommitted", "read_committed"),
        "read_committed stops at the last stable offset",
    ),
    "auto_offset_reset": Setting(
        "latest", _choice("latest", "earliest", "none"), "where to start without a position"
    ),
    "fetch_min_bytes": Setting(1, _int_in(1), "the broker waits for this many bytes"),
    "fetch_max_wait_ms": Setting(500, _int_in(0), "... or for this long"),
    "fetch_max_bytes": Setting(52_428_800, _int_in(1), "bytes per fetch response"),
    "max_partition_fetch_bytes": Setting(1_048_576, _int_in(1), "bytes per partition per fetch"),
    "max_poll_records": Setting(500, _int_in(1), "records per getmany() by default"),
    "check_crcs": Setting(True, _bool, "verify each fetched batch's CRC-32C"),
}


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """The settings every client accepts. Build with `from_kwargs`, never directly."""

    CLIENT: ClassVar[str] = "client"

    explicit: frozenset[str]  # the names the user passed
    security: ConnectionSecurity  # built from the security settings below, files already read
    bootstrap_servers: tuple[tuple[str, int], ...]
    client_id: str
    request_timeout_ms: int
    retry_backoff_ms: int
    retry_backoff_max_ms: int
    metadata_max_age_ms: int
    socket_connection_setup_timeout_ms: int
    security_protocol: SecurityProtocol
    ssl_ca_location: str | None
    ssl_certificate_location: str | None
    ssl_key_location: str | None
    ssl_key_password: str | None
    ssl_endpoint_identification_algorithm: str
    sasl_mechanism: str
    sasl_username: str | None
    sasl_password: str | None

    @classmethod
    def names(cls) -> tuple[str, ...]:
        derived = ("explicit", "security")
        return tuple(f.name for f in dataclasses.fields(cls) if f.name not in derived)

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, object]) -> Any:
        """Check and complete `kwargs` (see the module docstring); returns an instance of cls."""
        names = cls.names()
        for name in kwargs:
            if name not in names:
                raise TypeError(_unknown_message(cls.CLIENT, name, names))
        values: dict[str, Any] = {}
        for name in names:
            setting = SETTINGS[name]
            if name in kwargs:
                values[name] = setting.parse(name, kwargs[name])
            else:
                values[name] = setting.default
        if values["bootstrap_servers"] is None:
            raise ValueError(f'{cls.CLIENT} needs bootstrap_servers="host:port[,host:port...]"')
        explicit = frozenset(kwargs)
        cls._derive(values, explicit)
        return cls(explicit=explicit, security=_connection_security(values), **values)

    @classmethod
    def _derive(cls, values: dict[str, Any], explicit: frozenset[str]) -> None:
        """Check settings against each other and adjust defaults to explicit settings."""


@dataclass(frozen=True, slots=True)
class AdminSettings(ClientSettings):
    CLIENT: ClassVar[str] = "Admin"


@dataclass(frozen=True, slots=True)
class ProducerSettings(ClientSettings):
    CLIENT: ClassVar[str] = "Producer"

    acks: int
    linger_ms: int
    batch_size: int
    compression_type: str
    enable_idempotence: bool
    max_in_flight_requests_per_connection: int
    retries: int
    delivery_timeout_ms: int
    buffer_memory: int
    max_block_ms: int
    max_request_size: int
    transactional_id: str | None
    transaction_timeout_ms: int

    @property
    def compression(self) -> CompressionType:
        """`compression_type` as the codec enum used on the wire."""
        return CompressionType[self.compression_type.upper()]

    @classmethod
    def _derive(cls, values: dict[str, Any], explicit: frozenset[str]) -> None:
        conflicts = []
        if values["acks"] != ACKS_ALL:
            conflicts.append('acks must be "all"')
        if values["max_in_flight_requests_per_connection"] > IDEMPOTENT_IN_FLIGHT_MAX:
            conflicts.append(
                f"max_in_flight_requests_per_connection must be <= {IDEMPOTENT_IN_FLIGHT_MAX}"
            )
        if values["retries"] == 0:
            conflicts.append("retries must be > 0")
        if values["transactional_id"] is not None:
            # As the Java client: a transactional producer is idempotent, and settings that
            # contradict idempotence are errors rather than defaults that give way.
            if not values["transactional_id"]:
                raise ValueError("transactional_id must not be empty")
            if not values["enable_idempotence"]:
                raise ValueError("transactional_id needs enable_idempotence=True")
            if conflicts:
                raise ValueError("transactional_id: " + "; ".join(conflicts))
        if conflicts and values["enable_idempotence"]:
            # As the Java client (3.2+): idempotence on by default gives way to settings that
            # contradict it, but an explicit enable_idempotence=True with them is an error.
            if "enable_idempotence" in explicit:
                raise ValueError("enable_idempotence=True: " + "; ".join(conflicts))
            values["enable_idempotence"] = False
        delivery_floor_ms = values["linger_ms"] + values["request_timeout_ms"]
        if values["delivery_timeout_ms"] < delivery_floor_ms:
            if "delivery_timeout_ms" in explicit:
                raise ValueError(
                    f"delivery_timeout_ms must be >= linger_ms + request_timeout_ms "
                    f"({delivery_floor_ms}), got {values['delivery_timeout_ms']}"
                )
            values["delivery_timeout_ms"] = delivery_floor_ms
        if values["batch_size"] > values["buffer_memory"]:
            raise ValueError(
                f"batch_size ({values['batch_size']}) must not exceed buffer_memory "
                f"({values['buffer_memory']})"
            )


@dataclass(frozen=True, slots=True)
class ConsumerSettings(ClientSettings):
    CLIENT: ClassVar[str] = "Consumer"

    group_id: str | None
    group_instance_id: str | None
    session_timeout_ms: int
    heartbeat_interval_ms: int
    max_poll_interval_ms: int
    partition_assignment_strategy: tuple[str, ...]
    enable_auto_commit: bool
    auto_commit_interval_ms: int
    default_api_timeout_ms: int
    isolation_level: str
    auto_offset_reset: str
    fetch_min_bytes: int
    fetch_max_wait_ms: int
    fetch_max_bytes: int
    max_partition_fetch_bytes: int
    max_poll_records: int
    check_crcs: bool

    @property
    def isolation_level_code(self) -> int:
        """The wire value of isolation.level: 0 read_uncommitted, 1 read_committed."""
        return 1 if self.isolation_level == "read_committed" else 0

    @classmethod
    def _derive(cls, values: dict[str, Any], explicit: frozenset[str]) -> None:
        if values["group_id"] is None:
            # As the Java client: without a group, nothing can be committed automatically; the
            # default gives way, an explicit enable_auto_commit=True is an error.
            if values["enable_auto_commit"] and "enable_auto_commit" in explicit:
                raise ValueError("enable_auto_commit=True needs a group_id")
            values["enable_auto_commit"] = False
            if values["group_instance_id"] is not None:
                raise ValueError("group_instance_id needs a group_id")
        elif not values["group_id"]:
            raise ValueError("group_id must not be empty")
        if values["heartbeat_interval_ms"] >= values["session_timeout_ms"]:
            raise ValueError(
                f"heartbeat_interval_ms ({values['heartbeat_interval_ms']}) must be lower than "
                f"session_timeout_ms ({values['session_timeout_ms']})"
            )


def _unknown_message(client: str, name: str, names: tuple[str, ...]) -> str:
    underscored = name.replace(".", "_").replace("-", "_")
    close = [underscored] if underscored in names else []
    close = close or difflib.get_close_matches(underscored, names, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{client} got an unknown setting {name!r}{hint}"


def _connection_security(values: Mapping[str, Any]) -> ConnectionSecurity:
    """TLS context and SASL credentials from the settings; a ValueError names the problem."""
    protocol: SecurityProtocol = values["security_protocol"]
    sasl = None
    if protocol.uses_sasl:
        if values["sasl_username"] is None or values["sasl_password"] is None:
            raise ValueError(
                f"security_protocol={protocol.value.lower()} needs sasl_username and sasl_password"
            )
        sasl = SaslCredentials(
            values["sasl_mechanism"], values["sasl_username"], values["sasl_password"]
        )
    files = TlsFiles(
        keystore_location=values["ssl_certificate_location"],
        key_password=values["ssl_key_password"],
        truststore_location=values["ssl_ca_location"],
        key_location=values["ssl_key_location"],
    )
    check_hostname = values["ssl_endpoint_identification_algorithm"] == "https"
    try:
        return connection_security(protocol, files, check_hostname=check_hostname, sasl=sasl)
    except TlsConfigError as error:
        # The broker's names in the message would confuse a client's user: name ours.
        client_names = {
            "ssl.keystore.location": "ssl_certificate_location",
            "ssl.truststore.location": "ssl_ca_location",
        }
        raise ValueError(
            str(error).replace(error.key, client_names.get(error.key, error.key))
        ) from None
