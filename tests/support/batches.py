"""Reading records back in tests, as production decodes them (records_codec.decode_batch)."""

from __future__ import annotations

from riverbed.protocol.record_types import Record, TopicPartition
from riverbed.protocol.records import decode_batch, iter_batch_headers
from riverbed.protocol.records_header import Bytes


def records_in(tp: TopicPartition, data: Bytes) -> list[Record]:
    """The records of every whole batch in `data` (a log read, a fetch response's records), as
    partition `tp`'s; CRCs are checked. A partial batch at the end is left out, as a reader of a
    log chunk leaves it."""
    return [
        record
        for position, header in iter_batch_headers(data)
        for record in decode_batch(tp, data, position, header)
    ]
