"""An encoder of message bodies that also maps their bytes: where each length prefix, array
count, tagged-field header and boolean lies. Structure-aware mutations use the map to lie about
exactly those fields (a compact array claiming 2**32-2 elements, a string length of -2, a
tagged field of 4 GiB, a null marker in a field that is never null).

It walks the parsed spec files itself instead of reusing the codec's compiled writers, so a
test can check that both produce the same bytes: the map is then known to match the codec.
"""

from __future__ import annotations

import enum
import struct
import uuid
from dataclasses import dataclass
from typing import Any, Final

from riverbed.protocol.regions import FileRegion
from riverbed.protocol.schema import FieldSpec, StructSpec

_FIXED: Final = {
    "int8": struct.Struct(">b"),
    "int16": struct.Struct(">h"),
    "int32": struct.Struct(">i"),
    "int64": struct.Struct(">q"),
    "uint16": struct.Struct(">H"),
    "uint32": struct.Struct(">I"),
    "float64": struct.Struct(">d"),
}
_INT16: Final = struct.Struct(">h")
_INT32: Final = struct.Struct(">i")


class SlotKind(enum.Enum):
    STRING_LENGTH = "int16 string length (-1: null)"
    LENGTH = "int32 bytes or array length (-1: null)"
    COMPACT_LENGTH = "unsigned varint length + 1 (0: null)"
    TAG_COUNT = "unsigned varint count of tagged fields"
    TAG = "unsigned varint tag"
    TAG_SIZE = "unsigned varint size of a tagged field"
    BOOL = "bool byte"


@dataclass(frozen=True, slots=True)
class Slot:
    start: int
    end: int
    kind: SlotKind
    nullable: bool  # for lengths: whether null is allowed here in this version
    value: int  # the value encoded (for lengths: the length, -1 for null)


@dataclass(frozen=True, slots=True)
class WireMap:
    data: bytes
    slots: tuple[Slot, ...]


def write_uvarint(out: bytearray, value: int) -> None:
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def encode_uvarint(value: int) -> bytes:
    out = bytearray()
    write_uvarint(out, value)
    return bytes(out)


def map_struct(spec: StructSpec, value: Any, version: int, flexible: bool) -> WireMap:
    """Encode `value` (a message or struct of `spec`) as `version`, with its map."""
    writer = _Writer(version, flexible)
    writer.struct(spec, value)
    return WireMap(bytes(writer.out), tuple(writer.slots))


class _Writer:
    def __init__(self, version: int, flexible: bool) -> None:
        self.version = version
        self.flexible = flexible
        self.out = bytearray()
        self.slots: list[Slot] = []

    def struct(self, spec: StructSpec, value: Any) -> None:
        present = [f for f in spec.fields if self.version in f.versions]
        for field in present:
            if field.tag is None:
                self.field(field, getattr(value, field.attr_name))
        if not self.flexible:
            return
        defaults = type(value)()
        pending = []
        for field in sorted((f for f in present if f.tag is not None), key=lambda f: f.tag or 0):
            field_value = getattr(value, field.attr_name)
            if field_value != getattr(defaults, field.attr_name):
                pending.append((field, field_value))
        self.uvarint(len(pending), SlotKind.TAG_COUNT)
        for field, field_value in pending:
            self.uvarint(field.tag or 0, SlotKind.TAG)
            inner = _Writer(self.version, self.flexible)
            inner.field(field, field_value)
            self.uvarint(len(inner.out), SlotKind.TAG_SIZE)
            body_start = len(self.out)
            self.out += inner.out
            self.slots += [
                Slot(s.start + body_start, s.end + body_start, s.kind, s.nullable, s.value)
                for s in inner.slots
            ]

    def field(self, field: FieldSpec, value: Any) -> None:
        nullable = field.nullable_in(self.version)
        if field.is_array:
            if value is None:
                self.length(-1, nullable)
                return
            self.length(len(value), nullable)
            for element in value:
                self.element(field, element, nullable=False)
            return
        self.element(field, value, nullable)

    def element(self, field: FieldSpec, value: Any, nullable: bool) -> None:
        if field.struct is not None:
            self.struct(field.struct, value)
            return
        type_name = field.type_name
        fixed = _FIXED.get(type_name)
        if fixed is not None:
            self.out += fixed.pack(value)
        elif type_name == "bool":
            self.slots.append(Slot(len(self.out), len(self.out) + 1, SlotKind.BOOL, False, value))
            self.out.append(1 if value else 0)
        elif type_name == "uuid":
            self.out += value.bytes if isinstance(value, uuid.UUID) else bytes(16)
        elif type_name == "string":
            data = None if value is None else value.encode()
            self.string_length(-1 if data is None else len(data), nullable)
            self.out += data or b""
        else:  # bytes and records
            if isinstance(value, FileRegion):
                raise ValueError("a file region has no bytes to map")
            data = None if value is None else bytes(value)
            self.length(-1 if data is None else len(data), nullable)
            self.out += data or b""

    def length(self, length: int, nullable: bool) -> None:
        start = len(self.out)
        if self.flexible:
            write_uvarint(self.out, length + 1)
            kind = SlotKind.COMPACT_LENGTH
        else:
            self.out += _INT32.pack(length)
            kind = SlotKind.LENGTH
        self.slots.append(Slot(start, len(self.out), kind, nullable, length))

    def string_length(self, length: int, nullable: bool) -> None:
        if self.flexible:
            self.length(length, nullable)
            return
        start = len(self.out)
        self.out += _INT16.pack(length)
        self.slots.append(Slot(start, len(self.out), SlotKind.STRING_LENGTH, nullable, length))

    def uvarint(self, value: int, kind: SlotKind) -> None:
        start = len(self.out)
        write_uvarint(self.out, value)
        self.slots.append(Slot(start, len(self.out), kind, False, value))
