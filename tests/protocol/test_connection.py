"""The sans-IO connection objects: two in-memory peers, byte-level splits and fuzzing."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from riverbed.protocol import messages
from riverbed.protocol.connection import (
    NEED_DATA,
    ClientConnection,
    CloseConnection,
    RequestHeader,
    RequestReceived,
    ResponseReceived,
    ServerConnection,
    UnsupportedApiVersionsRequest,
    encode_response,
    encode_unsupported_api_versions,
    supported_api_versions,
)
from riverbed.protocol.errors import ErrorCode, ProtocolDecodeError, ProtocolEncodeError
from riverbed.protocol.messages import RequestBody
from riverbed.protocol.regions import FileRegion


def produce_request(records: bytes) -> messages.ProduceRequest:
    return messages.ProduceRequest(
        acks=-1,
        timeout_ms=1000,
        topic_data=[
            messages.ProduceRequest.TopicProduceData(
                "orders", [messages.ProduceRequest.PartitionProduceData(0, records)]
            )
        ],
    )


def pipelined_requests() -> tuple[bytes, list[tuple[int, RequestBody]]]:
    client = ClientConnection("test-client")
    requests: list[tuple[int, RequestBody]] = [
        (9, produce_request(b"batch" * 10)),
        (12, messages.MetadataRequest(topics=None)),
        (3, messages.ApiVersionsRequest("riverbed-tests", "0.1")),
        (4, produce_request(b"old")),
    ]
    data = b"".join(client.send_request(body, version)[1] for version, body in requests)
    return data, requests


def drain(server: ServerConnection) -> list[Any]:
    events = []
    while (event := server.next_event()) is not NEED_DATA:
        events.append(event)
        if isinstance(event, CloseConnection):
            break
    return events


def test_pipelined_frames_split_at_every_byte_boundary() -> None:
    data, requests = pipelined_requests()
    for split in range(len(data) + 1):
        server = ServerConnection()
        server.receive_data(data[:split])
        events = drain(server)
        server.receive_data(data[split:])
        events += drain(server)
        assert [(e.header.api_version, e.body) for e in events] == requests
        assert [e.header.correlation_id for e in events] == [0, 1, 2, 3]
        assert all(e.header.client_id == "test-client" for e in events)


@settings(max_examples=50, deadline=None)
@given(cuts=st.lists(st.integers(0, 400), max_size=8))
def test_pipelined_frames_in_arbitrary_pieces(cuts: list[int]) -> None:
    data, requests = pipelined_requests()
    server = ServerConnection()
    events: list[Any] = []
    previous = 0
    for cut in [*sorted(c for c in cuts if c <= len(data)), len(data)]:
        server.receive_data(data[previous:cut])
        events += drain(server)
        previous = cut
    assert [e.body for e in events] == [body for _, body in requests]


def test_records_view_stays_valid_and_writable_while_more_data_arrives() -> None:
    data, _ = pipelined_requests()
    server = ServerConnection()
    server.receive_data(data[:-3])
    first = server.next_event()
    assert isinstance(first, RequestReceived)
    assert isinstance(first.body, messages.ProduceRequest)
    records = first.body.topic_data[0].partition_data[0].records
    assert isinstance(records, memoryview)
    assert not records.readonly
    drain(server)
    server.receive_data(data[-3:])
    server.receive_data(b"\x00" * 3)  # part of a next frame: forces the buffer to be reshaped
    assert len(drain(server)) == 1
    assert bytes(records) == b"batch" * 10
    records[:5] = b"BATCH"
    assert bytes(records[:10]) == b"BATCHbatch"


def test_truncated_frame_needs_data() -> None:
    client = ClientConnection(None)
    _, frame = client.send_request(messages.MetadataRequest(), 12)
    server = ServerConnection()
    for size in range(len(frame)):
        server = ServerConnection()
        server.receive_data(frame[:size])
        assert server.next_event() is NEED_DATA


@pytest.mark.parametrize("size", [101, 2**31 - 1, -1, -(2**31)])
def test_bad_frame_size_closes_from_the_prefix_alone(size: int) -> None:
    server = ServerConnection(max_frame_bytes=100)
    server.receive_data(struct.pack(">i", size))
    event = server.next_event()
    assert isinstance(event, CloseConnection)
    assert "frame size" in event.reason
    # Closed for good: more data is ignored and the same event comes back.
    server.receive_data(b"\x00" * 1000)
    assert server.next_event() == event
    assert server.closed


def test_frame_of_exactly_max_bytes_is_accepted() -> None:
    client = ClientConnection(None)
    _, frame = client.send_request(produce_request(b"x" * 50), 9)
    server = ServerConnection(max_frame_bytes=len(frame) - 4)
    server.receive_data(frame)
    assert isinstance(server.next_event(), RequestReceived)


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (struct.pack(">hhi", 999, 0, 1) + b"\xff\xff", "unknown api key 999"),
        (struct.pack(">hhi", 0, 2, 1) + b"\xff\xff", "unsupported version 2 of Produce"),
        (struct.pack(">hhi", 1, 17, 1) + b"\xff\xff", "unsupported version 17 of Fetch"),
        (struct.pack(">hh", 3, 0), "too short for a request header"),
        (struct.pack(">hhi", 3, 1, 1) + b"\xff\xff" + b"\x00\x00", "malformed Metadata v1"),
        (struct.pack(">hhi", 3, 1, 1) + b"\x00\x05ab", "malformed Metadata v1"),
    ],
)
def test_protocol_violations_close_the_connection(payload: bytes, reason: str) -> None:
    server = ServerConnection()
    server.receive_data(frame(payload))
    event = server.next_event()
    assert isinstance(event, CloseConnection)
    assert reason in event.reason


def test_unsupported_api_versions_request_gets_the_kip_511_answer() -> None:
    server = ServerConnection()
    # ApiVersions v7 from a future client (flexible header v2 with tagged fields).
    payload = struct.pack(">hhi", 18, 7, 42) + b"\x00\x03cli" + b"\x00" + b"\x04abc\x04def\x00"
    server.receive_data(frame(payload))
    event = server.next_event()
    assert event == UnsupportedApiVersionsRequest(correlation_id=42, api_version=7)
    ranges = {18: (0, 3), 3: (0, 12)}
    answer = encode_unsupported_api_versions(42, ranges)
    body = (
        struct.pack(">ihi", 42, ErrorCode.UNSUPPORTED_VERSION, 2)
        + struct.pack(">hhh", 3, 0, 12)
        + struct.pack(">hhh", 18, 0, 3)
    )
    assert answer == frame(body)
    # The connection stays usable after KIP-511.
    _, request = ClientConnection(None).send_request(messages.MetadataRequest(), 1)
    server.receive_data(request)
    assert isinstance(server.next_event(), RequestReceived)


def test_client_reads_a_kip_511_answer_to_its_api_versions_request() -> None:
    client = ClientConnection("c")
    correlation_id, _ = client.send_request(messages.ApiVersionsRequest(), 3)
    answer = encode_unsupported_api_versions(correlation_id, {18: (0, 2)})
    client.receive_data(answer)
    response = client.next_response()
    assert isinstance(response, ResponseReceived)
    assert response.body == messages.ApiVersionsResponse(
        error_code=ErrorCode.UNSUPPORTED_VERSION,
        api_keys=[messages.ApiVersionsResponse.ApiVersion(18, 0, 2)],
    )


@pytest.mark.parametrize(
    ("api_key", "api_version", "header_bytes"),
    [
        (18, 3, struct.pack(">i", 7)),  # ApiVersions: always header v0
        (3, 8, struct.pack(">i", 7)),  # not flexible: header v0
        (3, 9, struct.pack(">i", 7) + b"\x00"),  # flexible: header v1, empty tagged fields
    ],
)
def test_response_header_versions(api_key: int, api_version: int, header_bytes: bytes) -> None:
    body = messages.RESPONSE_CLASSES[api_key]()
    header = RequestHeader(api_key, api_version, 7, "c")
    encoded = b"".join(c for c in encode_response(header, body) if isinstance(c, bytes))
    assert encoded[4 : 4 + len(header_bytes)] == header_bytes
    assert struct.unpack(">i", encoded[:4])[0] == len(encoded) - 4


def test_encode_response_with_file_region_counts_the_region_in_the_frame_size() -> None:
    region = FileRegion(fd=5, position=0, size=1000)
    body = messages.FetchResponse(
        responses=[
            messages.FetchResponse.FetchableTopicResponse(
                topic="t", partitions=[messages.FetchResponse.PartitionData(records=region)]
            )
        ]
    )
    chunks = encode_response(RequestHeader(1, 11, 3, None), body)
    head, middle = chunks
    assert middle is region
    assert isinstance(head, bytes)
    assert struct.unpack(">i", head[:4])[0] == len(head) - 4 + region.size
    assert head[-4:] == struct.pack(">i", region.size)


def test_encode_response_rejects_a_body_of_another_api() -> None:
    with pytest.raises(ProtocolEncodeError):
        encode_response(RequestHeader(3, 1, 0, None), messages.FetchResponse())


@pytest.mark.parametrize(
    ("api_key", "version"),
    [
        (key, v)
        for key, (low, high) in supported_api_versions().items()
        for v in range(low, high + 1)
    ],
)
def test_client_and_server_talk_every_api_version(api_key: int, version: int) -> None:
    client, server = ClientConnection("peer"), ServerConnection()
    request = messages.REQUEST_CLASSES[api_key]()
    if isinstance(request, messages.ProduceRequest):
        request.acks = 1  # acks=0 produce requests get no response
    correlation_id, data = client.send_request(request, version)
    server.receive_data(data)
    event = server.next_event()
    assert isinstance(event, RequestReceived)
    assert event.header == RequestHeader(api_key, version, correlation_id, "peer")
    assert event.body == request
    response = messages.RESPONSE_CLASSES[api_key]()
    for chunk in encode_response(event.header, response):
        assert isinstance(chunk, bytes)
        client.receive_data(chunk)
    assert client.next_response() == ResponseReceived(correlation_id, response)
    assert client.next_response() is NEED_DATA


def test_client_matches_responses_in_order_and_skips_acks_0_produce() -> None:
    client, server = ClientConnection(None), ServerConnection()
    first, data_1 = client.send_request(messages.MetadataRequest(), 12)
    no_answer, data_2 = client.send_request(messages.ProduceRequest(acks=0), 9)
    second, data_3 = client.send_request(messages.MetadataRequest(), 12)
    assert (first, no_answer, second) == (0, 1, 2)
    assert client.in_flight_count == 2
    server.receive_data(data_1 + data_2 + data_3)
    headers = [e.header for e in drain(server)]
    replies = b"".join(
        c
        for h in headers
        if h.api_key == messages.MetadataRequest.API_KEY
        for c in encode_response(h, messages.MetadataResponse(cluster_id="x"))
        if isinstance(c, bytes)
    )
    client.receive_data(replies)
    assert [client.next_response(), client.next_response()] == [
        ResponseReceived(first, messages.MetadataResponse(cluster_id="x")),
        ResponseReceived(second, messages.MetadataResponse(cluster_id="x")),
    ]
    assert client.in_flight_count == 0


def test_client_rejects_an_unexpected_correlation_id() -> None:
    client = ClientConnection(None)
    client.send_request(messages.MetadataRequest(), 1)
    client.receive_data(frame(struct.pack(">i", 99) + b"\x00" * 8))
    with pytest.raises(ProtocolDecodeError, match="correlation id 99"):
        client.next_response()


def test_client_rejects_a_response_with_nothing_in_flight() -> None:
    client = ClientConnection(None)
    client.receive_data(frame(struct.pack(">i", 0)))
    with pytest.raises(ProtocolDecodeError, match="no request in flight"):
        client.next_response()


def test_client_cannot_send_unsupported_versions_or_file_regions() -> None:
    client = ClientConnection(None)
    with pytest.raises(ProtocolEncodeError):
        client.send_request(messages.ProduceRequest(), 2)
    region_request = messages.ProduceRequest(
        topic_data=[
            messages.ProduceRequest.TopicProduceData(
                "t", [messages.ProduceRequest.PartitionProduceData(0, FileRegion(3, 0, 1))]
            )
        ]
    )
    with pytest.raises(ProtocolEncodeError):
        client.send_request(region_request, 9)
    assert client.in_flight_count == 0


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(st.binary(max_size=40), max_size=6))
def test_arbitrary_bytes_only_ever_yield_events(pieces: list[bytes]) -> None:
    server = ServerConnection(max_frame_bytes=64)
    for piece in pieces:
        server.receive_data(piece)
        for event in drain(server):
            assert isinstance(
                event, RequestReceived | UnsupportedApiVersionsRequest | CloseConnection
            )


@settings(max_examples=300, deadline=None)
@given(
    api_key=st.sampled_from(sorted(supported_api_versions())),
    version=st.integers(-1, 20),
    body=st.binary(max_size=48),
)
def test_valid_headers_with_arbitrary_bodies_only_ever_yield_events(
    api_key: int, version: int, body: bytes
) -> None:
    server = ServerConnection()
    server.receive_data(frame(struct.pack(">hhi", api_key, version, 5) + body))
    event = server.next_event()
    assert isinstance(event, RequestReceived | UnsupportedApiVersionsRequest | CloseConnection)
