"""A Riverbed broker: wires the local logs, ZooKeeper metadata and the Kafka server together.

Startup order matters and follows Kafka's: load and recover the local logs (nothing can be
served before they are consistent), then join the cluster in ZooKeeper, apply the metadata (open
the partitions this broker hosts; leading a `__consumer_offsets` or `__transaction_state`
partition starts loading its groups or transactions) and only then bind the listener — so a
client that can connect gets correct answers. The logs load on a worker thread while the
ZooKeeper session opens and the metadata is read (neither touches a log), and the broker
registers only once they are loaded. Shutdown runs the other way round and ends with a
clean-shutdown marker.

A failed data directory (a log in it went offline: a failed fsync, an append that could not be
undone) stops the broker as Kafka's last failed log dir does: one CRITICAL event, the ZooKeeper
session closed so that the controller moves the leaderships at once, then an immediate exit
with LOG_DIR_FAILURE_EXIT_CODE and no clean-shutdown marker (`_halt_after_log_dir_failure`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import ssl
from collections.abc import Callable, Mapping
from pathlib import Path

from riverbed.broker.controlled_shutdown import request_controlled_shutdown
from riverbed.broker.dispatcher import Dispatcher
from riverbed.broker.fetch_sessions import FetchSessionCache
from riverbed.broker.groups.coordinator import GroupCoordinator
from riverbed.broker.handlers.context import BrokerContext, wall_clock_ms
from riverbed.broker.metrics import BrokerMetrics
from riverbed.broker.metrics_server import MetricsServer
from riverbed.broker.metrics_state import BrokerStateCollector
from riverbed.broker.network.server import AuthenticatorFactory, KafkaServer, ServerLimits
from riverbed.broker.partition_roles import PartitionRoles, log_config
from riverbed.broker.stray_logs import StrayLogs
from riverbed.broker.transactions.coordinator import TransactionCoordinator
from riverbed.broker.transactions.markers import MarkerChannel
from riverbed.common.log_events import event
from riverbed.configs import (
    CONFIG_RULES,
    BrokerConfig,
    TopicConfig,
    topic_config,
)
from riverbed.coordination.controller import Controller
from riverbed.coordination.controller_election import ControllerElection
from riverbed.coordination.layout import BrokerRegistration
from riverbed.coordination.metadata import ClusterMetadataStore
from riverbed.coordination.metadata_cache import (
    MetadataCache,
    MetadataChange,
    MetadataWatcher,
    TopicMetadata,
)
from riverbed.coordination.producer_ids import ProducerIdAllocator, ProducerIdIssuer
from riverbed.coordination.zk import AsyncZooKeeper, ConnectionState
from riverbed.hot.replication.inter_broker import InterBrokerDialer
from riverbed.hot.replication.isr import IsrManager
from riverbed.hot.replication.partitions import PartitionManager
from riverbed.hot.replication.replica_fetcher import ReplicaFetcherManager
from riverbed.hot.storage.cleaner import CleanerSettings, LogCleaner
from riverbed.hot.storage.data_dir import check_data_dir_identity
from riverbed.hot.storage.log_manager import LogManager
from riverbed.hot.storage.retention import apply_retention
from riverbed.protocol.errors import KafkaError
from riverbed.security.acl_cache import AclCache
from riverbed.security.acl_store import AclStore
from riverbed.security.authorizer import Authorizer
from riverbed.security.credentials import CredentialCache, CredentialWatcher
from riverbed.security.limits import ConnectionQuotas
from riverbed.security.sasl_server import SaslServerAuthenticator
from riverbed.security.tls import ClientAuth, server_context

log = logging.getLogger(__name__)

# The per-broker secret that makes unknown SCRAM users' stand-in salts stable (and unguessable).
STAND_IN_SECRET_BYTES = 32

# How often recovery points and high watermarks are checkpointed (Kafka:
# replica.high.watermark.checkpoint.interval.ms = 5000).
CHECKPOINT_INTERVAL_S = 5.0
# How often logs with a `flush.ms` are checked for a due fsync (Kafka:
# log.flush.scheduler.interval.ms; an idle log must still flush on time).
FLUSH_CHECK_INTERVAL_S = 1.0
# How long startup waits for the metadata cache to show this broker's own registration.
REGISTRATION_WAIT_MS = 10_000
# The exit status of a broker whose data dir failed. Kafka halts with 1, which `riverbed` also
# uses for every user error; sysexits.h's EX_IOERR ("an error occurred while doing I/O on some
# file") tells a supervisor or an operator that the disk, not the config, stopped this broker.
LOG_DIR_FAILURE_EXIT_CODE = os.EX_IOERR
# How long a broker whose data dir failed waits for ZooKeeper to close its session before it
# exits anyway. Closing is one round trip; a ZooKeeper that does not answer expires the session
# itself after zookeeper.session.timeout.ms, so waiting longer would only delay the exit.
SESSION_CLOSE_TIMEOUT_S = 5.0


class Broker:
    """One broker process's state and lifecycle. `start()` then `stop()`, each exactly once."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self._zk = AsyncZooKeeper(
            config.zookeeper_connect,
            session_timeout_ms=config.zookeeper_session_timeout_ms,
            connect_timeout_ms=config.zookeeper_connect_timeout_ms,
            digest=config.zookeeper_digest,
        )
        self._store = ClusterMetadataStore(self._zk, CONFIG_RULES)
        self._cache = MetadataCache()
        # Each topic's effective config, with the TopicMetadata it was built from (_topic_config).
        self._topic_configs: dict[str, tuple[TopicMetadata, TopicConfig]] = {}
        self._watcher = MetadataWatcher(self._zk, self._cache)
        self._controller = Controller(
            self._store,
            self._cache,
            config.broker_id,
            self._unclean_leader_election,
            rebalance=config.leader_rebalance,
        )
        self._election = ControllerElection(
            self._store, config.broker_id, on_change=self._controller.on_election_change
        )
        self._dialer = InterBrokerDialer.from_config(config, self._cache)
        self._fetchers = ReplicaFetcherManager(config.broker_id, self._cache, self._dialer)
        self._registration_task: asyncio.Task[None] | None = None
        # The zxid that created our current registration (Kafka's broker epoch, KIP-380).
        self._broker_epoch = 0
        # Applies metadata to the hosted partitions, once our registration is known.
        self._roles: PartitionRoles | None = None
        self._log_manager: LogManager | None = None
        self._logs_loading: asyncio.Future[LogManager] | None = None
        self._servers: list[KafkaServer] = []  # one per listener, in `listeners` order
        self._ctx: BrokerContext | None = None
        self._metrics_server: MetricsServer | None = None
        self._exit_stack = contextlib.AsyncExitStack()
        # Closes the ZooKeeper session and exits, once the data dir failed.
        self._log_dir_failure_task: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        """The bound port of the first listener."""
        if not self._servers:
            return self.config.port
        return self._servers[0].port

    @property
    def metrics_port(self) -> int | None:
        """The bound port of the metrics endpoint; None when it is off or not started."""
        return None if self._metrics_server is None else self._metrics_server.port

    async def start(self) -> None:
        """Start every part in order; each part started registers how to stop it, so `stop()`
        after a failed start unwinds exactly what was started."""
        config = self.config
        stack = self._exit_stack
        # Before anything starts: a bad keystore is a one-line error, not a failing handshake.
        ssl_contexts = self._ssl_contexts()
        data_dir = Path(config.log_dir)
        await asyncio.to_thread(data_dir.mkdir, parents=True, exist_ok=True)
        # Recovery must finish before anything is served; meanwhile ZooKeeper is read.
        defaults = log_config(self.config, {})
        self._logs_loading = asyncio.ensure_future(
            asyncio.to_thread(
                LogManager, data_dir, defaults, on_dir_failure=self._log_dir_failure_channel()
            )
        )
        stack.push_async_callback(self._close_logs)
        await self._zk.start()
        stack.push_async_callback(self._zk.stop)
        authenticators = await self._start_authentication(stack)
        await self._store.ensure_layout()
        cluster_id = await self._store.ensure_cluster_id()
        await self._watcher.start()
        stack.push_async_callback(self._watcher.stop)
        acls = await self._start_acls() if config.authorizer_enabled else None
        self._log_manager = await self._logs_loading
        check_data_dir_identity(data_dir, cluster_id=cluster_id, broker_id=config.broker_id)
        partitions = PartitionManager(self._log_manager, config.broker_id)
        metrics = BrokerMetrics()
        isr_manager = IsrManager(
            self._store,
            partitions,
            broker_id=config.broker_id,
            lag_max_ms=config.replica_lag_time_max_ms,
            shrinks=metrics.isr_shrinks,
            expands=metrics.isr_expands,
        )
        # Started before the metadata is applied: leading a __consumer_offsets partition starts
        # its load. Closed before the logs are (the exit stack unwinds in reverse).
        groups = GroupCoordinator(config, self._cache, self._store, partitions, wall_clock_ms)
        groups.start()
        stack.push_async_callback(groups.close)
        # One producer id allocator: idempotent and transactional producers share its blocks.
        producer_id_allocator = ProducerIdAllocator(self._zk, config.broker_id)
        # Like the groups: started before the metadata is applied, closed before the logs.
        transactions = TransactionCoordinator(
            config,
            self._cache,
            self._store,
            partitions,
            producer_id_allocator,
            MarkerChannel(self._dialer, config.broker_id),
            wall_clock_ms,
        )
        transactions.start()
        stack.push_async_callback(transactions.close)
        # What clients are told to dial (advertised.listeners), not what this process binds.
        advertised_host, advertised_port = config.advertised_host_port
        self._ctx = BrokerContext(
            broker_id=config.broker_id,
            host=advertised_host,
            port=advertised_port,
            config=config,
            cache=self._cache,
            store=self._store,
            partitions=partitions,
            producer_ids=ProducerIdIssuer(producer_id_allocator),
            isr_manager=isr_manager,
            groups=groups,
            transactions=transactions,
            metrics=metrics,
            controller=self._controller,
            fetch_sessions=FetchSessionCache(
                config.max_incremental_fetch_session_cache_slots,
                config.min_incremental_fetch_session_eviction_ms,
            ),
        )
        metrics.watch_fetch_sessions(self._ctx.fetch_sessions)
        if acls is not None:
            self._ctx.acl_store = acls
            self._ctx.authorizer = Authorizer(config.authorizer_settings, lambda: acls.snapshot)
        self._servers = self._listener_servers(Dispatcher(self._ctx), ssl_contexts, authenticators)
        if config.remote_storage_url is not None:
            # Imported here: pyarrow and aiobotocore load only on brokers that tier.
            from riverbed.tiering.service import TieredStorage

            tiering = TieredStorage(config, data_dir, partitions, self._topic_config, wall_clock_ms)
            self._ctx.tiering = tiering
        self._cache.add_listener(self._on_metadata_change)
        # Stopped after the server (the exit stack unwinds in reverse): no follower task or
        # ISR write outlives the logs.
        stack.push_async_callback(self._fetchers.stop)
        stack.push_async_callback(isr_manager.stop)
        await self._register()
        self._zk.add_state_listener(self._on_zk_state)
        stack.callback(self._zk.remove_state_listener, self._on_zk_state)
        stack.push_async_callback(self._stop_registration)
        stack.push_async_callback(self._controller.stop)  # after the election stopped
        await self._election.start()
        stack.push_async_callback(self._election.stop)
        await self._cache_caught_up()
        strays = StrayLogs(
            self._store, self._log_manager, partitions, config.broker_id, self._apply_all
        )
        self._roles = PartitionRoles(
            self.config,
            self._cache,
            self._require_ctx(),
            self._fetchers,
            self._log_manager,
            strays,
            lambda: self._broker_epoch,
        )
        self._roles.apply_all()
        strays.start()
        stack.push_async_callback(strays.stop)
        await isr_manager.start()
        for server in self._servers:
            await server.start()
            stack.push_async_callback(server.stop)
        if self._ctx.tiering is not None:
            await self._ctx.tiering.start()
            stack.push_async_callback(self._ctx.tiering.stop)
        loops = (
            (self._checkpoint_loop, "checkpoints"),
            (self._flush_loop, "flush"),
            (self._retention_loop, "retention"),
            (self._cleaner_loop, "log cleaner"),
        )
        for loop, name in loops:
            task = asyncio.create_task(loop(), name=name)
            stack.push_async_callback(_cancel, task)
        if config.metrics_port >= 0:
            # Last: the scrape-time collector reads parts (tiering) that exist only once started.
            metrics.registry.register(BrokerStateCollector(self._ctx))
            self._metrics_server = MetricsServer(
                metrics.registry, config.metrics_host or config.host, config.metrics_port
            )
            await self._metrics_server.start()
            stack.push_async_callback(self._metrics_server.stop)
        event(
            log,
            logging.INFO,
            "broker.started",
            broker=config.broker_id,
            host=config.host,
            port=self.port,
            cluster_id=cluster_id,
        )

    async def stop(self) -> None:
        """Clean shutdown: hand leaderships over (controlled shutdown), stop serving, leave the
        cluster, close logs with a clean marker."""
        if self._servers:
            try:
                # Kafka's StopReplica, before the handover rather than after it: while the
                # controller takes this broker out of thousands of ISRs (seconds), leaders that
                # still saw it fetching put it back, and its exit then cost every partition a
                # second ISR change. Partitions it starts following meanwhile are not fetched.
                await self._fetchers.stop()
                await request_controlled_shutdown(
                    self._cache,
                    self.config.broker_id,
                    self._controller,
                    self._dialer,
                    local_bound_ms=self.config.zookeeper_session_timeout_ms,
                )
            except Exception:  # a failed handover must not prevent a clean stop
                log.exception("controlled shutdown of broker %d failed", self.config.broker_id)
        if self._ctx is not None:
            # Before the server drains: JoinGroup and SyncGroup calls parked in rebalances are
            # answered NOT_COORDINATOR now rather than cut off after the server's grace period.
            await self._ctx.groups.close()
            await self._ctx.transactions.close()
        await self._exit_stack.aclose()
        event(log, logging.INFO, "broker.stopped", broker=self.config.broker_id)

    def _log_dir_failure_channel(self) -> Callable[[Path, str], None]:
        """What the log manager calls when the data dir failed: logs go offline on the loop
        (appends, flushes) and on the log manager's flush thread (sealed segments' fsyncs), so
        the report hops to the loop."""
        loop = asyncio.get_running_loop()

        def report(log_dir: Path, reason: str) -> None:
            loop.call_soon_threadsafe(self._on_log_dir_failure, log_dir, reason)

        return report

    def _on_log_dir_failure(self, log_dir: Path, reason: str) -> None:
        """The data dir failed: with no other dir to serve from, the broker must stop (Kafka's
        LogManager halts once its last live log dir failed). Once, however often reported."""
        if self._log_dir_failure_task is not None:
            return
        event(
            log,
            logging.CRITICAL,
            "broker.log_dir_failed",
            broker=self.config.broker_id,
            log_dir=str(log_dir),
            reason=reason,
        )
        self._log_dir_failure_task = asyncio.create_task(
            self._halt_after_log_dir_failure(), name="log dir failure"
        )

    async def _halt_after_log_dir_failure(self) -> None:
        """Close the ZooKeeper session (bounded by SESSION_CLOSE_TIMEOUT_S), then exit the
        process at once with LOG_DIR_FAILURE_EXIT_CODE.

        The session goes first because it carries the registration: its ephemeral znode is
        deleted with it, and the controller moves this broker's leaderships now instead of
        after zookeeper.session.timeout.ms, which is what a crash would cost.

        os._exit, not a fast `stop()` (Kafka's Exit.halt, for the same reasons): every step of
        a stop touches the failed disk or waits on something that does. Closing the logs
        flushes, checkpoints and writes the clean-shutdown marker, which must not exist (the
        next start must recover from the recovery points, as after a crash); controlled shutdown
        waits for the controller while producers keep getting KAFKA_STORAGE_ERROR; the flush
        thread may hang in an fsync of a dying disk, and the interpreter joins it at exit.
        Nothing this process holds needs a goodbye: the kernel closes its sockets (clients and
        followers see a crashed broker) and releases the data dir's lock. Runs even if the
        task is cancelled (a SIGTERM stop finishing meanwhile): the exit status must say why.
        """
        try:
            async with asyncio.timeout(SESSION_CLOSE_TIMEOUT_S):
                await self._zk.stop()
        except Exception as error:  # a timeout included: the session then expires by itself
            log.error("closing the ZooKeeper session after the data dir failed: %r", error)
        finally:
            logging.shutdown()  # flush every handler: os._exit skips the interpreter's exit
            os._exit(LOG_DIR_FAILURE_EXIT_CODE)

    async def _start_acls(self) -> AclStore:
        """The ACL cache, loaded before anything is served (so no request is decided on an
        empty one), and the store that writes through it."""
        cache = AclCache(self._zk)
        await cache.start()
        self._exit_stack.push_async_callback(cache.stop)
        return AclStore(self._zk, cache)

    async def _close_logs(self) -> None:
        if self._log_manager is None and self._logs_loading is not None:
            # Startup failed while the logs loaded: they hold the data dir's lock until closed.
            with contextlib.suppress(Exception):
                self._log_manager = await asyncio.shield(self._logs_loading)
        if self._ctx is not None:
            # The server is stopped, so there are no more appends: snapshot before closing.
            for partition in self._ctx.partitions:
                partition.snapshot_producer_state()
        if self._log_manager is not None:
            await asyncio.to_thread(self._log_manager.close)

    def _unclean_leader_election(self, topic: str) -> bool:
        config = self._topic_config(topic) or topic_config(self.config, {})  # unknown: defaults
        return config.unclean_leader_election_enable

    def _topic_config(self, topic: str) -> TopicConfig | None:
        """The topic's effective config, built once per TopicMetadata: the cache replaces that
        (frozen) object when the topic's overrides change, and the broker's static config is
        the rest. Every follower fetch of a tiered topic asks (TieredStorage.enabled_for), and
        rebuilding it each time took ~8% of a leader's event loop under replicated load."""
        metadata = self._cache.topic(topic)
        if metadata is None:
            self._topic_configs.pop(topic, None)
            return None
        built = self._topic_configs.get(topic)
        if built is not None and built[0] is metadata:
            return built[1]
        config = topic_config(self.config, metadata.configs)
        self._topic_configs[topic] = (metadata, config)
        return config

    def _ssl_contexts(self) -> dict[str, ssl.SSLContext]:
        """The TLS context of each TLS listener, by listener name (one, shared)."""
        config = self.config
        tls_listeners = [li.name for li in config.listener_set.bound if li.protocol.uses_tls]
        if not tls_listeners:
            return {}
        context = server_context(config.tls_files, ClientAuth(config.ssl_client_auth))
        return dict.fromkeys(tls_listeners, context)

    async def _start_authentication(
        self, stack: contextlib.AsyncExitStack
    ) -> AuthenticatorFactory | None:
        """With a SASL listener: the SCRAM credentials cache, kept current by ZooKeeper watches
        (authentications never wait on ZooKeeper), and the factory of per-connection
        authenticators. One random stand-in secret per broker: an unknown user gets the same
        made-up salt every time, so trying names tells nothing."""
        config = self.config
        if not any(listener.protocol.uses_sasl for listener in config.listener_set.bound):
            return None
        cache = CredentialCache()
        watcher = CredentialWatcher(self._zk, cache)
        await watcher.start()
        stack.push_async_callback(watcher.stop)
        stand_in_secret = secrets.token_bytes(STAND_IN_SECRET_BYTES)
        mechanisms = config.sasl_enabled_mechanisms

        def authenticator() -> SaslServerAuthenticator:
            return SaslServerAuthenticator(mechanisms, cache, stand_in_secret=stand_in_secret)

        return authenticator

    def _listener_servers(
        self,
        dispatcher: Dispatcher,
        ssl_contexts: Mapping[str, ssl.SSLContext],
        authenticators: AuthenticatorFactory | None,
    ) -> list[KafkaServer]:
        """A server per listener, sharing the connection quotas."""
        config = self.config
        limits = ServerLimits(
            socket_request_max_bytes=config.socket_request_max_bytes,
            idle_ms_max=config.connections_max_idle_ms,
        )
        quotas = ConnectionQuotas(config.connection_limits)
        return [
            KafkaServer(
                listener,
                dispatcher,
                limits,
                quotas,
                ssl_context=ssl_contexts.get(listener.name),
                authenticators=authenticators if listener.protocol.uses_sasl else None,
                response_sent=dispatcher.response_sent,
            )
            for listener in config.listener_set.bound
        ]

    async def _register(self) -> None:
        """(Re-)create our registration; a new timestamp tells the controller this is a new
        incarnation of the broker, whose old leaderships must move."""
        advertised = self.config.listener_set.advertised
        self._broker_epoch = await self._store.register_broker(
            BrokerRegistration(
                broker_id=self.config.broker_id,
                host=advertised[0].host,
                port=advertised[0].port,
                endpoints=tuple(str(listener) for listener in advertised),
                security_protocols={li.name: li.protocol.value for li in advertised},
                rack=self.config.broker_rack,
                timestamp_ms=wall_clock_ms(),
            )
        )

    def _on_zk_state(self, state: ConnectionState) -> None:
        # A new session after an expired one: our ephemeral registration went with the old
        # session. Register again, as Kafka brokers do.
        running = self._registration_task is not None and not self._registration_task.done()
        if state is ConnectionState.CONNECTED and not running:
            self._registration_task = asyncio.create_task(self._reregister(), name="re-register")

    async def _reregister(self) -> None:
        try:
            await self._register()
            event(log, logging.WARNING, "broker.reregistered", broker=self.config.broker_id)
        except Exception:
            log.exception("broker %d could not register again", self.config.broker_id)

    async def _stop_registration(self) -> None:
        if self._registration_task is not None:
            await _cancel(self._registration_task)

    async def _cache_caught_up(self) -> None:
        """Wait until our own (current) registration and the controller the election just
        saw are visible, so Metadata lists this broker at once and names a controller (admin
        clients such as aiokafka's send CreateTopics to it without retrying a missing one), and
        roles are judged against this incarnation's epoch. The watches deliver these znodes
        independently, in any order."""
        broker_id = self.config.broker_id
        # The cache's own wait: metadata is not applied yet, so nothing would wake a wait on that.
        with contextlib.suppress(TimeoutError):
            await self._cache.wait_until(
                lambda cache: (
                    cache.broker_epoch(broker_id) == self._broker_epoch
                    and cache.controller_id is not None
                ),
                REGISTRATION_WAIT_MS,
            )

    def _apply_all(self) -> None:
        """A whole metadata pass: after stray logs were deleted, a topic created again under
        their name can be hosted."""
        if self._roles is not None:
            self._roles.apply_all()

    def _on_metadata_change(self, change: MetadataChange) -> None:
        # Roles are judged against this incarnation's registration: none before it is known.
        if self._roles is not None:
            self._roles.on_change(change)

    async def _checkpoint_loop(self) -> None:
        assert self._log_manager is not None
        while True:
            await asyncio.sleep(CHECKPOINT_INTERVAL_S)
            try:
                # Only the checkpoint methods are safe off the loop (they only read offsets).
                await asyncio.to_thread(self._log_manager.checkpoint)
            except OSError as error:
                # The files are replaced atomically: the previous checkpoints stay valid (lower
                # bounds), so a full disk must not end checkpointing for good.
                log.error("writing the checkpoints in %s failed: %s", self.config.log_dir, error)
            # Bound the idempotence state: producers idle for producer.id.expiration.ms go.
            now_ms = self._require_ctx().now_ms()
            for partition in self._require_ctx().partitions:
                partition.producer_state.remove_expired(now_ms)

    async def _flush_loop(self) -> None:
        ctx = self._require_ctx()
        while True:
            await asyncio.sleep(FLUSH_CHECK_INTERVAL_S)
            for partition in ctx.partitions:
                try:
                    partition.log.flush_if_due()
                except KafkaError as error:
                    # One log's failure must not end flushing for the others. An offline log
                    # reported itself (the broker stops); a leader epoch checkpoint that a full
                    # disk refused is tried again at the next check.
                    log.error("%s: flush failed: %s", partition.log, error)

    async def _retention_loop(self) -> None:
        """Deletion retention on the hot tier, every log.retention.check.interval.ms."""
        ctx = self._require_ctx()
        while True:
            await asyncio.sleep(self.config.log_retention_check_interval_ms / 1000)
            apply_retention(ctx.partitions.logs(), self._topic_config, self._tiered, ctx.now_ms())
            ctx.metrics.retention_passes.inc()

    async def _cleaner_loop(self) -> None:
        """Compaction (riverbed.hot.storage.cleaner): one log after another while any is due, then a
        pause of log.cleaner.backoff.ms."""
        config = self.config
        if not config.log_cleaner_enable:
            return
        ctx = self._require_ctx()
        cleaner = LogCleaner(
            CleanerSettings(
                config.log_cleaner_dedupe_buffer_size, config.log_cleaner_io_max_bytes_per_second
            ),
            ctx.now_ms,
        )
        while True:
            try:
                cleaned = await cleaner.clean_filthiest(
                    ctx.partitions.logs(), self._topic_config, self._tiered
                )
            except Exception:  # a bug in one pass must not end compaction for good
                log.exception("log cleaner pass failed")
                cleaned = None
            if cleaned is None:
                await asyncio.sleep(config.log_cleaner_backoff_ms / 1000)

    def _tiered(self, topic: str) -> bool:
        tiering = self._require_ctx().tiering
        return tiering is not None and tiering.enabled_for(topic)

    def _require_ctx(self) -> BrokerContext:
        if self._ctx is None:
            raise RuntimeError("broker is not started")
        return self._ctx


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
