"""A transactional producer's requests to its coordinators, each retried until it is answered.

The transaction coordinator (FindCoordinator key_type 1, the leader of the transactional id's
`__transaction_state` partition) takes InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn and
EndTxn; a group's coordinator takes the TxnOffsetCommit of that group's offsets (KIP-98). Each
coordinator is reached over a connection of its own (`CoordinatorLink`).

Every call loops the same way: send, read the error code, and let
`transactions.classify` decide: done; retry after a backoff (CONCURRENT_TRANSACTIONS,
COORDINATOR_LOAD_IN_PROGRESS, a lost connection...); look the coordinator up again and retry
(NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE); or raise the fenced / abortable / fatal error
(`transactions.error_for_action`). A call gives up at its deadline with KafkaTimeoutError: the
operation may then be called again (Kafka's producer does the same with max.block.ms).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Final, TypeVar

from riverbed.client.group.coordinator_link import (
    COORDINATOR_KEY_TYPE_GROUP,
    COORDINATOR_KEY_TYPE_TRANSACTION,
    CoordinatorLink,
)
from riverbed.client.pool import BrokerPool
from riverbed.client.settings import ProducerSettings
from riverbed.client.transactions import TxnAction, TxnApi, classify, error_for_action
from riverbed.client.types import ConsumerGroupMetadata, OffsetAndMetadata, TopicPartition
from riverbed.common.backoff import backoff_ms
from riverbed.errors import KafkaTimeoutError, RetriableError
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.messages import RequestBody

log = logging.getLogger(__name__)

# Kafka's producer retries AddPartitionsToTxn sooner after CONCURRENT_TRANSACTIONS (the previous
# transaction's markers are being written, which takes milliseconds): 20 ms.
CONCURRENT_TRANSACTIONS_BACKOFF_MS: Final = 20
NO_LEADER_EPOCH: Final = -1
# The worst outcome among a response's partitions decides (Kafka stops at the first such).
_ACTION_RANK: Final = {
    TxnAction.FENCED: 0,
    TxnAction.FATAL: 1,
    TxnAction.FIND_COORDINATOR: 2,
    TxnAction.RETRY: 3,
    TxnAction.ABORTABLE: 4,
    TxnAction.DONE: 5,
}

ResponseT = TypeVar("ResponseT")


def worst_code(api: TxnApi, codes: list[int]) -> ErrorCode:
    """The code whose action comes first in `_ACTION_RANK` (NONE for an empty list)."""
    worst = ErrorCode.NONE
    for code in codes:
        if _ACTION_RANK[classify(api, code)] < _ACTION_RANK[classify(api, worst)]:
            worst = ErrorCode(code)
    return worst


class TxnCoordinatorClient:
    """The requests of one transactional id; `close()` ends the coordinator connections."""

    def __init__(self, settings: ProducerSettings, pool: BrokerPool, transactional_id: str) -> None:
        self._settings = settings
        self._pool = pool
        self.transactional_id = transactional_id
        self._link = CoordinatorLink(
            settings, pool, transactional_id, key_type=COORDINATOR_KEY_TYPE_TRANSACTION
        )
        self._group_links: dict[str, CoordinatorLink] = {}

    async def close(self) -> None:
        for link in [self._link, *self._group_links.values()]:
            await link.close()

    # -- the requests -------------------------------------------------------------------------
    async def init_producer_id(
        self, producer_id: int, producer_epoch: int, deadline: float
    ) -> tuple[int, int]:
        """InitProducerId for the transactional id: (producer id, epoch). With the current
        id and epoch (not -1) it asks for a new epoch of the same producer (KIP-360): the
        coordinator fences it if a newer instance took the id meanwhile."""
        request = m.InitProducerIdRequest(
            transactional_id=self.transactional_id,
            transaction_timeout_ms=self._settings.transaction_timeout_ms,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
        )
        response = await self._until_done(
            TxnApi.INIT_PRODUCER_ID,
            self._link,
            lambda: request,
            m.InitProducerIdResponse,
            lambda r: ErrorCode(r.error_code),
            deadline,
        )
        return response.producer_id, response.producer_epoch

    async def add_partitions(
        self, producer_id: int, producer_epoch: int, tps: list[TopicPartition], deadline: float
    ) -> None:
        by_topic: dict[str, list[int]] = {}
        for tp in sorted(tps):
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        request = m.AddPartitionsToTxnRequest(
            v3_and_below_transactional_id=self.transactional_id,
            v3_and_below_producer_id=producer_id,
            v3_and_below_producer_epoch=producer_epoch,
            v3_and_below_topics=[
                m.AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(topic, partitions)
                for topic, partitions in by_topic.items()
            ],
        )

        def code(response: m.AddPartitionsToTxnResponse) -> ErrorCode:
            return worst_code(
                TxnApi.ADD_PARTITIONS,
                [
                    p.partition_error_code
                    for t in response.results_by_topic_v3_and_below
                    for p in t.results_by_partition
                ],
            )

        await self._until_done(
            TxnApi.ADD_PARTITIONS,
            self._link,
            lambda: request,
            m.AddPartitionsToTxnResponse,
            code,
            deadline,
        )

    async def add_offsets(
        self, producer_id: int, producer_epoch: int, group_id: str, deadline: float
    ) -> None:
        request = m.AddOffsetsToTxnRequest(
            transactional_id=self.transactional_id,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            group_id=group_id,
        )
        await self._until_done(
            TxnApi.ADD_OFFSETS,
            self._link,
            lambda: request,
            m.AddOffsetsToTxnResponse,
            lambda r: ErrorCode(r.error_code),
            deadline,
        )

    async def txn_offset_commit(
        self,
        producer_id: int,
        producer_epoch: int,
        group: ConsumerGroupMetadata,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
        deadline: float,
    ) -> None:
        """TxnOffsetCommit to the group's coordinator; partitions answered with a retriable
        error are sent again, alone (as Kafka's pendingTxnOffsetCommits)."""
        link = self._group_links.get(group.group_id)
        if link is None:
            link = self._group_links[group.group_id] = CoordinatorLink(
                self._settings, self._pool, group.group_id, key_type=COORDINATOR_KEY_TYPE_GROUP
            )
        pending = dict(offsets)

        def build() -> RequestBody:
            return txn_offset_commit_request(
                self.transactional_id, producer_id, producer_epoch, group, pending
            )

        def code(response: m.TxnOffsetCommitResponse) -> ErrorCode:
            answered = {
                TopicPartition(topic.name, partition.partition_index): partition.error_code
                for topic in response.topics
                for partition in topic.partitions
            }
            codes = [answered.get(tp, ErrorCode.UNKNOWN_SERVER_ERROR) for tp in pending]
            # Partial success: a retry names only the partitions not committed yet.
            for tp, answer in answered.items():
                if answer == ErrorCode.NONE:
                    pending.pop(tp, None)
            return worst_code(TxnApi.TXN_OFFSET_COMMIT, codes)

        await self._until_done(
            TxnApi.TXN_OFFSET_COMMIT, link, build, m.TxnOffsetCommitResponse, code, deadline
        )

    async def end_txn(
        self, producer_id: int, producer_epoch: int, commit: bool, deadline: float
    ) -> None:
        request = m.EndTxnRequest(
            transactional_id=self.transactional_id,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            committed=commit,
        )
        await self._until_done(
            TxnApi.END_TXN,
            self._link,
            lambda: request,
            m.EndTxnResponse,
            lambda r: ErrorCode(r.error_code),
            deadline,
        )

    # -- the retry loop -----------------------------------------------------------------------
    async def _until_done(
        self,
        api: TxnApi,
        link: CoordinatorLink,
        build: Callable[[], RequestBody],
        response_type: type[ResponseT],
        read_code: Callable[[ResponseT], ErrorCode],
        deadline: float,
    ) -> ResponseT:
        """Send `build()` until `classify` calls its answer DONE; raise the typed failure, or
        KafkaTimeoutError at the loop time `deadline`. Each attempt builds the request anew
        (a retried TxnOffsetCommit names only the partitions still pending)."""
        loop = asyncio.get_running_loop()
        settings = self._settings
        failures = 0
        last: str = "no answer yet"
        while True:
            remaining_s = deadline - loop.time()
            if remaining_s <= 0:
                raise KafkaTimeoutError(
                    f"transactional_id {self.transactional_id!r}: {api.value} did not complete "
                    f"in time (last: {last})"
                )
            backoff_floor_ms = 0
            try:
                async with asyncio.timeout(remaining_s):
                    response = await link.call(
                        build(), response_type, timeout_ms=settings.request_timeout_ms
                    )
            except (OSError, TimeoutError, RetriableError) as error:
                # A lost connection, a request timeout, or no coordinator yet (FindCoordinator
                # answered COORDINATOR_NOT_AVAILABLE): the link looks it up again next time.
                last = repr(error)
                link.mark_unknown(f"{api.value}: {error!r}")
            else:
                code = read_code(response)
                action = classify(api, code)
                if action is TxnAction.DONE:
                    return response
                last = code.name
                if action is TxnAction.FIND_COORDINATOR:
                    link.mark_unknown(f"{api.value} answered {code.name}")
                elif action is not TxnAction.RETRY:
                    raise error_for_action(action, api, code, self.transactional_id)
                if code == ErrorCode.CONCURRENT_TRANSACTIONS and api is TxnApi.ADD_PARTITIONS:
                    backoff_floor_ms = CONCURRENT_TRANSACTIONS_BACKOFF_MS
            failures += 1
            wait_ms = backoff_floor_ms or backoff_ms(
                failures, settings.retry_backoff_ms, settings.retry_backoff_max_ms
            )
            log.debug(
                "transactional_id %s: %s retried in %.0f ms (%s)",
                self.transactional_id,
                api.value,
                wait_ms,
                last,
            )
            await asyncio.sleep(min(wait_ms / 1000, max(0.0, deadline - loop.time())))


def txn_offset_commit_request(
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    group: ConsumerGroupMetadata,
    offsets: Mapping[TopicPartition, OffsetAndMetadata],
) -> m.TxnOffsetCommitRequest:
    """TxnOffsetCommit with the consumer's group metadata (v3+, KIP-447: the coordinator fences
    a commit from a member of an older generation)."""
    topics: dict[str, m.TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic] = {}
    for tp, committed in sorted(offsets.items()):
        topic = topics.setdefault(
            tp.topic, m.TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic(tp.topic)
        )
        topic.partitions.append(
            m.TxnOffsetCommitRequest.TxnOffsetCommitRequestPartition(
                partition_index=tp.partition,
                committed_offset=committed.offset,
                committed_leader_epoch=NO_LEADER_EPOCH
                if committed.leader_epoch is None
                else committed.leader_epoch,
                committed_metadata=committed.metadata,
            )
        )
    return m.TxnOffsetCommitRequest(
        transactional_id=transactional_id,
        group_id=group.group_id,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        generation_id=group.generation_id,
        member_id=group.member_id,
        group_instance_id=group.group_instance_id,
        topics=list(topics.values()),
    )
