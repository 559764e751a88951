"""The broker's Prometheus metrics that are counted as things happen.

One `BrokerMetrics` per broker, each with its own registry (several brokers may share a process
in tests, and the default global registry would mix them). What is a reading of the broker's
state at scrape time (partitions under-replicated, tiering backlog, group lag) is not counted
here but collected when scraped (riverbed.hot.metrics_state), so it can never drift.

Counters are per request and per partition, never per record: the produce path counts records
from batch headers it already parsed, the fetch path counts offsets handed out (on a compacted
topic a range can hold fewer records than offsets).
"""

from __future__ import annotations

from typing import Final, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

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


class Traffic(NamedTuple):
    """One topic's byte and record counters in one direction."""

    bytes: Counter
    records: Counter


class ApiMetrics(NamedTuple):
    requests: Counter
    seconds: Histogram


class BrokerMetrics:
    """Counters, gauges and histograms updated by the request handlers and background tasks.

    The hot paths get labelled children from `api()`, `traffic_in()` and `traffic_out()`, which
    look each one up once: prometheus_client's `labels()` validates and locks on every call
    (about 1.5 us, per partition of every produce and fetch)."""

    def __init__(self) -> None:
        self._apis: dict[str, ApiMetrics] = {}
        self._in: dict[str, Traffic] = {}
        self._out: dict[tuple[str, str], Traffic] = {}
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        self.bytes_in = Counter(
            "riverbed_topic_bytes_in",
            "Record batch bytes appended by produce requests",
            ["topic"],
            registry=registry,
        )
        self.records_in = Counter(
            "riverbed_topic_records_in",
            "Records appended by produce requests (from batch headers)",
            ["topic"],
            registry=registry,
        )
        self.bytes_out = Counter(
            "riverbed_topic_bytes_out",
            "Record batch bytes returned by fetch requests, by reader (consumer or follower)",
            ["topic", "reader"],
            registry=registry,
        )
        self.records_out = Counter(
            "riverbed_topic_records_out",
            "Offsets handed out by fetch requests from the fetch offset on, by reader",
            ["topic", "reader"],
            registry=registry,
        )
        self.requests = Counter(
            "riverbed_requests", "Requests handled, by API", ["api"], registry=registry
        )
        self.request_seconds = Histogram(
            "riverbed_request_duration_seconds",
            "Time from a request's decoding to its response (acks=all: replication included)",
            ["api"],
            buckets=REQUEST_SECONDS_BUCKETS,
            registry=registry,
        )
        self.isr_shrinks = Counter(
            "riverbed_isr_shrinks", "ISR shrinks written by this leader", registry=registry
        )
        self.isr_expands = Counter(
            "riverbed_isr_expands", "ISR expansions written by this leader", registry=registry
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

    def api(self, request_type: str) -> ApiMetrics:
        """The request counter and timer of an API, by its request class (`ProduceRequest`)."""
        found = self._apis.get(request_type)
        if found is None:
            api = request_type.removesuffix("Request")
            found = ApiMetrics(self.requests.labels(api), self.request_seconds.labels(api))
            self._apis[request_type] = found
        return found

    def traffic_in(self, topic: str) -> Traffic:
        found = self._in.get(topic)
        if found is None:
            found = Traffic(self.bytes_in.labels(topic), self.records_in.labels(topic))
            self._in[topic] = found
        return found

    def traffic_out(self, topic: str, reader: str) -> Traffic:
        found = self._out.get((topic, reader))
        if found is None:
            found = Traffic(
                self.bytes_out.labels(topic, reader), self.records_out.labels(topic, reader)
            )
            self._out[(topic, reader)] = found
        return found
