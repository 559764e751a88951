"""Producer ids for idempotent producers: unique cluster-wide, handed out in blocks.

Like Kafka in ZooKeeper mode (ZkProducerIdManager), a broker claims a block of
`PRODUCER_ID_BLOCK_SIZE` ids at a time by rewriting one znode, conditionally on its version, so
two brokers never claim the same block:

| Path                      | Mode       | Data             | Written by                  |
|---------------------------|------------|------------------|-----------------------------|
| /latest_producer_id_block | persistent | ProducerIdBlock  | the broker claiming a block |

ProducerIdBlock is Kafka's JSON: `{"version": 1, "broker": 1, "block_start": "0",
"block_end": "999"}` (the ids are strings, as Kafka writes them). The znode names the LAST block
claimed by anyone; the next claim starts right after its end. Ids of a block a broker did not use
up before restarting are simply never used.

`ProducerIdIssuer` answers InitProducerId for producers without a transactional id: a fresh id
at epoch 0, or (KIP-360) the next epoch of an id this broker handed out.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final, Protocol

from riverbed.coordination.layout import MalformedZnodeError
from riverbed.coordination.zk import AsyncZooKeeper, BadVersionError, NodeExistsError, NoNodeError
from riverbed.protocol.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)

PRODUCER_ID_BLOCK_PATH: Final = "/latest_producer_id_block"
PRODUCER_ID_BLOCK_VERSION: Final = 1
# Kafka's ProducerIdsBlock.PRODUCER_ID_BLOCK_SIZE.
PRODUCER_ID_BLOCK_SIZE: Final = 1000
PRODUCER_ID_MAX: Final = 2**63 - 1
# Conditional writes lost to other brokers claiming at the same moment before we give up (the
# client retries InitProducerId on the retriable error it then gets).
CLAIM_ATTEMPTS_MAX: Final = 10

NO_PRODUCER_ID: Final = -1
NO_PRODUCER_EPOCH: Final = -1
PRODUCER_EPOCH_MAX: Final = 2**15 - 1
# Ids whose latest epoch this broker remembers for KIP-360 bumps (oldest forgotten first; a
# forgotten id asking for a bump just gets a fresh id, which is always safe).
ISSUED_PRODUCERS_MAX: Final = 100_000


class ProducerIdsExhaustedError(Exception):
    """Every int64 producer id has been claimed (Kafka treats this as fatal too)."""


class ProducerIdClaimError(Exception):
    """Other brokers won CLAIM_ATTEMPTS_MAX conditional writes in a row."""


@dataclass(frozen=True, slots=True)
class ProducerIdBlock:
    broker_id: int
    first_id: int
    last_id: int

    def encode(self) -> bytes:
        return json.dumps(
            {
                "version": PRODUCER_ID_BLOCK_VERSION,
                "broker": self.broker_id,
                "block_start": str(self.first_id),
                "block_end": str(self.last_id),
            }
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> ProducerIdBlock:
        path = PRODUCER_ID_BLOCK_PATH
        try:
            fields = json.loads(data)
            block = cls(int(fields["broker"]), int(fields["block_start"]), int(fields["block_end"]))
        except (ValueError, KeyError, TypeError) as error:
            raise MalformedZnodeError(path, f"not a producer id block: {error!r}") from None
        if not 0 <= block.first_id <= block.last_id:
            raise MalformedZnodeError(path, f"block {block.first_id}..{block.last_id} is empty")
        return block

    @classmethod
    def after(cls, previous: ProducerIdBlock | None, broker_id: int) -> ProducerIdBlock:
        first_id = 0 if previous is None else previous.last_id + 1
        if first_id > PRODUCER_ID_MAX - PRODUCER_ID_BLOCK_SIZE:
            raise ProducerIdsExhaustedError(f"no producer id block after {previous}")
        return cls(broker_id, first_id, first_id + PRODUCER_ID_BLOCK_SIZE - 1)


class ProducerIdSource(Protocol):
    async def next_producer_id(self) -> int: ...


class ProducerIdAllocator:
    """Unique producer ids for this broker, a ZooKeeper block at a time."""

    def __init__(self, zk: AsyncZooKeeper, broker_id: int) -> None:
        self._zk = zk
        self._broker_id = broker_id
        self._block: ProducerIdBlock | None = None
        self._next_id = 0
        # One claim at a time: concurrent callers wait for it instead of claiming a block each.
        self._claim_lock = asyncio.Lock()

    async def next_producer_id(self) -> int:
        """Raises ProducerIdClaimError / ProducerIdsExhaustedError / ZkError if no block."""
        if not self._has_id():
            async with self._claim_lock:
                if not self._has_id():  # re-check: a claim may have finished while we waited
                    self._block = await self._claim_block()
                    self._next_id = self._block.first_id
        producer_id = self._next_id
        self._next_id += 1
        return producer_id

    def _has_id(self) -> bool:
        return self._block is not None and self._next_id <= self._block.last_id

    async def _claim_block(self) -> ProducerIdBlock:
        for _ in range(CLAIM_ATTEMPTS_MAX):
            try:
                data, stat = await self._zk.get(PRODUCER_ID_BLOCK_PATH)
            except NoNodeError:
                block = ProducerIdBlock.after(None, self._broker_id)
                try:
                    await self._zk.create(PRODUCER_ID_BLOCK_PATH, block.encode())
                except NodeExistsError:
                    continue
                log.info("claimed producer ids %d..%d", block.first_id, block.last_id)
                return block
            previous = ProducerIdBlock.decode(data) if data else None
            block = ProducerIdBlock.after(previous, self._broker_id)
            try:
                await self._zk.set(PRODUCER_ID_BLOCK_PATH, block.encode(), version=stat.version)
            except BadVersionError:
                continue
            log.info("claimed producer ids %d..%d", block.first_id, block.last_id)
            return block
        raise ProducerIdClaimError(
            f"lost {CLAIM_ATTEMPTS_MAX} races for {PRODUCER_ID_BLOCK_PATH} to other brokers"
        )


class ProducerIdIssuer:
    """(producer id, epoch) for InitProducerId requests without a transactional id.

    KIP-360 (v3+): a producer may send its current (id, epoch) to get the next epoch of the same
    id. We bump it when that pair is the latest this broker handed out; a known id with another
    epoch is a fenced zombie (INVALID_PRODUCER_EPOCH). An id we do not know (handed out before
    a restart, by another broker, or forgotten beyond ISSUED_PRODUCERS_MAX) gets a fresh id at
    epoch 0, which is what Kafka does for every non-transactional InitProducerId: failing would
    leave a healthy producer unable to continue. The record is in memory only (single broker).
    """

    def __init__(self, source: ProducerIdSource) -> None:
        self._source = source
        self._latest_epochs: OrderedDict[int, int] = OrderedDict()

    async def init_producer(self, producer_id: int, producer_epoch: int) -> tuple[int, int]:
        """Raises KafkaError(INVALID_REQUEST / INVALID_PRODUCER_EPOCH) for a bad pair."""
        if (producer_id == NO_PRODUCER_ID) != (producer_epoch == NO_PRODUCER_EPOCH):
            raise KafkaError(
                ErrorCode.INVALID_REQUEST,
                f"producer id {producer_id} and epoch {producer_epoch}: set both or neither",
            )
        latest = self._latest_epochs.get(producer_id)
        if latest is not None and producer_epoch != latest:
            raise KafkaError(
                ErrorCode.INVALID_PRODUCER_EPOCH,
                f"producer {producer_id} epoch {producer_epoch} is not its latest, {latest}",
            )
        if latest is None or latest >= PRODUCER_EPOCH_MAX:
            producer_id, epoch = await self._source.next_producer_id(), 0
        else:
            epoch = latest + 1
        self._remember(producer_id, epoch)
        return producer_id, epoch

    def _remember(self, producer_id: int, epoch: int) -> None:
        self._latest_epochs[producer_id] = epoch
        self._latest_epochs.move_to_end(producer_id)
        while len(self._latest_epochs) > ISSUED_PRODUCERS_MAX:
            self._latest_epochs.popitem(last=False)
