# cython: language_level=3
"""Kafka's zigzag varints and checked int64 arithmetic, inlined into the compiled record loops
(records_fast, riverbed.tiering.records_columns) that cimport them: one definition, no runtime
module (every function here is inline)."""

from libc.stdint cimport int64_t, uint64_t

cdef extern from *:
    """
    /* a + b into *sum; nonzero if it overflows int64. */
    static inline int riverbed_add_overflows(int64_t a, int64_t b, int64_t *sum) {
        return __builtin_add_overflow(a, b, sum);
    }

    /* a - b into *difference; nonzero if it overflows int64. */
    static inline int riverbed_sub_overflows(int64_t a, int64_t b, int64_t *difference) {
        return __builtin_sub_overflow(a, b, difference);
    }
    """
    bint riverbed_add_overflows(int64_t a, int64_t b, int64_t *sum) noexcept nogil
    bint riverbed_sub_overflows(int64_t a, int64_t b, int64_t *difference) noexcept nogil

cdef enum:
    # Returned by the readers in place of a position: the varint runs past its end, or does
    # not fit 64 bits.
    CUT_SHORT = -1
    # A varint holds 64 bits in at most ten 7-bit groups; the tenth may only hold bit 63.
    VARINT_SHIFT_LAST = 63
    # zigzag(-1): the length of a null key or value.
    NULL_LENGTH = 0x01


cdef inline Py_ssize_t read_varint(
    const unsigned char *data, Py_ssize_t position, Py_ssize_t end, int64_t *value
) noexcept nogil:
    """Decode the zigzag varint at `position` (not past `end`) into `value`; return the position
    after it, or CUT_SHORT if it runs past `end` or does not fit 64 bits."""
    cdef uint64_t byte
    cdef uint64_t unsigned_value = 0
    cdef int shift = 0
    # One byte: every record's attributes-sized fields and most lengths.
    if position < end and data[position] < 0x80:
        byte = data[position]
        value[0] = <int64_t>((byte >> 1) ^ (-(byte & 1)))
        return position + 1
    while position < end:
        byte = data[position]
        position += 1
        if shift == VARINT_SHIFT_LAST and byte > 1:
            return CUT_SHORT
        unsigned_value |= (byte & 0x7F) << shift
        if byte < 0x80:
            value[0] = <int64_t>((unsigned_value >> 1) ^ (-(unsigned_value & 1)))
            return position
        shift += 7
    return CUT_SHORT


cdef inline Py_ssize_t read_length(
    const unsigned char *data, Py_ssize_t position, Py_ssize_t end, int64_t *length
) noexcept nogil:
    """Read a length varint that must leave `length` (>= -1) bytes before `end`; return the
    position after the varint, or CUT_SHORT."""
    position = read_varint(data, position, end, length)
    if position == CUT_SHORT or length[0] < -1 or length[0] > end - position:
        return CUT_SHORT
    return position


cdef inline uint64_t zigzag(int64_t value) noexcept nogil:
    return (<uint64_t>value << 1) ^ <uint64_t>(value >> 63)


cdef inline Py_ssize_t varint_size(int64_t value) noexcept nogil:
    cdef uint64_t unsigned_value = zigzag(value)
    cdef Py_ssize_t size = 1
    while unsigned_value > 0x7F:
        unsigned_value >>= 7
        size += 1
    return size


cdef inline unsigned char *write_varint(unsigned char *out, int64_t value) noexcept nogil:
    cdef uint64_t unsigned_value = zigzag(value)
    while unsigned_value > 0x7F:
        out[0] = (unsigned_value & 0x7F) | 0x80
        out += 1
        unsigned_value >>= 7
    out[0] = <unsigned char>unsigned_value
    return out + 1
