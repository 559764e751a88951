# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""Batch v2 records sections <-> column buffers in Arrow's layout, with no Python object per
record: what lets the broker tier a segment, and rebuild batches from it, at memcpy speed.

`RecordColumns` decodes the (decompressed) records sections of batches into the buffers of the
columns `offset` and `record_timestamp_delta` (int64), `key` and `value` (binary: validity
bitmap, int32 offsets, data) and `headers` (list offsets, then the key strings and the binary
values of all headers); riverbed.tiering.segment_rows wraps them as Arrow arrays. It checks
what decode_records checks (every read within its record, a section of exactly recordsCount
records) and more, because a segment is refused rather than tiered wrong: offsets inside their
batch and strictly increasing, header keys present. (UTF-8 of header keys is checked by Arrow
when the column is built.)

`RowGroupColumns.append_records` writes records back from such columns (Arrow arrays' buffers,
read in place at any offset) with each record's own offset delta, gapped or not, and timestamp
delta: what riverbed.tiering.batch_rebuild needs to rebuild a batch byte for byte.

No pyarrow here: buffers in and out are anything with the buffer protocol.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from libc.stdint cimport INT32_MAX, int32_t, int64_t
from libc.string cimport memcpy

from kafka_varint cimport (
    CUT_SHORT,
    NULL_LENGTH,
    read_length,
    read_varint,
    riverbed_add_overflows,
    varint_size,
    write_varint,
)

from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.records_header import CorruptRecordError


cdef object corrupt(str what, Py_ssize_t position):
    return CorruptRecordError(
        ErrorCode.CORRUPT_MESSAGE, f"{what} at byte {position} of the records section"
    )


cdef class _Buffer:
    """A growing byte buffer: a bytearray with room reserved past the bytes in use (doubling,
    so appending stays linear), trimmed by `take`."""

    cdef bytearray data
    cdef Py_ssize_t used

    def __cinit__(self):
        self.data = bytearray()
        self.used = 0

    cdef inline unsigned char *room(self, Py_ssize_t size) except NULL:
        """Where the next `size` bytes go (count them with `used += size`)."""
        if self.used + size > PyByteArray_GET_SIZE(self.data):
            PyByteArray_Resize(self.data, 2 * (self.used + size) + 64)
        return <unsigned char *>PyByteArray_AS_STRING(self.data) + self.used

    cdef inline int append(self, const void *source, Py_ssize_t size) except -1:
        memcpy(self.room(size), source, size)
        self.used += size
        return 0

    cdef inline int append_int32(self, int32_t value) except -1:
        return self.append(&value, sizeof(int32_t))

    cdef inline int append_int64(self, int64_t value) except -1:
        return self.append(&value, sizeof(int64_t))

    cdef int reserve(self, Py_ssize_t capacity) except -1:
        """Room for `capacity` bytes in all, so appending up to there never moves the bytes."""
        if capacity > PyByteArray_GET_SIZE(self.data):
            PyByteArray_Resize(self.data, capacity)
        return 0

    cdef bytearray take(self):
        """The bytes in use; the buffer starts over empty."""
        cdef bytearray data = self.data
        PyByteArray_Resize(data, self.used)
        self.data = bytearray()
        self.used = 0
        return data


cdef class _BinaryBuilder:
    """A binary column: validity bitmap (LSB first), int32 offsets, data."""

    cdef _Buffer validity
    cdef _Buffer offsets
    cdef _Buffer data
    cdef Py_ssize_t length
    cdef Py_ssize_t null_count

    def __cinit__(self):
        self.validity = _Buffer()
        self.offsets = _Buffer()
        self.data = _Buffer()
        self.offsets.append_int32(0)

    cdef int add(self, const unsigned char *value, int64_t size) except -1:
        """Append a value (`size` -1: null)."""
        cdef unsigned char *bits
        if self.length % 8 == 0:
            bits = self.validity.room(1)
            bits[0] = 0
            self.validity.used += 1
        if size < 0:
            self.null_count += 1
        else:
            if self.data.used + size > INT32_MAX:
                raise OverflowError("a binary column holds at most 2 GiB: use smaller row groups")
            self.data.append(value, size)
            bits = <unsigned char *>PyByteArray_AS_STRING(self.validity.data)
            bits[self.length // 8] |= 1 << (self.length % 8)
        self.length += 1
        self.offsets.append_int32(<int32_t>self.data.used)
        return 0

    cdef tuple take(self):
        """(validity or None if no value is null, offsets, data, null count)."""
        validity = self.validity.take()
        taken = (validity if self.null_count else None, self.offsets.take(), self.data.take(),
                 self.null_count)
        self.length = self.null_count = 0
        self.offsets.append_int32(0)
        return taken


cdef class RecordColumns:
    """The records of whole batches, decoded column by column (see the module's docstring)."""

    cdef _Buffer offsets
    cdef _Buffer timestamp_deltas
    cdef _BinaryBuilder keys
    cdef _BinaryBuilder values
    cdef _Buffer header_ends
    cdef _BinaryBuilder header_keys
    cdef _BinaryBuilder header_values
    cdef readonly Py_ssize_t rows
    cdef readonly Py_ssize_t headers

    def __cinit__(self, Py_ssize_t value_bytes_hint=0):
        # `value_bytes_hint`: room reserved up front for the values (a row group's bound).
        # Grown by doubling instead, a buffer of megabytes is copied several times over and
        # touches fresh pages at each step (a tenth of a conversion's page faults).
        self.offsets = _Buffer()
        self.timestamp_deltas = _Buffer()
        self.keys = _BinaryBuilder()
        self.values = _BinaryBuilder()
        self.header_ends = _Buffer()
        self.header_keys = _BinaryBuilder()
        self.header_values = _BinaryBuilder()
        self.header_ends.append_int32(0)
        self.values.data.reserve(value_bytes_hint)

    def add(
        self,
        const unsigned char[::1] data not None,
        int64_t base_offset,
        int64_t last_offset_delta,
        int64_t base_timestamp,
        int64_t records_count,
    ):
        """Decode the records section `data` of one batch. Raises CorruptRecordError
        (CORRUPT_MESSAGE) unless it holds exactly `records_count` well-formed records whose
        offsets increase within [base_offset, base_offset + last_offset_delta]. A batch that
        raises leaves the columns as they were only up to its first bad record: drop them."""
        cdef Py_ssize_t end = data.shape[0]
        # Never dereferenced when the section is empty: every read checks `position < end`.
        cdef const unsigned char *buf = &data[0] if end > 0 else NULL
        cdef Py_ssize_t position = 0
        cdef Py_ssize_t record_start, record_end
        cdef int64_t length, timestamp_delta, offset_delta, key_length, value_length
        cdef int64_t offset, timestamp_ms, header_count, header
        cdef int64_t previous_delta = -1
        cdef int64_t index
        if records_count < 0:
            raise corrupt(f"record batch has recordsCount {records_count}", 0)
        for index in range(records_count):
            record_start = position
            position = read_varint(buf, position, end, &length)
            if position == CUT_SHORT or length < 0 or length > end - position:
                raise corrupt(f"record {index} of {records_count} is cut short", record_start)
            # Every field below is read within the record's own length.
            record_end = position + length
            position += 1  # record attributes: unused in v2
            position = read_varint(buf, position, record_end, &timestamp_delta)
            if position == CUT_SHORT:
                raise corrupt("record timestamp delta is cut short", record_start)
            if riverbed_add_overflows(base_timestamp, timestamp_delta, &timestamp_ms):
                raise corrupt("record timestamp overflows int64", record_start)
            position = read_varint(buf, position, record_end, &offset_delta)
            if position == CUT_SHORT:
                raise corrupt("record offset delta is cut short", record_start)
            if not previous_delta < offset_delta <= last_offset_delta:
                raise corrupt(
                    f"record offset delta {offset_delta} is not above the record before "
                    f"({previous_delta}) and within the batch (0..{last_offset_delta})",
                    record_start,
                )
            previous_delta = offset_delta
            if riverbed_add_overflows(base_offset, offset_delta, &offset):
                raise corrupt("record offset overflows int64", record_start)
            position = read_length(buf, position, record_end, &key_length)
            if position == CUT_SHORT:
                raise corrupt("record key length is below -1 or past the record", record_start)
            self.keys.add(buf + position, key_length)
            if key_length > 0:
                position += key_length
            position = read_length(buf, position, record_end, &value_length)
            if position == CUT_SHORT:
                raise corrupt("record value length is below -1 or past the record", record_start)
            self.values.add(buf + position, value_length)
            if value_length > 0:
                position += value_length
            position = read_varint(buf, position, record_end, &header_count)
            # Each header takes two bytes at least: the count cannot claim more than that.
            if position == CUT_SHORT or header_count < 0 or header_count > record_end - position:
                raise corrupt("record header count is negative or past the record", record_start)
            for header in range(header_count):
                position = read_length(buf, position, record_end, &key_length)
                if position == CUT_SHORT or key_length < 0:
                    raise corrupt(
                        "record header key length is negative or past the record", record_start
                    )
                self.header_keys.add(buf + position, key_length)
                position += key_length
                position = read_length(buf, position, record_end, &value_length)
                if position == CUT_SHORT:
                    raise corrupt("record header value length is past the record", record_start)
                self.header_values.add(buf + position, value_length)
                if value_length > 0:
                    position += value_length
            if position != record_end:
                raise corrupt(f"record ends before its length says ({record_end})", position)
            self.headers += header_count
            self.header_ends.append_int32(<int32_t>self.headers)
            self.offsets.append_int64(offset)
            self.timestamp_deltas.append_int64(timestamp_delta)
            self.rows += 1
        if position != end:
            raise corrupt(f"{records_count} records end before the section does ({end})", position)

    def take(self):
        """The columns decoded so far, and start over empty: a dict of `offset` and
        `record_timestamp_delta` (int64 data), `key`, `value`, `header_key`, `header_value`
        ((validity or None, int32 offsets, data, null count)) and `header_ends` (int32 list
        offsets, one per row and a leading 0)."""
        columns = {
            "offset": self.offsets.take(),
            "record_timestamp_delta": self.timestamp_deltas.take(),
            "key": self.keys.take(),
            "value": self.values.take(),
            "header_ends": self.header_ends.take(),
            "header_key": self.header_keys.take(),
            "header_value": self.header_values.take(),
        }
        self.rows = self.headers = 0
        self.header_ends.append_int32(0)
        return columns


cdef class _Pinned:
    """The bytes of any buffer (pyarrow's are signed char, bytearray's unsigned), held until
    this object goes."""

    cdef Py_buffer view

    def __cinit__(self, source):
        PyObject_GetBuffer(source, &self.view, PyBUF_SIMPLE)

    def __dealloc__(self):
        PyBuffer_Release(&self.view)

    cdef inline const unsigned char *bytes_from(self, Py_ssize_t position, Py_ssize_t size) except NULL:
        """The bytes from `position` on, checked to hold at least `size` of them."""
        if position < 0 or size < 0 or self.view.len - position < size:
            raise ValueError(f"{size} bytes at {position} are not in a buffer of {self.view.len}")
        return <const unsigned char *>self.view.buf + position


cdef class BinaryColumn:
    """A binary or string Arrow array read in place: its buffers and offset (`array.buffers()`,
    `array.offset`; validity None when no value is null). Arrow has validated the array: its
    offsets lie within its data."""

    cdef const unsigned char *validity
    cdef const int32_t *offsets
    cdef const unsigned char *data
    cdef Py_ssize_t first
    # The buffers stay pinned while their pointers are in use.
    cdef tuple pins

    def __init__(self, validity, offsets, data, Py_ssize_t offset):
        pinned_offsets = _Pinned(offsets)
        self.offsets = <const int32_t *>pinned_offsets.bytes_from(0, (offset + 1) * 4)
        self.validity = NULL
        self.data = NULL
        self.first = offset
        self.pins = (pinned_offsets,)
        if validity is not None:
            pinned_validity = _Pinned(validity)
            self.validity = pinned_validity.bytes_from(0, 0)
            self.pins += (pinned_validity,)
        if data is not None:
            pinned_data = _Pinned(data)
            self.data = pinned_data.bytes_from(0, 0)
            self.pins += (pinned_data,)

    cdef inline Py_ssize_t size_of(self, Py_ssize_t row) noexcept:
        """Bytes of the value at `row`, -1 for null."""
        cdef Py_ssize_t at = self.first + row
        if self.validity != NULL and not (self.validity[at >> 3] >> (at & 7)) & 1:
            return -1
        return self.offsets[at + 1] - self.offsets[at]

    cdef inline const unsigned char *at(self, Py_ssize_t row) noexcept:
        return self.data + self.offsets[self.first + row]

    cdef inline Py_ssize_t field_size(self, Py_ssize_t row) noexcept:
        """Bytes of the value at `row` written as a record field: length varint and data."""
        cdef Py_ssize_t size = self.size_of(row)
        return 1 if size < 0 else varint_size(size) + size

    cdef inline unsigned char *write_field(self, unsigned char *out, Py_ssize_t row) noexcept:
        cdef Py_ssize_t size = self.size_of(row)
        if size < 0:
            out[0] = NULL_LENGTH
            return out + 1
        out = write_varint(out, size)
        if size:
            memcpy(out, self.at(row), size)
        return out + size


cdef class Int64Column:
    """An int64 Arrow array read in place (no nulls): its data buffer, offset and length."""

    cdef const int64_t *values
    cdef Py_ssize_t length
    cdef _Pinned pin

    def __init__(self, data, Py_ssize_t offset, Py_ssize_t length):
        if length <= 0:
            raise ValueError(f"an int64 column of {length} values")
        self.pin = _Pinned(data)
        self.values = <const int64_t *>self.pin.bytes_from(offset * 8, length * 8)
        self.length = length


cdef class Int32Column:
    """An int32 Arrow array read in place (list offsets): its data buffer, offset and length."""

    cdef const int32_t *values
    cdef Py_ssize_t length
    cdef _Pinned pin

    def __init__(self, data, Py_ssize_t offset, Py_ssize_t length):
        if length <= 0:
            raise ValueError(f"an int32 column of {length} values")
        self.pin = _Pinned(data)
        self.values = <const int32_t *>self.pin.bytes_from(offset * 4, length * 4)
        self.length = length


cdef class RowGroupColumns:
    """The columns a rebuild reads, of one row group (rows 0..n-1 of each column given): record
    offsets and timestamp deltas, keys, values, and headers (`header_ends`: n + 1 list offsets
    into `header_keys` / `header_values`)."""

    cdef Int64Column offsets
    cdef Int64Column timestamp_deltas
    cdef BinaryColumn keys
    cdef BinaryColumn values
    cdef Int32Column header_ends
    cdef BinaryColumn header_keys
    cdef BinaryColumn header_values

    def __init__(
        self,
        Int64Column offsets not None,
        Int64Column timestamp_deltas not None,
        BinaryColumn keys not None,
        BinaryColumn values not None,
        Int32Column header_ends not None,
        BinaryColumn header_keys not None,
        BinaryColumn header_values not None,
    ):
        if timestamp_deltas.length != offsets.length or header_ends.length != offsets.length + 1:
            raise ValueError("the columns of a row group differ in length")
        self.offsets = offsets
        self.timestamp_deltas = timestamp_deltas
        self.keys = keys
        self.values = values
        self.header_ends = header_ends
        self.header_keys = header_keys
        self.header_values = header_values

    def append_records(
        self, bytearray body not None, int64_t base_offset, Py_ssize_t first_row, Py_ssize_t rows
    ):
        """Append to `body` the records section of rows first_row .. first_row + rows - 1,
        each with its offset delta (offset - base_offset: gapped where compaction left gaps)
        and its timestamp delta as written."""
        cdef const int32_t *ends = self.header_ends.values
        cdef Py_ssize_t used = PyByteArray_GET_SIZE(body)
        cdef Py_ssize_t row, header, length, record_end
        cdef int64_t offset_delta, timestamp_delta
        cdef unsigned char *out
        if first_row < 0 or rows < 0 or first_row + rows > self.offsets.length:
            raise IndexError(f"rows {first_row}+{rows} of {self.offsets.length}")
        try:
            for row in range(first_row, first_row + rows):
                offset_delta = self.offsets.values[row] - base_offset
                timestamp_delta = self.timestamp_deltas.values[row]
                length = (
                    1  # attributes
                    + varint_size(timestamp_delta)
                    + varint_size(offset_delta)
                    + self.keys.field_size(row)
                    + self.values.field_size(row)
                    + varint_size(ends[row + 1] - ends[row])
                )
                for header in range(ends[row], ends[row + 1]):
                    length += (
                        self.header_keys.field_size(header) + self.header_values.field_size(header)
                    )
                record_end = used + varint_size(length) + length
                if record_end > PyByteArray_GET_SIZE(body):
                    PyByteArray_Resize(body, 2 * record_end)
                out = <unsigned char *>PyByteArray_AS_STRING(body) + used
                out = write_varint(out, length)
                out[0] = 0  # record attributes: unused in v2
                out = write_varint(out + 1, timestamp_delta)
                out = write_varint(out, offset_delta)
                out = self.keys.write_field(out, row)
                out = self.values.write_field(out, row)
                out = write_varint(out, ends[row + 1] - ends[row])
                for header in range(ends[row], ends[row + 1]):
                    out = self.header_keys.write_field(out, header)
                    out = self.header_values.write_field(out, header)
                used = record_end
        finally:
            PyByteArray_Resize(body, used)
