"""The transaction coordinator of one broker: the transactional ids of the `__transaction_state`
partitions it leads (Kafka's TransactionCoordinator and TransactionStateManager, KIP-98).

It is placed and moved like the group coordinator (riverbed.broker.groups.coordinator): a
transactional id's coordinator is the leader of its partition; becoming leader replays the
partition (`log_store.load`), stopping to lead drops its ids and stops their marker work. While a
partition loads its ids answer COORDINATOR_LOAD_IN_PROGRESS, elsewhere NOT_COORDINATOR. The
coordinator epoch sent with markers is the partition's leader epoch when the load began, so
partition leaders refuse the markers of a deposed coordinator.

Every change is written first and applied after: `_write` appends the target state, waits for
the ISR, then re-checks that the partition was not unloaded or reloaded meanwhile before the
target becomes current. While a write is in flight the id is `pending`, and every other request
for it gets CONCURRENT_TRANSACTIONS (Kafka's pendingState), so writes of one id never race.

Ending a transaction (EndTxn, a fence by InitProducerId, a timeout) writes PrepareCommit or
PrepareAbort, answers, then a completion task per id sends the markers to the leaders of the
transaction's partitions (riverbed.broker.transactions.markers), retrying what failed once the
metadata shows a leader, and writes CompleteCommit / CompleteAbort. A new coordinator restarts
the completion of every id it loads in a Prepare state.

Two loops run while the coordinator does: every
`transaction.abort.timed.out.transaction.cleanup.interval.ms` Ongoing transactions older than
their timeout are aborted with a bumped epoch (the zombie producer is fenced), and every
`transaction.remove.expired.transaction.cleanup.interval.ms` ids idle for
`transactional.id.expiration.ms` are tombstoned.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Final

from riverbed.broker.groups.log_store import append as append_to_log
from riverbed.broker.groups.log_store import coordinator_error
from riverbed.broker.transactions import log_store
from riverbed.broker.transactions.markers import Marker, MarkerChannel
from riverbed.broker.transactions.state import (
    IllegalTransitionError,
    TxnMetadata,
    TxnState,
    check_expected_producer,
    needs_new_producer_id,
    new_metadata,
    prepare_add_partitions,
    prepare_complete,
    prepare_dead,
    prepare_end,
    prepare_fence_epoch,
    prepare_increment_epoch,
    prepare_rotate_producer_id,
)
from riverbed.configs import BrokerConfig
from riverbed.coordination.internal_topics import (
    InternalTopic,
    coordinator_of,
    ensure_internal_topic,
    partition_for,
)
from riverbed.coordination.layout import NO_LEADER, BrokerRegistration
from riverbed.coordination.metadata import ClusterMetadataStore
from riverbed.coordination.metadata_cache import MetadataCache
from riverbed.coordination.producer_ids import ProducerIdSource
from riverbed.hot.replication.partitions import Partition, PartitionManager
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.protocol.record_types import TopicPartition

log = logging.getLogger(__name__)

TRANSACTION_STATE_TOPIC: Final = "__transaction_state"
# How long a write to __transaction_state waits for the ISR (Kafka: request.timeout.ms).
APPEND_TIMEOUT_MS: Final = 30_000
# Marker retries back off from the first to the last (a leader election takes ~100s of ms).
MARKER_RETRY_BACKOFF_MS_MIN: Final = 50
MARKER_RETRY_BACKOFF_MS_MAX: Final = 1_000
# Answers after which this coordinator's markers can never land: a newer coordinator (or a
# newer epoch of the producer) owns the transaction now; its completion is left to it.
ABANDONING_MARKER_ERRORS: Final = frozenset(
    {ErrorCode.TRANSACTION_COORDINATOR_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH}
)


@dataclass(eq=False, slots=True)
class _Txn:
    """One transactional id in memory: its written state, and the state being written."""

    metadata: TxnMetadata
    pending: TxnState | None = None
    # A fence whose write failed: its bumped epoch was never handed out, so the next fence
    # reuses it rather than bumping again (Kafka's hasFailedEpochFence).
    failed_fence: bool = False


@dataclass(frozen=True, slots=True)
class ListedTransactions:
    transactions: list[TxnMetadata]
    unknown_state_filters: list[str]


def transaction_topic(config: BrokerConfig) -> InternalTopic:
    """`__transaction_state` as Kafka's TransactionStateManager creates it."""
    return InternalTopic(
        name=TRANSACTION_STATE_TOPIC,
        num_partitions=config.transaction_state_log_num_partitions,
        replication_factor=config.transaction_state_log_replication_factor,
        replication_factor_config="transaction.state.log.replication.factor",
        configs={
            "cleanup.policy": "compact",
            "compression.type": "uncompressed",
            "segment.bytes": str(config.transaction_state_log_segment_bytes),
            "min.insync.replicas": str(config.transaction_state_log_min_isr),
            "unclean.leader.election.enable": "false",
        },
    )


class TransactionCoordinator:
    """Routes transactional requests to the ids of the `__transaction_state` partitions it leads."""

    def __init__(
        self,
        config: BrokerConfig,
        cache: MetadataCache,
        store: ClusterMetadataStore,
        partitions: PartitionManager,
        producer_ids: ProducerIdSource,
        markers: MarkerChannel,
        now_ms: Callable[[], int],
    ) -> None:
        self._config = config
        self._cache = cache
        self._store = store
        self._partitions = partitions
        self._producer_ids = producer_ids
        self._markers = markers
        self._now_ms = now_ms
        self._partition_count = config.transaction_state_log_num_partitions
        self._txns: dict[str, _Txn] = {}
        self._loading: dict[int, asyncio.Task[None]] = {}
        self._loaded: set[int] = set()
        self._failed: set[int] = set()
        # Bumped at every load: a write's outcome only counts in the term it was written in.
        self._terms: dict[int, int] = {}
        # The coordinator epoch of each loaded partition (its leader epoch when loaded).
        self._epochs: dict[int, int] = {}
        # Marker sending and Complete* writes, one task per transactional id.
        self._completions: dict[str, asyncio.Task[None]] = {}
        self._loops: list[asyncio.Task[None]] = []
        self._active = False

    def start(self) -> None:
        self._active = True
        config = self._config
        self._loops = [
            asyncio.create_task(
                self._every(
                    config.transaction_abort_timed_out_transaction_cleanup_interval_ms,
                    self.abort_timed_out,
                ),
                name="txn-abort-timed-out",
            ),
            asyncio.create_task(
                self._every(
                    config.transaction_remove_expired_transaction_cleanup_interval_ms,
                    self.expire_transactional_ids,
                ),
                name="txn-expire-ids",
            ),
        ]

    async def close(self) -> None:
        """Stop serving; loads, loops and marker work end. Idempotent."""
        self._active = False
        tasks = [*self._loops, *self._loading.values(), *self._completions.values()]
        self._loops = []
        for index in sorted(self._owned()):
            self._unload(index)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._markers.close()

    # -- leadership --------------------------------------------------------------------------------

    def on_partition_role(self, partition: Partition) -> None:
        """The broker applied a role to (or removed) a `__transaction_state` partition."""
        if partition.topic != TRANSACTION_STATE_TOPIC:
            return
        topic = self._cache.topic(TRANSACTION_STATE_TOPIC)
        if topic is not None:
            self._partition_count = len(topic.partitions)
        index = partition.index
        owned = index in self._owned()
        if partition.is_leader and not owned and self._active:
            self._terms[index] = self._terms.get(index, 0) + 1
            self._epochs[index] = partition.leader_epoch
            self._loading[index] = asyncio.create_task(
                self._load(index, partition), name=f"load-{partition}"
            )
            log.info("loading transactions of %s", partition)
        elif not partition.is_leader and owned:
            self._unload(index)

    def _owned(self) -> set[int]:
        return set(self._loading) | self._loaded | self._failed

    async def _load(self, index: int, partition: Partition) -> None:
        started_ms = self._now_ms()
        try:
            loaded = await log_store.load(partition)
        except Exception:
            log.exception("cannot load transactions of %s", partition)
            self._failed.add(index)
            del self._loading[index]
            return
        # No await from here on: the partition's ids appear at once.
        for transactional_id, metadata in loaded.items():
            self._txns[transactional_id] = _Txn(metadata)
        del self._loading[index]
        self._loaded.add(index)
        unfinished = [t for t, meta in loaded.items() if meta.state.is_prepare]
        for transactional_id in unfinished:
            self._start_completion(transactional_id)
        log.info(
            "loaded %d transactional ids from %s in %d ms (coordinator epoch %d), completing %d",
            len(loaded),
            partition,
            self._now_ms() - started_ms,
            self._epochs[index],
            len(unfinished),
        )

    def _unload(self, index: int) -> None:
        task = self._loading.pop(index, None)
        if task is not None:
            task.cancel()
        self._loaded.discard(index)
        self._failed.discard(index)
        self._epochs.pop(index, None)
        dropped = [t for t in self._txns if self._index(t) == index]
        for transactional_id in dropped:
            del self._txns[transactional_id]
            completion = self._completions.pop(transactional_id, None)
            if completion is not None:
                completion.cancel()
        log.info(
            "unloaded %d transactional ids of %s-%d", len(dropped), TRANSACTION_STATE_TOPIC, index
        )

    def _index(self, transactional_id: str) -> int:
        return partition_for(transactional_id, self._partition_count)

    # -- placement ---------------------------------------------------------------------------------

    async def find(self, transactional_id: str) -> BrokerRegistration:
        """FindCoordinator (key type 1): the leader of the id's partition, creating the topic on
        first use. KafkaError(COORDINATOR_NOT_AVAILABLE) while there is none."""
        topic = await ensure_internal_topic(
            self._cache, self._store, transaction_topic(self._config)
        )
        return coordinator_of(self._cache, topic, transactional_id)

    def _check(self, transactional_id: str) -> None:
        """Raise the error of a request for an id this broker cannot answer for now."""
        if not self._active:
            raise KafkaError(ErrorCode.COORDINATOR_NOT_AVAILABLE, "the coordinator is stopped")
        index = self._index(transactional_id)
        name = f"{TRANSACTION_STATE_TOPIC}-{index}"
        if index in self._loaded:
            return
        if index in self._loading:
            raise KafkaError(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, f"{name} is loading")
        if index in self._failed:
            raise KafkaError(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"{name} failed to load")
        raise KafkaError(ErrorCode.NOT_COORDINATOR, f"this broker does not lead {name}")

    def _producer(self, transactional_id: str, producer_id: int, producer_epoch: int) -> _Txn:
        """The id's state for a request of (producer_id, producer_epoch), or its error."""
        self._check(transactional_id)
        txn = self._txns.get(transactional_id)
        if txn is None or txn.metadata.producer_id != producer_id:
            raise KafkaError(
                ErrorCode.INVALID_PRODUCER_ID_MAPPING,
                f"producer {producer_id} is not the producer of {transactional_id!r}",
            )
        if txn.metadata.producer_epoch != producer_epoch:
            raise KafkaError(
                ErrorCode.PRODUCER_FENCED,
                f"epoch {producer_epoch} of {transactional_id!r} was fenced by epoch "
                f"{txn.metadata.producer_epoch}",
            )
        if txn.pending is not None:
            raise _concurrent(transactional_id, f"{txn.pending.kafka_name} is being written")
        return txn

    # -- InitProducerId ----------------------------------------------------------------------------

    async def init_producer_id(
        self, transactional_id: str, timeout_ms: int, expected: tuple[int, int] | None
    ) -> tuple[int, int]:
        """InitProducerId with a transactional id: its (producer id, epoch). Raises KafkaError;
        a producer id claim may raise what ProducerIdSource does (the handler maps it)."""
        if not transactional_id:
            raise KafkaError(ErrorCode.INVALID_REQUEST, "the transactional id is empty")
        if not 0 < timeout_ms <= self._config.transaction_max_timeout_ms:
            raise KafkaError(
                ErrorCode.INVALID_TRANSACTION_TIMEOUT,
                f"transaction timeout {timeout_ms} ms is not in 1..transaction.max.timeout.ms "
                f"({self._config.transaction_max_timeout_ms})",
            )
        self._check(transactional_id)
        txn = self._txns.get(transactional_id)
        if txn is None:
            producer_id = await self._producer_ids.next_producer_id()
            self._check(transactional_id)  # re-checked: the partition may have moved meanwhile
            txn = self._txns.get(transactional_id)
            if txn is None:
                metadata = new_metadata(transactional_id, producer_id, timeout_ms, self._now_ms())
                txn = self._txns[transactional_id] = _Txn(metadata)
        if txn.pending is not None:
            raise _concurrent(transactional_id, f"{txn.pending.kafka_name} is being written")
        current = txn.metadata
        check_expected_producer(current, expected)
        if current.state.is_prepare:
            raise _concurrent(transactional_id, f"its transaction is {current.state.kafka_name}")
        if current.state is TxnState.ONGOING:
            # Fence the producer of the open transaction and abort it; the client retries and
            # gets the next epoch once the abort completed.
            fenced = prepare_fence_epoch(current, failed_fence=txn.failed_fence)
            await self._prepare_end(txn, fenced, commit=False, fence=True)
            raise _concurrent(transactional_id, "its open transaction is being aborted")
        if current.state not in (TxnState.EMPTY, *_COMPLETE):
            raise IllegalTransitionError(f"{transactional_id!r} is {current.state.kafka_name}")
        if needs_new_producer_id(current, expected):
            txn.pending = TxnState.EMPTY  # no other request while the new id is claimed
            try:
                producer_id = await self._producer_ids.next_producer_id()
            finally:
                txn.pending = None
            target = prepare_rotate_producer_id(
                current,
                producer_id,
                timeout_ms,
                self._now_ms(),
                keep_last_epoch=expected is not None,
            )
        else:
            expected_epoch = None if expected is None else expected[1]
            target = prepare_increment_epoch(current, timeout_ms, expected_epoch, self._now_ms())
        await self._write(txn, target)
        log.info(
            "initialized transactional id %r: producer %d epoch %d",
            transactional_id,
            target.producer_id,
            target.producer_epoch,
        )
        return target.producer_id, target.producer_epoch

    # -- a transaction -----------------------------------------------------------------------------

    async def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Collection[TopicPartition],
    ) -> None:
        """AddPartitionsToTxn / AddOffsetsToTxn: the partitions join the open transaction (the
        first ones open it). Raises KafkaError."""
        if not transactional_id:
            raise KafkaError(ErrorCode.INVALID_REQUEST, "the transactional id is empty")
        txn = self._producer(transactional_id, producer_id, producer_epoch)
        current = txn.metadata
        if current.state.is_prepare:
            raise _concurrent(transactional_id, f"its transaction is {current.state.kafka_name}")
        if current.state is TxnState.ONGOING and current.partitions.issuperset(partitions):
            return  # already in the transaction: nothing to write
        await self._write(txn, prepare_add_partitions(current, partitions, self._now_ms()))

    async def end_txn(
        self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool
    ) -> None:
        """EndTxn: prepare the commit or abort (answered once that is written; the markers
        follow). A retry of an ended transaction with the same result succeeds."""
        if not transactional_id:
            raise KafkaError(ErrorCode.INVALID_REQUEST, "the transactional id is empty")
        txn = self._producer(transactional_id, producer_id, producer_epoch)
        state = txn.metadata.state
        wanted_prepare = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        wanted_complete = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
        if state is TxnState.ONGOING:
            await self._prepare_end(txn, txn.metadata, commit=commit, fence=False)
        elif state is wanted_complete:
            return
        elif state is wanted_prepare:
            raise _concurrent(transactional_id, f"its transaction is {state.kafka_name}")
        else:
            result = "commit" if commit else "abort"
            raise KafkaError(
                ErrorCode.INVALID_TXN_STATE,
                f"cannot {result} the transaction of {transactional_id!r}: "
                f"it is {state.kafka_name}",
            )

    async def _prepare_end(
        self, txn: _Txn, base: TxnMetadata, *, commit: bool, fence: bool
    ) -> None:
        """Write PrepareCommit / PrepareAbort from `base` (the current state, or its fenced
        epoch), then start sending the markers."""
        target = prepare_end(base, commit, self._now_ms())
        try:
            await self._write(txn, target)
        except KafkaError:
            if fence:
                txn.failed_fence = True
            raise
        txn.failed_fence = False
        self._start_completion(target.transactional_id)

    # -- markers and completion --------------------------------------------------------------------

    def _start_completion(self, transactional_id: str) -> None:
        if transactional_id in self._completions:
            return
        task = asyncio.create_task(
            self._complete(transactional_id), name=f"txn-complete-{transactional_id}"
        )
        self._completions[transactional_id] = task

        def forget(done: asyncio.Task[None]) -> None:
            if self._completions.get(transactional_id) is done:
                del self._completions[transactional_id]

        task.add_done_callback(forget)

    async def _complete(self, transactional_id: str) -> None:
        """Send the markers of a prepared transaction, then write its Complete state. Ends when
        done, or when the id is unloaded (the task is cancelled)."""
        txn = self._txns.get(transactional_id)
        coordinator_epoch = self._epochs.get(self._index(transactional_id))
        if txn is None or coordinator_epoch is None or not txn.metadata.state.is_prepare:
            return
        prepared = txn.metadata
        try:
            done = await self._send_markers(prepared, coordinator_epoch)
        except Exception:
            log.exception("sending the markers of %r failed", transactional_id)
            return
        if not done:
            return
        backoff_ms = MARKER_RETRY_BACKOFF_MS_MIN
        while self._txns.get(transactional_id) is txn and txn.metadata is prepared:
            try:
                await self._write(txn, prepare_complete(prepared, self._now_ms()))
                return
            except KafkaError as error:
                if error.code == ErrorCode.NOT_COORDINATOR:
                    return  # the next coordinator completes it
                log.warning("cannot complete the transaction of %r: %s", transactional_id, error)
            await asyncio.sleep(backoff_ms / 1000)
            backoff_ms = min(backoff_ms * 2, MARKER_RETRY_BACKOFF_MS_MAX)

    async def _send_markers(self, prepared: TxnMetadata, coordinator_epoch: int) -> bool:
        """Write the markers to every partition of the transaction; False if they can never
        land from here (a newer coordinator or producer epoch owns the transaction)."""
        commit = prepared.state is TxnState.PREPARE_COMMIT
        remaining = set(prepared.partitions)
        backoff_ms = MARKER_RETRY_BACKOFF_MS_MIN
        while remaining:
            # A partition of a deleted topic needs no marker any more.
            remaining = {tp for tp in remaining if self._cache.partition(tp.topic, tp.partition)}
            by_leader = self._by_leader(remaining)
            sends = [
                self._markers.send(
                    leader,
                    Marker(
                        producer_id=prepared.producer_id,
                        producer_epoch=prepared.producer_epoch,
                        commit=commit,
                        coordinator_epoch=coordinator_epoch,
                        partitions=tuple(sorted(tps)),
                    ),
                )
                for leader, tps in by_leader.items()
            ]
            for codes in await asyncio.gather(*sends):
                for tp, code in codes.items():
                    if code in (ErrorCode.NONE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION):
                        remaining.discard(tp)
                    elif code in ABANDONING_MARKER_ERRORS:
                        log.warning(
                            "marker of %r for %s refused with %s: left to the newer owner",
                            prepared.transactional_id,
                            tp,
                            code.name,
                        )
                        return False
                    else:
                        log.debug(
                            "marker of %r for %s: %s, retried",
                            prepared.transactional_id,
                            tp,
                            code.name,
                        )
            if remaining:
                await asyncio.sleep(backoff_ms / 1000)
                backoff_ms = min(backoff_ms * 2, MARKER_RETRY_BACKOFF_MS_MAX)
        return True

    def _by_leader(self, partitions: Iterable[TopicPartition]) -> dict[int, list[TopicPartition]]:
        """The partitions with a live leader, by leader (the others wait for one)."""
        by_leader: dict[int, list[TopicPartition]] = {}
        for tp in partitions:
            state = self._cache.partition(tp.topic, tp.partition)
            if (
                state is None
                or state.leader == NO_LEADER
                or self._cache.broker(state.leader) is None
            ):
                continue
            by_leader.setdefault(state.leader, []).append(tp)
        return by_leader

    # -- the log -----------------------------------------------------------------------------------

    async def _write(self, txn: _Txn, target: TxnMetadata) -> None:
        """Write `target` and make it the id's state once committed. Raises KafkaError with the
        code the client sees (NOT_COORDINATOR if the leadership moved meanwhile)."""
        transactional_id = target.transactional_id
        index = self._index(transactional_id)
        partition = self._partitions.get(TRANSACTION_STATE_TOPIC, index)
        if partition is None or index not in self._loaded:
            raise KafkaError(
                ErrorCode.NOT_COORDINATOR,
                f"{TRANSACTION_STATE_TOPIC}-{index} is not loaded here",
            )
        term = self._terms.get(index)
        txn.pending = target.state
        try:
            await append_to_log(
                partition, [log_store.entry(target)], self._now_ms(), APPEND_TIMEOUT_MS
            )
        except KafkaError as error:
            raise coordinator_error(error, commit=False) from error
        finally:
            txn.pending = None
        if (
            index not in self._loaded
            or self._terms.get(index) != term
            or self._txns.get(transactional_id) is not txn
        ):
            # Committed, but the new coordinator loads it from the log.
            raise KafkaError(ErrorCode.NOT_COORDINATOR, f"{partition}: leadership moved")
        if target.state is TxnState.DEAD:
            del self._txns[transactional_id]
        else:
            txn.metadata = target

    # -- timeouts and expiry -----------------------------------------------------------------------

    async def _every(self, interval_ms: int, work: Callable[[], object]) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                result = work()
                if asyncio.iscoroutine(result):
                    await result
            except Exception:  # a bug in one round must not end the loop for good
                log.exception("transaction coordinator loop failed")

    async def abort_timed_out(self) -> int:
        """Abort every Ongoing transaction open longer than its timeout, fencing its producer
        with a bumped epoch (as Kafka does). Returns how many aborts were prepared."""
        now_ms = self._now_ms()
        due = [
            txn
            for txn in self._txns.values()
            if txn.metadata.state is TxnState.ONGOING
            and txn.pending is None
            and txn.metadata.start_timestamp_ms + txn.metadata.timeout_ms < now_ms
        ]
        aborted = 0
        for txn in due:
            current = txn.metadata
            if self._txns.get(current.transactional_id) is not txn or txn.pending is not None:
                continue  # changed while an earlier abort was written
            if current.state is not TxnState.ONGOING:
                continue
            log.info(
                "aborting the transaction of %r (producer %d): open longer than %d ms",
                current.transactional_id,
                current.producer_id,
                current.timeout_ms,
            )
            fenced = prepare_fence_epoch(current, failed_fence=txn.failed_fence)
            try:
                await self._prepare_end(txn, fenced, commit=False, fence=True)
                aborted += 1
            except KafkaError as error:
                log.warning(
                    "cannot abort the transaction of %r: %s", current.transactional_id, error
                )
        return aborted

    async def expire_transactional_ids(self) -> int:
        """Tombstone ids without a transaction for transactional.id.expiration.ms."""
        now_ms = self._now_ms()
        expiration_ms = self._config.transactional_id_expiration_ms
        due = [
            txn
            for txn in self._txns.values()
            if txn.metadata.state.expiration_allowed
            and txn.pending is None
            and txn.metadata.last_update_timestamp_ms + expiration_ms <= now_ms
        ]
        expired = 0
        for txn in due:
            current = txn.metadata
            if self._txns.get(current.transactional_id) is not txn or txn.pending is not None:
                continue
            if not current.state.expiration_allowed:
                continue
            try:
                await self._write(txn, prepare_dead(current))
                expired += 1
            except KafkaError as error:
                log.warning("cannot expire %r: %s", current.transactional_id, error)
        if expired:
            log.info("expired %d transactional ids", expired)
        return expired

    # -- describing --------------------------------------------------------------------------------

    def describe(self, transactional_id: str) -> TxnMetadata:
        """DescribeTransactions of one id; KafkaError (TRANSACTIONAL_ID_NOT_FOUND, ...)."""
        if not transactional_id:
            raise KafkaError(ErrorCode.INVALID_REQUEST, "the transactional id is empty")
        self._check(transactional_id)
        txn = self._txns.get(transactional_id)
        if txn is None:
            raise KafkaError(
                ErrorCode.TRANSACTIONAL_ID_NOT_FOUND,
                f"unknown transactional id {transactional_id!r}",
            )
        return txn.metadata

    def list_transactions(
        self, state_filters: Collection[str], producer_id_filters: Collection[int], duration_ms: int
    ) -> ListedTransactions:
        """ListTransactions: the ids of every loaded partition matching all filters (Kafka's
        names for states; an unknown name is reported, not an error)."""
        if not self._active:
            raise KafkaError(ErrorCode.COORDINATOR_NOT_AVAILABLE, "the coordinator is stopped")
        if self._loading:
            raise KafkaError(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, "partitions are loading")
        states = {TxnState.from_kafka_name(name) for name in state_filters}
        unknown = [name for name in state_filters if TxnState.from_kafka_name(name) is None]
        now_ms = self._now_ms()
        listed = []
        for transactional_id in sorted(self._txns):
            metadata = self._txns[transactional_id].metadata
            if state_filters and metadata.state not in states:
                continue
            if producer_id_filters and metadata.producer_id not in producer_id_filters:
                continue
            if duration_ms >= 0 and now_ms - metadata.start_timestamp_ms <= duration_ms:
                continue
            listed.append(metadata)
        return ListedTransactions(listed, unknown)


_COMPLETE: Final = (TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)


def _concurrent(transactional_id: str, why: str) -> KafkaError:
    return KafkaError(ErrorCode.CONCURRENT_TRANSACTIONS, f"{transactional_id!r}: {why}")
