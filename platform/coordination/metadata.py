"""Writes of cluster metadata to ZooKeeper: broker registration, controller election, topics.

Every multi-znode change is one ZooKeeper transaction, and every change that must not overwrite
a concurrent one is conditional on a znode version; reads for the serving path come from the
watch-driven MetadataCache instead (see metadata_cache.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final, Protocol

from riverbed.common.uuids import decode_uuid, encode_uuid
from riverbed.coordination import layout
from riverbed.coordination.assignment import (
    assign_added_replicas,
    assign_replicas,
    check_manual_replicas,
)
from riverbed.coordination.layout import (
    BrokerRegistration,
    PartitionState,
    TopicAssignment,
    TopicConfigOverrides,
)
from riverbed.coordination.zk import (
    AsyncZooKeeper,
    BadVersionError,
    CheckOp,
    CreateOp,
    DeleteOp,
    NodeExistsError,
    NodeStat,
    NoNodeError,
    NotEmptyError,
    SetOp,
    TransactionOp,
    ZkError,
)
from riverbed.protocol.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)

# Optimistic-concurrency retries (a concurrent writer bumped a version we read): a few suffice,
# more would mean a livelock worth surfacing.
CONDITIONAL_WRITE_ATTEMPTS_MAX: Final = 5
# A broker restarted within its old session's timeout finds its previous, not yet expired
# registration; like Kafka it waits for that session to expire, at most this many timeouts.
STALE_REGISTRATION_WAIT_SESSIONS_MAX: Final = 2
INITIAL_CONTROLLER_EPOCH: Final = 0
# Partitions one CreatePartitions may add to a topic: they are created in one transaction, two
# znodes each, and ZooKeeper drops a client whose request exceeds its 1 MiB jute.maxbuffer (a
# transaction adding 4,000 partitions to a short-named topic did). With a 249-character topic
# name a partition's two creates take about 700 bytes, so this many stay well below it.
PARTITIONS_ADDED_AT_ONCE_MAX: Final = 1_000
# A topic too large for one such transaction is created (and deleted) in several, each at most
# this many bytes as estimated by `_transaction_chunks`: half the limit, for the estimate's error.
TRANSACTION_BYTES_MAX: Final = 512 * 1024
# What an operation of a multi request costs besides its path and data: its header, flags and,
# for a create, the open ACL (~35 bytes); rounded up.
TRANSACTION_OP_OVERHEAD_BYTES: Final = 64


class BrokerIdConflictError(RuntimeError):
    """Another live session holds this broker id: two brokers were given the same broker.id."""


class ControllerMovedError(RuntimeError):
    """/controller_epoch moved past the version our election left: another broker has been
    elected since, so our controller decisions must not be written (Kafka's
    ControllerMovedException)."""


@dataclass(frozen=True, slots=True)
class PartitionStateUpdate:
    """A controller's new state for one partition, written only over `expected_version`."""

    topic: str
    partition: int
    state: PartitionState
    expected_version: int

    @property
    def path(self) -> str:
        return layout.partition_state_path(self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class AssignmentUpdate:
    """A controller's new replica assignment for a topic (reassignments), written only over
    `expected_version`, in the same transaction as the partition states it goes with."""

    topic: str
    assignment: TopicAssignment
    expected_version: int

    @property
    def path(self) -> str:
        return layout.topic_path(self.topic)


class ConfigRules(Protocol):
    """How config overrides are checked before they are written (riverbed.configs'
    CONFIG_RULES): each returns the canonical overrides or raises a KafkaError naming the bad
    one. The store checks every write with them, so nothing invalid reaches ZooKeeper."""

    def topic(self, configs: Mapping[str, str | None]) -> dict[str, str]: ...

    def dynamic_broker(self, configs: Mapping[str, str | None]) -> dict[str, str]: ...


def _now_ms() -> int:
    return int(time.time() * 1000)


class ClusterMetadataStore:
    """The writes of cluster metadata, over one AsyncZooKeeper session."""

    def __init__(
        self, zk: AsyncZooKeeper, rules: ConfigRules, rng: random.Random | None = None
    ) -> None:
        self.zk = zk
        self._rules = rules
        self.controller_epoch: int | None = None  # the epoch of our last won election
        # The /controller_epoch znode version that election left: controller writes check it.
        self.controller_epoch_version: int | None = None
        self._rng = rng or random.Random()

    async def ensure_layout(self) -> None:
        """Create the persistent parent znodes (idempotent); call once after connecting."""
        for path in layout.PERSISTENT_PATHS:
            await self.zk.ensure_path(path)

    async def ensure_cluster_id(self) -> str:
        """The cluster id; the first broker to ask creates it (a race is settled by ZooKeeper)."""
        try:
            data, _ = await self.zk.get(layout.CLUSTER_ID_PATH)
        except NoNodeError:
            candidate = encode_uuid(uuid.uuid4())
            try:
                await self.zk.create(
                    layout.CLUSTER_ID_PATH, layout.encode_cluster_id(candidate), makepath=True
                )
                return candidate
            except NodeExistsError:
                data, _ = await self.zk.get(layout.CLUSTER_ID_PATH)
        return layout.decode_cluster_id(data)

    # ---- brokers ----------------------------------------------------------------------------

    async def register_broker(self, registration: BrokerRegistration) -> int:
        """Create our ephemeral /brokers/ids/<id> and return the broker epoch (the zxid that
        created it). If a node from an expired session of this broker is still there, wait for
        ZooKeeper to expire it (bounded), as Kafka does."""
        path = layout.broker_path(registration.broker_id)
        data = registration.encode()
        wait_ms = STALE_REGISTRATION_WAIT_SESSIONS_MAX * self.zk.session_timeout_ms
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            created = False
            with contextlib.suppress(NodeExistsError):
                await self.zk.create(path, data, ephemeral=True)
                created = True
            stat = await self.zk.exists(path)
            if stat is None:
                continue  # expired between our create and our check: try again
            if stat.ephemeral_owner == self.zk.session_id:
                if not created:
                    await self.zk.set(path, data)  # ours already (a retried create): refresh it
                return stat.created_zxid
            remaining_ms = (deadline - time.monotonic()) * 1000
            if remaining_ms <= 0:
                raise BrokerIdConflictError(
                    f"broker id {registration.broker_id} is registered by live ZooKeeper "
                    f"session 0x{stat.ephemeral_owner:x} for more than {wait_ms} ms: "
                    "is another broker running with the same broker.id?"
                )
            log.info("waiting for the stale registration at %s to expire", path)
            await self._wait_for_deletion(path, remaining_ms)

    async def deregister_broker(self, broker_id: int) -> None:
        """Remove our registration now (controlled shutdown) rather than at session expiry."""
        path = layout.broker_path(broker_id)
        stat = await self.zk.exists(path)
        if stat is not None and stat.ephemeral_owner == self.zk.session_id:
            await self.zk.delete(path, stat.version)

    async def _wait_for_deletion(self, path: str, timeout_ms: float) -> None:
        gone = asyncio.Event()

        def on_change(data: bytes | None, _stat: object) -> None:
            if data is None:
                gone.set()

        handle = await self.zk.watch_data(path, on_change)
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                await gone.wait()
        except TimeoutError:
            pass  # the caller re-checks and reports
        finally:
            handle.cancel()

    # ---- controller -------------------------------------------------------------------------

    async def elect_controller(self, broker_id: int) -> bool:
        """Try to become controller: create the ephemeral /controller and bump /controller_epoch
        (conditional on its version) in one transaction. True if we are the controller now;
        `self.controller_epoch` and `self.controller_epoch_version` then hold our epoch and the
        /controller_epoch znode version our controller writes are conditional on."""
        for _ in range(CONDITIONAL_WRITE_ATTEMPTS_MAX):
            epoch, epoch_version = await self._read_controller_epoch()
            ops: list[TransactionOp] = [
                CreateOp(layout.CONTROLLER_PATH, layout.encode_controller(broker_id, _now_ms()),
                         ephemeral=True),
                SetOp(layout.CONTROLLER_EPOCH_PATH, layout.encode_controller_epoch(epoch + 1),
                      epoch_version),
            ]  # fmt: skip
            try:
                results = await self.zk.transaction(ops)
            except NodeExistsError:
                return await self._already_controller(broker_id)
            except BadVersionError:
                continue  # another contender bumped the epoch first: re-read
            epoch_stat = results[1]
            if not isinstance(epoch_stat, NodeStat):
                raise TypeError(f"a SetOp yields a NodeStat, got {epoch_stat!r}")
            self.controller_epoch = epoch + 1
            self.controller_epoch_version = epoch_stat.version
            log.info("broker %d is the controller, epoch %d", broker_id, epoch + 1)
            return True
        return False

    async def get_controller(self) -> int | None:
        try:
            data, _ = await self.zk.get(layout.CONTROLLER_PATH)
        except NoNodeError:
            return None
        return layout.decode_controller(data)

    async def _already_controller(self, broker_id: int) -> bool:
        try:
            data, stat = await self.zk.get(layout.CONTROLLER_PATH)
        except NoNodeError:
            return False  # vacant again; the caller's watch will trigger another attempt
        # Ours only if this very session created it (a retried election after connection loss).
        if (
            layout.decode_controller(data) != broker_id
            or stat.ephemeral_owner != self.zk.session_id
        ):
            return False
        # While our /controller exists nobody else can win an election, so the current epoch is
        # the one our transaction wrote.
        self.controller_epoch, self.controller_epoch_version = await self._read_controller_epoch()
        return True

    async def _read_controller_epoch(self) -> tuple[int, int]:
        try:
            data, stat = await self.zk.get(layout.CONTROLLER_EPOCH_PATH)
        except NoNodeError:
            initial = layout.encode_controller_epoch(INITIAL_CONTROLLER_EPOCH)
            with contextlib.suppress(NodeExistsError):  # another contender created it
                await self.zk.create(layout.CONTROLLER_EPOCH_PATH, initial)
            data, stat = await self.zk.get(layout.CONTROLLER_EPOCH_PATH)
        return layout.decode_controller_epoch(data), stat.version

    # ---- topics -----------------------------------------------------------------------------

    async def create_topic(
        self,
        name: str,
        num_partitions: int,
        replication_factor: int,
        configs: Mapping[str, str | None],
        live_broker_ids: Collection[int],
        controller_epoch: int = INITIAL_CONTROLLER_EPOCH,
    ) -> uuid.UUID:
        """Create a topic: assignment, partition states (leader = first replica, ISR = replicas,
        leader epoch 0) and config overrides in one transaction. Returns the new topic id.

        A topic whose znodes exceed one transaction (thousands of partitions) is created in
        several, the assignment first: brokers show a topic only once every partition state is
        there, so readers never see half of it. If a later transaction fails, what was created
        is deleted again (best effort; a ZooKeeper gone meanwhile leaves a topic that no broker
        shows, which DeleteTopics or a new CreateTopics of the name reports)."""
        self.check_new_topic(name, num_partitions, replication_factor, live_broker_ids)
        overrides = self._rules.topic(configs)
        topic_id = uuid.uuid4()
        replicas = assign_replicas(live_broker_ids, num_partitions, replication_factor, self._rng)
        ops = _create_topic_ops(name, topic_id, replicas, overrides, controller_epoch)
        first, *rest = _transaction_chunks(ops, len(self.zk.chroot))
        try:
            await self.zk.transaction(first)
        except NodeExistsError as error:
            message = f"topic {name!r} already exists"
            raise KafkaError(ErrorCode.TOPIC_ALREADY_EXISTS, message) from error
        try:
            for chunk in rest:
                await self.zk.transaction(chunk)
        except ZkError:
            with contextlib.suppress(ZkError, KafkaError):
                await self.delete_topic(name)
            raise
        return topic_id

    @staticmethod
    def check_new_topic(
        name: str, num_partitions: int, replication_factor: int, live_broker_ids: Collection[int]
    ) -> None:
        """The checks of create_topic that need no ZooKeeper (CreateTopics' validate_only):
        raises KafkaError INVALID_TOPIC_EXCEPTION / INVALID_PARTITIONS /
        INVALID_REPLICATION_FACTOR."""
        name_error = layout.topic_name_error(name)
        if name_error is not None:
            raise KafkaError(ErrorCode.INVALID_TOPIC_EXCEPTION, name_error)
        if num_partitions < 1:
            message = f"number of partitions must be >= 1, got {num_partitions}"
            raise KafkaError(ErrorCode.INVALID_PARTITIONS, message)
        live_count = len(set(live_broker_ids))
        if not 1 <= replication_factor <= live_count:
            raise KafkaError(
                ErrorCode.INVALID_REPLICATION_FACTOR,
                f"replication factor {replication_factor} must be between 1 and the number "
                f"of live brokers ({live_count})",
            )

    async def add_partitions(
        self,
        name: str,
        count: int,
        live_broker_ids: Collection[int],
        manual: Sequence[Sequence[int]] | None = None,
        *,
        validate_only: bool = False,
        controller_epoch: int = INITIAL_CONTROLLER_EPOCH,
    ) -> dict[int, tuple[int, ...]]:
        """Raise the topic's partition count to `count` (Kafka's CreatePartitions): its
        assignment rewritten, conditional on the version it was read at, and each new
        partition's znodes created as create_topic creates them, in one transaction. The new
        partitions' replicas are `manual` (one list per new partition, checked), else placed on
        `live_broker_ids` continuing the topic's round robin, as many as partition 0 has.
        Returns them, partition -> replicas (only checked and placed with `validate_only`).

        Raises KafkaError UNKNOWN_TOPIC_OR_PARTITION, INVALID_PARTITIONS (not an increase),
        REASSIGNMENT_IN_PROGRESS (the assignment is being rewritten by a move: Kafka refuses
        too), INVALID_REPLICA_ASSIGNMENT (a bad `manual`) or INVALID_REPLICATION_FACTOR (fewer
        live brokers than partition 0 has replicas)."""
        path = layout.topic_path(name)
        for _ in range(CONDITIONAL_WRITE_ATTEMPTS_MAX):
            try:
                data, stat = await self.zk.get(path)
            except NoNodeError as error:
                raise _unknown_topic(name) from error
            assignment = TopicAssignment.decode(name, data)
            added = _added_partitions(name, assignment, count, live_broker_ids, manual)
            if validate_only:
                return added
            grown = replace(assignment, partitions={**assignment.partitions, **added})
            ops: list[TransactionOp] = [SetOp(path, grown.encode(), stat.version)]
            ops.extend(_partition_ops(name, added, controller_epoch))
            try:
                await self.zk.transaction(ops)
            except BadVersionError:
                continue  # changed under us (a move started, partitions added): decide again
            except NoNodeError as error:
                raise _unknown_topic(name) from error  # deleted meanwhile
            except NodeExistsError as error:
                raise KafkaError(
                    ErrorCode.UNKNOWN_SERVER_ERROR,
                    f"{error.path} exists already, though the assignment of {name!r} does "
                    "not name its partition",
                ) from error
            return added
        raise KafkaError(ErrorCode.UNKNOWN_SERVER_ERROR, f"{path} kept changing")

    async def delete_topic(self, name: str, topic_id: uuid.UUID | None = None) -> uuid.UUID:
        """Delete a topic: first the durable intent (layout.TopicDeletion, which alone lets a
        broker delete the topic's local logs), then its assignment, partition states and config
        overrides in one transaction (a topic too large for one: its partitions' znodes first,
        in as many as needed, then the rest conditionally, so the topic is gone only once its
        last transaction commits). With `topic_id`, only the topic of that id: the controller
        finishing a marker's deletion must not delete a topic created again under the name.
        Returns the deleted topic's id."""
        for _ in range(CONDITIONAL_WRITE_ATTEMPTS_MAX):
            try:
                data, stat = await self.zk.get(layout.topic_path(name))
                partitions = await self._partition_children(name)
            except NoNodeError:
                break
            assignment = TopicAssignment.decode(name, data)
            if topic_id is not None and assignment.topic_id != topic_id:
                break
            await self._mark_for_deletion(name, assignment)
            config_exists = await self.zk.exists(layout.topic_config_path(name)) is not None
            ops = _delete_topic_ops(name, partitions, stat.version, config_exists)
            try:
                for chunk in _transaction_chunks(ops, len(self.zk.chroot)):
                    await self.zk.transaction(chunk)
            except (BadVersionError, NoNodeError, NotEmptyError):
                continue  # changed under us (partitions added, deleted concurrently): re-read
            return assignment.topic_id
        raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")

    async def _mark_for_deletion(self, name: str, assignment: TopicAssignment) -> None:
        replicas = frozenset(b for replicas in assignment.partitions.values() for b in replicas)
        marker = layout.TopicDeletion(assignment.topic_id, name, replicas)
        # An earlier attempt (or a controller before this one) may have written it already.
        with contextlib.suppress(NodeExistsError):
            await self.zk.create(layout.topic_deletion_path(assignment.topic_id), marker.encode())

    async def topic_deletions(self) -> list[layout.TopicDeletion]:
        """The DeleteTopics that some broker has not carried out yet."""
        markers = []
        for child in await self.zk.get_children(layout.DELETE_TOPICS_PATH):
            try:
                topic_id = decode_uuid(child)
            except ValueError:
                log.warning("ignoring %s/%s: not a topic id", layout.DELETE_TOPICS_PATH, child)
                continue
            try:
                data, _ = await self.zk.get(layout.topic_deletion_path(topic_id))
            except NoNodeError:
                continue  # finished meanwhile
            markers.append(layout.TopicDeletion.decode(topic_id, data))
        return markers

    async def finish_topic_deletion(self, topic_id: uuid.UUID, broker_id: int) -> None:
        """`broker_id` has deleted its logs of the topic: take it out of the marker, and delete
        the marker once no broker is left in it (conditional writes: brokers finish at once)."""
        path = layout.topic_deletion_path(topic_id)
        for _ in range(CONDITIONAL_WRITE_ATTEMPTS_MAX):
            try:
                data, stat = await self.zk.get(path)
                marker = layout.TopicDeletion.decode(topic_id, data)
                left = marker.replicas - {broker_id}
                if left == marker.replicas:
                    return
                if left:
                    await self.zk.set(path, replace(marker, replicas=left).encode(), stat.version)
                else:
                    await self.zk.delete(path, stat.version)
                return
            except NoNodeError:
                return
            except BadVersionError:
                continue
        raise KafkaError(ErrorCode.UNKNOWN_SERVER_ERROR, f"{path} kept changing")

    async def set_topic_config(self, name: str, configs: Mapping[str, str | None]) -> None:
        """Replace the topic's config overrides (validated) with `configs`."""
        await self.update_topic_config(name, lambda _current: configs)

    async def update_topic_config(
        self,
        name: str,
        change: Callable[[Mapping[str, str]], Mapping[str, str | None]],
        *,
        validate_only: bool = False,
    ) -> dict[str, str]:
        """Read-modify-write of a topic's overrides: `change(current)` gives the new ones.

        The write is conditional on the config znode's version (and on the topic existing), so
        two brokers changing one topic at once never lose a change: the loser re-reads and
        re-applies its change. Returns the validated overrides (written unless `validate_only`).
        """
        try:
            return await self._update_config(
                layout.topic_config_path(name),
                change,
                self._rules.topic,
                validate_only=validate_only,
                must_exist=layout.topic_path(name),
            )
        except NoNodeError as error:
            raise KafkaError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist"
            ) from error

    async def update_broker_default_config(
        self,
        change: Callable[[Mapping[str, str]], Mapping[str, str | None]],
        *,
        validate_only: bool = False,
    ) -> dict[str, str]:
        """Read-modify-write of the cluster-wide dynamic broker configs, like a topic's."""
        return await self._update_config(
            layout.BROKER_DEFAULT_CONFIG_PATH,
            change,
            self._rules.dynamic_broker,
            validate_only=validate_only,
        )

    async def _update_config(
        self,
        config_path: str,
        change: Callable[[Mapping[str, str]], Mapping[str, str | None]],
        validate: Callable[[Mapping[str, str | None]], dict[str, str]],
        *,
        validate_only: bool,
        must_exist: str | None = None,
    ) -> dict[str, str]:
        """Raises zk.NoNodeError if `must_exist` does not."""
        checks: list[TransactionOp] = [] if must_exist is None else [CheckOp(must_exist, -1)]
        for _ in range(CONDITIONAL_WRITE_ATTEMPTS_MAX):
            try:
                data, stat = await self.zk.get(config_path)
                current = TopicConfigOverrides.decode_at(config_path, data).config
                version: int | None = stat.version
            except NoNodeError:
                current, version = {}, None
            overrides = validate(change(current))
            if validate_only:
                return overrides
            encoded = TopicConfigOverrides(overrides).encode()
            write: TransactionOp = (
                CreateOp(config_path, encoded)
                if version is None
                else SetOp(config_path, encoded, version)
            )
            try:
                await self.zk.transaction([*checks, write])
                return overrides
            except NoNodeError as error:
                if error.path == must_exist:
                    raise
            except (NodeExistsError, BadVersionError):
                pass  # changed concurrently: read again and re-apply
        raise KafkaError(ErrorCode.UNKNOWN_SERVER_ERROR, f"{config_path} kept changing")

    async def read_partition_state(
        self, topic: str, partition: int
    ) -> tuple[PartitionState, NodeStat]:
        """The partition's state and its znode's stat (version, and zxid of the last write)."""
        path = layout.partition_state_path(topic, partition)
        data, stat = await self.zk.get(path)
        return PartitionState.decode(path, data), stat

    async def read_partition_states(
        self, keys: Sequence[tuple[str, int]]
    ) -> list[tuple[PartitionState, int] | None]:
        """The states of many partitions and their znode versions, read in multiRead batches;
        None for a partition without a state (its topic deleted). A malformed state raises
        MalformedZnodeError."""
        paths = [layout.partition_state_path(topic, index) for topic, index in keys]
        found = await self.zk.get_many(paths)
        return [
            None if result is None else (PartitionState.decode(path, result[0]), result[1].version)
            for path, result in zip(paths, found, strict=True)
        ]

    async def write_leader_states(self, updates: Sequence[PartitionStateUpdate]) -> list[int]:
        """A leader's ISR changes of several partitions in one transaction, each conditional on
        its znode's version; the new versions, in order. On failure nothing is written:
        zk.BadVersionError / zk.NoNodeError name the znode that changed or went away."""
        results = await self.zk.transaction(
            [SetOp(u.path, u.state.encode(), u.expected_version) for u in updates]
        )
        return [_stat_of(result).version for result in results]

    async def write_partition_states(
        self,
        updates: Sequence[PartitionStateUpdate],
        controller_epoch_version: int,
        assignments: Sequence[AssignmentUpdate] = (),
    ) -> list[int]:
        """The controller's write: all `updates` (and `assignments`) in one transaction, each
        conditional on its znode's version, and only while /controller_epoch is still at
        `controller_epoch_version` (our election's). Returns the new state znode versions, in
        order.

        On failure nothing is written: ControllerMovedError if another controller was elected
        since; zk.BadVersionError / zk.NoNodeError whose `.path` names the znode that changed
        (a leader's ISR write: re-read, decide again) or went away (topic deleted)."""
        epoch_check = CheckOp(layout.CONTROLLER_EPOCH_PATH, controller_epoch_version)
        ops: list[TransactionOp] = [epoch_check]
        ops.extend(SetOp(u.path, u.state.encode(), u.expected_version) for u in updates)
        ops.extend(SetOp(a.path, a.assignment.encode(), a.expected_version) for a in assignments)
        try:
            results = await self.zk.transaction(ops)
        except (BadVersionError, NoNodeError) as error:
            if error.path == epoch_check.path:
                raise ControllerMovedError(
                    f"/controller_epoch is past version {controller_epoch_version}: "
                    "another controller was elected"
                ) from error
            raise
        return [_stat_of(result).version for result in results[1 : 1 + len(updates)]]

    async def _partition_children(self, name: str) -> list[int] | None:
        """The partition numbers under the topic, None without a `partitions` znode."""
        try:
            children = await self.zk.get_children(layout.partitions_path(name))
        except NoNodeError:
            return None
        return sorted(int(child) for child in children if child.isdigit())


def _stat_of(result: object) -> NodeStat:
    if not isinstance(result, NodeStat):
        raise TypeError(f"a SetOp yields a NodeStat, got {result!r}")
    return result


def _unknown_topic(name: str) -> KafkaError:
    return KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")


def _added_partitions(
    name: str,
    assignment: TopicAssignment,
    count: int,
    live_broker_ids: Collection[int],
    manual: Sequence[Sequence[int]] | None,
) -> dict[int, tuple[int, ...]]:
    """add_partitions' decision: the new partitions' replicas, or the KafkaError refusing."""
    if assignment.adding or assignment.removing:
        moving = sorted({*assignment.adding, *assignment.removing})
        raise KafkaError(
            ErrorCode.REASSIGNMENT_IN_PROGRESS,
            f"partitions {moving} of topic {name!r} are being reassigned; add partitions once "
            "the move is done",
        )
    current = len(assignment.partitions)
    if count == current:
        message = f"topic {name!r} already has {current} partitions"
        raise KafkaError(ErrorCode.INVALID_PARTITIONS, message)
    if count < current:
        message = (
            f"topic {name!r} has {current} partitions, more than the {count} asked for: "
            "partitions can be added, not removed"
        )
        raise KafkaError(ErrorCode.INVALID_PARTITIONS, message)
    if count - current > PARTITIONS_ADDED_AT_ONCE_MAX:
        raise KafkaError(
            ErrorCode.INVALID_PARTITIONS,
            f"{count - current} partitions asked for {name!r}: at most "
            f"{PARTITIONS_ADDED_AT_ONCE_MAX} are added at once (one ZooKeeper transaction); "
            "add them in steps",
        )
    if manual is None:
        try:
            return assign_added_replicas(live_broker_ids, assignment.partitions, count)
        except ValueError as error:
            raise KafkaError(ErrorCode.INVALID_REPLICATION_FACTOR, str(error)) from error
    if len(manual) != count - current:
        raise KafkaError(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            f"{count - current} partitions are added to {name!r} but {len(manual)} replica "
            "lists were given",
        )
    try:
        check_manual_replicas(manual, len(assignment.partitions[0]), live_broker_ids)
    except ValueError as error:
        raise KafkaError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, str(error)) from error
    return {current + i: tuple(replicas) for i, replicas in enumerate(manual)}


def _create_topic_ops(
    name: str,
    topic_id: uuid.UUID,
    replicas: Mapping[int, tuple[int, ...]],
    overrides: Mapping[str, str],
    controller_epoch: int,
) -> list[TransactionOp]:
    # The config before the partitions: a topic created in several transactions has it from
    # the first.
    ops: list[TransactionOp] = [
        CreateOp(layout.topic_path(name), TopicAssignment(topic_id, replicas).encode()),
        CreateOp(layout.topic_config_path(name), TopicConfigOverrides(overrides).encode()),
        CreateOp(layout.partitions_path(name)),
    ]
    ops.extend(_partition_ops(name, replicas, controller_epoch))
    return ops


def _transaction_chunks(
    ops: Sequence[TransactionOp], chroot_bytes: int
) -> list[list[TransactionOp]]:
    """`ops` in order, cut into transactions of at most TRANSACTION_BYTES_MAX (estimated: each
    op's path with the chroot kazoo prefixes, its data, and TRANSACTION_OP_OVERHEAD_BYTES)."""
    chunks: list[list[TransactionOp]] = [[]]
    size_bytes = 0
    for op in ops:
        data = op.data if isinstance(op, (CreateOp, SetOp)) else b""
        op_bytes = TRANSACTION_OP_OVERHEAD_BYTES + chroot_bytes + len(op.path.encode()) + len(data)
        if chunks[-1] and size_bytes + op_bytes > TRANSACTION_BYTES_MAX:
            chunks.append([])
            size_bytes = 0
        chunks[-1].append(op)
        size_bytes += op_bytes
    return chunks


def _partition_ops(
    name: str, replicas: Mapping[int, tuple[int, ...]], controller_epoch: int
) -> list[TransactionOp]:
    """The znodes of new partitions (of a new topic, or added to one): each partition's, and
    its state with the first replica leading, every replica in sync, leader epoch 0."""
    ops: list[TransactionOp] = []
    for partition, partition_replicas in sorted(replicas.items()):
        state = PartitionState(
            leader=partition_replicas[0],
            leader_epoch=0,
            isr=partition_replicas,
            controller_epoch=controller_epoch,
        )
        ops.append(CreateOp(layout.partition_path(name, partition)))
        ops.append(CreateOp(layout.partition_state_path(name, partition), state.encode()))
    return ops


def _delete_topic_ops(
    name: str, partitions: list[int] | None, assignment_version: int, config_exists: bool
) -> list[TransactionOp]:
    ops: list[TransactionOp] = []
    if partitions is not None:
        for partition in partitions:
            ops.append(DeleteOp(layout.partition_state_path(name, partition)))
            ops.append(DeleteOp(layout.partition_path(name, partition)))
        ops.append(DeleteOp(layout.partitions_path(name)))
    ops.append(DeleteOp(layout.topic_path(name), assignment_version))
    if config_exists:
        ops.append(DeleteOp(layout.topic_config_path(name)))
    return ops
