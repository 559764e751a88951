"""Fuzzing the frame reader: any byte stream, in any chunking, fed to a ServerConnection yields
only RequestReceived, the KIP-511 UnsupportedApiVersionsRequest or one final CloseConnection
(tools.fuzz.targets.check_server_stream says exactly what each must satisfy); fed to a
ClientConnection, only ResponseReceived or ProtocolDecodeError. And the events do not depend on
where the stream was cut.

Hypothesis runs derandomized and without an example database, so CI runs the same examples
every time; the budgets below keep this file to a few seconds.
"""

from __future__ import annotations

import struct
from typing import Final

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from riverbed.protocol.codec import RequestHeader
from riverbed.protocol.connection import (
    NEED_DATA,
    REQUEST_FRAME_BYTES_MAX,
    ClientConnection,
    CloseConnection,
    RequestReceived,
    ServerConnection,
    UnsupportedApiVersionsRequest,
    encode_response,
)
from riverbed.protocol.messages import RESPONSE_CLASSES, MetadataResponse

from tools.fuzz.corpus import seed_frames
from tools.fuzz.targets import CLIENT_REQUESTS, check_client_stream, check_server_stream, split

FUZZ: Final = settings(
    derandomize=True,
    database=None,
    deadline=1000,
    max_examples=300,
    suppress_health_check=[HealthCheck.too_slow],
)
FRAMES: Final = [frame for _, _, frame in seed_frames()]
_INT32: Final = struct.Struct(">i")

valid_frames = st.sampled_from(FRAMES)
chunk_sizes = st.lists(st.integers(0, 255), max_size=12).map(bytes)


def _mutated(frame: bytes, position: int, byte: int, kind: int) -> bytes:
    position %= len(frame) + 1
    if kind == 0:  # overwrite
        return frame[:position] + bytes([byte]) + frame[position + 1 :]
    if kind == 1:  # insert
        return frame[:position] + bytes([byte]) + frame[position:]
    return frame[:position] + frame[position + 1 :]  # delete


streams = st.one_of(
    st.binary(max_size=300),
    st.lists(valid_frames, min_size=1, max_size=4).map(b"".join),
    st.builds(
        lambda frames, tail: b"".join(frames) + tail,
        st.lists(valid_frames, max_size=3),
        st.binary(min_size=1, max_size=40),
    ),
    st.builds(
        _mutated, valid_frames, st.integers(0, 1 << 16), st.integers(0, 255), st.integers(0, 2)
    ),
)


@FUZZ
@given(stream=streams, cuts=chunk_sizes)
def test_any_stream_in_any_chunking_yields_only_documented_events(
    stream: bytes, cuts: bytes
) -> None:
    events = check_server_stream(split(stream, cuts))
    # Cut anywhere, the same stream gives the same events.
    assert events == check_server_stream([stream])
    assert events == check_server_stream([bytes([b]) for b in stream])


@FUZZ
@given(frames=st.lists(valid_frames, min_size=1, max_size=5), tail=st.binary(max_size=30))
def test_valid_frames_come_out_in_order_whatever_follows(frames: list[bytes], tail: bytes) -> None:
    events = check_server_stream([b"".join(frames) + tail])
    received = [event for event in events if isinstance(event, RequestReceived)]
    assert len(received) == len(frames)
    assert [event.header.correlation_id for event in received] == [1] * len(frames)
    # What follows them is either waited for or refused; never a crash, never a fifth request.
    assert len(events) <= len(frames) + 1


@FUZZ
@given(
    size=st.one_of(
        st.integers(REQUEST_FRAME_BYTES_MAX + 1, 2**31 - 1),
        st.integers(-(2**31), -1),
        st.sampled_from([REQUEST_FRAME_BYTES_MAX + 1, 2**31 - 1, -1, -(2**31)]),
    ),
    body=st.binary(max_size=20),
)
def test_a_frame_size_out_of_bounds_closes_the_connection_at_once(size: int, body: bytes) -> None:
    [event] = check_server_stream([_INT32.pack(size) + body])
    assert isinstance(event, CloseConnection)
    assert "frame size" in event.reason


@FUZZ
@given(frame=valid_frames, cut=st.integers(0, 1 << 16), cuts=chunk_sizes)
def test_a_truncated_frame_waits_for_more(frame: bytes, cut: int, cuts: bytes) -> None:
    assert check_server_stream(split(frame[: cut % len(frame)], cuts)) == []


@FUZZ
@given(
    api_version=st.integers(-(2**15), 2**15 - 1).filter(lambda v: not 0 <= v <= 3),
    correlation_id=st.integers(-(2**31), 2**31 - 1),
    tail=st.binary(max_size=20),
)
def test_api_versions_of_an_unknown_version_takes_the_kip_511_path(
    api_version: int, correlation_id: int, tail: bytes
) -> None:
    payload = struct.pack(">hhi", 18, api_version, correlation_id) + tail
    [event] = check_server_stream([_INT32.pack(len(payload)) + payload])
    assert event == UnsupportedApiVersionsRequest(correlation_id, api_version)


@FUZZ
@given(api_key=st.integers(-(2**15), 2**15 - 1), api_version=st.integers(-(2**15), 2**15 - 1))
def test_unknown_apis_and_versions_close_the_connection(api_key: int, api_version: int) -> None:
    payload = struct.pack(">hhih", api_key, api_version, 1, -1) + bytes(8)
    events = check_server_stream([_INT32.pack(len(payload)) + payload])
    assert len(events) == 1  # checked by the oracle: a request, the KIP-511 event or a close


# --- the client side ----------------------------------------------------------------------------


def _responses() -> bytes:
    """The broker's answers to CLIENT_REQUESTS, as it would frame them."""
    client = ClientConnection("fuzz-client")
    frames = []
    for body, version in CLIENT_REQUESTS:
        correlation_id, _ = client.send_request(body, version)
        header = RequestHeader(body.API_KEY, version, correlation_id, "fuzz-client")
        response = RESPONSE_CLASSES[body.API_KEY]()
        frames.append(
            b"".join(c for c in encode_response(header, response) if isinstance(c, bytes))
        )
    return b"".join(frames)


RESPONSES: Final = _responses()


def test_the_answers_decode() -> None:
    assert check_client_stream(CLIENT_REQUESTS, [RESPONSES]) == len(CLIENT_REQUESTS)


@FUZZ
@given(
    stream=st.one_of(
        st.binary(max_size=200),
        st.builds(
            _mutated,
            st.just(RESPONSES),
            st.integers(0, 1 << 16),
            st.integers(0, 255),
            st.integers(0, 2),
        ),
        st.integers(0, len(RESPONSES)).map(lambda cut: RESPONSES[:cut]),
    ),
    cuts=chunk_sizes,
)
def test_any_response_stream_decodes_or_raises_protocol_decode_error(
    stream: bytes, cuts: bytes
) -> None:
    received = check_client_stream(CLIENT_REQUESTS, split(stream, cuts))
    assert received == check_client_stream(CLIENT_REQUESTS, [stream])


@FUZZ
@given(size=st.one_of(st.integers(256 * 1024 * 1024 + 1, 2**31 - 1), st.integers(-(2**31), -1)))
def test_a_response_frame_size_out_of_bounds_is_a_decode_error(size: int) -> None:
    assert check_client_stream(CLIENT_REQUESTS, [_INT32.pack(size) + bytes(8)]) == 0


def test_a_response_nobody_asked_for_is_a_decode_error() -> None:
    metadata = MetadataResponse()
    header = RequestHeader(3, 12, 0, None)
    frame = b"".join(c for c in encode_response(header, metadata) if isinstance(c, bytes))
    assert check_client_stream([], [frame]) == 0


def test_a_closed_server_connection_stays_closed() -> None:
    server = ServerConnection()
    server.receive_data(_INT32.pack(-1))
    event = server.next_event()
    assert isinstance(event, CloseConnection)
    server.receive_data(FRAMES[0])
    assert server.next_event() is event
    assert server.next_event() is not NEED_DATA
