"""Compile a struct of the spec files, at one version, into ONE generated reader and ONE writer.

The broker decodes and encodes a Fetch or Produce message on every request, so the per-field
cost is what counts. Each function is straight-line Python generated (with `exec`) from the
fields present in that version, with nested structs and arrays inlined as loops, so a field
costs no function call:

- consecutive fixed-size fields (integers, float64, bool, uuid) are one `struct.Struct`: one
  `unpack_from` into the instance's attributes, one `pack` of them;
- compact lengths and counts are read and written inline when they fit in one varint byte (the
  common case), the general varint code only past that;
- arrays of integers are one `unpack_from` / `pack` of a `count`-long format;
- instances are allocated without running `__init__` and every attribute is set once: decoded
  fields from the wire, the others (absent from this version, or tagged) to fresh defaults;
- an empty tagged-field section is the single byte 0, tested inline on both sides: the writer
  compares each declared tagged field with its default in the generated code, and builds the
  section only when one differs.

Structs nested deeper than STRUCT_INLINE_DEPTH_MAX, and tagged fields (decoded only when sent,
each checked against its size), are compiled into functions of their own and called.

Generated readers index the buffer without checking its end where a truncation can only raise
IndexError or struct.error (fixed-size values, the first byte of a varint), and decode strings
without catching UnicodeDecodeError: each reader turns those into ProtocolDecodeError. Lengths
and counts are checked against the bytes that remain before anything is sliced or allocated,
and every array count is spent from the ElementBudget before its elements are built.
"""

from __future__ import annotations

import abc
import dataclasses
import keyword
import struct
import uuid
from collections.abc import Callable
from functools import cache
from typing import Any, Final, cast

from riverbed.protocol.errors import ProtocolDecodeError
from riverbed.protocol.primitives import (
    INT16,
    INT32,
    Output,
    read_uvarint,
    uuid_cache,
    uuid_from_bytes,
    write_uvarint,
)
from riverbed.protocol.regions import FileRegion
from riverbed.protocol.schema import FieldSpec, StructSpec

# Structs nested deeper than this inside one generated function get a function of their own.
# Every level of arrays adds two or three nested blocks to the generated code, and CPython
# refuses more than 20; our specs nest at most 4 levels (message included), all inlined.
STRUCT_INLINE_DEPTH_MAX: Final = 4

# The `struct` format of each fixed-size type. `?` unpacks any non-zero byte as True, as Kafka's
# readers do; uuids are their 16 raw bytes, turned into uuid.UUID through the cache.
_FIXED_FORMATS: Final = {
    "int8": "b",
    "int16": "h",
    "int32": "i",
    "int64": "q",
    "uint16": "H",
    "uint32": "I",
    "float64": "d",
    "bool": "?",
    "uuid": "16s",
}
# Arrays of these types are one `unpack_from` / `pack` of a `count`-long format.
_NUMBER_TYPES: Final = frozenset({"int8", "int16", "int32", "int64", "uint16", "uint32", "float64"})
# Such formats are prebuilt for counts below this (replica lists, partition indexes): formatting
# a format string and looking it up in `struct`'s cache would cost more than the packing itself.
_NUMBER_ARRAY_STRUCTS_COUNT: Final = 32
_VARINT_BYTE_MAX: Final = 0x7F  # a compact length up to this value is its own single byte


class ElementBudget:
    """How many more array elements a decode may produce: the generated readers spend each
    array's count as they read it, and refuse the array once `remaining` would go negative."""

    __slots__ = ("remaining", "total")

    def __init__(self, elements_max: int) -> None:
        self.total = elements_max
        self.remaining = elements_max


Reader = Callable[[memoryview, int, ElementBudget], tuple[Any, int]]
Writer = Callable[[Output, Any], None]


@dataclasses.dataclass(frozen=True, slots=True)
class Codec:
    read: Reader
    write: Writer


@dataclasses.dataclass(frozen=True, slots=True)
class _Target:
    """What the generated code compiles: the struct and version, and the classes to build."""

    message_cls: type[Any]  # holds the struct classes, by struct name
    version: int
    flexible: bool

    def present(self, struct_spec: StructSpec) -> list[FieldSpec]:
        return [f for f in struct_spec.fields if self.version in f.versions]

    def struct_cls(self, struct_spec: StructSpec) -> type[Any]:
        cls: type[Any] = getattr(self.message_cls, struct_spec.name)
        return cls


def compile_struct(
    struct_spec: StructSpec, cls: type[Any], message_cls: type[Any], version: int, flexible: bool
) -> Codec:
    """The codec of `struct_spec` as `version`, building instances of `cls` (the message or
    data class itself, or one of its nested struct classes)."""
    target = _Target(message_cls, version, flexible)
    reader = _ReaderSource(target)
    reader.struct(struct_spec, cls, "value", reader.indent, 1)
    writer = _WriterSource(target)
    writer.struct(struct_spec, cls, "value", writer.indent, 1)
    return Codec(reader.finish(), writer.finish())


def compile_field(field: FieldSpec, message_cls: type[Any], version: int, flexible: bool) -> Codec:
    """The codec of one field's value as `version` (a tagged field, the request's ClientId)."""
    target = _Target(message_cls, version, flexible)
    reader = _ReaderSource(target)
    reader.field(field, "value", reader.indent, 1)
    writer = _WriterSource(target)
    writer.field(field, "value", writer.indent, 1)
    return Codec(reader.finish(), writer.finish())


def _min_size(field: FieldSpec, target: _Target) -> int:
    """The fewest bytes the field's encoding takes: bounds array counts before allocating."""
    if field.is_array:
        return 1 if target.flexible else 4
    if field.struct is not None:
        regular = [f for f in target.present(field.struct) if f.tag is None]
        return sum(_min_size(f, target) for f in regular) + (1 if target.flexible else 0)
    if field.type_name in _FIXED_FORMATS:
        return struct.calcsize(">" + _FIXED_FORMATS[field.type_name])
    if field.type_name == "string":
        return 1 if target.flexible else 2
    return 1 if target.flexible else 4  # bytes, records


def _attribute(name: str, cls: type[Any]) -> str:
    # Field names come from our own spec files; still, nothing else goes into generated source.
    if not name.isidentifier() or keyword.iskeyword(name):
        raise ValueError(f"field name {name!r} of {cls.__qualname__} is not an identifier")
    return name


def _element(field: FieldSpec) -> FieldSpec:
    """An array field's element: the same type, neither an array nor nullable."""
    return dataclasses.replace(field, is_array=False, nullable_versions=None, tag=None)


def _is_fixed(field: FieldSpec) -> bool:
    return not field.is_array and field.struct is None and field.type_name in _FIXED_FORMATS


def _runs(fields: list[FieldSpec]) -> list[list[FieldSpec]]:
    """The fields in order, consecutive fixed-size ones grouped (other fields alone)."""
    runs: list[list[FieldSpec]] = []
    for field in fields:
        if _is_fixed(field) and runs and _is_fixed(runs[-1][-1]):
            runs[-1].append(field)
        else:
            runs.append([field])
    return runs


@cache
def _number_arrays(
    code: str,
) -> tuple[tuple[Callable[..., Any], ...], tuple[Callable[..., Any], ...]]:
    """`unpack_from` and `pack` of arrays of 0 to _NUMBER_ARRAY_STRUCTS_COUNT - 1 numbers of the
    type `code`, by count."""
    structs = [struct.Struct(f">{count}{code}") for count in range(_NUMBER_ARRAY_STRUCTS_COUNT)]
    return tuple(s.unpack_from for s in structs), tuple(s.pack for s in structs)


def _wrong_type(expected: type[Any], value: object) -> TypeError:
    return TypeError(f"expected {expected.__qualname__}, got {type(value).__qualname__}")


def _check_plain_dataclass(cls: type[Any]) -> None:
    """Check that instances of `cls` may be built without `__init__`, field by field."""
    if not dataclasses.is_dataclass(cls) or hasattr(cls, "__post_init__"):
        raise ValueError(f"{cls.__qualname__} is not a plain dataclass")


class _Source(abc.ABC):
    """Lines of one generated function and the names it uses."""

    def __init__(self, target: _Target, name: str, parameters: str) -> None:
        self.target = target
        self.name = name
        self.lines = [f"def {name}({parameters}):"]
        self.namespace: dict[str, Any] = {
            "ProtocolDecodeError": ProtocolDecodeError,
            "new": object.__new__,
            "read_uvarint": read_uvarint,
            "write_uvarint": write_uvarint,
            "wrong_type": _wrong_type,
        }
        self._names: dict[int, str] = {}
        self._locals = 0

    def emit(self, indent: int, line: str) -> None:
        self.lines.append("    " * indent + line)

    def local(self, prefix: str) -> str:
        self._locals += 1
        return f"{prefix}{self._locals}"

    def constant(self, value: object, prefix: str) -> str:
        """A global name for `value` in the generated code."""
        name = self._names.get(id(value))
        if name is None:
            name = self._names[id(value)] = f"{prefix}_{len(self._names)}"
            self.namespace[name] = value
        return name

    def literal(self, value: object) -> str:
        if value is None or type(value) in (int, bool, str, bytes):
            return repr(value)
        return self.constant(value, "constant")

    def fixed_struct(self, fields: list[FieldSpec]) -> struct.Struct:
        return struct.Struct(">" + "".join(_FIXED_FORMATS[f.type_name] for f in fields))

    def finish(self) -> Any:
        exec("\n".join(self.lines), self.namespace)
        return self.namespace[self.name]

    def field(self, field: FieldSpec, place: str, indent: int, depth: int) -> None:
        """Code for one field, read into or written from `place` (a name in the generated
        code): the same dispatch in both directions, each supplying the four kinds."""
        if field.is_array:
            self.array(field, place, indent, depth)
        elif field.struct is not None:
            cls = self.target.struct_cls(field.struct)
            self.struct(field.struct, cls, place, indent, depth + 1)
        elif _is_fixed(field):
            self.fixed_run([field], [place], indent)
        else:
            self.sized(field, place, indent)

    @abc.abstractmethod
    def array(self, field: FieldSpec, place: str, indent: int, depth: int) -> None: ...

    @abc.abstractmethod
    def struct(
        self, struct_spec: StructSpec, cls: type[Any], place: str, indent: int, depth: int
    ) -> None: ...

    @abc.abstractmethod
    def fixed_run(self, fields: list[FieldSpec], places: list[str], indent: int) -> None: ...

    @abc.abstractmethod
    def sized(self, field: FieldSpec, place: str, indent: int) -> None: ...


class _ReaderSource(_Source):
    """`read(buf, offset, budget) -> (value, offset)`; `n` is the end of the buffer. It raises
    ProtocolDecodeError alone (see the module's docstring)."""

    indent: Final = 2  # inside `try:`

    def __init__(self, target: _Target) -> None:
        super().__init__(target, "read", "buf, offset, budget")
        self.namespace.update(
            struct_error=struct.error,
            unpack_int16=INT16.unpack_from,
            unpack_int32=INT32.unpack_from,
            unpack_format=struct.unpack_from,
            uuid_get=uuid_cache.get,
            uuid_from_bytes=uuid_from_bytes,
        )
        self.emit(1, "try:")
        self.emit(self.indent, "n = len(buf)")

    def finish(self) -> Reader:
        self.emit(self.indent, "return value, offset")
        # A fixed-size value or the first byte of a varint past the end of the buffer.
        self.emit(1, "except (struct_error, IndexError) as exc:")
        self.emit(2, 'raise ProtocolDecodeError(f"truncated message: {exc}") from exc')
        self.emit(1, "except UnicodeDecodeError as exc:")
        self.emit(2, 'raise ProtocolDecodeError(f"invalid UTF-8 in string: {exc}") from exc')
        return cast(Reader, super().finish())

    def struct(
        self, struct_spec: StructSpec, cls: type[Any], target: str, indent: int, depth: int
    ) -> None:
        if depth > STRUCT_INLINE_DEPTH_MAX:
            codec = compile_struct(
                struct_spec, cls, self.target.message_cls, self.target.version, self.target.flexible
            )
            reader = self.constant(codec.read, "read_struct")
            self.emit(indent, f"{target}, offset = {reader}(buf, offset, budget)")
            return
        _check_plain_dataclass(cls)
        present = self.target.present(struct_spec)
        regular = [f for f in present if f.tag is None]
        obj = target if target.isidentifier() else self.local("struct")
        self.emit(indent, f"{obj} = new({self.constant(cls, 'cls')})")
        decoded = {f.attr_name for f in regular}
        defaults = cls()
        for cls_field in dataclasses.fields(cls):
            name = _attribute(cls_field.name, cls)
            if name not in decoded:
                self.fresh_default(f"{obj}.{name}", getattr(defaults, name), indent)
        for run in _runs(regular):
            if _is_fixed(run[0]):
                self.fixed_run(run, [f"{obj}.{_attribute(f.attr_name, cls)}" for f in run], indent)
            else:
                field = run[0]
                self.field(field, f"{obj}.{_attribute(field.attr_name, cls)}", indent, depth)
        if self.target.flexible:
            self.tagged_section(present, cls, obj, indent)
        if obj != target:
            self.emit(indent, f"{target} = {obj}")

    def fresh_default(self, target: str, default: object, indent: int) -> None:
        """Assign a new copy of a field's default (structs and lists are mutable: never shared)."""
        if dataclasses.is_dataclass(default) and not isinstance(default, type):
            cls = type(default)
            _check_plain_dataclass(cls)
            obj = self.local("default")
            self.emit(indent, f"{obj} = new({self.constant(cls, 'cls')})")
            for cls_field in dataclasses.fields(cls):
                name = _attribute(cls_field.name, cls)
                self.fresh_default(f"{obj}.{name}", getattr(default, name), indent)
            self.emit(indent, f"{target} = {obj}")
        elif type(default) is list and not default:
            self.emit(indent, f"{target} = []")
        elif default is None or isinstance(default, int | float | str | bytes | uuid.UUID):
            self.emit(indent, f"{target} = {self.literal(default)}")
        else:
            raise ValueError(f"no fresh copy of the default {default!r}")

    def tagged_section(
        self, present: list[FieldSpec], cls: type[Any], obj: str, indent: int
    ) -> None:
        """Each known tagged field is read by its own function, from the whole buffer (no slice to
        build), and must end where its size says: one that reads past it is refused then, its
        lengths having been checked against the buffer like any other. Unknown tags are
        skipped (a newer peer may send them)."""
        count, tag, end = self.local("tags"), self.local("tag"), self.local("tag_end")
        self.emit(indent, "if buf[offset]:")
        self.uvarint(count, indent + 1)
        self.emit(indent + 1, f"for _ in range({count}):")
        body = indent + 2
        self.uvarint(tag, body)
        self.uvarint("size", body)
        self.emit(body, f"{end} = offset + size")
        self.emit(body, f"if {end} > n:")
        self.emit(
            body + 1,
            'raise ProtocolDecodeError(f"length {size} at offset {offset} exceeds the buffer")',
        )
        branch = "if"
        for field in present:
            if field.tag is not None:
                codec = compile_field(
                    field, self.target.message_cls, self.target.version, self.target.flexible
                )
                reader = self.constant(codec.read, "read_tagged")
                self.emit(body, f"{branch} {tag} == {field.tag}:")
                attribute = f"{obj}.{_attribute(field.attr_name, cls)}"
                self.emit(body + 1, f"{attribute}, offset = {reader}(buf, offset, budget)")
                branch = "elif"
        if branch == "if":  # no known tag
            self.emit(body, f"offset = {end}")
        else:
            self.emit(body, "else:")
            self.emit(body + 1, f"offset = {end}")
            self.emit(body, f"if offset != {end}:")
            self.emit(
                body + 1,
                f'raise ProtocolDecodeError(f"tagged field {{{tag}}} of {{size}} bytes decodes'
                f' to {{offset - {end} + size}}")',
            )
        self.emit(indent, "else:")
        self.emit(indent + 1, "offset += 1")

    def fixed_run(self, fields: list[FieldSpec], targets: list[str], indent: int) -> None:
        packer = self.fixed_struct(fields)
        unpack = self.constant(packer.unpack_from, "unpack")
        assigned = list(targets)
        uuids = []
        for index, field in enumerate(fields):
            if field.type_name == "uuid":
                assigned[index] = self.local("raw")
                uuids.append((targets[index], assigned[index]))
        if len(fields) == 1:
            self.emit(indent, f"{assigned[0]} = {unpack}(buf, offset)[0]")
        else:
            self.emit(indent, f"{', '.join(assigned)} = {unpack}(buf, offset)")
        self.emit(indent, f"offset += {packer.size}")
        for target, raw in uuids:  # a UUID is never false: `or` only calls on a cache miss
            self.emit(indent, f"{target} = uuid_get({raw}) or uuid_from_bytes({raw})")

    def uvarint(self, target: str, indent: int) -> None:
        self.emit(indent, f"{target} = buf[offset]")
        self.emit(indent, f"if {target} <= {_VARINT_BYTE_MAX}:")
        self.emit(indent + 1, "offset += 1")
        self.emit(indent, "else:")
        self.emit(indent + 1, f"{target}, offset = read_uvarint(buf, offset)")

    def length(self, what: str, short: bool, nullable: bool, target: str, indent: int) -> int:
        """Read a length or count into `size`: null sets `target` to None. Returns the indent
        of the code for a present value (`size` >= 0)."""
        if self.target.flexible:  # a compact length: the length plus one, as a varint
            self.uvarint("size", indent)
            self.emit(indent, "size -= 1")
        else:
            width = 2 if short else 4
            self.emit(indent, f"size = unpack_int{width * 8}(buf, offset)[0]")
            self.emit(indent, f"offset += {width}")
        invalid = (
            f'raise ProtocolDecodeError(f"invalid {what} length {{size}} at offset {{offset}}")'
        )
        if not nullable:
            self.emit(indent, "if size < 0:")
            self.emit(indent + 1, invalid)
            return indent
        self.emit(indent, "if size < 0:")
        if not self.target.flexible:  # a compact length is never below -1
            self.emit(indent + 1, "if size != -1:")
            self.emit(indent + 2, invalid)
        self.emit(indent + 1, f"{target} = None")
        self.emit(indent, "else:")
        return indent + 1

    def sized(self, field: FieldSpec, target: str, indent: int) -> None:
        """A string, bytes or records value: a length, then that many bytes."""
        is_string = field.type_name == "string"
        nullable = field.nullable_in(self.target.version)
        what = "string" if is_string else "bytes"
        indent = self.length(what, is_string, nullable, target, indent)
        self.emit(indent, "end = offset + size")
        self.emit(indent, "if end > n:")
        self.emit(
            indent + 1,
            'raise ProtocolDecodeError(f"length {size} at offset {offset} exceeds the buffer")',
        )
        if is_string:
            self.emit(indent, f'{target} = str(buf[offset:end], "utf-8")')
        elif field.type_name == "records":  # zero-copy: the produce path rewrites it in place
            self.emit(indent, f"{target} = buf[offset:end]")
        else:
            self.emit(indent, f"{target} = bytes(buf[offset:end])")
        self.emit(indent, "offset = end")

    def array(self, field: FieldSpec, target: str, indent: int, depth: int) -> None:
        element = _element(field)
        element_size_min = max(_min_size(element, self.target), 1)
        indent = self.length("array", False, field.nullable_in(self.target.version), target, indent)
        self.emit(indent, f"if size * {element_size_min} > n - offset:")
        self.emit(
            indent + 1,
            'raise ProtocolDecodeError(f"array of {size} elements exceeds the buffer")',
        )
        self.emit(indent, "budget.remaining -= size")
        self.emit(indent, "if budget.remaining < 0:")
        self.emit(
            indent + 1,
            'raise ProtocolDecodeError(f"more than {budget.total} array elements")',
        )
        if element.type_name in _NUMBER_TYPES:
            code = _FIXED_FORMATS[element.type_name]
            unpacks = _number_arrays(code)[0]
            self.emit(indent, f"if size < {len(unpacks)}:")
            self.emit(
                indent + 1,
                f"{target} = list({self.constant(unpacks, 'unpack_array')}[size](buf, offset))",
            )
            self.emit(indent, "else:")
            self.emit(
                indent + 1, f'{target} = list(unpack_format(f">{{size}}{code}", buf, offset))'
            )
            self.emit(indent, f"offset += size * {element_size_min}")
            return
        items = self.local("items")
        item = self.local("item")
        self.emit(indent, f"{target} = {items} = []")
        self.emit(indent, "for _ in range(size):")
        self.field(element, item, indent + 1, depth)
        self.emit(indent + 1, f"{items}.append({item})")


class _WriterSource(_Source):
    """`write(out, value)`: appends to `buffer` (`out.buffer`, the same bytearray throughout)."""

    indent: Final = 1

    def __init__(self, target: _Target) -> None:
        super().__init__(target, "write", "out, value")
        self.namespace.update(
            pack_int16=INT16.pack,
            pack_int32=INT32.pack,
            pack_format=struct.pack,
            UUID=uuid.UUID,
            FileRegion=FileRegion,
            write_sized=_write_sized,
        )
        self.emit(self.indent, "buffer = out.buffer")

    def finish(self) -> Writer:
        return cast(Writer, super().finish())

    def struct(
        self, struct_spec: StructSpec, cls: type[Any], value: str, indent: int, depth: int
    ) -> None:
        if depth > STRUCT_INLINE_DEPTH_MAX:
            codec = compile_struct(
                struct_spec, cls, self.target.message_cls, self.target.version, self.target.flexible
            )
            self.emit(indent, f"{self.constant(codec.write, 'write_struct')}(out, {value})")
            return
        if not value.isidentifier():
            obj = self.local("struct")
            self.emit(indent, f"{obj} = {value}")
            value = obj
        cls_name = self.constant(cls, "cls")
        self.emit(indent, f"if {value}.__class__ is not {cls_name}:")
        self.emit(indent + 1, f"raise wrong_type({cls_name}, {value})")
        present = self.target.present(struct_spec)
        for run in _runs([f for f in present if f.tag is None]):
            values = [f"{value}.{_attribute(f.attr_name, cls)}" for f in run]
            if _is_fixed(run[0]):
                self.fixed_run(run, values, indent)
            else:
                self.field(run[0], values[0], indent, depth)
        if self.target.flexible:
            self.tagged_section(present, cls, value, indent)

    def tagged_section(
        self, present: list[FieldSpec], cls: type[Any], obj: str, indent: int
    ) -> None:
        tagged: list[tuple[int, str, Writer]] = []  # in tag order
        flags = []
        defaults = cls()
        for field in sorted(present, key=lambda f: f.tag or 0):
            if field.tag is not None:
                name = _attribute(field.attr_name, cls)
                codec = compile_field(
                    field, self.target.message_cls, self.target.version, self.target.flexible
                )
                tagged.append((field.tag, name, codec.write))
                flags.append(self.local("default"))
                test = self.default_test(f"{obj}.{name}", getattr(defaults, name))
                self.emit(indent, f"{flags[-1]} = {test}")
        if not tagged:
            self.emit(indent, "buffer.append(0)")
            return
        self.emit(indent, f"if {' and '.join(flags)}:")
        self.emit(indent + 1, "buffer.append(0)")
        self.emit(indent, "else:")
        count = " + ".join(f"(not {flag})" for flag in flags)
        if len(flags) <= _VARINT_BYTE_MAX:
            self.emit(indent + 1, f"buffer.append({count})")
        else:
            self.emit(indent + 1, f"write_uvarint(buffer, {count})")
        for (tag, name, write), flag in zip(tagged, flags, strict=True):
            tag_bytes = bytearray()
            write_uvarint(tag_bytes, tag)
            self.emit(indent + 1, f"if not {flag}:")
            self.emit(indent + 2, f"buffer += {bytes(tag_bytes)!r}")
            writer = self.constant(write, "write_tagged")
            self.emit(indent + 2, f"write_sized(out, {writer}, {obj}.{name})")

    def default_test(self, value: str, default: object) -> str:
        """An expression true when `value` equals `default`, as dataclass equality would say."""
        if dataclasses.is_dataclass(default) and not isinstance(default, type):
            cls = type(default)
            struct = self.local("tagged")  # its fields are tested one by one
            tests = [f"({struct} := {value}).__class__ is {self.constant(cls, 'cls')}"]
            for cls_field in dataclasses.fields(cls):
                name = _attribute(cls_field.name, cls)
                tests.append(self.default_test(f"{struct}.{name}", getattr(default, name)))
            return f"({' and '.join(tests)})"
        if default is None:
            return f"{value} is None"
        if type(default) is list and not default:
            return f"{value} == []"
        return f"{value} == {self.literal(default)}"

    def fixed_run(self, fields: list[FieldSpec], values: list[str], indent: int) -> None:
        packed = []
        for field, value in zip(fields, values, strict=True):
            if field.type_name in ("bool", "uuid"):  # `?` would pack any value by its truth
                checked = self.local("checked")
                self.emit(indent, f"{checked} = {value}")
                if field.type_name == "bool":
                    self.emit(indent, f"if {checked}.__class__ is not bool:")
                    self.emit(indent + 1, f"raise wrong_type(bool, {checked})")
                    value = checked
                else:
                    self.emit(indent, f"if not isinstance({checked}, UUID):")
                    self.emit(indent + 1, f"raise wrong_type(UUID, {checked})")
                    value = f"{checked}.bytes"
            packed.append(value)
        pack = self.constant(self.fixed_struct(fields).pack, "pack")
        self.emit(indent, f"buffer += {pack}({', '.join(packed)})")

    def length(self, size: str, short: bool, indent: int) -> None:
        if self.target.flexible:
            self.emit(indent, f"if {size} < {_VARINT_BYTE_MAX}:")
            self.emit(indent + 1, f"buffer.append({size} + 1)")
            self.emit(indent, "else:")
            self.emit(indent + 1, f"write_uvarint(buffer, {size} + 1)")
        else:
            self.emit(indent, f"buffer += pack_int{16 if short else 32}({size})")

    def null(
        self, what: str, nullable: bool, short: bool, value: str, indent: int
    ) -> tuple[str, int]:
        """Write null if `value` is None (or refuse it). Returns a local holding the value and
        the indent of the code for a present value."""
        local = self.local(what)
        self.emit(indent, f"{local} = {value}")
        self.emit(indent, f"if {local} is None:")
        if not nullable:
            message = f"null {what} in a field that is not nullable in this version"
            self.emit(indent + 1, f"raise ValueError({message!r})")
            return local, indent
        null = b"\x00" if self.target.flexible else b"\xff" * (2 if short else 4)
        self.emit(indent + 1, f"buffer += {null!r}")
        self.emit(indent, "else:")
        return local, indent + 1

    def sized(self, field: FieldSpec, value: str, indent: int) -> None:
        nullable = field.nullable_in(self.target.version)
        if field.type_name == "string":
            value, indent = self.null("string", nullable, True, value, indent)
            self.emit(indent, f"data = {value}.encode()")
            self.emit(indent, "size = len(data)")
            self.length("size", True, indent)
            self.emit(indent, "buffer += data")
            return
        value, indent = self.null("bytes", nullable, False, value, indent)
        # The server sends a file region with sendfile(): it becomes its own chunk of `out`.
        self.emit(indent, f"if isinstance({value}, FileRegion):")
        self.length(f"{value}.size", False, indent + 1)
        self.emit(indent + 1, f"out.write_region({value})")
        self.emit(indent, "else:")
        self.emit(
            indent + 1,
            f"size = {value}.nbytes if isinstance({value}, memoryview) else len({value})",
        )
        self.length("size", False, indent + 1)
        self.emit(indent + 1, f"buffer += {value}")

    def array(self, field: FieldSpec, value: str, indent: int, depth: int) -> None:
        nullable = field.nullable_in(self.target.version)
        items, indent = self.null("array", nullable, False, value, indent)
        element = _element(field)
        self.emit(indent, f"size = len({items})")
        self.length("size", False, indent)
        if element.type_name in _NUMBER_TYPES:
            code = _FIXED_FORMATS[element.type_name]
            packs = _number_arrays(code)[1]
            self.emit(indent, f"if size < {len(packs)}:")
            self.emit(indent + 1, f"buffer += {self.constant(packs, 'pack_array')}[size](*{items})")
            self.emit(indent, "else:")
            self.emit(indent + 1, f'buffer += pack_format(f">{{size}}{code}", *{items})')
            return
        item = self.local("item")
        self.emit(indent, f"for {item} in {items}:")
        self.field(element, item, indent + 1, depth)


def _write_sized(out: Output, write: Writer, value: object) -> None:
    """`value` as `write` encodes it, after its size as a uvarint: a tagged field's value."""
    encoded = Output()
    write(encoded, value)
    write_uvarint(out.buffer, encoded.size)
    out.extend(encoded)
