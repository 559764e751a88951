"""The object store contract, run against both stores: `file://` on tmp_path and `s3://` on
moto's standalone S3 server (a real HTTP endpoint, through aiobotocore). Then what only one
store has (S3's multipart uploads, timeouts and retries against a stopped or hung server; the
file store's key rules and temporary files), and `open_store`'s parsing of URLs, settings and
the AWS environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from botocore.httpsession import get_cert_path
from riverbed.tiering.file_store import TEMP_SUFFIX, FileStore
from riverbed.tiering.retry import RetryPolicy
from riverbed.tiering.s3_store import MIB, S3Settings, S3Store
from riverbed.tiering.store import ObjectInfo, ObjectNotFoundError, ObjectStore, ObjectStoreError
from riverbed.tiering.stores import open_store

from tests.support.moto_server import HOST, MotoServer
from tests.support.stalls import StallMeter
from tests.tiering.conftest import MotoServerFactory

# Small pages so listing walks many of them; small parts so a multipart upload stays quick
# (5 MiB is S3's minimum part size).
LIST_PAGE_KEYS = 7
PART_BYTES = 5 * MIB
LARGE_FILE_BYTES = 11 * MIB  # three parts: 5 + 5 + 1 MiB
CONCURRENT_CREATORS = 20
# Outage tests: short timeouts and few retries, so a call against a dead server ends quickly.
OUTAGE_SETTINGS = {
    "connect_timeout_ms": "500",
    "request_timeout_ms": "1000",
    "retries": "2",
    "retry_backoff_ms": "50",
    "retry_backoff_max_ms": "200",
}
# Time the test machine may add to a call's bound (scheduling on a busy 2-core machine).
SLACK_S = 1.5


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.processes)])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ObjectStore]:
    if request.param == "file":
        opened = open_store((tmp_path / "store").as_uri(), {}, environ={})
    else:
        server: MotoServer = request.getfixturevalue("moto_server")
        bucket: str = request.getfixturevalue("s3_bucket")
        settings = server.settings(
            list_max_keys=str(LIST_PAGE_KEYS),
            multipart_threshold_bytes=str(PART_BYTES),
            multipart_part_bytes=str(PART_BYTES),
        )
        opened = open_store(f"s3://{bucket}/tiered/root", settings, environ={})
    try:
        yield opened
    finally:
        await opened.close()


# -- the contract, on both stores ------------------------------------------------------------------
async def test_put_get_size_and_replace(store: ObjectStore) -> None:
    await store.put("t/0/a.bin", b"first version")
    assert await store.get("t/0/a.bin") == b"first version"
    assert await store.size("t/0/a.bin") == len(b"first version")
    await store.put("t/0/a.bin", b"second")  # put replaces
    assert await store.get("t/0/a.bin") == b"second"
    assert await store.size("t/0/a.bin") == len(b"second")
    await store.put("t/0/empty", b"")
    assert await store.get("t/0/empty") == b""
    assert await store.size("t/0/empty") == 0
    with pytest.raises(ObjectNotFoundError, match="'t/0/missing'"):
        await store.get("t/0/missing")
    with pytest.raises(ObjectNotFoundError):
        await store.size("t/0/missing")


async def test_ranged_reads(store: ObjectStore) -> None:
    data = os.urandom(10_000)
    await store.put("k", data)
    assert await store.get("k", 0, 100) == data[:100]  # the start
    assert await store.get("k", 4_000, 1_000) == data[4_000:5_000]  # the middle
    assert await store.get("k", 9_000) == data[9_000:]  # to the end
    assert await store.get("k", 9_990, 100) == data[9_990:]  # over the end: what there is
    assert await store.get("k", 9_999, 1) == data[9_999:]  # the last byte
    for past_end in (10_000, 20_000):
        with pytest.raises(ObjectNotFoundError, match="past the object's end"):
            await store.get("k", past_end, 10)
    with pytest.raises(ObjectNotFoundError):
        await store.get("k", 10_000)
    for position, size_bytes in ((-1, 10), (0, 0), (5, -1)):
        with pytest.raises(ValueError, match="bad range"):
            await store.get("k", position, size_bytes)
    await store.put("empty", b"")
    assert await store.get("empty", 0, 10) == b""  # from 0, an empty object is just empty


async def test_one_of_many_concurrent_creators_wins(store: ObjectStore) -> None:
    results = await asyncio.gather(
        *(
            store.put_if_absent("m/0001.json", f"writer {i}".encode())
            for i in range(CONCURRENT_CREATORS)
        )
    )
    assert results.count(True) == 1
    winner = results.index(True)
    assert await store.get("m/0001.json") == f"writer {winner}".encode()
    assert await store.put_if_absent("m/0001.json", b"late") is False
    assert await store.get("m/0001.json") == f"writer {winner}".encode()
    # Even with the winner's bytes: another call, another create, refused.
    assert await store.put_if_absent("m/0001.json", f"writer {winner}".encode()) is False
    await store.delete("m/0001.json")
    assert await store.put_if_absent("m/0001.json", b"again") is True
    assert [info.key for info in await store.list("m/")] == ["m/0001.json"]


async def test_list_is_sorted_recursive_and_complete_over_pages(store: ObjectStore) -> None:
    segment_keys = [f"t/0/segments/{i:020d}.parquet" for i in range(3 * LIST_PAGE_KEYS + 2)]
    others = ["t/0/manifest/00000000000000000001.json", "t/1/x", "t/10/y", "u/z"]
    everything = segment_keys + others
    shuffled = random.Random(6).sample(everything, len(everything))
    await asyncio.gather(*(store.put(key, key.encode()) for key in shuffled))
    expected = [ObjectInfo(key, len(key)) for key in sorted(everything)]
    assert await store.list("") == expected
    assert await store.list("t/0/segments/") == [i for i in expected if i.key in segment_keys]
    # A prefix is a string prefix, not a directory: "t/1" also matches "t/10/...".
    assert [i.key for i in await store.list("t/1")] == ["t/1/x", "t/10/y"]
    assert [i.key for i in await store.list("t/0/manifest/0000")] == [others[0]]
    assert await store.list("nothing/") == []
    assert await store.list("t/0/segments/9") == []


async def test_delete_is_idempotent(store: ObjectStore) -> None:
    await store.delete("never/written")
    await store.put("d/a", b"1")
    await store.put("d/b", b"2")
    await store.delete("d/a")
    await store.delete("d/a")
    with pytest.raises(ObjectNotFoundError):
        await store.get("d/a")
    assert await store.list("d/") == [ObjectInfo("d/b", 1)]


async def test_put_file_small_and_in_parts(store: ObjectStore, tmp_path: Path) -> None:
    small = tmp_path / "small.parquet"
    small.write_bytes(b"PAR1 small PAR1")
    await store.put_file("t/0/segments/small.parquet", small)
    assert await store.get("t/0/segments/small.parquet") == small.read_bytes()

    large = tmp_path / "large.parquet"
    data = os.urandom(LARGE_FILE_BYTES)
    large.write_bytes(data)
    await store.put_file("t/0/segments/large.parquet", large)
    assert await store.size("t/0/segments/large.parquet") == LARGE_FILE_BYTES
    assert await store.get("t/0/segments/large.parquet") == data
    # Across the first part boundary, and the last part alone.
    assert (
        await store.get("t/0/segments/large.parquet", PART_BYTES - 10, 20)
        == data[PART_BYTES - 10 : PART_BYTES + 10]
    )
    assert await store.get("t/0/segments/large.parquet", 2 * PART_BYTES) == data[2 * PART_BYTES :]


async def test_keys_that_leave_the_root_are_refused(store: ObjectStore) -> None:
    for key in ("", "/abs", "../escape", "a/../../escape", "a/.."):
        with pytest.raises(ValueError, match="bad object key"):
            await store.put(key, b"x")
        with pytest.raises(ValueError, match="bad object key"):
            await store.get(key)
    for prefix in ("/abs", "../", "a/../"):
        with pytest.raises(ValueError, match="bad object key prefix"):
            await store.list(prefix)


async def test_a_concurrent_reader_never_sees_part_of_an_object(store: ObjectStore) -> None:
    """Readers racing a writer that replaces the object over and over see one whole version
    or the other, never a mix or a prefix."""
    versions = [b"a" * (1 * MIB), b"b" * (2 * MIB) + b"end"]
    await store.put("hot", versions[0])
    writes = 12
    seen: set[bytes] = set()

    async def writer() -> None:
        for i in range(writes):
            await store.put("hot", versions[(i + 1) % 2])

    async def reader() -> None:
        for _ in range(writes):
            data = await store.get("hot")
            assert data in versions, f"read {len(data)} bytes starting {data[:8]!r}"
            seen.add(data)

    await asyncio.gather(writer(), reader(), reader())
    assert seen <= set(versions)


# -- S3: multipart, failures, retries --------------------------------------------------------------
async def test_s3_put_file_above_the_threshold_is_a_multipart_upload(
    moto_server: MotoServer, s3_bucket: str, tmp_path: Path
) -> None:
    settings = moto_server.settings(
        multipart_threshold_bytes=str(PART_BYTES), multipart_part_bytes=str(PART_BYTES)
    )
    store = open_store(f"s3://{s3_bucket}", settings, environ={})
    source = tmp_path / "segment.parquet"
    data = os.urandom(LARGE_FILE_BYTES)
    source.write_bytes(data)
    try:
        await store.put_file("seg", source)
        assert await store.get("seg") == data
        at_threshold = tmp_path / "at-threshold"
        at_threshold.write_bytes(data[:PART_BYTES])
        await store.put_file("one-put", at_threshold)
    finally:
        await store.close()
    # S3 marks an object made of N parts with an ETag ending "-N".
    assert moto_server.etag(s3_bucket, "seg").endswith('-3"')
    assert "-" not in moto_server.etag(s3_bucket, "one-put")
    assert moto_server.multipart_uploads(s3_bucket) == []


async def test_s3_a_failed_multipart_upload_is_aborted(
    moto_server_factory: MotoServerFactory, tmp_path: Path
) -> None:
    # This server wants parts of 6 MiB at least: completing our 5 MiB parts fails (400
    # EntityTooSmall), after every part went up.
    server = moto_server_factory({"S3_UPLOAD_PART_MIN_SIZE": str(6 * MIB)})
    bucket = server.create_bucket("strict")
    settings = server.settings(
        multipart_threshold_bytes=str(PART_BYTES), multipart_part_bytes=str(PART_BYTES)
    )
    store = open_store(f"s3://{bucket}/p", settings, environ={})
    source = tmp_path / "segment.parquet"
    source.write_bytes(os.urandom(LARGE_FILE_BYTES))
    try:
        with pytest.raises(ObjectStoreError, match="EntityTooSmall") as failed:
            await store.put_file("seg", source)
    finally:
        await store.close()
    assert "complete multipart upload" in str(failed.value)
    assert server.multipart_uploads(bucket) == []  # aborted: no parts left behind
    assert server.keys(bucket) == []


async def test_s3_uploads_left_unfinished_under_a_prefix_are_aborted(
    moto_server: MotoServer, s3_bucket: str
) -> None:
    for key in ("p/t/0/segments/a", "p/t/0/segments/b", "p/t/1/segments/a", "t/0/segments/a"):
        moto_server.start_multipart_upload(s3_bucket, key)
    store = open_store(f"s3://{s3_bucket}/p", moto_server.settings(list_max_keys="1"), environ={})
    try:
        assert await store.abort_unfinished("t/0/segments/") == 2  # over two pages
        assert await store.abort_unfinished("t/0/segments/") == 0
    finally:
        await store.close()
    # Only those under the store's root and the prefix.
    assert sorted(moto_server.multipart_uploads(s3_bucket)) == [
        "p/t/1/segments/a",
        "t/0/segments/a",
    ]


async def test_s3_calls_fail_within_their_bound_while_the_server_is_down_then_recover(
    moto_server_factory: MotoServerFactory,
) -> None:
    server = moto_server_factory()
    bucket = server.create_bucket("outage")
    store = open_store(f"s3://{bucket}/p", server.settings(**OUTAGE_SETTINGS), environ={})
    assert isinstance(store, S3Store)
    bound_s = store.settings.retry_policy.duration_ms_max / 1000
    try:
        await store.put("k", b"before")
        server.stop()
        calls: dict[str, Callable[[], Awaitable[object]]] = {
            "put": lambda: store.put("k", b"during"),
            "put_if_absent": lambda: store.put_if_absent("new", b"during"),
            "get": lambda: store.get("k"),
            "size": lambda: store.size("k"),
            "list": lambda: store.list(""),
            "delete": lambda: store.delete("k"),
        }
        for operation, call in calls.items():
            started = time.monotonic()
            with pytest.raises(ObjectStoreError) as failed:
                await call()
            assert time.monotonic() - started < bound_s + SLACK_S
            message = str(failed.value)
            assert not isinstance(failed.value, ObjectNotFoundError), message
            assert server.endpoint_url in message, message
            assert f"{operation} " in message, message
            assert "gave up after 3 attempts" in message, message
            assert "\n" not in message

        server.start()  # same port; moto lost everything but the (re-created) bucket
        await store.put("k", b"after")  # the first attempt may meet a stale pooled connection
        assert await store.get("k") == b"after"
        assert await store.list("") == [ObjectInfo("k", 5)]
    finally:
        await store.close()


async def test_s3_a_hung_server_times_out_then_recovers(
    moto_server_factory: MotoServerFactory,
) -> None:
    server = moto_server_factory()
    bucket = server.create_bucket("hung")
    store = open_store(f"s3://{bucket}", server.settings(**OUTAGE_SETTINGS), environ={})
    assert isinstance(store, S3Store)
    policy = store.settings.retry_policy
    try:
        await store.put("k", b"value")
        server.pause()  # connections are accepted (by the kernel) and never answered
        started = time.monotonic()
        with pytest.raises(ObjectStoreError, match="no answer within 1000 ms") as failed:
            await store.get("k")
        elapsed_s = time.monotonic() - started
        attempts = policy.retries_max + 1
        assert attempts * policy.attempt_timeout_ms / 1000 <= elapsed_s
        assert elapsed_s < policy.duration_ms_max / 1000 + SLACK_S
        assert server.endpoint_url in str(failed.value)
        server.resume()
        assert await store.get("k") == b"value"
    finally:
        server.resume()
        await store.close()


class AnswerLosingProxy:
    """A TCP forwarder to the S3 server that, once `losing` is set, drops the next answer of the
    server: the request still reaches the server and takes effect, the client never hears of it.
    `losing` clears itself when that answer is dropped, so the client's retry (on a new
    connection) is answered: with a flag the test cleared after a sleep, a server that closes
    the connection after an error answer made all the retries fail fast inside the sleep."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.losing = False
        self._server: asyncio.Server | None = None
        self._pumps: set[asyncio.Task[None]] = set()

    @property
    def endpoint_url(self) -> str:
        assert self._server is not None
        return f"http://{HOST}:{self._server.sockets[0].getsockname()[1]}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._forward, HOST, 0)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for pump in self._pumps:
            pump.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)

    async def _forward(self, client: asyncio.StreamReader, to_client: asyncio.StreamWriter) -> None:
        upstream, to_upstream = await asyncio.open_connection(HOST, self.target_port)
        pumps = {
            asyncio.create_task(self._pump(client, to_upstream, answers=False)),
            asyncio.create_task(self._pump(upstream, to_client, answers=True)),
        }
        self._pumps |= pumps
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for pump in pumps:
            pump.cancel()
        self._pumps -= pumps
        to_client.close()
        to_upstream.close()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, answers: bool
    ) -> None:
        # Once an answer was dropped the connection stays a black hole for answers: passing
        # later bytes would hand the client the tail of a response whose head it never saw
        # (seen in CI as a "bad status line" when `losing` flipped between two chunks).
        dropped = False
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(64 * 1024):
                # An interim "100 Continue" still passes: without it the client never sends
                # the request's body (botocore sends PUTs with Expect: 100-continue).
                interim = data.startswith(b"HTTP/1.1 100 ") and not dropped
                if answers and (self.losing or dropped) and not interim:
                    self.losing = False
                    dropped = True
                    continue
                writer.write(data)
                await writer.drain()


async def test_s3_a_create_whose_answer_was_lost_is_not_a_lost_race(
    moto_server: MotoServer, s3_bucket: str
) -> None:
    """The create reaches the server and takes effect but its answer is lost; whatever retries
    it (our retry after the timeout, or aiohttp resending the PUT once the connection drops)
    then finds the key taken, by our own create: put_if_absent must still report it created."""
    proxy = AnswerLosingProxy(moto_server.port)
    await proxy.start()
    settings = moto_server.settings(**OUTAGE_SETTINGS, endpoint=proxy.endpoint_url)
    store = open_store(f"s3://{s3_bucket}", settings, environ={})
    assert isinstance(store, S3Store)
    try:
        proxy.losing = True
        assert await store.put_if_absent("manifest/1", b"ours") is True
        assert not proxy.losing, "no answer was lost"
        assert await store.get("manifest/1") == b"ours"
        assert await store.put_if_absent("manifest/1", b"ours") is False  # another call
        # A rival's create, its answer lost the same way: that is a lost race.
        proxy.losing = True
        assert await store.put_if_absent("manifest/1", b"theirs") is False
        assert not proxy.losing, "no answer was lost"
        assert await store.get("manifest/1") == b"ours"
    finally:
        await store.close()
        await proxy.close()


async def test_s3_keys_live_under_the_url_prefix(moto_server: MotoServer, s3_bucket: str) -> None:
    store = open_store(f"s3://{s3_bucket}/tiered/root/", moto_server.settings(), environ={})
    assert store.url == f"s3://{s3_bucket}/tiered/root"
    try:
        await store.put("t/0/a", b"1")
        # Beside the root, and a "folder" marker a console made inside it: none are objects.
        for foreign in ("tiered/rootless", "other/x", "tiered/root/t/"):
            moto_server.put_object(s3_bucket, foreign, b"")
        assert sorted(moto_server.keys(s3_bucket)) == [
            "other/x",
            "tiered/root/t/",
            "tiered/root/t/0/a",
            "tiered/rootless",
        ]
        assert await store.list("") == [ObjectInfo("t/0/a", 1)]
    finally:
        await store.close()


async def test_s3_open_readies_the_client_without_a_request(
    moto_server_factory: MotoServerFactory,
) -> None:
    """A broker opens its store at start: with the store down that must neither fail nor wait
    (the outage is the uploads' business, with their retries and backlog)."""
    server = moto_server_factory()
    bucket = server.create_bucket("opened")
    store = open_store(f"s3://{bucket}", server.settings(**OUTAGE_SETTINGS), environ={})
    assert isinstance(store, S3Store)
    try:
        server.pause()  # a request would wait out its timeout, then fail
        started = time.monotonic()
        with StallMeter() as stalls:  # reading botocore's models took 3 s on a stalling host
            await store.open()
            await store.open()  # once is enough; again changes nothing
        took_s = time.monotonic() - started
        attempt_timeout_s = store.settings.retry_policy.attempt_timeout_ms / 1000
        assert took_s < attempt_timeout_s + stalls.stalled_s_total, (took_s, stalls.stalled_s_total)
        assert store._client is not None  # built: the first call will not pay for it
        server.resume()
        await store.put("k", b"v")
        assert await store.get("k") == b"v"
    finally:
        server.resume()
        await store.close()
    with pytest.raises(ObjectStoreError, match="closed"):
        await store.open()


async def test_s3_plain_http_endpoint_loads_no_ca_bundle(
    moto_server: MotoServer, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An http:// endpoint never starts TLS: its first request must not pay for reading the
    CA bundle (aiobotocore does that when the client verifies, whatever the scheme)."""
    loads: list[object] = []
    real_load = ssl.SSLContext.load_verify_locations

    def counting_load(context: ssl.SSLContext, *args: Any, **kwargs: Any) -> None:
        loads.append(args)
        real_load(context, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counting_load)
    # The counter counts: the contexts aiobotocore makes are ssl.SSLContext's.
    ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(get_cert_path(True))
    assert loads
    loads.clear()
    assert moto_server.settings()["remote.storage.s3.endpoint"].startswith("http://")
    store = open_store(f"s3://{s3_bucket}", moto_server.settings(), environ={})
    try:
        await store.put("k", b"v")
        assert await store.get("k") == b"v"
    finally:
        await store.close()
    assert loads == []
    https = S3Settings(region="us-east-1", endpoint_url="https://s3.example.test")
    assert https.tls_verify is None  # botocore's default: verify against the CA bundle


async def test_s3_store_closed(moto_server: MotoServer, s3_bucket: str) -> None:
    never_used = open_store(f"s3://{s3_bucket}", moto_server.settings(), environ={})
    await never_used.close()  # nothing opened: nothing to close
    store = open_store(f"s3://{s3_bucket}", moto_server.settings(), environ={})
    await store.put("k", b"v")
    await store.close()
    with pytest.raises(ObjectStoreError, match="closed"):
        await store.get("k")


# -- the file store --------------------------------------------------------------------------------
async def test_file_store_keys_name_plain_files_only(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "root")  # created on the first write
    for key in ("a//b", "./a", "a/./b", "a/", f"seg{TEMP_SUFFIX}", "nul\0byte"):
        with pytest.raises(ValueError, match="bad object key"):
            await store.put(key, b"x")
    await store.put("t/0/a", b"x")
    # "t/0" is a directory here, not an object.
    with pytest.raises(ObjectNotFoundError):
        await store.get("t/0")
    with pytest.raises(ObjectNotFoundError):
        await store.size("t/0")
    with pytest.raises(ObjectStoreError, match="'t/0'"):
        await store.put_if_absent("t/0", b"x")
    with pytest.raises(ObjectStoreError, match="'t/0/a/b'"):
        await store.put("t/0/a/b", b"x")  # "t/0/a" is an object, not a directory
    with pytest.raises(ValueError, match="absolute path"):
        FileStore(Path("relative"))


async def test_file_store_hides_and_leaves_no_temporary_files(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    source = tmp_path / "source"
    source.write_bytes(b"data")
    await asyncio.gather(
        store.put("t/a", b"1"),
        store.put_file("t/b", source),
        *(store.put_if_absent("t/c", b"3") for _ in range(5)),
    )
    assert not list(tmp_path.rglob(f"*{TEMP_SUFFIX}"))
    # One left by a crash (a writer killed before its rename) is not an object, and goes when
    # the unfinished writes under its prefix are aborted.
    (tmp_path / "t" / f".0123abcd{TEMP_SUFFIX}").write_bytes(b"half")
    (tmp_path / "u").mkdir()
    (tmp_path / "u" / f".4567cdef{TEMP_SUFFIX}").write_bytes(b"half")
    assert [info.key for info in await store.list("t/")] == ["t/a", "t/b", "t/c"]
    assert await store.abort_unfinished("t/") == 1
    assert [p.name for p in tmp_path.rglob(f"*{TEMP_SUFFIX}")] == [f".4567cdef{TEMP_SUFFIX}"]
    assert [info.key for info in await store.list("t/")] == ["t/a", "t/b", "t/c"]
    with pytest.raises(ObjectStoreError, match="put_file 't/d'"):
        await store.put_file("t/d", tmp_path / "no-such-source")
    assert store.url == tmp_path.as_uri()


# -- retry policy ----------------------------------------------------------------------------------
def test_backoff_is_full_jitter_under_an_exponential_ceiling() -> None:
    policy = RetryPolicy(retries_max=5, backoff_ms=100, backoff_max_ms=1_000, attempt_timeout_ms=1)
    first = [policy.wait_ms(1) for _ in range(1_000)]
    late = [policy.wait_ms(10) for _ in range(1_000)]
    # The first ceiling is 100 ms (+-20%, Kafka's jitter), a late one capped at 1000 ms; full
    # jitter draws anywhere below the ceiling, not just around it.
    assert 0 <= min(first) < 10
    assert 90 < max(first) <= 120
    assert 0 <= min(late) < 100
    assert 900 < max(late) <= 1_000
    assert policy.duration_ms_max == 6 * 1 + 5 * 1_000


# -- open_store: URLs, settings, environment -------------------------------------------------------
def test_open_store_file_urls(tmp_path: Path) -> None:
    assert isinstance(open_store("file:///var/riverbed/tiered", {}), FileStore)
    spaced = open_store("file:///var/river%20bed", {})
    assert spaced.url == "file:///var/river%20bed"
    assert open_store("file://localhost/var/x", {}).url == "file:///var/x"
    for url, problem in (
        ("file://relative/path", "names a local path"),
        ("file:relative", "absolute path"),
        ("file:///x?sync=1", "no query"),
        ("ftp://host/x", "unknown object store scheme 'ftp'"),
        ("/var/riverbed", "unknown object store scheme ''"),
    ):
        with pytest.raises(ValueError, match=problem) as failed:
            open_store(url, {})
        assert url in str(failed.value)
        assert "\n" not in str(failed.value)


def test_open_store_s3_settings() -> None:
    settings = {
        "remote.storage.s3.endpoint": "http://127.0.0.1:9000",
        "remote.storage.s3.region": "eu-west-3",
        "remote.storage.s3.access.key.id": "AKID",
        "remote.storage.s3.secret.access.key": "SECRET",
        "remote.storage.s3.path.style.access": "TRUE",
        "remote.storage.s3.connect.timeout.ms": "1500",
        "remote.storage.s3.request.timeout.ms": "20000",
        "remote.storage.s3.retries": "5",
        "remote.storage.s3.retry.backoff.ms": "50",
        "remote.storage.s3.retry.backoff.max.ms": "5000",
        "remote.storage.s3.multipart.threshold.bytes": str(64 * MIB),
        "remote.storage.s3.multipart.part.bytes": str(16 * MIB),
        "remote.storage.s3.list.max.keys": "100",
        "log.dirs": "/not/ours",  # other broker settings are not this function's business
    }
    store = open_store("s3://my-bucket/tiered/prod/", settings, environ={"AWS_REGION": "x"})
    assert isinstance(store, S3Store)
    assert store.url == "s3://my-bucket/tiered/prod"
    assert store.settings == S3Settings(
        region="eu-west-3",
        endpoint_url="http://127.0.0.1:9000",
        access_key_id="AKID",
        secret_access_key="SECRET",
        addressing_style="path",
        connect_timeout_ms=1500,
        request_timeout_ms=20000,
        retries_max=5,
        retry_backoff_ms=50,
        retry_backoff_max_ms=5000,
        multipart_threshold_bytes=64 * MIB,
        multipart_part_bytes=16 * MIB,
        list_max_keys=100,
    )
    assert "SECRET" not in repr(store.settings)
    bare = open_store("s3://my-bucket", {"remote.storage.s3.region": "us-east-1"}, environ={})
    assert isinstance(bare, S3Store)
    assert bare.url == "s3://my-bucket"
    assert bare.settings == S3Settings(region="us-east-1")  # the documented defaults


def test_open_store_s3_falls_back_to_the_aws_environment() -> None:
    def opened(settings: dict[str, str], environ: dict[str, str]) -> S3Settings:
        store = open_store("s3://bucket", settings, environ)
        assert isinstance(store, S3Store)
        return store.settings

    environ = {
        "AWS_ENDPOINT_URL_S3": "http://s3-only:9000",
        "AWS_ENDPOINT_URL": "http://every-service:9000",
        "AWS_REGION": "eu-north-1",
        "AWS_DEFAULT_REGION": "us-west-2",
        "AWS_ACCESS_KEY_ID": "ENVKEY",
        "AWS_SECRET_ACCESS_KEY": "ENVSECRET",
        "AWS_SESSION_TOKEN": "ENVTOKEN",
    }
    from_env = opened({}, environ)
    assert (from_env.endpoint_url, from_env.region) == ("http://s3-only:9000", "eu-north-1")
    assert (from_env.access_key_id, from_env.secret_access_key, from_env.session_token) == (
        "ENVKEY",
        "ENVSECRET",
        "ENVTOKEN",
    )
    fallback = opened(
        {}, {"AWS_ENDPOINT_URL": "http://every-service:9000", "AWS_DEFAULT_REGION": "us-west-2"}
    )
    assert (fallback.endpoint_url, fallback.region) == ("http://every-service:9000", "us-west-2")
    assert fallback.access_key_id is None  # botocore's credential chain (instance roles)
    # Settings win; credentials come whole from one place (no env token on settings' key).
    explicit = opened(
        {
            "remote.storage.s3.endpoint": "http://explicit:1",
            "remote.storage.s3.region": "ap-south-1",
            "remote.storage.s3.access.key.id": "SETKEY",
            "remote.storage.s3.secret.access.key": "SETSECRET",
        },
        environ,
    )
    assert (explicit.endpoint_url, explicit.region) == ("http://explicit:1", "ap-south-1")
    assert (explicit.access_key_id, explicit.secret_access_key, explicit.session_token) == (
        "SETKEY",
        "SETSECRET",
        None,
    )
    # Set but empty is unset.
    assert opened({}, {**environ, "AWS_ENDPOINT_URL_S3": ""}).endpoint_url == (
        "http://every-service:9000"
    )


@pytest.mark.parametrize(
    ("url", "settings", "problem"),
    [
        ("s3://", {}, "missing bucket"),
        ("s3:///prefix", {}, "missing bucket"),
        ("s3://Bad_Bucket/p", {}, "not a valid S3 bucket name"),
        ("s3://key:secret@bucket/p", {}, "not the URL"),
        ("s3://bucket:9000/p", {}, "not the URL"),
        ("s3://bucket/a/../b", {}, "'..'"),
        ("s3://bucket/p", {"region": ""}, "needs a region"),
        ("s3://bucket/p", {"request.timeout.ms": "30s"}, "request.timeout.ms must be an integer"),
        ("s3://bucket/p", {"request.timeout.ms": "0"}, "request timeout must be > 0"),
        ("s3://bucket/p", {"connect.timeout.ms": "-1"}, "connect timeout must be > 0"),
        ("s3://bucket/p", {"retries": "-1"}, "retries must be >= 0"),
        ("s3://bucket/p", {"retry.backoff.max.ms": "10"}, "retry.backoff.max.ms"),
        ("s3://bucket/p", {"path.style.access": "yes"}, "path.style.access must be true or false"),
        ("s3://bucket/p", {"multipart.part.bytes": str(MIB)}, "part size must be"),
        ("s3://bucket/p", {"multipart.threshold.bytes": "0"}, "threshold must be > 0"),
        ("s3://bucket/p", {"list.max.keys": "1001"}, "list page size must be 1 to 1000"),
        ("s3://bucket/p", {"endpoint": "localhost:9000"}, "not http(s)://host"),
        ("s3://bucket/p", {"access.key.id": "AKID"}, "need both"),
        ("s3://bucket/p", {"session.token": "T"}, "session token needs"),
        ("s3://bucket/p", {"requst.timeout.ms": "1"}, "unknown setting remote.storage.s3.requst"),
    ],
)
def test_open_store_s3_refuses_bad_urls_and_settings(
    url: str, settings: dict[str, str], problem: str
) -> None:
    full = {"remote.storage.s3.region": "us-east-1"} | {
        f"remote.storage.s3.{name}": value for name, value in settings.items()
    }
    with pytest.raises(ValueError, match=re.escape(problem)) as failed:
        open_store(url, full, environ={})
    message = str(failed.value)
    assert message.startswith(url), message
    assert "\n" not in message, message
