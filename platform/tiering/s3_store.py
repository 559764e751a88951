"""`s3://bucket/prefix`: the object store on S3 or an S3-compatible server (MinIO, moto's server)
through aiobotocore.

Every setting aiobotocore would otherwise take from its defaults or the environment is passed
explicitly (`S3Settings`). botocore's own retries are off: each call is retried here
(retry.py) with a timeout on every attempt, so the longest a call can take is
`S3Settings.retry_policy.duration_ms_max`, and what reaches the caller is a result,
ObjectNotFoundError, or one ObjectStoreError line naming the store, the endpoint, the operation,
the key and the last cause.

`put_if_absent` is a conditional write (PutObject with If-None-Match: *), atomic on S3 itself.
Its object carries a random create id (user metadata), so when a retry is refused because the
key exists, a HEAD tells whether an earlier attempt of the same call created it (its answer
lost) or another writer did.

Large `put_file` uploads go in parts (multipart upload); an upload that fails is aborted so its
parts do not linger. A multipart upload is invisible until completed, so readers never see
half an object, as with the file store.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import functools
import logging
import os
import re
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal, TypeVar

from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore import exceptions as botocore_errors
from riverbed.tiering.retry import RetriesExhaustedError, RetryPolicy, call_with_retries
from riverbed.tiering.store import (
    ObjectInfo,
    ObjectNotFoundError,
    ObjectStoreError,
    check_key,
    check_prefix,
)

if TYPE_CHECKING:
    from types_aiobotocore_s3.client import S3Client
    from types_aiobotocore_s3.type_defs import (
        CompletedPartTypeDef,
        ListMultipartUploadsOutputTypeDef,
        ListMultipartUploadsRequestTypeDef,
        ListObjectsV2OutputTypeDef,
        ListObjectsV2RequestTypeDef,
    )

log = logging.getLogger(__name__)

T = TypeVar("T")

MIB: Final = 1024 * 1024
# S3's limits: every part but the last is at least 5 MiB, at most 5 GiB, at most 10,000 parts;
# ListObjectsV2 returns at most 1,000 keys a page; a key is at most 1,024 bytes of UTF-8.
S3_PART_BYTES_MIN: Final = 5 * MIB
S3_PART_BYTES_MAX: Final = 5 * 1024 * MIB
S3_PARTS_MAX: Final = 10_000
S3_LIST_KEYS_MAX: Final = 1_000
S3_KEY_BYTES_MAX: Final = 1_024
# Bucket names: 3-63 lowercase letters, digits, dots and hyphens, starting and ending with a
# letter or digit.
BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
# Parts of one multipart upload sent at once: bounds its memory to this many parts.
PARTS_IN_FLIGHT_MAX: Final = 4
# HTTP connections kept to the endpoint: parts in flight plus cold reads and manifest calls.
CONNECTIONS_MAX: Final = 16

HTTP_PRECONDITION_FAILED: Final = 412
HTTP_RANGE_NOT_SATISFIABLE: Final = 416
# Worth another attempt: throttling and server-side failures (S3 asks for retries with backoff
# on 500/503 SlowDown), and 409 ConditionalRequestConflict, which S3 answers a conditional write
# that raced another write of the same key (the retry then gets a definite 200 or 412).
RETRIABLE_STATUSES: Final = frozenset({429, 500, 502, 503, 504})
RETRIABLE_CODES: Final = frozenset(
    {"ConditionalRequestConflict", "RequestTimeout", "SlowDown", "Throttling", "InternalError"}
)
# User metadata (x-amz-meta-...) naming the put_if_absent call that created an object.
CREATE_ID_METADATA: Final = "riverbed-create-id"
NOT_FOUND_CODES: Final = frozenset({"NoSuchKey", "NotFound", "404"})  # "404": HEAD's bodiless

AddressingStyle = Literal["path", "virtual"]


@dataclass(frozen=True, slots=True)
class S3Settings:
    """How to reach the bucket; `stores.open_store` fills it from `remote.storage.s3.*` settings
    and the standard AWS environment variables.

    Without an access key id and secret, botocore's credential chain is used (instance profile,
    web identity, ~/.aws), as on AWS with IAM roles. Path-style addressing
    (`http://host/bucket/key`) is what MinIO and moto's server need; virtual-hosted
    (`https://bucket.host/key`) is AWS's own.
    """

    region: str
    endpoint_url: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    addressing_style: AddressingStyle = "virtual"
    connect_timeout_ms: int = 10_000
    request_timeout_ms: int = 30_000  # one attempt, reading the whole answer included
    retries_max: int = 3
    retry_backoff_ms: int = 100
    retry_backoff_max_ms: int = 1_000
    multipart_threshold_bytes: int = 16 * MIB  # put_file: larger files go in parts ...
    multipart_part_bytes: int = 8 * MIB  # ... of this size (more if 10,000 would not do)
    list_max_keys: int = S3_LIST_KEYS_MAX  # keys per ListObjectsV2 page

    def __post_init__(self) -> None:
        if not self.region:
            raise ValueError("S3 needs a region (remote.storage.s3.region or AWS_REGION)")
        if self.endpoint_url is not None and not re.fullmatch(
            r"https?://[^/?#\s]+/?", self.endpoint_url
        ):
            raise ValueError(f"S3 endpoint {self.endpoint_url!r} is not http(s)://host[:port]")
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise ValueError("S3 credentials need both an access key id and a secret access key")
        if self.session_token is not None and self.access_key_id is None:
            raise ValueError("an S3 session token needs an access key id and secret access key")
        if self.addressing_style not in ("path", "virtual"):
            raise ValueError(
                f"S3 addressing style must be path or virtual, not {self.addressing_style!r}"
            )
        if self.connect_timeout_ms <= 0:
            raise ValueError(f"S3 connect timeout must be > 0 ms, got {self.connect_timeout_ms}")
        _ = self.retry_policy  # RetryPolicy checks the retry settings
        if not S3_PART_BYTES_MIN <= self.multipart_part_bytes <= S3_PART_BYTES_MAX:
            raise ValueError(
                f"S3 multipart part size must be {S3_PART_BYTES_MIN} to {S3_PART_BYTES_MAX} "
                f"bytes, got {self.multipart_part_bytes}"
            )
        if self.multipart_threshold_bytes <= 0:
            raise ValueError(
                f"S3 multipart threshold must be > 0 bytes, got {self.multipart_threshold_bytes}"
            )
        if not 1 <= self.list_max_keys <= S3_LIST_KEYS_MAX:
            raise ValueError(
                f"S3 list page size must be 1 to {S3_LIST_KEYS_MAX} keys, got {self.list_max_keys}"
            )

    @property
    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            retries_max=self.retries_max,
            backoff_ms=self.retry_backoff_ms,
            backoff_max_ms=self.retry_backoff_max_ms,
            attempt_timeout_ms=self.request_timeout_ms,
        )

    @property
    def tls_verify(self) -> bool | None:
        """What the client's `verify` gets: False for a plain-HTTP endpoint, where no TLS
        session ever starts, so aiobotocore does not load the CA bundle (~70 ms of CPU here)
        on the event loop's first request; botocore's default (verify) for HTTPS."""
        if self.endpoint_url is not None and self.endpoint_url.startswith("http://"):
            return False
        return None

    def client_config(self) -> AioConfig:
        return AioConfig(
            connect_timeout=self.connect_timeout_ms / 1000,
            read_timeout=self.request_timeout_ms / 1000,
            # One attempt per request: retries are ours (call_with_retries), so the bound on a
            # call's duration is explicit and not multiplied by a hidden second retry loop.
            retries={"mode": "standard", "total_max_attempts": 1},
            s3={"addressing_style": self.addressing_style},
            max_pool_connections=CONNECTIONS_MAX,
            signature_version="s3v4",
            # Checksums only where S3 requires them: S3-compatible servers differ in their
            # support for the newer flexible checksums (aws-chunked trailers), and without
            # them parts need no checksum bookkeeping on completion.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            # The endpoint is the one resolved from our settings and environment mapping, not
            # one botocore would find in os.environ or ~/.aws/config on its own.
            ignore_configured_endpoint_urls=True,
        )


class S3Store:
    """One aiobotocore client per store, opened by the first call and closed by close()."""

    def __init__(self, bucket: str, prefix: str, settings: S3Settings) -> None:
        if not BUCKET_NAME.fullmatch(bucket):
            raise ValueError(f"s3://{bucket}: not a valid S3 bucket name")
        prefix = prefix.strip("/")
        if "//" in prefix or ".." in prefix.split("/"):
            raise ValueError(f"s3://{bucket}/{prefix}: the prefix holds an empty or '..' part")
        self._bucket = bucket
        self._root = f"{prefix}/" if prefix else ""
        self._settings = settings
        self._policy = settings.retry_policy
        self._url = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
        # Error messages name the endpoint too: which server did not answer is the first
        # thing to know when a store is unreachable.
        self._where = (
            f"{self._url} at {settings.endpoint_url}" if settings.endpoint_url else self._url
        )
        self._session = get_session()
        self._client: S3Client | None = None
        self._exit_stack = contextlib.AsyncExitStack()
        self._opening = asyncio.Lock()
        self._closed = False

    @property
    def url(self) -> str:
        return self._url

    @property
    def settings(self) -> S3Settings:
        return self._settings

    async def open(self) -> None:
        """Build the client (botocore reads S3's models from disk: ~0.1 s of CPU); it sends
        nothing until the first call."""
        await self._open()

    async def put(self, key: str, data: bytes) -> None:
        s3_key = self._s3_key(key)
        await self._call(
            "put", key, lambda client: client.put_object(Bucket=self._bucket, Key=s3_key, Body=data)
        )

    async def put_file(self, key: str, path: Path) -> None:
        s3_key = self._s3_key(key)
        size_bytes = await self._local(key, path, asyncio.to_thread(os.path.getsize, path))
        if size_bytes <= self._settings.multipart_threshold_bytes:
            data = await self._local(key, path, asyncio.to_thread(path.read_bytes))
            await self.put(key, data)
        else:
            await self._put_multipart(key, s3_key, path, size_bytes)

    async def put_if_absent(self, key: str, data: bytes) -> bool:
        s3_key = self._s3_key(key)
        # Marks the object this call creates, whichever of its attempts lands.
        create_id = uuid.uuid4().hex

        async def create(client: S3Client) -> bool:
            try:
                await client.put_object(
                    Bucket=self._bucket,
                    Key=s3_key,
                    Body=data,
                    IfNoneMatch="*",
                    Metadata={CREATE_ID_METADATA: create_id},
                )
            except botocore_errors.ClientError as error:
                if _status(error) == HTTP_PRECONDITION_FAILED:
                    return False
                raise
            return True

        if await self._call("put_if_absent", key, create):
            return True
        # The key exists, maybe created by an attempt of ours whose answer was lost: our retry,
        # or aiohttp's own silent resend of a PUT whose connection dropped, then finds it.
        try:
            head = await self._call(
                "put_if_absent",
                key,
                lambda client: client.head_object(Bucket=self._bucket, Key=s3_key),
            )
        except ObjectNotFoundError:  # someone else's, deleted since
            return False
        return head.get("Metadata", {}).get(CREATE_ID_METADATA) == create_id

    async def get(self, key: str, position: int = 0, size_bytes: int | None = None) -> bytes:
        if position < 0 or (size_bytes is not None and size_bytes <= 0):
            raise ValueError(f"bad range of {key!r}: position {position}, size {size_bytes}")
        s3_key = self._s3_key(key)

        async def read(client: S3Client) -> bytes:
            try:
                if position == 0 and size_bytes is None:
                    response = await client.get_object(Bucket=self._bucket, Key=s3_key)
                else:
                    last = "" if size_bytes is None else str(position + size_bytes - 1)
                    response = await client.get_object(
                        Bucket=self._bucket, Key=s3_key, Range=f"bytes={position}-{last}"
                    )
            except botocore_errors.ClientError as error:
                if _status(error) != HTTP_RANGE_NOT_SATISFIABLE:
                    raise
                if position == 0:  # the key exists (else 404): an empty object has no bytes
                    return b""
                raise ObjectNotFoundError(
                    self._message("get", key, f"range starts at {position}, past the object's end")
                ) from error
            async with response["Body"] as body:
                return await body.read()

        return await self._call("get", key, read)

    async def size(self, key: str) -> int:
        s3_key = self._s3_key(key)
        head = await self._call(
            "size", key, lambda client: client.head_object(Bucket=self._bucket, Key=s3_key)
        )
        return head["ContentLength"]

    async def list(self, prefix: str) -> builtins.list[ObjectInfo]:
        check_prefix(prefix)
        found: builtins.list[ObjectInfo] = []
        token: str | None = None
        while True:
            page = await self._call(
                "list", prefix, functools.partial(self._list_page, prefix=prefix, token=token)
            )
            for entry in page.get("Contents", []):
                key = entry["Key"][len(self._root) :]
                # Keys ending in '/' are "folder" markers that consoles and tools create.
                if key and not key.endswith("/"):
                    modified_ms = int(entry["LastModified"].timestamp() * 1000)
                    found.append(ObjectInfo(key, entry["Size"], modified_ms))
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or token is None:
                break
        # S3 lists in key order already; some S3-compatible servers do not promise it.
        return sorted(found, key=lambda info: info.key)

    async def delete(self, key: str) -> None:
        s3_key = self._s3_key(key)
        await self._call(
            "delete", key, lambda client: client.delete_object(Bucket=self._bucket, Key=s3_key)
        )

    async def abort_unfinished(self, prefix: str) -> int:
        check_prefix(prefix)
        uploads: builtins.list[tuple[str, str]] = []
        after: tuple[str, str] | None = None
        while True:
            page = await self._call(
                "abort_unfinished (list multipart uploads)",
                prefix,
                functools.partial(self._uploads_page, prefix=prefix, after=after),
            )
            uploads += [(upload["Key"], upload["UploadId"]) for upload in page.get("Uploads", [])]
            if not page.get("IsTruncated"):
                break
            after = (page.get("NextKeyMarker", ""), page.get("NextUploadIdMarker", ""))
        for s3_key, upload_id in uploads:
            await self._abort_multipart(s3_key[len(self._root) :], s3_key, upload_id)
        return len(uploads)

    async def close(self) -> None:
        async with self._opening:
            self._closed = True
            self._client = None
            await self._exit_stack.aclose()

    # -- helpers ---------------------------------------------------------------------------------
    def _s3_key(self, key: str) -> str:
        check_key(key)
        s3_key = self._root + key
        if len(s3_key.encode()) > S3_KEY_BYTES_MAX:
            raise ValueError(f"object key {key!r} is over S3's {S3_KEY_BYTES_MAX} bytes")
        return s3_key

    def _list_page(
        self, client: S3Client, *, prefix: str, token: str | None
    ) -> Awaitable[ListObjectsV2OutputTypeDef]:
        request: ListObjectsV2RequestTypeDef = {
            "Bucket": self._bucket,
            "Prefix": self._root + prefix,
            "MaxKeys": self._settings.list_max_keys,
        }
        if token is not None:
            request["ContinuationToken"] = token
        return client.list_objects_v2(**request)

    def _uploads_page(
        self, client: S3Client, *, prefix: str, after: tuple[str, str] | None
    ) -> Awaitable[ListMultipartUploadsOutputTypeDef]:
        request: ListMultipartUploadsRequestTypeDef = {
            "Bucket": self._bucket,
            "Prefix": self._root + prefix,
            "MaxUploads": self._settings.list_max_keys,
        }
        if after is not None:
            request["KeyMarker"], request["UploadIdMarker"] = after
        return client.list_multipart_uploads(**request)

    async def _put_multipart(self, key: str, s3_key: str, path: Path, size_bytes: int) -> None:
        # Bigger parts when the configured size would need more than S3's 10,000.
        part_bytes = max(self._settings.multipart_part_bytes, -(-size_bytes // S3_PARTS_MAX))
        part_count = -(-size_bytes // part_bytes)
        upload = await self._call(
            "put_file (create multipart upload)",
            key,
            lambda client: client.create_multipart_upload(Bucket=self._bucket, Key=s3_key),
        )
        upload_id = upload["UploadId"]
        try:
            etags: dict[int, str] = {}
            numbers = iter(range(1, part_count + 1))

            async def send_parts() -> None:
                # Workers share one iterator of part numbers: each takes the next one free.
                for number in numbers:
                    position = (number - 1) * part_bytes
                    length = min(part_bytes, size_bytes - position)
                    data = await self._local(
                        key, path, asyncio.to_thread(_read_exactly, path, position, length)
                    )
                    etags[number] = await self._upload_part(key, s3_key, upload_id, number, data)

            try:
                async with asyncio.TaskGroup() as workers:
                    for _ in range(min(PARTS_IN_FLIGHT_MAX, part_count)):
                        workers.create_task(send_parts())
            except BaseExceptionGroup as failed:
                raise failed.exceptions[0] from None
            parts: builtins.list[CompletedPartTypeDef] = [
                {"PartNumber": number, "ETag": etags[number]} for number in sorted(etags)
            ]
            await self._call(
                "put_file (complete multipart upload)",
                key,
                lambda client: client.complete_multipart_upload(
                    Bucket=self._bucket,
                    Key=s3_key,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": parts},
                ),
            )
        except BaseException:
            await self._abort_multipart(key, s3_key, upload_id)
            raise

    async def _upload_part(
        self, key: str, s3_key: str, upload_id: str, number: int, data: bytes
    ) -> str:
        response = await self._call(
            f"put_file (part {number})",
            key,
            lambda client: client.upload_part(
                Bucket=self._bucket, Key=s3_key, UploadId=upload_id, PartNumber=number, Body=data
            ),
        )
        return response["ETag"]

    async def _abort_multipart(self, key: str, s3_key: str, upload_id: str) -> None:
        """Best effort: the upload's own error is what the caller needs to see."""
        try:
            await self._call(
                "put_file (abort multipart upload)",
                key,
                lambda client: client.abort_multipart_upload(
                    Bucket=self._bucket, Key=s3_key, UploadId=upload_id
                ),
            )
        except ObjectStoreError as error:
            # Its parts stay billed until a bucket lifecycle rule (AbortIncompleteMultipartUpload)
            # removes them.
            log.warning("multipart upload %s left behind: %s", upload_id, error)

    async def _local(self, key: str, path: Path, work: Awaitable[T]) -> T:
        """Reading the local source file; its OSError becomes this call's ObjectStoreError."""
        try:
            return await work
        except OSError as error:
            raise ObjectStoreError(
                self._message("put_file", key, f"reading {path}: {error}")
            ) from error

    async def _open(self) -> S3Client:
        async with self._opening:
            if self._closed:
                raise ObjectStoreError(f"{self._where}: the store is closed")
            if self._client is None:
                # botocore reads S3's service model and endpoint rules (large JSON files) when
                # the first client is made: read them in a thread so the event loop never waits.
                await asyncio.to_thread(self._load_models)
                settings = self._settings
                self._client = await self._exit_stack.enter_async_context(
                    self._session.create_client(
                        "s3",
                        region_name=settings.region,
                        endpoint_url=settings.endpoint_url,
                        aws_access_key_id=settings.access_key_id,
                        aws_secret_access_key=settings.secret_access_key,
                        aws_session_token=settings.session_token,
                        config=settings.client_config(),
                        verify=settings.tls_verify,
                    )
                )
            return self._client

    def _load_models(self) -> None:
        loader = self._session.get_component("data_loader")
        for type_name in ("service-2", "endpoint-rule-set-1"):
            loader.load_service_model("s3", type_name)  # cached by the loader

    async def _call(
        self, operation: str, key: str, request: Callable[[S3Client], Awaitable[T]]
    ) -> T:
        """`request` under the retry policy, its failure turned into ObjectNotFoundError or an
        ObjectStoreError line."""
        client = self._client if self._client is not None and not self._closed else None
        if client is None:
            client = await self._open()
        try:
            return await call_with_retries(
                lambda: request(client),
                self._policy,
                _retriable,
                f"{self._url}: {operation} {key!r}",
            )
        except RetriesExhaustedError as error:
            cause = f"gave up after {error.attempts} attempts; last: {self._describe(error.last)}"
            raise ObjectStoreError(self._message(operation, key, cause)) from error.last
        except botocore_errors.ClientError as error:
            message = self._message(operation, key, self._describe(error))
            if _code(error) in NOT_FOUND_CODES:
                raise ObjectNotFoundError(message) from error
            raise ObjectStoreError(message) from error
        except botocore_errors.BotoCoreError as error:
            raise ObjectStoreError(self._message(operation, key, self._describe(error))) from error

    def _message(self, operation: str, key: str, cause: str) -> str:
        return f"{self._where}: {operation} {key!r} failed: {cause}".replace("\n", " ")

    def _describe(self, error: Exception) -> str:
        if isinstance(error, botocore_errors.ClientError):
            status, code = _status(error), _code(error)
            message = error.response.get("Error", {}).get("Message", "")
            named = f"HTTP {status}" if code == str(status) else f"HTTP {status} {code}"
            return f"{named}: {message}" if message else named
        if isinstance(error, botocore_errors.BotoCoreError):
            return str(error)
        if isinstance(error, TimeoutError):  # ours: the attempt's whole time was used up
            return f"no answer within {self._settings.request_timeout_ms} ms"
        return f"{type(error).__name__}: {error}"


def _status(error: botocore_errors.ClientError) -> int | None:
    return error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")


def _code(error: botocore_errors.ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def _retriable(error: Exception) -> bool:
    if isinstance(error, botocore_errors.ClientError):
        return _status(error) in RETRIABLE_STATUSES or _code(error) in RETRIABLE_CODES
    # Connection refused or reset, a botocore read/connect timeout, a body cut short, or the
    # attempt's own timeout (TimeoutError).
    return isinstance(
        error,
        (
            TimeoutError,
            botocore_errors.ConnectionError,
            botocore_errors.HTTPClientError,
            botocore_errors.IncompleteReadError,
        ),
    )


def _read_exactly(path: Path, position: int, length: int) -> bytes:
    with path.open("rb") as file:
        file.seek(position)
        data = file.read(length)
    if len(data) != length:
        raise OSError(f"{path} is shorter than when its upload started")
    return data
