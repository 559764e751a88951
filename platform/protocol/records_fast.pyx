# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The per-record loops of batch v2 in C: decoding a batch (the consumer's fetches, the broker's
reads of its own logs: there is no other decoder), encoding a produced one.

`decode_records` walks the (decompressed) records section of one batch and builds the
`riverbed.protocol.record_types.Record` of each record in place. The bytes come from the network, so
every read is checked by hand against the end of the record it belongs to (bounds checking is
off for the whole module: no line indexes the buffer without such a check), and anything
malformed raises CorruptRecordError(CORRUPT_MESSAGE), never a crash or another exception.

It refuses what the wire format could carry but no client writes: a varint that does not fit 64
bits, an offset or timestamp that overflows int64 once its delta is added, and an offsetDelta
that is not above the record before or past the batch's lastOffsetDelta (offsets must increase
within their batch, as tiering's RecordColumns requires too: a record claiming an offset out of
order or past its batch would move a consumer's position backwards, or the log cleaner's map of
latest offsets past records that come later).

`record_keys` is the log cleaner's view of a batch: each record's key, offset, timestamp,
whether it is a tombstone, and where it ends, so that the records kept are copied byte for byte.

`append_records` is encode_batch's loop: it writes records sections (without the batch header,
compression or CRC, which stay in records_codec) straight into the batch's bytearray.

Records are frozen dataclasses whose storage is the slots of `_RecordSlots`; a frozen
dataclass's `__init__` costs ~0.8 us, so a record is allocated empty and its slots are filled
by their offsets, read once at import from the slots' member descriptors (and checked there, so
a change to the Record class fails loudly at import instead of writing to the wrong memory).
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.list cimport PyList_Append
from cpython.long cimport PyLong_FromLongLong
from cpython.object cimport PyTypeObject
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from cpython.ref cimport Py_INCREF
from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_DecodeUTF8
from libc.stdint cimport int64_t
from libc.string cimport memcpy

from kafka_varint cimport (
    CUT_SHORT,
    NULL_LENGTH,
    read_length,
    read_varint,
    riverbed_add_overflows,
    riverbed_sub_overflows,
    varint_size,
    write_varint,
)

import inspect

from riverbed.protocol.record_types import Record, _RecordSlots
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.records_header import TIMESTAMP_TYPE_LOG_APPEND_TIME, CorruptRecordError

cdef extern from *:
    """
    #include <structmember.h>

    /* The slot offset of a writable object member descriptor, or -1 for anything else. */
    static Py_ssize_t riverbed_slot_offset(PyObject *descriptor) {
        PyMemberDef *member;
        if (!PyObject_TypeCheck(descriptor, &PyMemberDescr_Type)) return -1;
        member = ((PyMemberDescrObject *)descriptor)->d_member;
        if (member->type != T_OBJECT_EX || (member->flags & READONLY)) return -1;
        return member->offset;
    }

    /* A new, empty instance of `type`, as object.__new__ makes it (no __init__). */
    static PyObject *riverbed_new_empty(PyTypeObject *type) {
        return type->tp_alloc(type, 0);
    }

    /* Store `value` in the (still empty) slot at `offset` of `instance`. */
    static void riverbed_fill_slot(PyObject *instance, Py_ssize_t offset, PyObject *value) {
        Py_INCREF(value);
        *(PyObject **)((char *)instance + offset) = value;
    }
    """
    Py_ssize_t riverbed_slot_offset(object descriptor)
    object riverbed_new_empty(PyTypeObject *type)
    void riverbed_fill_slot(object instance, Py_ssize_t offset, object value)
    void PyObject_GC_UnTrack(object instance)

# The smallest header: a key length and a value length, one byte each.
cdef Py_ssize_t HEADER_BYTES_MIN = 2
cdef unsigned char RECORD_ATTRIBUTES = 0  # unused in v2


def _slot_offset(str name):
    descriptor = _RecordSlots.__dict__[name]
    offset = riverbed_slot_offset(descriptor)
    if offset < 0 or inspect.getattr_static(Record, name) is not descriptor:
        raise ImportError(f"Record.{name} is not a plain slot of _RecordSlots")
    return offset


# Record must be _RecordSlots' storage and nothing more: no __dict__, no weakref slot, no slots
# of its own (else an instance would not be fully initialised by filling these eight).
if (
    Record.__basicsize__ != _RecordSlots.__basicsize__
    or Record.__dictoffset__ != 0
    or Record.__weakrefoffset__ != 0
    or set(_RecordSlots.__slots__) != {field for field in Record.__dataclass_fields__}
):
    raise ImportError("riverbed.protocol.record_types.Record no longer has the layout this module fills")

cdef PyTypeObject *RECORD_TYPE = <PyTypeObject *>Record
cdef Py_ssize_t TOPIC_SLOT = _slot_offset("topic")
cdef Py_ssize_t PARTITION_SLOT = _slot_offset("partition")
cdef Py_ssize_t OFFSET_SLOT = _slot_offset("offset")
cdef Py_ssize_t TIMESTAMP_MS_SLOT = _slot_offset("timestamp_ms")
cdef Py_ssize_t TIMESTAMP_TYPE_SLOT = _slot_offset("timestamp_type")
cdef Py_ssize_t KEY_SLOT = _slot_offset("key")
cdef Py_ssize_t VALUE_SLOT = _slot_offset("value")
cdef Py_ssize_t HEADERS_SLOT = _slot_offset("headers")
cdef tuple NO_HEADERS = ()


cdef object corrupt(str what, Py_ssize_t position):
    return CorruptRecordError(
        ErrorCode.CORRUPT_MESSAGE, f"{what} at byte {position} of the records section"
    )


cdef tuple decode_headers(
    const unsigned char *data, Py_ssize_t *position_io, Py_ssize_t end
):
    """The headers at position_io[0] (advanced past them); raises CorruptRecordError."""
    cdef Py_ssize_t position = position_io[0]
    cdef int64_t count, key_length, value_length
    cdef Py_ssize_t index
    cdef tuple headers
    cdef object key, value, pair
    position = read_varint(data, position, end, &count)
    # The count bounds the tuple allocated next: no more headers than bytes could hold.
    if position == CUT_SHORT or count < 0 or count > (end - position) // HEADER_BYTES_MIN:
        raise corrupt("record header count is negative or past the record", position_io[0])
    headers = PyTuple_New(count)
    for index in range(count):
        position = read_length(data, position, end, &key_length)
        if position == CUT_SHORT or key_length < 0:
            raise corrupt("record header key length is negative or past the record", position)
        try:
            key = PyUnicode_DecodeUTF8(<const char *>data + position, key_length, "strict")
        except UnicodeDecodeError as error:
            raise corrupt(f"record header key is not UTF-8 ({error})", position) from error
        position += key_length
        position = read_length(data, position, end, &value_length)
        if position == CUT_SHORT:
            raise corrupt("record header value length is past the record", position)
        if value_length < 0:
            value = None
        else:
            value = PyBytes_FromStringAndSize(<const char *>data + position, value_length)
            position += value_length
        pair = (key, value)
        Py_INCREF(pair)  # PyTuple_SET_ITEM steals the reference
        PyTuple_SET_ITEM(headers, index, pair)
    position_io[0] = position
    return headers


cdef struct RecordStart:
    # A record's fields up to its value length, as both record loops below read them.
    Py_ssize_t record_start
    Py_ssize_t record_end
    int64_t timestamp_delta
    int64_t offset_delta  # set to -1 before the first record: each must be above the last
    int64_t offset
    Py_ssize_t key_position
    int64_t key_length  # -1: null key
    int64_t value_length  # -1: null value (a tombstone)


cdef inline Py_ssize_t read_record_start(
    const unsigned char *buf,
    Py_ssize_t position,
    Py_ssize_t end,
    int64_t base_offset,
    int64_t last_offset_delta,
    int64_t index,
    int64_t records_count,
    RecordStart *out,
) except -1:
    """Read record `index` at `position` up to its value length into `out` (which holds the
    record before's offset delta); return the position of its value. Every read is checked
    against the record's own length; anything malformed raises CorruptRecordError."""
    cdef int64_t length, offset_delta
    out.record_start = position
    position = read_varint(buf, position, end, &length)
    if position == CUT_SHORT or length < 0 or length > end - position:
        raise corrupt(f"record {index} of {records_count} is cut short", out.record_start)
    out.record_end = position + length
    position += 1  # record attributes: unused in v2
    position = read_varint(buf, position, out.record_end, &out.timestamp_delta)
    if position == CUT_SHORT:
        raise corrupt("record timestamp delta is cut short or past 64 bits", out.record_start)
    position = read_varint(buf, position, out.record_end, &offset_delta)
    if position == CUT_SHORT:
        raise corrupt("record offset delta is cut short or past 64 bits", out.record_start)
    if not out.offset_delta < offset_delta <= last_offset_delta:
        raise corrupt(
            f"record offset delta {offset_delta} is not above the record before "
            f"({out.offset_delta}) and within the batch (0..{last_offset_delta})",
            out.record_start,
        )
    out.offset_delta = offset_delta
    if riverbed_add_overflows(base_offset, offset_delta, &out.offset):
        raise corrupt("record offset overflows int64", out.record_start)
    position = read_length(buf, position, out.record_end, &out.key_length)
    if position == CUT_SHORT:
        raise corrupt("record key length is below -1 or past the record", out.record_start)
    out.key_position = position
    if out.key_length > 0:
        position += out.key_length
    position = read_length(buf, position, out.record_end, &out.value_length)
    if position == CUT_SHORT:
        raise corrupt("record value length is below -1 or past the record", out.record_start)
    return position


def decode_records(tp, header, const unsigned char[::1] data not None, int64_t skip_below):
    """The records of the (decompressed) records section `data` of the batch `header`, for the
    partition `tp`, leaving out those whose offset is below `skip_below`.

    Every record is checked, kept or not. Raises CorruptRecordError (CORRUPT_MESSAGE) if the
    section does not hold exactly `header.records_count` well-formed records.
    """
    cdef Py_ssize_t end = data.shape[0]
    # Never dereferenced when the section is empty: every read checks `position < end` first.
    cdef const unsigned char *buf = &data[0] if end > 0 else NULL
    cdef int64_t base_offset = header.base_offset
    cdef int64_t last_offset_delta = header.last_offset_delta
    cdef int64_t base_timestamp = header.base_timestamp
    cdef bint log_append_time = header.timestamp_type == TIMESTAMP_TYPE_LOG_APPEND_TIME
    cdef int64_t records_count = header.records_count
    cdef Py_ssize_t position = 0
    cdef RecordStart fields
    cdef Py_ssize_t record_end
    cdef int64_t timestamp_ms
    cdef int64_t index
    cdef list records = []
    cdef object topic = tp[0]
    cdef object partition = tp[1]
    cdef object timestamp_type = header.timestamp_type
    cdef object max_timestamp = header.max_timestamp
    cdef object key, value, timestamp, record
    cdef tuple headers
    if records_count < 0:
        raise corrupt(f"record batch has recordsCount {records_count}", 0)
    fields.offset_delta = -1
    for index in range(records_count):
        position = read_record_start(
            buf, position, end, base_offset, last_offset_delta, index, records_count, &fields
        )
        key = (
            PyBytes_FromStringAndSize(<const char *>buf + fields.key_position, fields.key_length)
            if fields.key_length >= 0
            else None
        )
        if fields.value_length >= 0:
            value = PyBytes_FromStringAndSize(<const char *>buf + position, fields.value_length)
            position += fields.value_length
        else:
            value = None
        record_end = fields.record_end
        if position < record_end and buf[position] == 0:
            headers = NO_HEADERS
            position += 1
        else:
            headers = decode_headers(buf, &position, record_end)
        if position != record_end:
            raise corrupt(f"record ends before its length says ({record_end})", position)
        # Checked before a record is skipped: a batch is refused or accepted whole, whatever
        # offset the reader starts from.
        if not log_append_time and riverbed_add_overflows(
            base_timestamp, fields.timestamp_delta, &timestamp_ms
        ):
            raise corrupt("record timestamp overflows int64", fields.record_start)
        if fields.offset < skip_below:
            continue
        timestamp = max_timestamp if log_append_time else PyLong_FromLongLong(timestamp_ms)
        record = riverbed_new_empty(RECORD_TYPE)
        riverbed_fill_slot(record, TOPIC_SLOT, topic)
        riverbed_fill_slot(record, PARTITION_SLOT, partition)
        riverbed_fill_slot(record, OFFSET_SLOT, PyLong_FromLongLong(fields.offset))
        riverbed_fill_slot(record, TIMESTAMP_MS_SLOT, timestamp)
        riverbed_fill_slot(record, TIMESTAMP_TYPE_SLOT, timestamp_type)
        riverbed_fill_slot(record, KEY_SLOT, key)
        riverbed_fill_slot(record, VALUE_SLOT, value)
        riverbed_fill_slot(record, HEADERS_SLOT, headers)
        # Its fields are str, int, bytes, None and tuples of them: the record can be in no
        # reference cycle, so the collector need not track it (as CPython does with tuples of
        # atomic values); that halves the cost of building it, most of which was collections.
        PyObject_GC_UnTrack(record)
        PyList_Append(records, record)
    if position != end:
        raise corrupt(f"{records_count} records end before the section does ({end})", position)
    return records


def record_keys(
    const unsigned char[::1] data not None,
    int64_t base_offset,
    int64_t base_timestamp,
    int64_t records_count,
    int64_t last_offset_delta,
):
    """(end position, offset, key, is tombstone, create time) of each record of the
    (decompressed) records section `data` of a batch: what the log cleaner needs to decide which
    records stay and to copy those byte for byte (a record starts where the one before it ends;
    its offset and timestamp deltas are relative to the batch header, which the cleaner keeps).
    Headers and values are not read. Raises CorruptRecordError as decode_records does.
    """
    cdef Py_ssize_t end = data.shape[0]
    cdef const unsigned char *buf = &data[0] if end > 0 else NULL
    cdef Py_ssize_t position = 0
    cdef RecordStart fields
    cdef int64_t timestamp_ms, index
    cdef list spans = []
    cdef object key
    if records_count < 0:
        raise corrupt(f"record batch has recordsCount {records_count}", 0)
    fields.offset_delta = -1
    for index in range(records_count):
        read_record_start(
            buf, position, end, base_offset, last_offset_delta, index, records_count, &fields
        )
        if riverbed_add_overflows(base_timestamp, fields.timestamp_delta, &timestamp_ms):
            raise corrupt("record timestamp overflows int64", fields.record_start)
        key = (
            PyBytes_FromStringAndSize(<const char *>buf + fields.key_position, fields.key_length)
            if fields.key_length >= 0
            else None
        )
        position = fields.record_end
        PyList_Append(spans, (position, fields.offset, key, fields.value_length < 0, timestamp_ms))
    if position != end:
        raise corrupt(f"{records_count} records end before the section does ({end})", position)
    return spans


cdef class _Field:
    """A key or value to write: its bytes (borrowed from the caller's object) and length,
    -1 for null. Bytes are read in place; any other buffer through a memoryview."""

    cdef const char *data
    cdef Py_ssize_t length
    cdef object owner

    cdef inline void take(self, object field) except *:
        cdef const unsigned char[::1] view
        if field is None:
            self.data = NULL
            self.length = -1
        elif type(field) is bytes:
            self.data = PyBytes_AS_STRING(field)
            self.length = PyBytes_GET_SIZE(field)
        else:
            view = field
            self.owner = view
            self.length = view.shape[0]
            self.data = <const char *>&view[0] if self.length > 0 else NULL

    cdef inline Py_ssize_t size(self) noexcept:
        """Bytes of its length varint and its data."""
        if self.length < 0:
            return 1
        return varint_size(self.length) + self.length

    cdef inline unsigned char *write(self, unsigned char *out) noexcept:
        if self.length < 0:
            out[0] = NULL_LENGTH
            return out + 1
        out = write_varint(out, self.length)
        memcpy(out, self.data, self.length)
        return out + self.length


cdef Py_ssize_t headers_size(tuple headers, _Field value) except -1:
    cdef Py_ssize_t size = varint_size(len(headers))
    cdef Py_ssize_t key_length
    for key, header_value in headers:
        PyUnicode_AsUTF8AndSize(key, &key_length)  # UTF-8 cached in the str: read again below
        value.take(header_value)
        size += varint_size(key_length) + key_length + value.size()
    return size


cdef unsigned char *write_headers(unsigned char *out, tuple headers, _Field value) except NULL:
    cdef Py_ssize_t key_length
    cdef const char *key_data
    out = write_varint(out, len(headers))
    for key, header_value in headers:
        key_data = PyUnicode_AsUTF8AndSize(key, &key_length)
        out = write_varint(out, key_length)
        memcpy(out, key_data, key_length)
        out += key_length
        value.take(header_value)
        out = value.write(out)
    return out


def append_records(bytearray body not None, records, int64_t base_timestamp):
    """Append the records section of `records` (key, value, headers, timestamp_ms), at offset
    deltas 0, 1, ..., to `body`; return their largest timestamp (base_timestamp at least).

    Raises ValueError if a timestamp is more than int64 away from `base_timestamp`, TypeError
    for a key or value that is not bytes-like or None, or a header key that is not a str.
    """
    cdef _Field key = _Field()
    cdef _Field value = _Field()
    cdef _Field header_value = _Field()
    cdef int64_t max_timestamp = base_timestamp
    cdef int64_t timestamp_ms, timestamp_delta
    cdef int64_t offset_delta = 0
    cdef Py_ssize_t length, record_end
    # body's bytes in use; past them, room reserved for the records to come. Reserving twice
    # what is needed keeps appending linear: bytearray itself over-allocates by only 1/8.
    cdef Py_ssize_t used = PyByteArray_GET_SIZE(body)
    cdef tuple headers
    cdef unsigned char *out
    try:
        for record_key, record_value, record_headers, record_timestamp_ms in records:
            timestamp_ms = record_timestamp_ms
            if riverbed_sub_overflows(timestamp_ms, base_timestamp, &timestamp_delta):
                raise ValueError(f"timestamp {timestamp_ms} is too far from {base_timestamp}")
            if timestamp_ms > max_timestamp:
                max_timestamp = timestamp_ms
            key.take(record_key)
            value.take(record_value)
            headers = record_headers if type(record_headers) is tuple else tuple(record_headers)
            length = (
                1  # attributes
                + varint_size(timestamp_delta)
                + varint_size(offset_delta)
                + key.size()
                + value.size()
                + (headers_size(headers, header_value) if headers else 1)
            )
            record_end = used + varint_size(length) + length
            if record_end > PyByteArray_GET_SIZE(body):
                PyByteArray_Resize(body, 2 * record_end)
            out = <unsigned char *>PyByteArray_AS_STRING(body) + used
            out = write_varint(out, length)
            out[0] = RECORD_ATTRIBUTES
            out = write_varint(out + 1, timestamp_delta)
            out = write_varint(out, offset_delta)
            out = key.write(out)
            out = value.write(out)
            if headers:
                write_headers(out, headers, header_value)
            else:
                out[0] = 0
            used = record_end
            offset_delta += 1
    finally:
        PyByteArray_Resize(body, used)
    return max_timestamp
