"""The broker's Prometheus metrics that are counted as things happen.

One `BrokerMetrics` per broker, each with its own registry (several brokers may share a process
in tests, and the default global registry would mix them). What is a reading of the broker's
state at scrape time (partitions under-replicated, tiering backlog, group lag) is not counted
here but collected when scraped (riverbed.broker.metrics_state), so it can never drift.

Counters are per request and per partition, never per record: the produce path counts records
from batch headers it already parsed, the fetch path counts offsets handed out (on a compacted
topic a range can hold fewer records than offsets).

The per-request counters and the request timer are plain numbers (`Count`, `Timing`) that
`_CountedCollector` reads when the registry is scraped: prometheus_client's Counter.inc takes a
lock (~0.6 us) and Histogram.observe a lock per bucket it passes (~1.7 us), and every produce and
fetch made four such calls. The scrape runs on the event loop (riverbed.broker.metrics_server), the
only writer, so no lock is needed.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from typing import Final, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString
from riverbed.broker.fetch_sessions import FetchSessionCache

# Request handling times: sub-millisecond metadata calls up to long-polled fetches and acks=all
# produces (bounded by their timeouts).
REQUEST_SECONDS_BUCKETS: Final = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
# Cold reads: a cache hit is a local file read, a miss one or more object-store requests.
REMOTE_FETCH_SECONDS_BUCKETS: Final = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
CONSUMER: Final = "consumer"
FOLLOWER: Final = "follower"


# prometheus_client's own `le` formatting (untyped there), so the labels match its Histogram's.
_bucket_label: Final[Callable[[float], str]] = floatToGoString


class Count:
    """A counter the hot path adds to: a plain number, read when the registry is scraped."""

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class Timing:
    """A histogram of durations in seconds: a count per bucket (`le` inclusive, as Prometheus
    buckets are) and their sum, read when the registry is scraped."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds

    def cumulative_buckets(self) -> list[tuple[str, float]]:
        """(`le` label as prometheus_client writes it, observations up to that bound)."""
        buckets = []
        total = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += count
            buckets.append((_bucket_label(bound), float(total)))
        return buckets


class Traffic(NamedTuple):
    """One topic's byte and record counters in one direction."""

    bytes: Count
    records: Count


class ApiMetrics(NamedTuple):
    requests: Count
    seconds: Timing


class BrokerMetrics:
    """Counters, gauges and histograms updated by the request handlers and background tasks.

    The hot paths get their counters from `api()`, `traffic_in()` and `traffic_out()`, one dict
    lookup each; the rest (ISR changes, cold reads) are prometheus_client's own, being rare."""

    def __init__(self) -> None:
        self._apis: dict[str, ApiMetrics] = {}
        self._in: dict[str, Traffic] = {}
        self._out: dict[tuple[str, str], Traffic] = {}
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        registry.register(_CountedCollector(self))
        self.isr_shrinks = Counter(
            "riverbed_isr_shrinks", "ISR shrinks written by this leader", registry=registry
        )
        self.isr_expands = Counter(
            "riverbed_isr_expands", "ISR expansions written by this leader", registry=registry
        )
        self.retention_passes = Counter(
            "riverbed_retention_passes",
            "Hot-tier retention passes over every partition (log.retention.check.interval.ms)",
            registry=registry,
        )
        # acks=all produce requests waiting for their followers: a plain count, changed twice
        # per such request, that the gauge reads when scraped (a Gauge's inc and dec lock).
        self.produce_purgatory_size = 0
        Gauge(
            "riverbed_produce_purgatory_size",
            "acks=all produce requests waiting for their followers",
            registry=registry,
        ).set_function(lambda: self.produce_purgatory_size)
        self.remote_fetches = Counter(
            "riverbed_remote_fetches",
            "Consumer reads served from the cold tier",
            registry=registry,
        )
        self.remote_fetch_errors = Counter(
            "riverbed_remote_fetch_errors",
            "Cold-tier reads that failed (the consumer got KAFKA_STORAGE_ERROR)",
            registry=registry,
        )
        self.remote_fetch_seconds = Histogram(
            "riverbed_remote_fetch_duration_seconds",
            "Time to read batches from the cold tier",
            buckets=REMOTE_FETCH_SECONDS_BUCKETS,
            registry=registry,
        )

    def watch_fetch_sessions(self, sessions: FetchSessionCache) -> None:
        """Gauges read from the fetch-session cache when scraped (Kafka's
        NumIncrementalFetchSessions, NumIncrementalFetchPartitionsCached and
        IncrementalFetchSessionEvictionsPerSec, the last as a running count)."""
        registry = self.registry
        Gauge(
            "riverbed_fetch_sessions", "Fetch sessions in the cache", registry=registry
        ).set_function(lambda: len(sessions))
        Gauge(
            "riverbed_fetch_session_partitions",
            "Partitions held by the cached fetch sessions",
            registry=registry,
        ).set_function(sessions.partitions_cached)
        Gauge(
            "riverbed_fetch_session_evictions",
            "Fetch sessions evicted for new ones since the broker started",
            registry=registry,
        ).set_function(lambda: sessions.evictions)
        Gauge(
            "riverbed_incremental_fetches",
            "Incremental fetch requests served since the broker started",
            registry=registry,
        ).set_function(lambda: sessions.incremental_fetches)

    def api(self, request_type: str) -> ApiMetrics:
        """The request counter and timer of an API, by its request class (`ProduceRequest`)."""
        found = self._apis.get(request_type)
        if found is None:
            found = ApiMetrics(Count(), Timing(REQUEST_SECONDS_BUCKETS))
            self._apis[request_type] = found
        return found

    def traffic_in(self, topic: str) -> Traffic:
        found = self._in.get(topic)
        if found is None:
            found = self._in[topic] = Traffic(Count(), Count())
        return found

    def traffic_out(self, topic: str, reader: str) -> Traffic:
        found = self._out.get((topic, reader))
        if found is None:
            found = self._out[(topic, reader)] = Traffic(Count(), Count())
        return found

    def counted(self) -> Iterator[Metric]:
        """The per-request counters and timers, as metric families (`_CountedCollector`)."""
        bytes_in = CounterMetricFamily(
            "riverbed_topic_bytes_in",
            "Record batch bytes appended by produce requests",
            labels=["topic"],
        )
        records_in = CounterMetricFamily(
            "riverbed_topic_records_in",
            "Records appended by produce requests (from batch headers)",
            labels=["topic"],
        )
        for topic, traffic in sorted(self._in.items()):
            bytes_in.add_metric([topic], traffic.bytes.value)
            records_in.add_metric([topic], traffic.records.value)
        bytes_out = CounterMetricFamily(
            "riverbed_topic_bytes_out",
            "Record batch bytes returned by fetch requests, by reader (consumer or follower)",
            labels=["topic", "reader"],
        )
        records_out = CounterMetricFamily(
            "riverbed_topic_records_out",
            "Offsets handed out by fetch requests from the fetch offset on, by reader",
            labels=["topic", "reader"],
        )
        for (topic, reader), traffic in sorted(self._out.items()):
            bytes_out.add_metric([topic, reader], traffic.bytes.value)
            records_out.add_metric([topic, reader], traffic.records.value)
        requests = CounterMetricFamily(
            "riverbed_requests", "Requests handled, by API", labels=["api"]
        )
        seconds = HistogramMetricFamily(
            "riverbed_request_duration_seconds",
            "Time from a request's decoding to its response (acks=all: replication included)",
            labels=["api"],
        )
        for request_type, api in sorted(self._apis.items()):
            name = request_type.removesuffix("Request")
            requests.add_metric([name], api.requests.value)
            seconds.add_metric([name], api.seconds.cumulative_buckets(), api.seconds.sum)
        yield from (bytes_in, records_in, bytes_out, records_out, requests, seconds)


class _CountedCollector(Collector):
    def __init__(self, metrics: BrokerMetrics) -> None:
        self._metrics = metrics

    def describe(self) -> list[Metric]:
        return []  # nothing to describe ahead: the families are built at each scrape

    def collect(self) -> Iterator[Metric]:
        return self._metrics.counted()
