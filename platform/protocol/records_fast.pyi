"""Types of the compiled module records_fast.pyx (mypy does not read Cython)."""

from collections.abc import Iterable, Sequence

from riverbed.protocol.record_types import Record, TopicPartition
from riverbed.protocol.records_header import BatchHeader, Bytes

def decode_records(
    tp: TopicPartition, header: BatchHeader, data: Bytes, skip_below: int
) -> list[Record]: ...
def append_records(
    body: bytearray,
    records: Iterable[tuple[Bytes | None, Bytes | None, Sequence[tuple[str, Bytes | None]], int]],
    base_timestamp: int,
) -> int: ...
def record_keys(
    data: Bytes, base_offset: int, base_timestamp: int, records_count: int, last_offset_delta: int
) -> list[tuple[int, int, bytes | None, bool, int]]: ...
