"""Types of the compiled module records_columns.pyx (mypy does not read Cython)."""

from typing import Any

from typing_extensions import Buffer

class RecordColumns:
    rows: int
    headers: int
    def __init__(self, value_bytes_hint: int = 0) -> None: ...
    def add(
        self,
        data: Buffer,
        base_offset: int,
        last_offset_delta: int,
        base_timestamp: int,
        records_count: int,
    ) -> None: ...
    def take(self) -> dict[str, Any]: ...

class BinaryColumn:
    def __init__(
        self, validity: Buffer | None, offsets: Buffer, data: Buffer | None, offset: int
    ) -> None: ...

class Int64Column:
    def __init__(self, data: Buffer, offset: int, length: int) -> None: ...

class Int32Column:
    def __init__(self, data: Buffer, offset: int, length: int) -> None: ...

class RowGroupColumns:
    def __init__(
        self,
        offsets: Int64Column,
        timestamp_deltas: Int64Column,
        keys: BinaryColumn,
        values: BinaryColumn,
        header_ends: Int32Column,
        header_keys: BinaryColumn,
        header_values: BinaryColumn,
    ) -> None: ...
    def append_records(
        self, body: bytearray, base_offset: int, first_row: int, rows: int
    ) -> None: ...
