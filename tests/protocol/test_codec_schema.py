"""The spec file parser: the model it builds and the errors it reports (file and line)."""

from __future__ import annotations

import pytest
from riverbed.protocol.schema import SpecError, VersionRange, parse_spec, snake_case

VALID = """\
# A comment.
api 7 Example versions 2-9 flexible 5+

request
  Name string nullable=4+ default=null  # trailing comment
  Count int32 3+ default=0x10
  Items []Item 5+ tag=0
    Id uuid
    Values []int64 6-7
  Leader Leader 5+ tag=1
    Epoch int32 default=-1

response
  ErrorCode int16
"""


def test_valid_spec_model() -> None:
    spec = parse_spec(VALID, "example.spec")
    assert (spec.key, spec.name, spec.min_version, spec.max_version) == (7, "Example", 2, 9)
    assert spec.flexible_min_version == 5
    assert spec.is_flexible(5)
    assert not spec.is_flexible(4)
    name, count, items, leader = spec.request.fields
    assert name.versions == VersionRange(2, 9)
    assert name.nullable_in(4)
    assert not name.nullable_in(3)
    assert name.default is None
    assert name.null_default
    assert count.versions == VersionRange(3, 9)
    assert count.default == 16
    assert items.is_array
    assert items.tag == 0
    assert items.struct is not None
    values = items.struct.fields[1]
    assert values.versions == VersionRange(6, 7)
    assert values.type_name == "int64"
    assert leader.struct is not None
    assert leader.struct.fields[0].default == -1
    assert [s.name for s in spec.request.structs()] == ["Item", "Leader"]
    assert spec.response.name == "ExampleResponse"


@pytest.mark.parametrize(
    ("name", "attribute"),
    [
        ("ThrottleTimeMs", "throttle_time_ms"),
        ("TopicId", "topic_id"),
        ("Index", "index"),
        ("IsrNodes", "isr_nodes"),
    ],
)
def test_snake_case(name: str, attribute: str) -> None:
    assert snake_case(name) == attribute


def _replace_field(line: str) -> str:
    return VALID.replace("  Count int32 3+ default=0x10\n", line + "\n")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "api 7 Example versions 9-2 flexible none\nrequest\nresponse\n",
            "example.spec:1: bad version",
        ),
        ("api x Example\n", "example.spec:1: expected `api"),
        (VALID.replace("\nresponse\n  ErrorCode int16\n", "\n"), "missing the `response` section"),
        (_replace_field("  Count int99"), ":6: unknown type"),
        (_replace_field("  count int32"), ":6: bad field name"),
        (_replace_field("  Count int32 10+"), ":6: field Count is present in no supported version"),
        (_replace_field("  Count int32 nullable"), ":6: int32 cannot be nullable"),
        (_replace_field("  Count int32 default=null"), ":6: default=null needs a nullable field"),
        (_replace_field("  Count int8 default=300"), ":6: bad default '300' for int8"),
        (_replace_field("  Count int32 tag=3"), ":6: a tagged field must exist only in flexible"),
        (_replace_field("  Count int32 5+ tag=0"), ":7: duplicate tag 0"),
        (_replace_field("  Name int32"), ":6: duplicate field Name"),
        (_replace_field("  Count int32 bogus=1"), ":6: unknown or repeated option"),
        (_replace_field("  Count records nullable"), ":6: records are always nullable"),
        (_replace_field("  Count []Item\n    X int8"), "struct name Item is used twice"),
        (_replace_field("   Count int32"), ":6: indent with two spaces"),
        (_replace_field("      Count int32"), ":6: unexpected indentation"),
        (_replace_field("  Count []int32 default=null"), ":6: default=null needs a nullable"),
    ],
)
def test_errors_name_file_and_line(text: str, message: str) -> None:
    with pytest.raises(SpecError, match=message.replace("[", r"\[").replace("+", r"\+")):
        parse_spec(text, "example.spec")
