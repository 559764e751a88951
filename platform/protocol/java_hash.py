"""Java's `String.hashCode`, which Kafka's wire-visible choices depend on: the
`__consumer_offsets` partition of a group, and the HashMap order the Java sticky assignor walks."""

from __future__ import annotations


def java_string_hash(text: str) -> int:
    """Java's `String.hashCode()`: s[0]*31^(n-1) + ... + s[n-1] over UTF-16 code units, as a
    signed 32-bit int (characters outside the BMP count as their two surrogates)."""
    units = text.encode("utf-16-be", "surrogatepass")
    value = 0
    for position in range(0, len(units), 2):
        value = (31 * value + (units[position] << 8 | units[position + 1])) & 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value
