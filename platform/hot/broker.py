"""A Riverbed broker: wires the local logs, ZooKeeper metadata and the Kafka server together.

Startup order matters and follows Kafka's: load and recover the local logs first (nothing can be
served before they are consistent), then join the cluster in ZooKeeper, apply the metadata (open
the partitions this broker hosts) and only then bind the listener — so a client that can connect
gets correct answers. Shutdown runs the other way round and ends with a clean-shutdown marker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from pathlib import Path

from riverbed.configs import BrokerConfig, effective_topic_config, topic_config
from riverbed.coordination.controller_election import ControllerElection
from riverbed.coordination.layout import BrokerRegistration
from riverbed.coordination.metadata import ClusterMetadataStore
from riverbed.coordination.metadata_cache import MetadataCache, MetadataChange, MetadataWatcher
from riverbed.coordination.producer_ids import ProducerIdAllocator, ProducerIdIssuer
from riverbed.coordination.zk import AsyncZooKeeper
from riverbed.hot.data_dir import check_data_dir_identity
from riverbed.hot.dispatcher import Dispatcher
from riverbed.hot.handlers.context import BrokerContext
from riverbed.hot.log import LogConfig
from riverbed.hot.log_manager import LogManager
from riverbed.hot.partitions import PartitionManager
from riverbed.hot.server import KafkaServer, ServerLimits

log = logging.getLogger(__name__)

# How often recovery points and high watermarks are checkpointed (Kafka:
# replica.high.watermark.checkpoint.interval.ms = 5000).
CHECKPOINT_INTERVAL_S = 5.0
# How often logs with a `flush.ms` are checked for a due fsync (Kafka:
# log.flush.scheduler.interval.ms; an idle log must still flush on time).
FLUSH_CHECK_INTERVAL_S = 1.0


class Broker:
    """One broker process's state and lifecycle. `start()` then `stop()`, each exactly once."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self._zk = AsyncZooKeeper(
            config.zookeeper_connect,
            session_timeout_ms=config.zookeeper_session_timeout_ms,
            connect_timeout_ms=config.zookeeper_connect_timeout_ms,
        )
        self._store = ClusterMetadataStore(self._zk)
        self._cache = MetadataCache()
        self._watcher = MetadataWatcher(self._zk, self._cache)
        self._election = ControllerElection(self._store, config.broker_id)
        self._log_manager: LogManager | None = None
        self._server: KafkaServer | None = None
        self._ctx: BrokerContext | None = None
        self._exit_stack = contextlib.AsyncExitStack()

    @property
    def port(self) -> int:
        if self._server is None:
            return self.config.port
        return self._server.port

    async def start(self) -> None:
        """Start every part in order; each part started registers how to stop it, so `stop()`
        after a failed start unwinds exactly what was started."""
        config = self.config
        stack = self._exit_stack
        data_dir = Path(config.log_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
        # Local logs first: recovery must finish before anything is served.
        self._log_manager = await asyncio.to_thread(LogManager, data_dir, self._log_config({}))
        stack.push_async_callback(self._close_logs)
        partitions = PartitionManager(self._log_manager)
        await self._zk.start()
        stack.push_async_callback(self._zk.stop)
        await self._store.ensure_layout()
        cluster_id = await self._store.ensure_cluster_id()
        check_data_dir_identity(data_dir, cluster_id=cluster_id, broker_id=config.broker_id)
        await self._watcher.start()
        stack.push_async_callback(self._watcher.stop)
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
            producer_ids=ProducerIdIssuer(ProducerIdAllocator(self._zk, config.broker_id)),
        )
        self._server = KafkaServer(
            config.host,
            config.port,
            Dispatcher(self._ctx),
            ServerLimits(socket_request_max_bytes=config.socket_request_max_bytes),
        )
        self._cache.add_listener(self._on_metadata_change)
        await self._store.register_broker(
            BrokerRegistration(
                broker_id=config.broker_id, host=advertised_host, port=advertised_port
            )
        )
        await self._election.start()
        stack.push_async_callback(self._election.stop)
        await self._cache_caught_up()
        self._apply_metadata()
        await self._server.start()
        stack.push_async_callback(self._server.stop)
        for loop, name in ((self._checkpoint_loop, "checkpoints"), (self._flush_loop, "flush")):
            task = asyncio.create_task(loop(), name=name)
            stack.push_async_callback(_cancel, task)
        log.info(
            "broker %d listening on %s:%d (cluster %s)",
            config.broker_id,
            config.host,
            self.port,
            cluster_id,
        )

    async def stop(self) -> None:
        """Clean shutdown: stop serving, leave the cluster, close logs with a clean marker."""
        await self._exit_stack.aclose()
        log.info("broker %d stopped", self.config.broker_id)

    async def _close_logs(self) -> None:
        if self._ctx is not None:
            # The server is stopped, so there are no more appends: snapshot before closing.
            for partition in self._ctx.partitions:
                partition.snapshot_producer_state()
        if self._log_manager is not None:
            await asyncio.to_thread(self._log_manager.close)

    def _log_config(self, overrides: Mapping[str, str]) -> LogConfig:
        effective = effective_topic_config(self.config, overrides)
        return LogConfig.from_topic_config({k: v.value for k, v in effective.items() if v.value})

    async def _cache_caught_up(self) -> None:
        """Wait until our own registration is visible, so Metadata lists this broker at once."""
        ctx = self._require_ctx()
        await ctx.wait_until(lambda: self.config.broker_id in self._cache.brokers(), 10.0)

    def _on_metadata_change(self, _change: MetadataChange) -> None:
        if self._server is not None:
            self._apply_metadata()

    def _apply_metadata(self) -> None:
        """Make the hosted partitions match ZooKeeper: open, lead, or delete (topic deleted)."""
        ctx = self._require_ctx()
        wanted: set[tuple[str, int]] = set()
        for topic in self._cache.topics().values():
            typed = topic_config(self.config, topic.configs)
            log_append_time = typed.message_timestamp_type == "LogAppendTime"
            config = self._log_config(topic.configs)
            for index, state in topic.partitions.items():
                if self.config.broker_id not in state.replicas:
                    continue
                wanted.add((topic.name, index))
                partition = ctx.partitions.ensure(topic.name, index, config)
                partition.log_append_time = log_append_time
                if state.leader == self.config.broker_id:
                    if not partition.is_leader or partition.leader_epoch != state.leader_epoch:
                        partition.become_leader(state.leader_epoch)
                        # One replica: the whole local log is committed.
                        partition.log.update_high_watermark(partition.log.log_end_offset)
                        log.info("leading %s at epoch %d", partition, state.leader_epoch)
                else:
                    partition.become_non_leader(state.leader_epoch)
        for topic_name, index in ctx.partitions.hosted() - wanted:
            ctx.partitions.remove(topic_name, index, delete_data=True)
        assert self._log_manager is not None
        for topic_name, index in set(self._log_manager.partitions()) - wanted:
            # Left on disk by a topic deleted while this broker was down.
            self._log_manager.delete(topic_name, index)
        ctx.metadata_applied()

    async def _checkpoint_loop(self) -> None:
        assert self._log_manager is not None
        while True:
            await asyncio.sleep(CHECKPOINT_INTERVAL_S)
            # Only the checkpoint methods are safe off the loop (they only read offsets).
            await asyncio.to_thread(self._log_manager.checkpoint)
            # Bound the idempotence state: producers idle for producer.id.expiration.ms go.
            now_ms = self._require_ctx().now_ms()
            for partition in self._require_ctx().partitions:
                partition.producer_state.remove_expired(now_ms)

    async def _flush_loop(self) -> None:
        ctx = self._require_ctx()
        while True:
            await asyncio.sleep(FLUSH_CHECK_INTERVAL_S)
            for partition in ctx.partitions:
                partition.log.flush_if_due()

    def _require_ctx(self) -> BrokerContext:
        if self._ctx is None:
            raise RuntimeError("broker is not started")
        return self._ctx


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
