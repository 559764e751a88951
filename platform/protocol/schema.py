"""Parse our compact spec files (`specs/*.spec`, `specs/data/*.spec`) into an immutable model.

Spec format
===========
One file per API, named after the API in snake_case (`fetch.spec`). Blank lines and comments
(`#` to the end of a line) are ignored. Indentation is two spaces per level.

    api 1 Fetch versions 4-16 flexible 12+

    request
      ClusterId string 12+ nullable default=null tag=0
      MaxWaitMs int32
      Topics []FetchTopic
        TopicId uuid 13+
        Partitions []int32

    response
      ...

* Header line: `api <key> <Name> versions <min>-<max> flexible <n>+` (or `flexible none`). The
  file holds only the versions Riverbed supports; every version range below is absolute (as in
  Kafka's own JSON specs) and is clipped to `<min>-<max>`.
* Then a `request` section and a `response` section (in that order), each at indentation 0.
* Field line: `Name type [versions] [nullable[=versions]] [tag=N] [default=VALUE]`.
  - `Name` is Kafka's CamelCase field name; the generated attribute is its snake_case form.
  - `type` is a primitive (int8 int16 int32 int64 uint16 uint32 float64 bool string bytes records
    uuid), an array of a primitive (`[]int32`), an array of structs (`[]StructName`) or a single
    struct (`StructName`). Struct fields follow on the next lines, indented one level deeper.
    Struct names must be unique within a message: they name the generated nested classes.
  - `versions` (`5`, `5+`, `3-7`) defaults to every version of the API; a nested field is present
    only where its struct is present too.
  - `nullable` alone means nullable in every version the field exists; `nullable=10+` limits it.
    Only string, bytes and array fields may be nullable; `records` is always nullable.
  - `tag=N` makes the field a tagged field (written only when it differs from its default) in
    every one of its versions, which must therefore all be flexible versions.
  - `default=` takes an integer (decimal or 0x hex), true/false, a float, `null` (nullable fields
    only) or, for strings, the literal text. Without it a field defaults to its type's zero:
    0, 0.0, False, "", b"", the all-zero UUID, an empty array, a struct of defaults, and None
    for `records`.

Data specs
==========
A data schema (Kafka's `"type": "data"`) is a versioned struct that is not a message of an API:
the consumer protocol's subscription and assignment, the `__consumer_offsets` record keys and
values. One file per schema under `specs/data/`, named after it in snake_case:

    data ConsumerProtocolAssignment versions 0-3 flexible none

    AssignedPartitions []TopicPartition
      Topic string
      Partitions []int32
    UserData bytes nullable default=null

* Header line: `data <Name> versions <min>-<max> flexible <n>+` (or `flexible none`).
* Then the fields, at indentation 0, with the same syntax as above (`records` excepted: data
  is encoded to plain bytes).
"""

from __future__ import annotations

import keyword
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Final, TypeVar

from riverbed.protocol.primitives import ZERO_UUID

SPECS_DIR: Final = Path(__file__).parent / "specs"
DATA_SPECS_DIR: Final = SPECS_DIR / "data"

# Kafka versions are int16 on the wire; an open range ("5+") runs to the largest one.
VERSION_MAX: Final = 0x7FFF
INDENT: Final = "  "

INTEGER_TYPES: Final = frozenset({"int8", "int16", "int32", "int64", "uint16", "uint32"})
PRIMITIVE_TYPES: Final = INTEGER_TYPES | {"float64", "bool", "string", "bytes", "records", "uuid"}
_NULLABLE_PRIMITIVES: Final = frozenset({"string", "bytes", "records"})

_NAME_RE: Final = re.compile(r"[A-Z][A-Za-z0-9]*\Z")
_VERSIONS_RE: Final = re.compile(r"(\d+)(\+|-(\d+))?\Z")
_HEADER_TAIL: Final = r"([A-Z][A-Za-z0-9]*) versions (\d+)-(\d+) flexible (none|\d+\+)\Z"
_API_HEADER_RE: Final = re.compile(r"api (\d+) " + _HEADER_TAIL)
_DATA_HEADER_RE: Final = re.compile(r"data " + _HEADER_TAIL)

DefaultValue = int | float | bool | str | bytes | uuid.UUID | None


class SpecError(ValueError):
    """A spec file is malformed; the message names the file and line."""


@dataclass(frozen=True, slots=True)
class VersionRange:
    """An inclusive range of API versions."""

    low: int
    high: int

    def __contains__(self, version: object) -> bool:
        return isinstance(version, int) and self.low <= version <= self.high

    def intersect(self, other: VersionRange) -> VersionRange | None:
        low, high = max(self.low, other.low), min(self.high, other.high)
        return VersionRange(low, high) if low <= high else None


@dataclass(frozen=True, slots=True)
class FieldSpec:
    name: str
    type_name: str  # a primitive type name or a struct name
    is_array: bool
    versions: VersionRange  # already clipped to the API's and the enclosing struct's versions
    nullable_versions: VersionRange | None
    tag: int | None
    default: DefaultValue  # scalars only; arrays and structs default to empty / all-defaults
    null_default: bool  # an explicit `default=null`: for arrays, None instead of []
    struct: StructSpec | None
    line: int

    @property
    def attr_name(self) -> str:
        return snake_case(self.name)

    def nullable_in(self, version: int) -> bool:
        return self.nullable_versions is not None and version in self.nullable_versions

    @property
    def ever_nullable(self) -> bool:
        return self.nullable_versions is not None


@dataclass(frozen=True, slots=True)
class StructSpec:
    name: str
    fields: tuple[FieldSpec, ...]

    def structs(self) -> list[StructSpec]:
        """Every struct nested in this one, depth first, in declaration order."""
        found: list[StructSpec] = []
        for field in self.fields:
            if field.struct is not None:
                found.append(field.struct)
                found.extend(field.struct.structs())
        return found


@dataclass(frozen=True, slots=True)
class VersionedSpec:
    """What API and data specs share: a name, the supported versions and the flexible ones."""

    name: str
    min_version: int
    max_version: int
    flexible_min_version: int | None  # None: no supported version is flexible

    def supports(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version

    def is_flexible(self, version: int) -> bool:
        return self.flexible_min_version is not None and version >= self.flexible_min_version


@dataclass(frozen=True, slots=True)
class ApiSpec(VersionedSpec):
    key: int
    request: StructSpec
    response: StructSpec


@dataclass(frozen=True, slots=True)
class DataSpec(VersionedSpec):
    struct: StructSpec  # named like the schema


def snake_case(name: str) -> str:
    """A CamelCase field name as a Python attribute: ThrottleTimeMs -> throttle_time_ms."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


@cache
def load_api_specs(directory: Path = SPECS_DIR) -> dict[int, ApiSpec]:
    """Parse every `*.spec` file of `directory`, keyed by API key."""
    return _load(directory, parse_spec, lambda spec: spec.key)


@cache
def load_data_specs(directory: Path = DATA_SPECS_DIR) -> dict[str, DataSpec]:
    """Parse every data `*.spec` file of `directory`, keyed by schema name."""
    return _load(directory, parse_data_spec, lambda spec: spec.name)


def parse_spec(text: str, filename: str) -> ApiSpec:
    return _Parser(text, filename).parse_api()


def parse_data_spec(text: str, filename: str) -> DataSpec:
    return _Parser(text, filename).parse_data()


_Spec = TypeVar("_Spec", bound=VersionedSpec)
_Key = TypeVar("_Key", int, str)


def _load(
    directory: Path, parse: Callable[[str, str], _Spec], key: Callable[[_Spec], _Key]
) -> dict[_Key, _Spec]:
    specs: dict[_Key, _Spec] = {}
    for path in sorted(directory.glob("*.spec")):
        spec = parse(path.read_text(encoding="utf-8"), path.name)
        if key(spec) in specs:
            raise SpecError(f"{path.name}: {key(spec)} is already defined by another file")
        specs[key(spec)] = spec
    return specs


@dataclass(slots=True)
class _Line:
    number: int
    depth: int
    tokens: list[str]


class _Parser:
    def __init__(self, text: str, filename: str) -> None:
        self._filename = filename
        self._lines = list(self._tokenize(text))
        self._position = 0
        self._spec_versions = VersionRange(0, 0)
        self._flexible: VersionRange | None = None
        self._is_data = False

    def parse_api(self) -> ApiSpec:
        match = self._header(_API_HEADER_RE, "api <key> <Name>")
        name = match[2]
        request = self._section("request", f"{name}Request")
        response = self._section("response", f"{name}Response")
        if self._position < len(self._lines):
            raise self._error(
                self._lines[self._position].number, "unexpected line after the response section"
            )
        return ApiSpec(
            name=name,
            min_version=self._spec_versions.low,
            max_version=self._spec_versions.high,
            flexible_min_version=self._flexible.low if self._flexible else None,
            key=int(match[1]),
            request=request,
            response=response,
        )

    def parse_data(self) -> DataSpec:
        self._is_data = True
        match = self._header(_DATA_HEADER_RE, "data <Name>")
        name = match[1]
        struct = self._struct(name, 0, self._lines[0].number)  # every line left is a field
        if not struct.fields:
            raise self._error(0, f"data schema {name} has no fields")
        return DataSpec(
            name=name,
            min_version=self._spec_versions.low,
            max_version=self._spec_versions.high,
            flexible_min_version=self._flexible.low if self._flexible else None,
            struct=struct,
        )

    def _header(self, pattern: re.Pattern[str], start: str) -> re.Match[str]:
        """Match the header line; its last three groups are the versions and flexible ones."""
        expected = f"`{start} versions <a>-<b> flexible <n>+|none`"
        header = self._take(0, f"the header line {expected}")
        match = pattern.match(" ".join(header.tokens))
        if match is None:
            raise self._error(header.number, f"expected {expected}")
        low, high, flexible = match.groups()[-3:]
        if int(low) > int(high) or int(high) > VERSION_MAX:
            raise self._error(header.number, f"bad version range {low}-{high}")
        self._spec_versions = VersionRange(int(low), int(high))
        if flexible != "none":
            self._flexible = VersionRange(int(flexible[:-1]), VERSION_MAX)
        return match

    def _section(self, keyword_: str, struct_name: str) -> StructSpec:
        line = self._take(0, f"the `{keyword_}` section")
        if line.tokens != [keyword_]:
            raise self._error(line.number, f"expected `{keyword_}`")
        return self._struct(struct_name, 1, line.number)

    def _struct(self, struct_name: str, depth: int, number: int) -> StructSpec:
        struct = StructSpec(struct_name, self._fields(depth, self._spec_versions))
        names = [s.name for s in struct.structs()]
        for struct_name_ in names:
            if names.count(struct_name_) > 1 or struct_name_ == struct_name:
                raise self._error(
                    number, f"struct name {struct_name_} is used twice in {struct_name}"
                )
        return struct

    def _fields(self, depth: int, versions: VersionRange) -> tuple[FieldSpec, ...]:
        fields: list[FieldSpec] = []
        while self._position < len(self._lines) and self._lines[self._position].depth >= depth:
            line = self._lines[self._position]
            if line.depth > depth:
                raise self._error(line.number, "unexpected indentation")
            self._position += 1
            field = self._field(line, depth, versions)
            if any(f.name == field.name for f in fields):
                raise self._error(line.number, f"duplicate field {field.name}")
            if field.tag is not None and any(f.tag == field.tag for f in fields):
                raise self._error(line.number, f"duplicate tag {field.tag}")
            fields.append(field)
        return tuple(fields)

    def _field(self, line: _Line, depth: int, parent_versions: VersionRange) -> FieldSpec:
        if len(line.tokens) < 2:
            raise self._error(line.number, "expected `Name type [versions] [options]`")
        name, type_token, *options = line.tokens
        if not _NAME_RE.match(name) or keyword.iskeyword(snake_case(name)):
            raise self._error(line.number, f"bad field name {name!r} (CamelCase expected)")
        is_array = type_token.startswith("[]")
        type_name = type_token[2:] if is_array else type_token
        is_struct = type_name not in PRIMITIVE_TYPES
        if is_struct and not _NAME_RE.match(type_name):
            raise self._error(line.number, f"unknown type {type_token!r}")
        if is_array and type_name == "records":
            raise self._error(line.number, "arrays of records are not supported")
        if self._is_data and type_name == "records":
            raise self._error(line.number, "data schemas cannot hold records")

        declared = parent_versions
        if options and _VERSIONS_RE.match(options[0]):
            declared = self._versions(options.pop(0), line.number)
        versions = declared.intersect(parent_versions)
        if versions is None:
            raise self._error(line.number, f"field {name} is present in no supported version")

        nullable: VersionRange | None = None
        tag: int | None = None
        default_text: str | None = None
        for option in options:
            key, _, value = option.partition("=")
            if key == "nullable" and nullable is None:
                nullable = self._versions(value, line.number) if value else versions
            elif key == "tag" and tag is None and value.isdigit():
                tag = int(value)
            elif key == "default" and default_text is None and value:
                default_text = value
            else:
                raise self._error(line.number, f"unknown or repeated option {option!r}")

        if type_name == "records":
            if nullable is not None:
                raise self._error(line.number, "records are always nullable; drop `nullable`")
            nullable = versions
        elif nullable is not None and not (is_array or type_name in _NULLABLE_PRIMITIVES):
            raise self._error(line.number, f"{type_token} cannot be nullable")
        if tag is not None and (self._flexible is None or versions.low < self._flexible.low):
            raise self._error(line.number, "a tagged field must exist only in flexible versions")

        struct: StructSpec | None = None
        if is_struct:
            struct = StructSpec(type_name, self._fields(depth + 1, versions))
            if not struct.fields:
                raise self._error(line.number, f"struct {type_name} has no fields")
        explicit_null = default_text == "null"
        if explicit_null and nullable is None:
            raise self._error(line.number, "default=null needs a nullable field")
        if default_text is not None and not explicit_null and (is_array or is_struct):
            raise self._error(line.number, "arrays and structs take no default other than null")
        default = self._default(type_name, is_array or is_struct, default_text, line.number)
        return FieldSpec(
            name=name,
            type_name=type_name,
            is_array=is_array,
            versions=versions,
            nullable_versions=nullable,
            tag=tag,
            default=default,
            null_default=explicit_null,
            struct=struct,
            line=line.number,
        )

    def _default(
        self, type_name: str, composite: bool, text: str | None, number: int
    ) -> DefaultValue:
        if composite or text == "null":
            return None
        try:
            return _parse_default(type_name, text)
        except ValueError as exc:
            raise self._error(number, f"bad default {text!r} for {type_name}: {exc}") from None

    def _versions(self, text: str, number: int) -> VersionRange:
        match = _VERSIONS_RE.match(text)
        if match is None:
            raise self._error(number, f"bad version range {text!r}")
        low = int(match[1])
        high = VERSION_MAX if match[2] == "+" else int(match[3]) if match[3] else low
        if low > high or high > VERSION_MAX:
            raise self._error(number, f"bad version range {text!r}")
        return VersionRange(low, high)

    def _take(self, depth: int, what: str) -> _Line:
        if self._position >= len(self._lines):
            raise self._error(0, f"missing {what}")
        line = self._lines[self._position]
        if line.depth != depth:
            raise self._error(line.number, f"expected {what} at indentation {depth}")
        self._position += 1
        return line

    def _tokenize(self, text: str) -> list[_Line]:
        lines: list[_Line] = []
        for number, raw in enumerate(text.splitlines(), start=1):
            content = raw.split("#", 1)[0].rstrip()
            if not content:
                continue
            stripped = content.lstrip(" ")
            indent = len(content) - len(stripped)
            if "\t" in content or indent % len(INDENT):
                raise self._error(number, "indent with two spaces per level (no tabs)")
            lines.append(_Line(number, indent // len(INDENT), stripped.split()))
        return lines

    def _error(self, number: int, message: str) -> SpecError:
        where = f"{self._filename}:{number}" if number else self._filename
        return SpecError(f"{where}: {message}")


_INTEGER_BOUNDS: Final = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint16": (0, 2**16 - 1),
    "uint32": (0, 2**32 - 1),
}


def _parse_default(type_name: str, text: str | None) -> DefaultValue:
    if type_name in _INTEGER_BOUNDS:
        value = int(text, 0) if text is not None else 0
        low, high = _INTEGER_BOUNDS[type_name]
        if not low <= value <= high:
            raise ValueError("out of range")
        return value
    if type_name == "bool":
        if text not in (None, "true", "false"):
            raise ValueError("expected true or false")
        return text == "true"
    if type_name == "float64":
        return float(text) if text is not None else 0.0
    if type_name == "string":
        return text or ""
    if type_name == "bytes" and text is None:
        return b""
    if type_name == "uuid" and text is None:
        return ZERO_UUID
    if type_name == "records" and text is None:
        return None
    raise ValueError("no default other than null is supported")
