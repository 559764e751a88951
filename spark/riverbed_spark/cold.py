"""The cold tier as Spark's driver and executors read it: straight from the object store through
pyarrow's filesystems (S3 or a local directory), with no broker in the way.

The driver reads each partition's latest manifest (the layout is in docs/tiering.md); an
executor opens one Parquet object, keeps the row groups whose offset statistics overlap its
range, and reads only the columns the query's schema names.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from riverbed.tiering.manifest import (
    Manifest,
    manifest_key,
    partition_prefix,
)
from riverbed.tiering.stores import s3_settings
from riverbed.tiering.txn_ranges import AbortedRange, overlapping, resolve

from riverbed_spark.options import StoreOptions

# Control batches (transaction markers) are rows in the objects, flagged by this attribute bit;
# consumers never see them, so neither does Spark.
CONTROL_BATCH_BIT = 1 << 5
# A transactional batch's bit: read_committed leaves out those of aborted transactions.
TRANSACTIONAL_BATCH_BIT = 1 << 4
MANIFEST_SUFFIX = ".json"


class DataLossError(RuntimeError):
    """Records the plan promised are gone from the store (retention or compaction ran)."""


@dataclass(frozen=True)
class ColdObject:
    """One finished remote segment, as planning hands it to an executor."""

    key: str
    base_offset: int
    last_offset: int
    size_bytes: int


class ColdStore:
    """A store root (bucket and prefix, or directory) opened through pyarrow."""

    def __init__(self, options: StoreOptions) -> None:
        self.options = options
        self.filesystem, self.root = _open(options)

    def path(self, key: str) -> str:
        return f"{self.root}/{key}"

    def topics(self) -> list[str]:
        """Topics with anything tiered: the store's top-level directories."""
        selector = pafs.FileSelector(self.root, allow_not_found=True)
        return sorted(
            info.base_name
            for info in self.filesystem.get_file_info(selector)
            if info.type == pafs.FileType.Directory
        )

    def partitions(self, topic: str) -> list[int]:
        selector = pafs.FileSelector(self.path(topic), allow_not_found=True)
        return sorted(
            int(info.base_name)
            for info in self.filesystem.get_file_info(selector)
            if info.type == pafs.FileType.Directory and info.base_name.isdigit()
        )

    def manifest(self, topic: str, partition: int) -> Manifest:
        """The latest committed version (empty when nothing was tiered)."""
        directory = self.path(f"{partition_prefix(topic, partition)}manifest")
        selector = pafs.FileSelector(directory, allow_not_found=True)
        versions = sorted(
            int(info.base_name[: -len(MANIFEST_SUFFIX)])
            for info in self.filesystem.get_file_info(selector)
            if info.base_name.endswith(MANIFEST_SUFFIX)
            and info.base_name[: -len(MANIFEST_SUFFIX)].isdigit()
        )
        if not versions:
            return Manifest.empty(topic, partition)
        key = manifest_key(topic, partition, versions[-1])
        with self.filesystem.open_input_file(self.path(key)) as file:
            data = file.read()
        return Manifest.from_json(data, f"{self.options.url}/{key}")

    def read(
        self,
        item: ColdObject,
        start: int,
        end: int,
        columns: list[str],
        aborted: Sequence[AbortedRange] = (),
    ) -> Iterator[pa.RecordBatch]:
        """Rows with offsets in [start, end) of `item`, data records only, `columns` only;
        without the records of the `aborted` transactions (read_committed)."""
        try:
            file = pq.ParquetFile(self.filesystem.open_input_file(self.path(item.key)))
        except FileNotFoundError as error:
            raise DataLossError(
                f"{self.options.url}/{item.key} (offsets {item.base_offset}..{item.last_offset})"
                " was deleted after the query was planned (retention or compaction); set "
                "failOnDataLoss=false to skip what is gone"
            ) from error
        with file:
            for group, whole in row_groups_overlapping(file, start, end, aborted):
                if whole:
                    # All its rows are wanted: read only the asked columns, filter nothing.
                    yield from file.read_row_group(group, columns=columns).to_batches()
                    continue
                wanted = [*columns, "offset", "batch_attributes", "batch_producer_id"]
                table = file.read_row_group(group, columns=list(dict.fromkeys(wanted)))
                offsets = table.column("offset")
                control = pc.bit_wise_and(table.column("batch_attributes"), CONTROL_BATCH_BIT)
                keep = pc.and_(
                    pc.and_(pc.greater_equal(offsets, start), pc.less(offsets, end)),
                    pc.equal(control, 0),
                )
                if aborted:
                    keep = pc.and_(keep, pc.invert(_in_aborted(table, aborted)))
                yield from table.filter(keep).select(columns).to_batches()


def _in_aborted(table: pa.Table, aborted: Sequence[AbortedRange]) -> pa.ChunkedArray:
    """Which rows are records of an aborted transaction: a transactional batch of its producer
    within its offsets (a producer has one transaction at a time, so nothing else of its lies
    there)."""
    offsets, producers = table.column("offset"), table.column("batch_producer_id")
    transactional = pc.not_equal(
        pc.bit_wise_and(table.column("batch_attributes"), TRANSACTIONAL_BATCH_BIT), 0
    )
    hit = pc.equal(offsets, -1)  # all false
    for txn in aborted:
        inside = pc.and_(
            pc.greater_equal(offsets, txn.first_offset), pc.less_equal(offsets, txn.last_offset)
        )
        hit = pc.or_(hit, pc.and_(inside, pc.equal(producers, txn.producer_id)))
    return pc.and_(hit, transactional)


def row_groups_overlapping(
    file: pq.ParquetFile, start: int, end: int, aborted: Sequence[AbortedRange] = ()
) -> list[tuple[int, bool]]:
    """Row groups whose offset range meets [start, end), by their statistics; each with whether
    all of its rows are wanted (offsets inside the range, no control batch: attributes below
    the control bit, and no aborted transaction's offsets)."""
    offset_column = _leaf_index(file, "offset")
    attributes_column = _leaf_index(file, "batch_attributes")
    groups = []
    for index in range(file.metadata.num_row_groups):
        row_group = file.metadata.row_group(index)
        offsets = row_group.column(offset_column).statistics
        attributes = row_group.column(attributes_column).statistics
        if offsets is None or not offsets.has_min_max:
            groups.append((index, False))  # cannot prune without statistics
        elif offsets.max >= start and offsets.min < end:
            whole = (
                start <= offsets.min
                and offsets.max < end
                and attributes is not None
                and attributes.has_min_max
                and attributes.min >= 0
                and attributes.max < CONTROL_BATCH_BIT
                and not overlapping(aborted, offsets.min, offsets.max + 1)
            )
            groups.append((index, whole))
    return groups


def _leaf_index(file: pq.ParquetFile, name: str) -> int:
    """A top-level column's index among the file's leaf columns (what statistics are kept by;
    `headers`, a list of structs, is two leaves, so Arrow's field index would be off)."""
    schema = file.metadata.schema
    for index in range(len(schema)):
        if schema.column(index).path == name:
            return index
    raise ValueError(f"{file}: no column {name!r}")


class ColdView:
    """What a reader at an isolation level may take from a partition's finished objects: offsets
    below `end`, without the records of the `aborted` transactions. At read_uncommitted that is
    every finished offset and nothing is left out; at read_committed the objects' transactions
    are resolved (riverbed.tiering.txn_ranges) and `end` stops at the first transaction whose
    marker is not in the store yet (the broker decides on those, or a later read)."""

    def __init__(self, manifest: Manifest, *, read_committed: bool) -> None:
        self.end = manifest.finished_end_offset
        self.aborted: tuple[AbortedRange, ...] = ()
        if read_committed:
            resolved = resolve([(s.base_offset, s.transactions) for s in manifest.finished()])
            self.aborted = resolved.aborted
            if resolved.unstable_from is not None:
                self.end = min(self.end, resolved.unstable_from)


def finished_objects(manifest: Manifest) -> list[ColdObject]:
    return [
        ColdObject(s.key, s.base_offset, s.last_offset, s.size_bytes) for s in manifest.finished()
    ]


def _open(options: StoreOptions) -> tuple[pafs.FileSystem, str]:
    url = urlparse(options.url)
    if url.scheme == "file":
        return pafs.LocalFileSystem(), url.path.rstrip("/")
    # The broker's own resolution of the settings and the AWS environment variables.
    settings = s3_settings(options.settings, os.environ)
    endpoint = urlparse(settings.endpoint_url) if settings.endpoint_url else None
    filesystem = pafs.S3FileSystem(
        access_key=settings.access_key_id,
        secret_key=settings.secret_access_key,
        session_token=settings.session_token,
        region=settings.region,
        scheme=endpoint.scheme if endpoint else "https",
        endpoint_override=endpoint.netloc if endpoint else None,
        force_virtual_addressing=settings.addressing_style == "virtual",
        connect_timeout=settings.connect_timeout_ms / 1000,
        request_timeout=settings.request_timeout_ms / 1000,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=settings.retries_max + 1),
    )
    return filesystem, f"{url.netloc}{url.path}".rstrip("/")
