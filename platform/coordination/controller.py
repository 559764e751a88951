"""The controller: moves partition leaderships when brokers come and go, and runs controlled
shutdowns (Kafka's ZooKeeper-mode KafkaController, for what Riverbed needs of it).

Brokers learn their roles from watches on the partition state znodes, not from LeaderAndIsr
requests, so the controller only decides and writes. It is active on the broker whose
ControllerElection won (`on_election_change`) and owns one task that handles one event at a time:

- a **reconciliation pass** after any metadata change (brokers, topics, partition states, topic
  configs, the controller): every partition is checked against the brokers with
  `partition_election.reconcile`. The pass reads the whole cache afresh, so changes that arrive
  together are handled together and none is missed however they are coalesced.
- a **controlled shutdown** request (ControlledShutdown API, `controlled_shutdown`).

Every write is one ZooKeeper transaction (`ClusterMetadataStore.write_partition_states`): a check
of /controller_epoch at the version our election left, so a deposed controller writes nothing,
plus each partition's state conditional on the znode version the decision was made from, so a
leader's concurrent ISR change is re-read and decided again rather than overwritten.

A broker that registered after a partition's state was last written — it restarted, or got a
new ZooKeeper session — is **fenced** for that partition: the leadership or ISR place the state
gives it belonged to its previous incarnation (whose log tail may be gone), so it is treated as
lost, and a new leader epoch is written. This is Kafka's broker epoch (KIP-380): the zxid that
created the broker's registration, compared with the zxid of the state's last write. Both live
in ZooKeeper, so any controller — also one elected after the restart — fences the same way, and
the broker applies the same rule to itself (it does not take a leadership from such a state).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from riverbed.coordination.layout import NO_LEADER, MalformedZnodeError
from riverbed.coordination.metadata import (
    ClusterMetadataStore,
    ControllerMovedError,
    PartitionStateUpdate,
)
from riverbed.coordination.metadata_cache import MetadataCache, MetadataChange
from riverbed.coordination.partition_election import (
    BrokerView,
    LeaderAndIsr,
    controlled_shutdown,
    next_state,
    reconcile,
    still_led_by,
)
from riverbed.coordination.zk import BadVersionError, NoNodeError, ZkError
from riverbed.protocol.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]

# Partition states per ZooKeeper transaction (besides the epoch check): at ~150 bytes each, far
# below ZooKeeper's 1 MiB request limit (jute.maxbuffer).
STATE_WRITES_PER_TRANSACTION_MAX: Final = 200
# Times one partition may be re-read because its state changed under a decision, in one event;
# past that it waits for the next pass.
CONFLICT_REREADS_MAX: Final = 5
# Controlled shutdown requests waiting for the controller task (a broker sends one at a time).
SHUTDOWN_REQUESTS_QUEUED_MAX: Final = 128
# A pass that failed on ZooKeeper (connection loss) is retried after this long.
RETRY_BACKOFF_MS: Final = 500
# How long the controller waits for its cache to show its own writes, so that its next decision
# starts from them rather than from the state they replaced.
CACHE_CATCH_UP_TIMEOUT_MS: Final = 5_000


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """A partition as a decision sees it: from the cache, or re-read after a conflict."""

    topic: str
    partition: int
    replicas: tuple[int, ...]
    current: LeaderAndIsr
    leader_epoch: int
    version: int  # the state znode's version
    modified_zxid: int  # the state znode's last write

    @property
    def key(self) -> TopicPartition:
        return (self.topic, self.partition)


Decision = Callable[[_Snapshot], LeaderAndIsr | None]
_ShutdownRequest = tuple[int, asyncio.Future[list[TopicPartition]]]


class Controller:
    """Decides leaders and ISRs while this broker is the elected controller."""

    def __init__(
        self,
        store: ClusterMetadataStore,
        cache: MetadataCache,
        broker_id: int,
        unclean_leader_election: Callable[[str], bool],
    ) -> None:
        self.broker_id = broker_id
        self._store = store
        self._cache = cache
        self._unclean = unclean_leader_election  # topic -> effective config
        self._active = False
        self._epoch = 0
        self._epoch_version = 0
        self._registrations: dict[int, int | None] = {}  # broker -> epoch last seen
        self._shutting_down: set[int] = set()
        self._rescan = False
        self._shutdowns: deque[_ShutdownRequest] = deque()
        self._wakeup = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def active(self) -> bool:
        return self._active

    def on_election_change(self, is_controller: bool) -> None:
        """ControllerElection's `on_change` (on the loop)."""
        self._resign()
        if is_controller:
            self._activate()

    async def controlled_shutdown(self, broker_id: int) -> list[TopicPartition]:
        """Move `broker_id`'s leaderships to other live ISR members and take it out of every ISR;
        return the replicated partitions it still leads (nobody else in sync). Raises KafkaError
        NOT_CONTROLLER if this controller is not active (or stops being so meanwhile)."""
        self._check_active()
        if len(self._shutdowns) >= SHUTDOWN_REQUESTS_QUEUED_MAX:
            raise KafkaError(
                ErrorCode.REQUEST_TIMED_OUT,
                f"{SHUTDOWN_REQUESTS_QUEUED_MAX} controlled shutdowns are already waiting",
            )
        future: asyncio.Future[list[TopicPartition]] = asyncio.get_running_loop().create_future()
        self._shutdowns.append((broker_id, future))
        self._wakeup.set()
        return await future

    async def stop(self) -> None:
        """Stop acting and wait for the controller task to end. Idempotent."""
        self._resign()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # ---- activation -------------------------------------------------------------------------

    def _activate(self) -> None:
        epoch, version = self._store.controller_epoch, self._store.controller_epoch_version
        if epoch is None or version is None:
            raise RuntimeError("the controller was activated without a won election")
        self._epoch, self._epoch_version = epoch, version
        self._registrations = self._live_epochs()
        self._shutting_down.clear()
        self._active = True
        self._cache.add_listener(self._on_metadata_change)
        self._rescan = True
        self._wakeup = asyncio.Event()
        self._wakeup.set()
        task = asyncio.get_running_loop().create_task(
            self._run(self._wakeup), name=f"controller-{self.broker_id}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        log.info("broker %d is the active controller, epoch %d", self.broker_id, epoch)

    def _resign(self) -> None:
        if not self._active:
            return
        self._active = False
        self._cache.remove_listener(self._on_metadata_change)
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()
        while self._shutdowns:
            _broker_id, future = self._shutdowns.popleft()
            if not future.done():
                future.set_exception(self._not_controller())
        log.info("broker %d is no longer the active controller", self.broker_id)

    def _check_active(self) -> None:
        if not self._active:
            raise self._not_controller()

    def _not_controller(self) -> KafkaError:
        return KafkaError(
            ErrorCode.NOT_CONTROLLER, f"broker {self.broker_id} is not the active controller"
        )

    def _on_metadata_change(self, _change: MetadataChange) -> None:
        self._request_pass()

    def _request_pass(self) -> None:
        self._rescan = True
        self._wakeup.set()

    # ---- the event loop ---------------------------------------------------------------------

    async def _run(self, wakeup: asyncio.Event) -> None:
        while True:
            await wakeup.wait()
            wakeup.clear()
            try:
                while self._shutdowns:
                    await self._serve_shutdown(*self._shutdowns[0])
                    self._shutdowns.popleft()
                if self._rescan:
                    self._rescan = False
                    await self._reconcile()
            except ControllerMovedError:
                log.warning("broker %d: another controller was elected", self.broker_id)
                self._resign()
                return
            except Exception as error:
                # ZooKeeper unreachable (or a bug, logged in full): the controller must not
                # die silently while still elected, so the pass is tried again.
                if isinstance(error, ZkError):
                    log.warning("controller pass failed: %s", error)
                else:
                    log.exception("controller pass failed")
                self._rescan = True
                await asyncio.sleep(RETRY_BACKOFF_MS / 1000)
                wakeup.set()

    async def _serve_shutdown(
        self, broker_id: int, future: asyncio.Future[list[TopicPartition]]
    ) -> None:
        if future.done():
            return  # the requester gave up waiting; it retries or stops anyway
        try:
            remaining = await self._shut_down(broker_id)
        except ControllerMovedError:
            raise  # ends this controller; the request fails with NOT_CONTROLLER
        except KafkaError as error:
            outcome: list[TopicPartition] | BaseException = error
        except Exception as error:  # ZooKeeper unreachable (or a bug): the broker retries
            log.warning("controlled shutdown of broker %d failed", broker_id, exc_info=True)
            outcome = KafkaError(
                ErrorCode.UNKNOWN_SERVER_ERROR, f"controlled shutdown failed: {error}"
            )
        else:
            outcome = remaining
        if future.done():
            return
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

    # ---- decisions --------------------------------------------------------------------------

    async def _reconcile(self) -> None:
        """One pass: elect leaders where they are lost, drop lost brokers from ISRs."""
        self._note_registrations()
        snapshots = self._snapshots()
        brokers = self._broker_view()

        def decide(snapshot: _Snapshot) -> LeaderAndIsr | None:
            fenced = self._fenced(snapshot)
            change = reconcile(
                snapshot.replicas, snapshot.current, brokers, unclean=False, fenced=fenced
            )
            leader = snapshot.current.leader if change is None else change.leader
            # The topic's config is looked up only for partitions a clean election left offline.
            if leader == NO_LEADER and self._unclean(snapshot.topic):
                return reconcile(
                    snapshot.replicas, snapshot.current, brokers, unclean=True, fenced=fenced
                )
            return change

        await self._apply(snapshots, decide)

    async def _shut_down(self, broker_id: int) -> list[TopicPartition]:
        self._note_registrations()
        if broker_id not in self._registrations:
            raise KafkaError(ErrorCode.BROKER_NOT_AVAILABLE, f"broker {broker_id} is not live")
        self._shutting_down.add(broker_id)
        brokers = self._broker_view()
        snapshots = [s for s in self._snapshots() if broker_id in s.replicas]
        log.info("controlled shutdown of broker %d (%d replicas)", broker_id, len(snapshots))

        def decide(snapshot: _Snapshot) -> LeaderAndIsr | None:
            return controlled_shutdown(snapshot.replicas, snapshot.current, broker_id, brokers)

        now = await self._apply(snapshots, decide)
        return [
            s.key
            for s in snapshots
            if still_led_by(s.replicas, now.get(s.key, s.current), broker_id)
        ]

    def _broker_view(self) -> BrokerView:
        return BrokerView(
            live=frozenset(self._registrations), shutting_down=frozenset(self._shutting_down)
        )

    def _snapshots(self) -> list[_Snapshot]:
        return [
            _Snapshot(
                topic.name,
                index,
                state.replicas,
                LeaderAndIsr(state.leader, state.isr),
                state.leader_epoch,
                state.state_version,
                state.state_modified_zxid,
            )
            for topic in self._cache.topics().values()
            for index, state in sorted(topic.partitions.items())
        ]

    # ---- fencing of restarted brokers ------------------------------------------------------

    def _live_epochs(self) -> dict[int, int | None]:
        return {b: self._cache.broker_epoch(b) for b in self._cache.listed_broker_ids()}

    def _note_registrations(self) -> None:
        """Forget the controlled shutdown of brokers whose registration ended or was replaced
        (a restarted broker may lead again)."""
        live = self._live_epochs()
        for broker_id, epoch in self._registrations.items():
            if live.get(broker_id, -1) != epoch:
                self._shutting_down.discard(broker_id)
        self._registrations = live

    def _fenced(self, snapshot: _Snapshot) -> frozenset[int]:
        """The leader and ISR members registered after the state was written (restarted since);
        a broker whose registration is still being read is not fenced until it is known."""
        holders = (snapshot.current.leader, *snapshot.current.isr)
        return frozenset(
            broker_id
            for broker_id in holders
            if (epoch := self._cache.broker_epoch(broker_id)) is not None
            and epoch > snapshot.modified_zxid
        )

    # ---- writes -----------------------------------------------------------------------------

    async def _apply(
        self, snapshots: Iterable[_Snapshot], decide: Decision
    ) -> dict[TopicPartition, LeaderAndIsr]:
        """Write `decide`'s changes, batched, each conditional on the version it was decided
        from; a partition whose state changed meanwhile is re-read and decided again. Returns
        the leader and ISR that every partition it wrote or re-read has now."""
        pending: list[tuple[_Snapshot, LeaderAndIsr]] = []
        for snapshot in snapshots:
            change = decide(snapshot)
            if change is not None:
                pending.append((snapshot, change))
        now: dict[TopicPartition, LeaderAndIsr] = {}
        written: dict[TopicPartition, int] = {}
        rereads: Counter[TopicPartition] = Counter()
        while pending:
            batch = pending[:STATE_WRITES_PER_TRANSACTION_MAX]
            updates = [
                PartitionStateUpdate(
                    s.topic, s.partition, next_state(s.leader_epoch, change, self._epoch), s.version
                )
                for s, change in batch
            ]
            try:
                versions = await self._store.write_partition_states(updates, self._epoch_version)
            except (BadVersionError, NoNodeError) as error:
                index = next((i for i, u in enumerate(updates) if u.path == error.path), None)
                if index is None:
                    raise
                stale, _ = pending.pop(index)  # the rest of the batch goes again as it was
                fresh = await self._reread(stale)
                rereads[stale.key] += 1
                if fresh is None:
                    continue  # deleted with its topic, or unreadable (logged)
                if rereads[stale.key] > CONFLICT_REREADS_MAX:
                    log.warning("%s-%d keeps changing; left to the next pass", *stale.key)
                    self._request_pass()
                    continue
                redone = decide(fresh)
                if redone is None:
                    now[fresh.key] = fresh.current
                else:
                    pending.append((fresh, redone))
                continue
            for (s, change), update, version in zip(batch, updates, versions, strict=True):
                log.info(
                    "%s-%d: leader %d -> %d, ISR %s -> %s, leader epoch %d (controller epoch %d)",
                    s.topic,
                    s.partition,
                    s.current.leader,
                    change.leader,
                    list(s.current.isr),
                    list(change.isr),
                    update.state.leader_epoch,
                    self._epoch,
                )
                now[s.key] = change
                written[s.key] = version
            del pending[: len(batch)]
        await self._cache_catches_up(written)
        return now

    async def _reread(self, snapshot: _Snapshot) -> _Snapshot | None:
        try:
            state, stat = await self._store.read_partition_state(snapshot.topic, snapshot.partition)
        except NoNodeError:
            return None  # deleted with its topic
        except MalformedZnodeError:
            log.exception("cannot decide for %s-%d", snapshot.topic, snapshot.partition)
            return None
        return _Snapshot(
            snapshot.topic,
            snapshot.partition,
            snapshot.replicas,
            LeaderAndIsr(state.leader, state.isr),
            state.leader_epoch,
            stat.version,
            stat.modified_zxid,
        )

    async def _cache_catches_up(self, written: Mapping[TopicPartition, int]) -> None:
        if not written:
            return

        def caught_up(cache: MetadataCache) -> bool:
            return all(
                (state := cache.partition(topic, index)) is None or state.state_version >= version
                for (topic, index), version in written.items()
            )

        try:
            await self._cache.wait_until(caught_up, CACHE_CATCH_UP_TIMEOUT_MS)
        except TimeoutError:
            log.warning("the metadata cache did not show the controller's writes in time")
