"""Where cluster metadata lives in ZooKeeper, and the one place its JSON is encoded and decoded.

Modelled on Apache Kafka's ZooKeeper layout before KRaft, so the tree reads familiarly to anyone
who has run Kafka (paths are relative to the chroot of the connect string):

| Path                                         | Mode       | Data                 | Written by    |
|----------------------------------------------|------------|----------------------|---------------|
| /cluster/id                                  | persistent | cluster id           | first broker  |
| /brokers/ids/<broker id>                     | ephemeral  | BrokerRegistration   | its broker    |
| /brokers/topics/<topic>                      | persistent | TopicAssignment      | create topic  |
| /brokers/topics/<topic>/partitions/<p>/state | persistent | PartitionState       | create, CAS   |
| /config/topics/<topic>                       | persistent | TopicConfigOverrides | create, alter |
| /config/brokers/<default>                    | persistent | TopicConfigOverrides | alter         |
| /config/users/<sanitized user>               | persistent | TopicConfigOverrides | users CLI     |
| /controller                                  | ephemeral  | controller           | controller    |
| /controller_epoch                            | persistent | epoch                | each election |
| /admin/delete_topics/<topic id>              | persistent | TopicDeletion        | DeleteTopics  |

The data, one JSON object per znode (Kafka's field names and version numbers):

- cluster id: `{"version": "1", "id": "<22-char base64url UUID>"}`
- BrokerRegistration: `{"version": 5, "host": "h", "port": 9092, "endpoints":
  ["PLAINTEXT://h:9092"], "listener_security_protocol_map": {"PLAINTEXT": "PLAINTEXT"},
  "jmx_port": -1, "rack": null, "timestamp": "<ms>"}`; the broker id is the znode name.
- TopicAssignment: `{"version": 3, "topic_id": "<base64url UUID>", "partitions":
  {"0": [1, 2]}, "adding_replicas": {}, "removing_replicas": {}}`; replicas preferred first.
  During a reassignment (KIP-455) a partition's list is the full replica set, target replicas
  first, and `adding_replicas` / `removing_replicas` name what is moving (e.g. `{"0": [3]}`).
- PartitionState: `{"version": 1, "leader": 1, "leader_epoch": 0, "isr": [1, 2],
  "controller_epoch": 1}`; rewritten only conditionally on the znode version.
- TopicConfigOverrides: `{"version": 1, "config": {"retention.ms": "86400000"}}` (overrides only);
  the same shape holds the cluster-wide dynamic broker configs (Kafka's default broker entity,
  e.g. `follower.replication.throttled.rate`).
- user configs: the same shape, holding the user's SCRAM credentials under their mechanism names
  (Kafka's format, riverbed.security.credentials): `{"version": 1, "config": {"SCRAM-SHA-512":
  "salt=<b64>,stored_key=<b64>,server_key=<b64>,iterations=4096"}}`. The znode is named by
  Kafka's `Sanitizer.sanitize` (URL-encoding: `alice@example.com` -> `alice%40example.com`);
  Kafka also keeps user quotas there, which are left as they are.
- controller: `{"version": 1, "brokerid": 1, "timestamp": "<ms>"}`.
- epoch: the decimal string, e.g. `7`; bumped with a version check in the election transaction.
- TopicDeletion: `{"version": 1, "topic": "orders", "replicas": [1, 2, 3]}`: the durable intent
  of a DeleteTopics (Kafka's `/admin/delete_topics` marker), written before the topic's znodes are
  deleted and named by the topic *id*, since the name may be created again at once. A broker
  deletes a local log only when a marker names the log's own topic id (its `partition.metadata`),
  then takes itself out of `replicas`; the last one deletes the marker. A controller elected
  while a marker's topic still exists finishes that deletion.

A topic's assignment, partition states and config overrides are created and deleted together in
one ZooKeeper transaction, so no reader ever sees half a topic. Topic ids are Kafka's: a random
UUID printed as URL-safe base64 without padding.

Decoding is strict: a znode that is not what this table says raises MalformedZnodeError naming
the path and the field, rather than surfacing as a KeyError far away.

ACLs (`/kafka-acl`, `/kafka-acl-extended`, their change notifications) are not cluster metadata:
their paths and JSON live in riverbed.security.acl_layout.
"""

from __future__ import annotations

import json
import re
import urllib.parse
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from riverbed.common.uuids import decode_uuid, encode_uuid

CLUSTER_ID_PATH: Final = "/cluster/id"
BROKER_IDS_PATH: Final = "/brokers/ids"
BROKER_TOPICS_PATH: Final = "/brokers/topics"
CONFIG_TOPICS_PATH: Final = "/config/topics"
CONFIG_BROKERS_PATH: Final = "/config/brokers"
CONFIG_USERS_PATH: Final = "/config/users"
# Kafka's name for the entity of cluster-wide dynamic broker configs.
BROKER_DEFAULT_CONFIG_PATH: Final = f"{CONFIG_BROKERS_PATH}/<default>"
CONTROLLER_PATH: Final = "/controller"
CONTROLLER_EPOCH_PATH: Final = "/controller_epoch"
DELETE_TOPICS_PATH: Final = "/admin/delete_topics"
# Created once at startup so that children watches and creates below them always have a parent.
PERSISTENT_PATHS: Final = (
    BROKER_IDS_PATH,
    BROKER_TOPICS_PATH,
    CONFIG_TOPICS_PATH,
    CONFIG_BROKERS_PATH,
    DELETE_TOPICS_PATH,
)

BROKER_REGISTRATION_VERSION: Final = 5
TOPIC_ASSIGNMENT_VERSION: Final = 3
PARTITION_STATE_VERSION: Final = 1
TOPIC_CONFIG_VERSION: Final = 1
TOPIC_DELETION_VERSION: Final = 1
CONTROLLER_VERSION: Final = 1

# Kafka's rule (org.apache.kafka.common.internals.Topic): the name is also a file name.
TOPIC_NAME_LENGTH_MAX: Final = 249
_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]+")
NO_LEADER: Final = -1


class MalformedZnodeError(ValueError):
    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"malformed znode {path}: {reason}")
        self.path = path


def topic_name_error(name: str) -> str | None:
    """Why `name` is not a legal topic name, or None if it is."""
    if not name:
        return "topic name is empty"
    if name in (".", ".."):
        return f"topic name cannot be {name!r}"
    if len(name) > TOPIC_NAME_LENGTH_MAX:
        return f"topic name is {len(name)} characters long; the maximum is {TOPIC_NAME_LENGTH_MAX}"
    if not _TOPIC_NAME.fullmatch(name):
        return f"topic name {name!r} has characters outside [a-zA-Z0-9._-]"
    return None


# ---- paths ----------------------------------------------------------------------------------


def broker_path(broker_id: int) -> str:
    return f"{BROKER_IDS_PATH}/{broker_id}"


def topic_path(topic: str) -> str:
    return f"{BROKER_TOPICS_PATH}/{topic}"


def partitions_path(topic: str) -> str:
    return f"{topic_path(topic)}/partitions"


def partition_path(topic: str, partition: int) -> str:
    return f"{partitions_path(topic)}/{partition}"


def partition_state_path(topic: str, partition: int) -> str:
    return f"{partition_path(topic, partition)}/state"


def is_topic_path(path: str) -> bool:
    """Whether `path` is a topic's znode (`/brokers/topics/<topic>`)."""
    prefix = f"{BROKER_TOPICS_PATH}/"
    return path.startswith(prefix) and "/" not in path[len(prefix) :]


def parse_partition_state_path(path: str) -> tuple[str, int] | None:
    """(topic, partition) of a partition state znode's path; None for any other path."""
    prefix = f"{BROKER_TOPICS_PATH}/"
    if not path.startswith(prefix) or not path.endswith("/state"):
        return None
    parts = path[len(prefix) : -len("/state")].split("/")
    if len(parts) != 3 or parts[1] != "partitions" or not parts[2].isdigit():
        return None
    return parts[0], int(parts[2])


def topic_config_path(topic: str) -> str:
    return f"{CONFIG_TOPICS_PATH}/{topic}"


def topic_deletion_path(topic_id: uuid.UUID) -> str:
    return f"{DELETE_TOPICS_PATH}/{encode_uuid(topic_id)}"


def user_config_path(user: str) -> str:
    return f"{CONFIG_USERS_PATH}/{sanitize_entity_name(user)}"


# ---- entity names (Kafka's org.apache.kafka.common.utils.Sanitizer) -------------------------

# What Java's URLEncoder leaves alone, minus '*' (Kafka turns it into %2A for JMX); a space, which
# URLEncoder writes as '+', becomes %20. Everything else is percent-encoded UTF-8, upper-case hex.
_ENTITY_NAME_SAFE: Final = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_"
)
_PERCENT_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")


def sanitize_entity_name(name: str) -> str:
    """A user (or client id) as Kafka names its znode: `alice@x` -> `alice%40x`."""
    return "".join(
        char if char in _ENTITY_NAME_SAFE else "".join(f"%{b:02X}" for b in char.encode())
        for char in name
    )


def desanitize_entity_name(text: str) -> str:
    """The inverse, as Java's URLDecoder reads it ('+' is a space); a ValueError for a stray '%'
    or bytes that are not UTF-8."""
    if text.count("%") != len(_PERCENT_ESCAPE.findall(text)):
        raise ValueError(f"{text!r} has a '%' that does not start a %XX escape")
    try:
        return urllib.parse.unquote_plus(text, errors="strict")
    except UnicodeDecodeError:
        raise ValueError(f"{text!r} does not decode to UTF-8 text") from None


# ---- records --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    """A live broker: its advertised listeners (`LISTENER://host:port`) and what each speaks.

    `host`/`port` repeat the first endpoint (Kafka keeps its PLAINTEXT endpoint there); readers
    look endpoints up by the listener name a connection came in on (`endpoint`)."""

    broker_id: int  # from the znode name, not stored in the JSON (as in Kafka)
    host: str
    port: int
    endpoints: tuple[str, ...] = ()  # "LISTENER://host:port"; () means PLAINTEXT://host:port
    rack: str | None = None
    timestamp_ms: int = 0
    # listener name -> security protocol; a listener missing here speaks PLAINTEXT
    security_protocols: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if self.broker_id < 0:
            raise ValueError(f"broker id must be >= 0, got {self.broker_id}")
        if not 0 < self.port < 65536:
            raise ValueError(f"broker port must be in 1..65535, got {self.port}")
        if not self.endpoints:  # frozen: normalised once, so encode/decode round-trips
            object.__setattr__(self, "endpoints", (f"PLAINTEXT://{self.host}:{self.port}",))
        protocols = {name: self.security_protocols.get(name, "PLAINTEXT") for name in self._names()}
        object.__setattr__(self, "security_protocols", protocols)

    def _names(self) -> list[str]:
        return [endpoint.split("://", 1)[0] for endpoint in self.endpoints]

    def endpoint(self, listener: str) -> tuple[str, int] | None:
        """Host and port of `listener` on this broker; None if it has no such listener."""
        for endpoint in self.endpoints:
            name, _, address = endpoint.partition("://")
            if name == listener:
                host, _, port = address.rpartition(":")
                return host, int(port)
        return None

    def encode(self) -> bytes:
        return _dump(
            {
                "version": BROKER_REGISTRATION_VERSION,
                "host": self.host,
                "port": self.port,
                "endpoints": list(self.endpoints),
                "listener_security_protocol_map": dict(self.security_protocols),
                "jmx_port": -1,
                "rack": self.rack,
                "timestamp": str(self.timestamp_ms),
            }
        )

    @classmethod
    def decode(cls, broker_id: int, data: bytes) -> BrokerRegistration:
        path = broker_path(broker_id)
        fields = _Fields.load(path, data)
        rack = fields.get("rack")
        if rack is not None and not isinstance(rack, str):
            raise MalformedZnodeError(path, "field 'rack' must be a string or null")
        try:
            return cls(
                broker_id=broker_id,
                host=fields.string("host"),
                port=fields.integer("port"),
                endpoints=tuple(fields.string_list("endpoints")),
                rack=rack,
                timestamp_ms=fields.decimal_string("timestamp"),
                security_protocols=fields.string_map("listener_security_protocol_map"),
            )
        except ValueError as error:
            if isinstance(error, MalformedZnodeError):
                raise
            raise MalformedZnodeError(path, str(error)) from error


@dataclass(frozen=True, slots=True)
class TopicAssignment:
    topic_id: uuid.UUID
    partitions: Mapping[int, tuple[int, ...]]  # partition -> replica broker ids, preferred first
    # A reassignment in progress (KIP-455): `partitions` holds the full replica set, target
    # replicas first; these name the ones being added (not yet in sync) and being removed.
    adding: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    removing: Mapping[int, tuple[int, ...]] = field(default_factory=dict)

    def encode(self) -> bytes:
        return _dump(
            {
                "version": TOPIC_ASSIGNMENT_VERSION,
                "topic_id": encode_uuid(self.topic_id),
                "partitions": _partition_lists(self.partitions),
                "adding_replicas": _partition_lists(self.adding),
                "removing_replicas": _partition_lists(self.removing),
            }
        )

    @classmethod
    def decode(cls, topic: str, data: bytes) -> TopicAssignment:
        path = topic_path(topic)
        fields = _Fields.load(path, data)
        partitions = _decode_partition_lists(path, "partitions", fields.get("partitions"))
        if not partitions:
            raise MalformedZnodeError(path, "field 'partitions' must be a non-empty object")
        if sorted(partitions) != list(range(len(partitions))):
            raise MalformedZnodeError(path, "partitions must be numbered 0..n-1")
        # Absent in assignments written before reassignments existed (Kafka's version 1).
        adding = _decode_partition_lists(path, "adding_replicas", fields.get("adding_replicas", {}))
        removing = _decode_partition_lists(
            path, "removing_replicas", fields.get("removing_replicas", {})
        )
        for key, moving in (*adding.items(), *removing.items()):
            if key not in partitions or not set(moving) <= set(partitions[key]):
                raise MalformedZnodeError(path, f"partition {key} moves replicas it does not have")
        try:
            topic_id = decode_uuid(fields.string("topic_id"))
        except ValueError as error:
            raise MalformedZnodeError(path, str(error)) from error
        return cls(topic_id=topic_id, partitions=partitions, adding=adding, removing=removing)


@dataclass(frozen=True, slots=True)
class PartitionState:
    leader: int  # NO_LEADER (-1) when none
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int

    def encode(self) -> bytes:
        return _dump(
            {
                "version": PARTITION_STATE_VERSION,
                "leader": self.leader,
                "leader_epoch": self.leader_epoch,
                "isr": list(self.isr),
                "controller_epoch": self.controller_epoch,
            }
        )

    @classmethod
    def decode(cls, path: str, data: bytes) -> PartitionState:
        fields = _Fields.load(path, data)
        return cls(
            leader=fields.integer("leader"),
            leader_epoch=fields.integer("leader_epoch"),
            isr=tuple(fields.integer_list("isr")),
            controller_epoch=fields.integer("controller_epoch"),
        )


@dataclass(frozen=True, slots=True)
class TopicConfigOverrides:
    config: Mapping[str, str] = field(default_factory=dict)

    def encode(self) -> bytes:
        return _dump({"version": TOPIC_CONFIG_VERSION, "config": dict(sorted(self.config.items()))})

    @classmethod
    def decode(cls, topic: str, data: bytes) -> TopicConfigOverrides:
        return cls.decode_at(topic_config_path(topic), data)

    @classmethod
    def decode_at(cls, path: str, data: bytes) -> TopicConfigOverrides:
        raw = _Fields.load(path, data).get("config")
        if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
            raise MalformedZnodeError(path, "field 'config' must be an object of strings")
        return cls(config=dict(raw))


@dataclass(frozen=True, slots=True)
class TopicDeletion:
    """A DeleteTopics not yet carried out by every broker that held a replica of the topic."""

    topic_id: uuid.UUID
    topic: str
    replicas: frozenset[int]

    def encode(self) -> bytes:
        replicas = sorted(self.replicas)
        return _dump({"version": TOPIC_DELETION_VERSION, "topic": self.topic, "replicas": replicas})

    @classmethod
    def decode(cls, topic_id: uuid.UUID, data: bytes) -> TopicDeletion:
        fields = _Fields.load(topic_deletion_path(topic_id), data)
        return cls(topic_id, fields.string("topic"), frozenset(fields.integer_list("replicas")))


def encode_controller(broker_id: int, timestamp_ms: int) -> bytes:
    return _dump(
        {"version": CONTROLLER_VERSION, "brokerid": broker_id, "timestamp": str(timestamp_ms)}
    )


def decode_controller(data: bytes) -> int:
    """The controller's broker id."""
    return _Fields.load(CONTROLLER_PATH, data).integer("brokerid")


def encode_controller_epoch(epoch: int) -> bytes:
    return str(epoch).encode("ascii")


def decode_controller_epoch(data: bytes) -> int:
    text = data.decode("ascii", errors="replace").strip()
    if not text.isdigit():
        raise MalformedZnodeError(CONTROLLER_EPOCH_PATH, f"expected a decimal epoch, got {text!r}")
    return int(text)


def encode_cluster_id(cluster_id: str) -> bytes:
    return _dump({"version": "1", "id": cluster_id})


def decode_cluster_id(data: bytes) -> str:
    return _Fields.load(CLUSTER_ID_PATH, data).string("id")


# ---- strict JSON helpers --------------------------------------------------------------------


def _dump(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode("utf-8")


def _partition_lists(lists: Mapping[int, tuple[int, ...]]) -> dict[str, list[int]]:
    return {str(p): list(replicas) for p, replicas in sorted(lists.items())}


def _decode_partition_lists(path: str, key: str, value: object) -> dict[int, tuple[int, ...]]:
    if not isinstance(value, dict):
        raise MalformedZnodeError(path, f"field {key!r} must be an object")
    lists: dict[int, tuple[int, ...]] = {}
    for partition, replicas in value.items():
        if not partition.isdigit():
            raise MalformedZnodeError(path, f"partition key {partition!r} is not a number")
        lists[int(partition)] = tuple(_int_list(path, f"{key}.{partition}", replicas))
    return lists


def _int_list(path: str, key: str, value: object) -> list[int]:
    if not isinstance(value, list) or not all(_is_int(item) for item in value):
        raise MalformedZnodeError(path, f"field {key!r} must be a list of integers")
    return list(value)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _Fields:
    """A decoded JSON object that names the znode and the field in every error."""

    def __init__(self, path: str, values: dict[str, object]) -> None:
        self.path = path
        self.values = values

    @classmethod
    def load(cls, path: str, data: bytes) -> _Fields:
        try:
            values = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise MalformedZnodeError(path, f"not JSON ({error})") from error
        if not isinstance(values, dict):
            raise MalformedZnodeError(path, "expected a JSON object")
        return cls(path, values)

    def get(self, key: str, default: object = None) -> object:
        return self.values.get(key, default)

    def integer(self, key: str) -> int:
        value = self.values.get(key)
        if not isinstance(value, int) or isinstance(value, bool):
            raise MalformedZnodeError(self.path, f"field {key!r} must be an integer, got {value!r}")
        return value

    def string(self, key: str) -> str:
        value = self.values.get(key)
        if not isinstance(value, str):
            raise MalformedZnodeError(self.path, f"field {key!r} must be a string, got {value!r}")
        return value

    def decimal_string(self, key: str) -> int:
        value = self.string(key)
        if not value.isdigit():
            raise MalformedZnodeError(self.path, f"field {key!r} must be decimal, got {value!r}")
        return int(value)

    def integer_list(self, key: str) -> list[int]:
        return _int_list(self.path, key, self.values.get(key))

    def string_map(self, key: str) -> dict[str, str]:
        """A JSON object of strings; an absent key is an empty map (older registrations)."""
        value = self.values.get(key, {})
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise MalformedZnodeError(self.path, f"field {key!r} must be an object of strings")
        return dict(value)

    def string_list(self, key: str) -> list[str]:
        value = self.values.get(key)
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise MalformedZnodeError(self.path, f"field {key!r} must be a list of strings")
        return list(value)
