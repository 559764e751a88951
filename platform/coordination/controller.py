"""The controller: moves partition leaderships when brokers come and go, and runs controlled
shutdowns (Kafka's ZooKeeper-mode KafkaController, for what Riverbed needs of it).

Brokers learn their roles from watches on the partition state znodes, not from LeaderAndIsr
requests, so the controller only decides and writes. It is active on the broker whose
ControllerElection won (`on_election_change`) and owns one task that handles one event at a time:

- a **reconciliation pass** after any metadata change (brokers, topics, partition states, topic
  configs, the controller): partitions are checked against the brokers with
  `partition_election.reconcile`, reading the cache afresh, so changes that arrive together are
  handled together and none is missed however they are coalesced. A change of the brokers (or of
  the controller, or a failed pass) checks every partition; a change of some partitions' states,
  assignments or topic configs checks those only. Leaders' ISR writes reach the controller one
  watch event at a time, and a whole pass for each made a broker's restart cost the controller
  partitions times ISR changes.
- a **controlled shutdown** request (ControlledShutdown API, `controlled_shutdown`).
- an **automatic preferred-leader rebalance** check (Kafka's `auto.leader.rebalance.enable`),
  due every `leader.imbalance.check.interval.seconds`: brokers leading too few of the
  partitions they are the preferred replica of get them back (`leader_balance.plan_rebalance`)
  through the same election as ElectLeaders. A timer only marks the check due and wakes the
  task, so the check never runs beside a pass or a request, and it reads every partition once
  per interval, not per metadata change.

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
from collections import Counter, defaultdict, deque
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from riverbed.common.log_events import event
from riverbed.coordination import reassignment
from riverbed.coordination.layout import NO_LEADER, MalformedZnodeError, TopicAssignment
from riverbed.coordination.leader_balance import REBALANCE_OFF, RebalancePolicy, plan_rebalance
from riverbed.coordination.metadata import (
    AssignmentUpdate,
    ClusterMetadataStore,
    ControllerMovedError,
    PartitionStateUpdate,
)
from riverbed.coordination.metadata_cache import MetadataCache, MetadataChange, PartitionMetadata
from riverbed.coordination.partition_election import (
    BrokerView,
    LeaderAndIsr,
    controlled_shutdown,
    next_state,
    reconcile,
    still_led_by,
)
from riverbed.coordination.zk import BadVersionError, NoNodeError, ZkConnectionError, ZkError
from riverbed.protocol.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
T = TypeVar("T")

# Partition states per ZooKeeper transaction (besides the epoch check): at ~150 bytes each, far
# below ZooKeeper's 1 MiB request limit (jute.maxbuffer).
STATE_WRITES_PER_TRANSACTION_MAX: Final = 200
# Transactions of partition states sent before the first is answered: a broker's failure or
# shutdown writes thousands, and one at a time each waited for ZooKeeper's round trip (its log
# fsync included) while the controller's loop had nothing else to do for it.
STATE_TRANSACTIONS_IN_FLIGHT_MAX: Final = 4
# Times one partition may be re-read because its state changed under a decision, in one event;
# past that it waits for the next pass.
CONFLICT_REREADS_MAX: Final = 5
# Requests (controlled shutdowns, reassignments, elections) waiting for the controller task.
REQUESTS_QUEUED_MAX: Final = 128
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
# Decided changes not yet written: each partition as decided from, and its new leader and ISR.
_Writes = list[tuple[_Snapshot, LeaderAndIsr]]
_Request = tuple[Callable[[], Awaitable[object]], asyncio.Future[Any]]
# Per partition of a reassignment or election: None where it succeeded.
Outcomes = dict[TopicPartition, KafkaError | None]


class Controller:
    """Decides leaders and ISRs while this broker is the elected controller."""

    def __init__(
        self,
        store: ClusterMetadataStore,
        cache: MetadataCache,
        broker_id: int,
        unclean_leader_election: Callable[[str], bool],
        rebalance: RebalancePolicy = REBALANCE_OFF,
    ) -> None:
        self.broker_id = broker_id
        self._store = store
        self._cache = cache
        self._unclean = unclean_leader_election  # topic -> effective config
        self._rebalance = rebalance
        # Set by the timer, cleared by the controller task when it runs the check; the timer
        # belongs to one activation and is cancelled when the controller resigns.
        self._rebalance_due = False
        self._rebalance_timer: asyncio.TimerHandle | None = None
        # Set at each activation: the first pass finishes deletions a controller left half done.
        self._deletions_due = False
        self._active = False
        self._epoch = 0
        self._epoch_version = 0
        self._registrations: dict[int, int | None] = {}  # broker -> epoch last seen
        self._shutting_down: set[int] = set()
        # What the next pass checks: every partition, or those changed since the last pass.
        self._rescan_all = False
        self._dirty: set[TopicPartition] = set()
        self._requests: deque[_Request] = deque()
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
        return await self._submit(lambda: self._shut_down(broker_id))

    async def alter_reassignments(
        self, moves: Mapping[TopicPartition, Sequence[int] | None]
    ) -> Outcomes:
        """Start moving each partition to its target replicas (None: cancel its move); returns
        once the moves are written, not when they finish (AlterPartitionReassignments)."""
        return await self._submit(lambda: self._reassign(moves))

    async def elect_leaders(
        self, partitions: Collection[TopicPartition] | None, *, unclean: bool
    ) -> Outcomes:
        """Preferred (or, with `unclean`, any live) leaders for `partitions` (None: all)."""
        return await self._submit(lambda: self._elect_leaders(partitions, unclean))

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
        self._rescan_all = True
        self._deletions_due = True
        self._rebalance_due = False
        self._wakeup = asyncio.Event()
        self._wakeup.set()
        task = asyncio.get_running_loop().create_task(
            self._run(self._wakeup), name=f"controller-{self.broker_id}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        # The first check comes one interval after the election (Kafka's after 5 s), so the
        # checks keep the configured pace however often the controller moves.
        self._schedule_rebalance_check()
        event(
            log, logging.INFO, "controller.elected", broker=self.broker_id, controller_epoch=epoch
        )

    def _resign(self) -> None:
        if not self._active:
            return
        self._active = False
        self._cache.remove_listener(self._on_metadata_change)
        if self._rebalance_timer is not None:
            self._rebalance_timer.cancel()
            self._rebalance_timer = None
        self._rebalance_due = False
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()
        while self._requests:
            _work, future = self._requests.popleft()
            if not future.done():
                future.set_exception(self._not_controller())
        event(log, logging.INFO, "controller.resigned", broker=self.broker_id)

    def _check_active(self) -> None:
        if not self._active:
            raise self._not_controller()

    def _not_controller(self) -> KafkaError:
        return KafkaError(
            ErrorCode.NOT_CONTROLLER, f"broker {self.broker_id} is not the active controller"
        )

    def _on_metadata_change(self, change: MetadataChange) -> None:
        if (
            change.brokers_added
            or change.brokers_removed
            or change.controller_changed
            or change.broker_configs_changed  # a cluster-wide unclean.leader.election.enable
        ):
            self._request_pass()
            return
        dirty = self._dirty
        dirty.update(change.partitions_changed)
        for name in change.topics_added | change.configs_changed:
            topic = self._cache.topic(name)
            if topic is not None:
                dirty.update((name, index) for index in topic.partitions)
        if dirty:
            self._wakeup.set()

    def _request_pass(self) -> None:
        """Check every partition at the next pass."""
        self._rescan_all = True
        self._wakeup.set()

    def _schedule_rebalance_check(self) -> None:
        """Have the controller task check the leader balance one interval from now (Kafka
        schedules the next check once the last one ended, so checks never pile up)."""
        if not (self._active and self._rebalance.enabled) or self._rebalance_timer is not None:
            return
        self._rebalance_timer = asyncio.get_running_loop().call_later(
            self._rebalance.check_interval_s, self._rebalance_check_due
        )

    def _rebalance_check_due(self) -> None:
        self._rebalance_timer = None
        self._rebalance_due = True
        self._wakeup.set()

    # ---- the event loop ---------------------------------------------------------------------

    async def _run(self, wakeup: asyncio.Event) -> None:
        while True:
            await wakeup.wait()
            wakeup.clear()
            try:
                while self._requests:
                    await self._serve(*self._requests[0])
                    self._requests.popleft()
                if self._deletions_due:
                    await self._finish_topic_deletions()
                    self._deletions_due = False
                if self._rescan_all or self._dirty:
                    keys = None if self._rescan_all else self._dirty
                    self._rescan_all = False
                    self._dirty = set()
                    await self._reconcile(keys)
                if self._rebalance_due:
                    self._rebalance_due = False
                    try:
                        await self._rebalance_leaders()
                    finally:
                        # Also after a failure (ZooKeeper away): the next interval tries again.
                        self._schedule_rebalance_check()
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
                self._rescan_all = True
                await asyncio.sleep(RETRY_BACKOFF_MS / 1000)
                wakeup.set()

    async def _submit(self, work: Callable[[], Awaitable[T]]) -> T:
        """Run `work` on the controller task, between passes, and return its result."""
        self._check_active()
        if len(self._requests) >= REQUESTS_QUEUED_MAX:
            raise KafkaError(
                ErrorCode.REQUEST_TIMED_OUT,
                f"{REQUESTS_QUEUED_MAX} controller requests are already waiting",
            )
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._requests.append((work, future))
        self._wakeup.set()
        return await future

    async def _serve(
        self, work: Callable[[], Awaitable[object]], future: asyncio.Future[Any]
    ) -> None:
        if future.done():
            return  # the requester gave up waiting; it retries (or stops) anyway
        try:
            outcome: object = await work()
        except ControllerMovedError:
            raise  # ends this controller; the request fails with NOT_CONTROLLER
        except KafkaError as error:
            outcome = error
        except ZkConnectionError as error:
            # ZooKeeper went away mid-request: the same answer as a request that waited for it
            # in vain (REQUEST_TIMED_OUT, retriable), not a server error.
            outcome = KafkaError(
                ErrorCode.REQUEST_TIMED_OUT, f"ZooKeeper connection lost mid-request: {error}"
            )
        except Exception as error:  # a bug: the requester retries
            log.warning("controller request failed", exc_info=True)
            outcome = KafkaError(
                ErrorCode.UNKNOWN_SERVER_ERROR, f"controller request failed: {error}"
            )
        if future.done():
            return
        if isinstance(outcome, KafkaError):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

    # ---- decisions --------------------------------------------------------------------------

    async def _finish_topic_deletions(self) -> None:
        """Delete each topic whose DeleteTopics marker is written but which still exists: a
        controller stopped between the two writes (Kafka's controller likewise resumes topic
        deletions after a failover)."""
        for marker in await self._store.topic_deletions():
            current = self._cache.topic(marker.topic)
            if current is None or current.topic_id != marker.topic_id:
                continue
            log.info("finishing the deletion of topic %r (id %s)", marker.topic, marker.topic_id)
            try:
                await self._store.delete_topic(marker.topic, marker.topic_id)
            except KafkaError as error:
                if error.code is not ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                    raise
                # Deleted meanwhile: done.

    async def _reconcile(self, keys: Collection[TopicPartition] | None) -> None:
        """One pass over `keys` (None: every partition): elect leaders where they are lost, drop
        lost brokers from ISRs, finish reassignments whose targets are in sync."""
        self._note_registrations()
        snapshots = self._snapshots(keys)
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
        await self._finish_reassignments(snapshots)

    async def _shut_down(self, broker_id: int) -> list[TopicPartition]:
        self._note_registrations()
        if broker_id not in self._registrations:
            raise KafkaError(ErrorCode.BROKER_NOT_AVAILABLE, f"broker {broker_id} is not live")
        self._shutting_down.add(broker_id)
        brokers = self._broker_view()
        snapshots = [s for s in self._snapshots() if broker_id in s.replicas]
        event(
            log,
            logging.INFO,
            "broker.controlled_shutdown",
            broker=broker_id,
            replicas=len(snapshots),
        )

        def decide(snapshot: _Snapshot) -> LeaderAndIsr | None:
            return controlled_shutdown(snapshot.replicas, snapshot.current, broker_id, brokers)

        now = await self._apply(snapshots, decide)
        return [
            s.key
            for s in snapshots
            if still_led_by(s.replicas, now.get(s.key, s.current), broker_id)
        ]

    async def _finish_reassignments(self, snapshots: Iterable[_Snapshot]) -> None:
        """Shrink the replica set of each of these partitions whose reassignment has its target
        replicas all in sync (as the cache has them now, after this pass's writes). A conflict
        (an ISR write meanwhile) fails the pass, which is retried after a backoff."""
        moves: dict[TopicPartition, reassignment.ReplicaSet] = {}
        for snapshot in snapshots:
            state = self._cache.partition(snapshot.topic, snapshot.partition)
            if state is None:
                continue
            done = reassignment.finished(_replica_set(state), state.isr)
            if done is not None:
                moves[snapshot.key] = done
        if moves:
            await self._write_moves(moves)

    async def _reassign(self, moves: Mapping[TopicPartition, Sequence[int] | None]) -> Outcomes:
        outcomes: Outcomes = {}
        for attempt in range(CONFLICT_REREADS_MAX + 1):
            self._note_registrations()
            live = frozenset(self._registrations)
            planned: dict[TopicPartition, reassignment.ReplicaSet] = {}
            for key, target in moves.items():
                state = self._cache.partition(*key)
                if state is None:
                    outcomes[key] = KafkaError(
                        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{key[0]}-{key[1]} does not exist"
                    )
                    continue
                current = _replica_set(state)
                try:
                    if target is None:
                        moved = reassignment.cancel(current)
                    else:
                        reassignment.check_target(target, live)
                        moved = reassignment.start(current, target)
                except KafkaError as error:
                    outcomes[key] = error
                    continue
                outcomes[key] = None
                if moved != current:
                    planned[key] = moved
            try:
                leaderless = await self._write_moves(planned)
            except (BadVersionError, NoNodeError) as error:
                # A leader's ISR write or a topic deletion crossed ours: decide again from the
                # cache once it has caught up (moves already written come out unchanged).
                log.info("reassignment conflicted on %s (attempt %d)", error.path, attempt + 1)
                await asyncio.sleep(RETRY_BACKOFF_MS / 1000)
                continue
            for key in leaderless:
                outcomes[key] = KafkaError(
                    ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE, "no replica left could lead"
                )
            return outcomes
        raise KafkaError(ErrorCode.REQUEST_TIMED_OUT, "the partitions kept changing; try again")

    async def _rebalance_leaders(self) -> None:
        """Kafka's automatic preferred-leader election: one pass over the cache to find the
        brokers leading too few of their preferred partitions, then ElectLeaders' preferred
        election for the partitions they can lead again (batched like every write)."""
        self._note_registrations()
        partitions = (
            ((topic.name, index), state)
            for topic in self._cache.topics().values()
            for index, state in topic.partitions.items()
        )
        plan = plan_rebalance(partitions, self._broker_view(), self._rebalance.imbalance_percentage)
        if not plan.elect:
            return
        outcomes = await self._elect_leaders(plan.elect, unclean=False)
        # A partition whose state changed since the plan (its preferred replica left the ISR,
        # a restart fenced it) is refused like an ElectLeaders request would be; the next
        # check looks again.
        refused = Counter(error.code.name for error in outcomes.values() if error is not None)
        event(
            log,
            logging.INFO,
            "controller.leader_rebalance",
            brokers=[imbalance.broker for imbalance in plan.imbalanced],
            imbalance_ratios=[round(imbalance.ratio, 3) for imbalance in plan.imbalanced],
            elected=len(outcomes) - sum(refused.values()),
            refused=[f"{code}:{count}" for code, count in sorted(refused.items())],
        )

    async def _elect_leaders(
        self, partitions: Collection[TopicPartition] | None, unclean: bool
    ) -> Outcomes:
        self._note_registrations()
        brokers = self._broker_view()
        snapshots = self._snapshots(None if partitions is None else set(partitions))
        outcomes: Outcomes = {
            key: KafkaError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{key[0]}-{key[1]} does not exist"
            )
            for key in set(partitions or ()) - {s.key for s in snapshots}
        }

        def decide(snapshot: _Snapshot) -> LeaderAndIsr | None:
            try:
                change = self._election(snapshot, brokers, unclean)
            except KafkaError as error:
                outcomes[snapshot.key] = error
                return None
            outcomes[snapshot.key] = None
            return change

        await self._apply(snapshots, decide)
        return outcomes

    def _election(self, snapshot: _Snapshot, brokers: BrokerView, unclean: bool) -> LeaderAndIsr:
        current, fenced = snapshot.current, self._fenced(snapshot)
        if not unclean:
            if snapshot.replicas[0] in fenced:
                raise KafkaError(
                    ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE,
                    f"preferred replica {snapshot.replicas[0]} restarted since it was in sync",
                )
            return reassignment.preferred_leader(snapshot.replicas, current, brokers)
        if current.leader != NO_LEADER and current.leader not in fenced:
            raise KafkaError(ErrorCode.ELECTION_NOT_NEEDED, f"broker {current.leader} leads")
        change = reconcile(snapshot.replicas, current, brokers, unclean=True, fenced=fenced)
        if change is None or change.leader == NO_LEADER:
            raise KafkaError(ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE, "no replica is live")
        return change

    async def _write_moves(
        self, moves: Mapping[TopicPartition, reassignment.ReplicaSet]
    ) -> set[TopicPartition]:
        """Write new replica sets: per topic one transaction of its assignment and each moved
        partition's state (leader and ISR fitted to the new set, a new leader epoch). Returns the
        partitions not moved because nobody eligible could lead them."""
        brokers = self._broker_view()
        by_topic: defaultdict[str, dict[int, reassignment.ReplicaSet]] = defaultdict(dict)
        for (topic_name, index), moved in moves.items():
            by_topic[topic_name][index] = moved
        written: dict[TopicPartition, int] = {}
        assignments: dict[str, int] = {}
        leaderless: set[TopicPartition] = set()
        for name, moved_partitions in sorted(by_topic.items()):
            topic = self._cache.topic(name)
            if topic is None:
                raise NoNodeError(f"topic {name} is gone", path=None)
            sets = {index: _replica_set(state) for index, state in topic.partitions.items()}
            updates: list[PartitionStateUpdate] = []
            for index, moved in sorted(moved_partitions.items()):
                state = topic.partitions[index]
                change = reassignment.leader_and_isr(
                    moved.replicas, LeaderAndIsr(state.leader, state.isr), brokers
                )
                if change is None:
                    leaderless.add((name, index))
                    continue
                sets[index] = moved
                new_state = next_state(state.leader_epoch, change, self._epoch)
                updates.append(PartitionStateUpdate(name, index, new_state, state.state_version))
                event(
                    log,
                    logging.INFO,
                    "partition.replicas_changed",
                    topic=name,
                    partition=index,
                    replicas=list(moved.replicas),
                    previous_replicas=list(state.replicas),
                    adding=list(moved.adding),
                    removing=list(moved.removing),
                    leader=change.leader,
                    isr=list(change.isr),
                    leader_epoch=new_state.leader_epoch,
                )
            if not updates:
                continue
            assignment = TopicAssignment(
                topic.topic_id,
                {index: rs.replicas for index, rs in sets.items()},
                adding={index: rs.adding for index, rs in sets.items() if rs.adding},
                removing={index: rs.removing for index, rs in sets.items() if rs.removing},
            )
            versions = await self._store.write_partition_states(
                updates,
                self._epoch_version,
                [AssignmentUpdate(name, assignment, topic.assignment_version)],
            )
            for update, version in zip(updates, versions, strict=True):
                written[(update.topic, update.partition)] = version
            assignments[name] = topic.assignment_version + 1
        await self._cache_catches_up(written, assignments)
        return leaderless

    def _broker_view(self) -> BrokerView:
        return BrokerView(
            live=frozenset(self._registrations), shutting_down=frozenset(self._shutting_down)
        )

    def _snapshots(self, keys: Collection[TopicPartition] | None = None) -> list[_Snapshot]:
        """The partitions named by `keys` (None: all) that the cache has, in order."""
        if keys is None:
            states = [
                (topic.name, index, state)
                for topic in self._cache.topics().values()
                for index, state in sorted(topic.partitions.items())
            ]
        else:
            states = [
                (topic, index, state)
                for topic, index in sorted(keys)
                if (state := self._cache.partition(topic, index)) is not None
            ]
        return [
            _Snapshot(
                topic,
                index,
                state.replicas,
                LeaderAndIsr(state.leader, state.isr),
                state.leader_epoch,
                state.state_version,
                state.state_modified_zxid,
            )
            for topic, index, state in states
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
        the leader and ISR that every partition it wrote or re-read has now. Up to
        STATE_TRANSACTIONS_IN_FLIGHT_MAX transactions are sent at once: each is atomic, and a
        conflict in one sends its other writes again, unchanged."""
        pending: _Writes = []
        for snapshot in snapshots:
            change = decide(snapshot)
            if change is not None:
                pending.append((snapshot, change))
        # New leaders first, ISR-only changes after (as Kafka's controller elects leaders before
        # it takes a failed broker's replicas offline): a partition without a leader is down, one
        # whose ISR still names a gone follower is not. A broker's failure or shutdown touches
        # every partition it holds, and its leaderships then move in the first transactions.
        pending.sort(key=lambda item: item[1].leader == item[0].current.leader)
        now: dict[TopicPartition, LeaderAndIsr] = {}
        written: dict[TopicPartition, int] = {}
        rereads: Counter[TopicPartition] = Counter()
        in_flight: dict[asyncio.Task[list[int]], tuple[_Writes, list[PartitionStateUpdate]]] = {}
        try:
            while pending or in_flight:
                while pending and len(in_flight) < STATE_TRANSACTIONS_IN_FLIGHT_MAX:
                    batch = pending[:STATE_WRITES_PER_TRANSACTION_MAX]
                    del pending[: len(batch)]
                    updates = [
                        PartitionStateUpdate(
                            s.topic,
                            s.partition,
                            next_state(s.leader_epoch, change, self._epoch),
                            s.version,
                        )
                        for s, change in batch
                    ]
                    write = self._store.write_partition_states(updates, self._epoch_version)
                    in_flight[asyncio.create_task(write)] = (batch, updates)
                done, _ = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    batch, updates = in_flight.pop(task)
                    try:
                        versions = task.result()
                    except (BadVersionError, NoNodeError) as error:
                        index = next(
                            (i for i, u in enumerate(updates) if u.path == error.path), None
                        )
                        if index is None:
                            raise
                        stale, _ = batch.pop(index)
                        pending.extend(batch)  # the rest of the transaction goes again as it was
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
                        event(
                            log,
                            logging.INFO,
                            "partition.leader_changed",
                            topic=s.topic,
                            partition=s.partition,
                            leader=change.leader,
                            previous_leader=s.current.leader,
                            isr=list(change.isr),
                            previous_isr=list(s.current.isr),
                            leader_epoch=update.state.leader_epoch,
                            controller_epoch=self._epoch,
                        )
                        now[s.key] = change
                        written[s.key] = version
        finally:
            # An error (the controller moved, ZooKeeper went away) ends the pass: the writes
            # still in flight are ours to stop; what they wrote the next pass reads back.
            for task in in_flight:
                task.cancel()
            await asyncio.gather(*in_flight, return_exceptions=True)
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

    async def _cache_catches_up(
        self, written: Mapping[TopicPartition, int], assignments: Mapping[str, int] | None = None
    ) -> None:
        """Wait until the cache shows the partition state (and assignment) versions we wrote."""
        if not written:
            return
        assignments = assignments or {}

        def caught_up(cache: MetadataCache) -> bool:
            return all(
                (state := cache.partition(topic, index)) is None or state.state_version >= version
                for (topic, index), version in written.items()
            ) and all(
                (topic := cache.topic(name)) is None or topic.assignment_version >= version
                for name, version in assignments.items()
            )

        try:
            await self._cache.wait_until(caught_up, CACHE_CATCH_UP_TIMEOUT_MS)
        except TimeoutError:
            log.warning("the metadata cache did not show the controller's writes in time")


def _replica_set(state: PartitionMetadata) -> reassignment.ReplicaSet:
    return reassignment.ReplicaSet(state.replicas, state.adding_replicas, state.removing_replicas)
