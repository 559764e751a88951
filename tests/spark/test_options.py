"""The data source's options are checked before any planning: each mistake is one ValueError
naming the option; S3 options are checked by the broker's own rules (tiering/stores.py)."""

from __future__ import annotations

import pytest
from riverbed_spark.options import EARLIEST, LATEST, parse_read_options

BASE = {"bootstrap.servers": "127.0.0.1:9092", "subscribe": "orders"}


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"subscribe": "orders"}, "bootstrap.servers"),
        ({**BASE, "subscribePattern": "o.*"}, "exactly one of subscribe"),
        ({**BASE, "startingOffsets": '{"orders": {"0": -3}}'}, "startingOffsets"),
        ({**BASE, "startingOffsets": "soon"}, "startingOffsets"),
        ({**BASE, "startingOffsets": "latest"}, "startingOffsets=latest"),
        ({**BASE, "endingOffsets": "earliest"}, "endingOffsets=earliest"),
        ({**BASE, "includeHeaders": "yes"}, "includeHeaders"),
        ({**BASE, "maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger"),
        ({**BASE, "remote.storage.url": "http://bucket"}, "remote.storage.url"),
        ({**BASE, "remote.storage.s3.region": "x"}, "without remote.storage.url"),
        (
            {**BASE, "remote.storage.url": "s3://b", "remote.storage.s3.regoin": "x"},
            "remote.storage.s3.regoin",
        ),
    ],
)
def test_a_bad_option_is_refused_with_a_message_naming_it(
    options: dict[str, str], named: str
) -> None:
    with pytest.raises(ValueError, match=named.replace(".", r"\.").replace("*", r"\*")) as caught:
        parse_read_options(options)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("name", "streaming"),
    [("startingTimestamp", False), ("startingTimestamp", True), ("endingTimestamp", False)],
)
def test_offsets_by_time_without_the_cluster_are_refused_up_front(
    name: str, streaming: bool
) -> None:
    """Planning finds offsets by time through the cluster. With the store alone and nothing in
    it yet, planning never got as far as noticing: a batch read nothing, and a stream read its
    partitions from the earliest offset as they appeared."""
    store_only = {"remote.storage.url": "file:///tmp/cold", "subscribe": "orders"}
    with pytest.raises(ValueError, match=f"^{name} needs bootstrap\\.servers") as caught:
        parse_read_options({**store_only, name: "1000"}, streaming=streaming)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(("name", "value"), [("endingOffsets", "latest"), ("endingTimestamp", "1")])
def test_an_end_is_refused_for_a_stream(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=f"^{name} is for batch queries"):
        parse_read_options({**BASE, name: value}, streaming=True)


def test_good_options_parse_with_spark_kafka_defaults() -> None:
    batch = parse_read_options(
        {**BASE, "remote.storage.url": "s3://b/p", "remote.storage.s3.region": "eu-west-1"}
    )
    assert (batch.starting, batch.ending) == (EARLIEST, LATEST)
    assert batch.store is not None
    assert batch.store.url == "s3://b/p"
    stream = parse_read_options(BASE, streaming=True)
    assert stream.starting == LATEST
    offsets = parse_read_options({**BASE, "endingOffsets": '{"orders": {"0": 7, "1": -1}}'})
    assert offsets.ending == {("orders", 0): 7, ("orders", 1): LATEST}
