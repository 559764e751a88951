"""Metrics read off the broker's state when Prometheus scrapes, rather than counted as they change:
a reading cannot drift from the state it describes, and costs nothing between scrapes.

Runs on the event loop (the metrics server calls the registry there), so it reads the partitions,
the metadata cache and the group coordinator without locks.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from riverbed.broker.handlers.context import BrokerContext
from riverbed.coordination.layout import NO_LEADER


class BrokerStateCollector(Collector):
    def __init__(self, ctx: BrokerContext) -> None:
        self._ctx = ctx

    def describe(self) -> list[Metric]:
        # Nothing to describe ahead: registering must not run collect() before the broker runs.
        return []

    def collect(self) -> Iterator[Metric]:
        yield from self._partitions()
        yield from self._controller()
        yield from self._tiering()
        yield from self._group_lag()

    def _partitions(self) -> Iterator[Metric]:
        leading = [p for p in self._ctx.partitions if p.is_leader]
        yield GaugeMetricFamily(
            "riverbed_leader_partitions", "Partitions this broker leads", value=len(leading)
        )
        yield GaugeMetricFamily(
            "riverbed_under_replicated_partitions",
            "Partitions led here whose ISR is smaller than their replica set",
            value=sum(1 for p in leading if len(p.isr) < len(p.replicas)),
        )
        yield GaugeMetricFamily(
            "riverbed_under_min_isr_partitions",
            "Partitions led here whose ISR is below min.insync.replicas (acks=all refused)",
            value=sum(1 for p in leading if p.under_min_isr()),
        )

    def _controller(self) -> Iterator[Metric]:
        """Like Kafka's: the active controller reports the cluster's offline partitions, every
        other broker reports 0, so a sum over brokers counts each once."""
        controller = self._ctx.controller
        active = controller is not None and controller.active
        offline = 0
        if active:
            offline = sum(
                1
                for topic in self._ctx.cache.topics().values()
                for state in topic.partitions.values()
                if state.leader == NO_LEADER
            )
        yield GaugeMetricFamily(
            "riverbed_active_controller", "1 on the active controller", value=int(active)
        )
        yield GaugeMetricFamily(
            "riverbed_offline_partitions",
            "Partitions without a leader (reported by the active controller only)",
            value=offline,
        )

    def _tiering(self) -> Iterator[Metric]:
        tiering = self._ctx.tiering
        if tiering is None:
            return
        status = tiering.offloader.status
        backlog = GaugeMetricFamily(
            "riverbed_tiering_backlog_bytes",
            "Bytes of sealed local segments not yet uploaded, per partition led here",
            labels=["topic", "partition"],
        )
        for (topic, index), waiting in sorted(status.backlog_bytes.items()):
            backlog.add_metric([topic, str(index)], waiting)
        yield backlog
        yield CounterMetricFamily(
            "riverbed_tiering_uploaded_segments",
            "Segments uploaded to the cold tier",
            value=status.uploaded_segments,
        )
        yield CounterMetricFamily(
            "riverbed_tiering_upload_failures",
            "Tiering rounds of a partition that failed (the object store, the manifest)",
            value=status.upload_failures,
        )
        hits, misses = tiering.cache_hits_misses()
        yield CounterMetricFamily(
            "riverbed_remote_cache_hits", "Cold-read chunks found in the local cache", value=hits
        )
        yield CounterMetricFamily(
            "riverbed_remote_cache_misses",
            "Cold-read chunks fetched from the object store",
            value=misses,
        )

    def _group_lag(self) -> Iterator[Metric]:
        """Per group and partition: the high watermark minus the committed offset, for the
        groups this broker coordinates and the partitions it holds a replica of (a follower's
        high watermark trails the leader's by up to one fetch, so lag reads a little low)."""
        lag = GaugeMetricFamily(
            "riverbed_consumer_group_lag",
            "Offsets between a group's committed offset and the high watermark",
            labels=["group", "topic", "partition"],
        )
        partitions = self._ctx.partitions
        for group_id, tp, committed in self._ctx.groups.committed_offsets():
            partition = partitions.get(tp.topic, tp.partition)
            if partition is not None:
                behind = max(partition.log.high_watermark - committed, 0)
                lag.add_metric([group_id, tp.topic, str(tp.partition)], behind)
        yield lag
