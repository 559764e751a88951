"""The fuzz oracles: what any input may make the codec do, and nothing else.

Each `check_*` function feeds its input to the code under test and raises AssertionError (or
lets an unexpected exception through) when the outcome is not one of the documented ones:

- frames and requests (`check_server_stream`): a `RequestReceived` whose body is of the class
  of its api key, re-encodes and decodes back to itself, and can be answered; the KIP-511
  `UnsupportedApiVersionsRequest`; or one `CloseConnection`, after which the connection stays
  closed. Never an exception.
- responses (`check_client_stream`): a `ResponseReceived` of the class of the request it
  answers, or `ProtocolDecodeError`. Nothing else.
- produced records (`check_produced_records`): the batch headers, with every byte of the
  records covered by whole, CRC-intact batches whose offsets can be assigned in place; or a
  KafkaError with the code a Kafka broker answers (CORRUPT_MESSAGE, INVALID_RECORD,
  MESSAGE_TOO_LARGE, UNSUPPORTED_FOR_MESSAGE_FORMAT).
- fetched records (`check_fetched_records`, `check_batch_decoders`): records in offset order, or
  CorruptRecordError; the decoder (`decode_batch`, compiled: the consumer's and the broker's),
  the tests' Python oracle (tests/support/reference_decoder.py) and the log cleaner's key reader
  accept exactly the same batches and agree on every record.

`fuzz_*` functions adapt one flat byte string to each oracle (for atheris, which hands out
bytes): the first bytes choose the chunking, the API version or the batch's codec.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any, Final

import crc32c
from riverbed.client.fetched_records import PartitionFetch
from riverbed.hot.storage.compaction import batch_keys
from riverbed.protocol.codec import (
    api_specs,
    decode_request_body,
    encode_request_body,
)
from riverbed.protocol.compression import CompressionType, compress
from riverbed.protocol.connection import (
    NEED_DATA,
    ClientConnection,
    CloseConnection,
    RequestReceived,
    ResponseReceived,
    ServerConnection,
    UnsupportedApiVersionsRequest,
    encode_response,
    encode_unsupported_api_versions,
    supported_api_versions,
)
from riverbed.protocol.errors import ErrorCode, KafkaError, ProtocolDecodeError
from riverbed.protocol.messages import REQUEST_CLASSES, RESPONSE_CLASSES, RequestBody
from riverbed.protocol.record_types import TopicPartition
from riverbed.protocol.records import (
    ATTRIBUTES_POSITION,
    CRC_POSITION,
    LOG_OVERHEAD,
    RECORD_BATCH_OVERHEAD,
    BatchHeader,
    CorruptRecordError,
    assign_offsets,
    decode_batch,
    parse_batch_header,
    stamp_log_append_time,
    validate_records,
    validate_replicated_records,
)
from riverbed.protocol.records_header import HEADER_STRUCT

from tests.support.reference_decoder import reference_decode
from tools.fuzz.corpus import advertised_versions, sample_requests

# What a produce request's records may be refused with (Kafka's codes for the same faults).
PRODUCE_REJECTIONS: Final = frozenset(
    {
        ErrorCode.CORRUPT_MESSAGE,
        ErrorCode.INVALID_RECORD,
        ErrorCode.MESSAGE_TOO_LARGE,
        ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT,
    }
)
# What a fetched batch may be refused with: a v0/v1 message set, or anything malformed.
FETCH_REJECTIONS: Final = frozenset(
    {ErrorCode.CORRUPT_MESSAGE, ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT}
)
# max.message.bytes of the fuzzed topic: Kafka's default.
MAX_MESSAGE_BYTES: Final = 1_048_588
FUZZ_TP: Final = TopicPartition("fuzz", 0)
FIRST_OFFSET: Final = 1_000
LEADER_EPOCH: Final = 5
APPEND_TIME_MS: Final = 1_700_000_000_000

_FRAME_PREFIX: Final = struct.Struct(">i")
_API_PREFIX: Final = struct.Struct(">hh")
_HEADER: Final = HEADER_STRUCT
_CRC: Final = struct.Struct(">I")


# --- frames and requests ------------------------------------------------------------------------


def check_server_stream(chunks: Iterable[bytes], max_frame_bytes: int | None = None) -> list[Any]:
    """Feed `chunks` to a ServerConnection, draining events after each; return the events."""
    server = ServerConnection() if max_frame_bytes is None else ServerConnection(max_frame_bytes)
    events: list[Any] = []
    for chunk in chunks:
        server.receive_data(chunk)
        while (event := server.next_event()) is not NEED_DATA:
            check_server_event(event)
            events.append(event)
            if isinstance(event, CloseConnection):
                assert server.closed
                server.receive_data(b"\x00\x00\x00\x08" + bytes(8))
                assert server.next_event() is event, "a closed connection came back to life"
                return events
    return events


def check_server_event(event: object) -> None:
    if isinstance(event, RequestReceived):
        header, body = event.header, event.body
        spec = api_specs()[header.api_key]
        assert spec.supports(header.api_version), f"decoded an unadvertised {header}"
        assert type(body) is REQUEST_CLASSES[header.api_key], f"{type(body)} for {header}"
        check_request_round_trip(body, header.api_version)
        # The server can answer it whatever its header held.
        encode_response(header, RESPONSE_CLASSES[header.api_key]())
    elif isinstance(event, UnsupportedApiVersionsRequest):
        assert not api_specs()[18].supports(event.api_version)
        encode_unsupported_api_versions(event.correlation_id, supported_api_versions())
    else:
        assert isinstance(event, CloseConnection), f"unexpected event {event!r}"
        assert isinstance(event.reason, str)
        assert event.reason


def check_request_round_trip(body: RequestBody, version: int) -> None:
    """A decoded request is well-typed: it encodes, and decodes back to itself."""
    encoded = b"".join(
        chunk for chunk in encode_request_body(body, version) if isinstance(chunk, bytes)
    )
    again = decode_request_body(body.API_KEY, version, memoryview(encoded))
    assert again == body, f"{type(body).__name__} v{version} does not survive a round trip"


def check_request_body(api_key: int, version: int, data: bytes) -> RequestBody | None:
    """Decode `data` as the body of (api_key, version): a request, or ProtocolDecodeError."""
    try:
        body = decode_request_body(api_key, version, memoryview(data))
    except ProtocolDecodeError:
        return None
    assert type(body) is REQUEST_CLASSES[api_key]
    check_request_round_trip(body, version)
    return body


def check_client_stream(requests: list[tuple[RequestBody, int]], chunks: Iterable[bytes]) -> int:
    """Send `requests` from a ClientConnection, then feed `chunks` as the broker's bytes;
    return how many responses decoded before the bytes ran out or broke the protocol."""
    client = ClientConnection("fuzz-client")
    expected = []
    for body, version in requests:
        client.send_request(body, version)
        expected.append(body.API_KEY)
    received = 0
    for chunk in chunks:
        client.receive_data(chunk)
        while True:
            try:
                response = client.next_response()
            except ProtocolDecodeError:
                return received
            if response is NEED_DATA:
                break
            assert isinstance(response, ResponseReceived)
            assert type(response.body) is RESPONSE_CLASSES[expected[received]]
            received += 1
    return received


def split(data: bytes, cuts: bytes) -> list[bytes]:
    """`data` in chunks whose sizes come from `cuts` (each byte + 1; the rest in one chunk)."""
    chunks = []
    position = 0
    for cut in cuts:
        if position >= len(data):
            break
        chunks.append(data[position : position + cut + 1])
        position += cut + 1
    chunks.append(data[position:])
    return chunks


def fuzz_stream(data: bytes) -> None:
    """Byte 0: how many chunk sizes follow; then the sizes; the rest is the stream, fed to a
    server and to a client awaiting one response of each kind it sends."""
    cut_count = data[0] % 16 if data else 0
    cuts, stream = data[1 : 1 + cut_count], data[1 + cut_count :]
    check_server_stream(split(stream, cuts))
    check_client_stream(CLIENT_REQUESTS, split(stream, cuts))


def fuzz_request(data: bytes) -> None:
    """Byte 0 chooses an advertised (api key, version); the rest is everything after them in
    the frame (correlation id, client id, header tags, body), which goes through the whole
    server path. The same bytes past the header are also decoded as a bare body."""
    if not data:
        return
    pairs = advertised_versions()
    api_key, version = pairs[data[0] % len(pairs)]
    frame = _API_PREFIX.pack(api_key, version) + data[1:]
    check_server_stream([_FRAME_PREFIX.pack(len(frame)) + frame])
    check_request_body(api_key, version, data[1:])


# Requests a fuzzed client has in flight: the responses it then reads are of these kinds.
CLIENT_REQUESTS: Final = [
    (sample_requests(18, 3)[1], 3),
    (sample_requests(3, 12)[1], 12),
    (sample_requests(1, 16)[1], 16),
    (sample_requests(0, 9)[1], 9),
]


# --- record batches -----------------------------------------------------------------------------


def check_produced_records(data: bytes, max_message_bytes: int = MAX_MESSAGE_BYTES) -> bool:
    """The broker's produce path over one partition's records: validate, assign offsets, stamp
    LogAppendTime. Returns whether the records were accepted."""
    buf = bytearray(data)
    view = memoryview(buf)
    try:
        headers = validate_records(view, max_message_bytes)
    except KafkaError as error:
        assert error.code in PRODUCE_REJECTIONS, f"refused with {error.code!r}: {error}"
        return False
    assert headers
    assert sum(h.size_bytes for h in headers) == len(buf)
    assigned = assign_offsets(view, headers, FIRST_OFFSET, LEADER_EPOCH)
    assert [h.base_offset for h in assigned] == _consecutive(headers, FIRST_OFFSET)
    # The rewrite left every CRC intact: a follower (or recovery) accepts the bytes as they are.
    assert validate_replicated_records(view) == assigned
    stamped = stamp_log_append_time(view, assigned, APPEND_TIME_MS)
    assert validate_replicated_records(view) == stamped
    return True


def _consecutive(headers: list[BatchHeader], first_offset: int) -> list[int]:
    offsets = []
    for header in headers:
        offsets.append(first_offset)
        first_offset += header.last_offset_delta + 1
    return offsets


def check_fetched_records(data: bytes, fetch_offset: int = 0, read_committed: bool = False) -> int:
    """The consumer's path over one partition's records from a Fetch response: returns how many
    records it yielded before the bytes ran out or turned out corrupt."""
    try:
        fetch = PartitionFetch(
            FUZZ_TP, data, fetch_offset, 0, read_committed=read_committed, aborted_transactions=()
        )
    except CorruptRecordError as error:
        assert error.code in FETCH_REJECTIONS, f"refused with {error.code!r}"
        return 0
    taken = 0
    last_offset = fetch_offset - 1
    while not fetch.exhausted:
        try:
            records = fetch.take(7)
        except CorruptRecordError as error:
            assert error.code in FETCH_REJECTIONS, f"refused with {error.code!r}"
            return taken
        for record in records:
            assert record.offset > last_offset, "records out of offset order"
            last_offset = record.offset
        taken += len(records)
    return taken


def check_batch_decoders(batch: bytes) -> bool:
    """The three decoders of the first batch of `batch` agree: the tests' Python oracle, the
    compiled one (`decode_batch`), and the log cleaner's key reader. Returns whether they
    accepted it."""
    try:
        header = parse_batch_header(batch)
    except CorruptRecordError as error:
        assert error.code in FETCH_REJECTIONS
        return False
    batch = batch[: header.size_bytes]  # the cleaner takes exactly one batch
    python = _outcome(lambda: reference_decode(FUZZ_TP, batch))
    compiled = _outcome(lambda: decode_batch(FUZZ_TP, batch, 0, header))
    if isinstance(python, CorruptRecordError) or isinstance(compiled, CorruptRecordError):
        assert isinstance(python, CorruptRecordError), (
            f"only the compiled decoder refused: {compiled}"
        )
        assert isinstance(compiled, CorruptRecordError), f"only the oracle refused: {python}"
        return False
    assert python == compiled
    if not header.is_control:  # the cleaner keeps control batches whole, unread
        keys = _outcome(lambda: batch_keys(batch, header))
        assert not isinstance(keys, CorruptRecordError), f"only the cleaner refused: {keys}"
        assert [(offset, key) for _, offset, key, _, _ in keys] == [
            (r.offset, r.key) for r in python
        ]
    return True


def _outcome(decode: Any) -> Any:
    try:
        return decode()
    except CorruptRecordError as error:
        assert error.code == ErrorCode.CORRUPT_MESSAGE, f"refused with {error.code!r}"
        return error


def build_batch(header_fields: bytes, section: bytes, codec: int, compress_section: bool) -> bytes:
    """A batch with a correct batchLength and CRC around `section`, its other header fields
    taken from `header_fields` (zero-padded), magic 2, and `codec` in the attributes. With
    `compress_section`, `section` is compressed first, so the decoders see it intact."""
    if compress_section and 0 < codec <= CompressionType.ZSTD:
        section = compress(CompressionType(codec), section)
    fields = list(
        _HEADER.unpack((header_fields + bytes(RECORD_BATCH_OVERHEAD))[:RECORD_BATCH_OVERHEAD])
    )
    fields[1] = RECORD_BATCH_OVERHEAD - LOG_OVERHEAD + len(section)  # batchLength
    fields[3] = 2  # magic
    fields[5] = (fields[5] & ~0x07) | (codec & 0x07)  # attributes: the codec
    batch = bytearray(_HEADER.pack(*fields) + section)
    _CRC.pack_into(batch, CRC_POSITION, crc32c.crc32c(memoryview(batch)[ATTRIBUTES_POSITION:]))
    return bytes(batch)


def fuzz_records(data: bytes) -> None:
    """Byte 0 picks the mode: the bytes as they are (as a produce request's records and as a
    fetch response's), or wrapped into a batch with a correct length and CRC (so the record
    parsers past the CRC check are reached), compressed or claiming a codec over garbage."""
    if not data:
        return
    mode, rest = data[0], data[1:]
    if mode % 4 == 0:
        check_produced_records(rest)
        check_fetched_records(rest, fetch_offset=mode >> 2)
        if len(rest) >= RECORD_BATCH_OVERHEAD:
            check_batch_decoders(rest)
        return
    header_fields, section = rest[:RECORD_BATCH_OVERHEAD], rest[RECORD_BATCH_OVERHEAD:]
    batch = build_batch(
        header_fields, section, codec=(mode >> 2) % 8, compress_section=mode % 4 == 1
    )
    if mode % 4 == 3:  # two batches back to back: the second follows the first's length
        batch += build_batch(
            header_fields[::-1], section[::-1], codec=(mode >> 5), compress_section=True
        )
    check_batch_decoders(batch)
    check_produced_records(batch)
    check_fetched_records(batch, read_committed=bool(mode & 0x80))
