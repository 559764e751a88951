"""The per-request counters and the request timer are plain numbers read at scrape time: what
Prometheus gets is what prometheus_client's own Counter and Histogram would have exposed."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from riverbed.broker.metrics import CONSUMER, FOLLOWER, BrokerMetrics, Timing


def samples(metrics: BrokerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(metrics.registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_buckets_count_a_duration_equal_to_their_bound_and_add_up() -> None:
    timing = Timing((0.001, 0.01))
    for seconds in (0.0005, 0.001, 0.002, 0.01, 5.0):
        timing.observe(seconds)
    assert timing.cumulative_buckets() == [("0.001", 2.0), ("0.01", 4.0), ("+Inf", 5.0)]
    assert timing.sum == 0.0005 + 0.001 + 0.002 + 0.01 + 5.0


def test_the_scrape_exposes_counters_and_the_request_histogram_by_label() -> None:
    metrics = BrokerMetrics()
    produce = metrics.api("ProduceRequest")
    produce.requests.inc()
    produce.requests.inc()
    produce.seconds.observe(0.0004)
    produce.seconds.observe(0.003)
    metrics.traffic_in("t").bytes.inc(1000)
    metrics.traffic_in("t").records.inc(10)
    metrics.traffic_out("t", FOLLOWER).bytes.inc(1000)
    metrics.traffic_out("t", CONSUMER).records.inc(7)

    got = samples(metrics)
    assert got[("riverbed_requests_total", (("api", "Produce"),))] == 2
    assert got[("riverbed_request_duration_seconds_count", (("api", "Produce"),))] == 2
    assert got[("riverbed_request_duration_seconds_sum", (("api", "Produce"),))] == pytest.approx(
        0.0034
    )
    bucket = "riverbed_request_duration_seconds_bucket"
    assert got[(bucket, (("api", "Produce"), ("le", "0.0005")))] == 1
    assert got[(bucket, (("api", "Produce"), ("le", "0.0025")))] == 1
    assert got[(bucket, (("api", "Produce"), ("le", "0.005")))] == 2
    assert got[(bucket, (("api", "Produce"), ("le", "+Inf")))] == 2
    assert got[("riverbed_topic_bytes_in_total", (("topic", "t"),))] == 1000
    assert got[("riverbed_topic_records_in_total", (("topic", "t"),))] == 10
    assert got[("riverbed_topic_bytes_out_total", (("reader", FOLLOWER), ("topic", "t")))] == 1000
    assert got[("riverbed_topic_records_out_total", (("reader", CONSUMER), ("topic", "t")))] == 7
    # The broker's other metrics are still there, counted by prometheus_client.
    assert got[("riverbed_produce_purgatory_size", ())] == 0
    assert ("riverbed_isr_shrinks_total", ()) in got
